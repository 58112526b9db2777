"""Witnessing between peers over a channel that is not HTTP (hivemind's Matrix rooms).

The exchange is tlog-witness's (docs/FORMAT.md 16.2), carried as plain values so any
channel can carry it: the log side sends an ``add-checkpoint`` body
(:func:`checkpoint_request`), the witness side answers with a :class:`PeerAnswer`
(:meth:`PeerWitness.answer`), and the log side keeps a verified cosignature in
``cosignatures`` (:func:`accept_cosignature`) or records a refusal (:func:`witness_refused`).

The witness side *is* the remote witness (:class:`.server.Witness`): the same rules
and the same state file per log, kept in the agent's own witness folder (outside its
archive), under its own cosigner key. Two additions for a channel that redelivers and
carries no request/response pairing: a checkpoint smaller than the one cosigned is refused
at once as a rollback (HTTP would answer 409 and never see it), and a request sent before
the last cosignature (a redelivered message) is ignored as stale, never judged.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from ..format.signed_note import (
    ALG_ED25519,
    NoteError,
    Verifier,
    format_add_checkpoint,
    open_checkpoint,
    parse_add_checkpoint,
    parse_checkpoint,
    parse_note,
)
from ..storage.safe_files import write_private_file
from ..storage.store import DB_NAME, EventStore, connect
from ..storage.witness import witness_dir_for
from .client import BadCosignature, _cosignature
from .remote import (
    cosigner_key,
    latest_checkpoint,
    peer_witness_keys,
    store_cosignature,
    tree_contains,
)
from .server import (
    KEY_FILE,
    Witness,
    check_private_dir,
    keygen,
    load_key,
    read_private_file,
)

PEERS_FOLDER = "peers"
PINS_FILE = "pins.json"  # peer -> the log key first cosigned for it
MAX_PINS_BYTES = 1024 * 1024
#: a peer's refusal evidence longer than this is not parsed (parsing costs ~0.3 ms a KB):
#: a checkpoint note with MAX_SIGNATURES signatures under 30-character key names is 13.7 KB
MAX_EVIDENCE_CHARS = 16 * 1024
#: the answer statuses: cosigned, conflict (send again from ``size``), refused, stale
COSIGNED, CONFLICT, REFUSED, STALE = "cosigned", "conflict", "refused", "stale"


@dataclass(frozen=True)
class PeerAnswer:
    """A witness's answer to one checkpoint.

    ``checkpoint`` is the checkpoint text cosigned (cosigned), or the note the witness last
    cosigned (refused: the evidence, with the log's signature and the witness's).
    """

    status: str
    cosignature: str = ""
    checkpoint: str = ""
    size: int = 0
    reason: str = ""


@dataclass(frozen=True)
class CheckpointRequest:
    """What the log side sends: an ``add-checkpoint`` body, the size it names and the key
    its log signature verifies with."""

    body: bytes
    size: int
    log_vkey: str


def cosigned_size(folder: Path, vkey: str) -> int:
    """The largest size the witness ``vkey`` cosigned for the archive in ``folder`` (or 0)."""
    verifier = cosigner_key(vkey)
    conn = connect(folder / DB_NAME, readonly=True)
    try:
        row = conn.execute(
            "SELECT max(size) FROM cosignatures WHERE name = ? AND key_id = ?",
            (verifier.name, verifier.key_id.to_bytes(4, "big")),
        ).fetchone()
    finally:
        conn.close()
    return int(row[0]) if row and row[0] is not None else 0


def checkpoint_request(folder: Path, old_size: int) -> CheckpointRequest | None:
    """The newest checkpoint with a consistency proof from ``old_size`` (None: none signed).

    An ``old_size`` beyond the checkpoint (the witness saw more than this archive holds)
    is sent as it is, with no proof: the witness refuses it as a rollback.
    """
    found = latest_checkpoint(folder)
    if found is None:
        return None
    note, proofs = found
    size = parse_checkpoint(parse_note(note).text).size
    proof = proofs(old_size, size) if 0 < old_size <= size else []
    reader = EventStore.open(folder, create=False, readonly=True)
    try:
        vkey = str(reader.vkey)
    finally:
        reader.close()
    return CheckpointRequest(format_add_checkpoint(old_size, proof, note), size, vkey)


def accept_cosignature(folder: Path, vkey: str, checkpoint: str, line: str) -> int | None:
    """Keep the witness ``vkey``'s cosignature of ``checkpoint`` if this archive signed that
    very checkpoint and the cosignature verifies; the size kept, or None."""
    verifier = cosigner_key(vkey)
    try:
        cosigned = parse_checkpoint(checkpoint)
    except NoteError:
        return None
    reader = EventStore.open(folder, create=False, readonly=True)
    try:
        ours = reader.checkpoint_note(cosigned.size)
    finally:
        reader.close()
    if ours is None or not ours.decode("utf-8").startswith(checkpoint + "\n"):
        return None  # not a checkpoint this archive holds (say, one from before a rollback)
    try:
        signature = _cosignature(checkpoint, line.encode("utf-8"), verifier)
    except BadCosignature:
        return None
    store_cosignature(folder, cosigned.size, signature)
    return cosigned.size


def refusal_checks(folder: Path, peer: str, vkey: str, evidence: str) -> bool:
    """Whether ``peer``'s refusal of this archive carries evidence that checks, and so is
    worth archiving: ``vkey`` is a key the log names for that peer, and ``evidence`` is a
    checkpoint this archive's key signed, cosigned by ``vkey``, that the tree does not hold
    (the archive was rolled back or rewritten after it). Anything else a peer can say for
    free, as often as it likes, so what fails is refused at the least cost."""
    if len(evidence) > MAX_EVIDENCE_CHARS:
        return False
    reader = EventStore.open(folder, create=False, readonly=True)
    try:
        if vkey not in peer_witness_keys(reader.conn, peer):
            return False
        log_key = Verifier.from_vkey(reader.note_vkey())
        checkpoint, _, cosigned = open_checkpoint(evidence, log_key, [cosigner_key(vkey)])
        return bool(cosigned) and not tree_contains(reader, checkpoint)
    except ValueError:  # NoteError, BadWitness: a note or key that does not check
        return False
    finally:
        reader.close()


class PeerWitness:
    """This agent as a witness of its peers' archives (one per profile, in its witness
    folder, under a cosigner key named ``name``). Holds the folder's lock until :meth:`close`."""

    def __init__(self, hermes_home: Path, name: str) -> None:
        archive = (Path(hermes_home).expanduser().absolute() / "archive").resolve()
        tag = hashlib.blake2b(str(archive).encode("utf-8"), digest_size=8).hexdigest()
        folder = check_private_dir(witness_dir_for(hermes_home) / f"{PEERS_FOLDER}-{tag}")
        if not (folder / KEY_FILE).exists():
            keygen(folder, name)
        self.folder = folder
        self.vkey = load_key(folder).vkey  # its cosigner key, sent with every answer
        self._witness: Witness | None = None

    def close(self) -> None:
        if self._witness is not None:
            self._witness.close()

    def _serving(self, log_key: Verifier) -> Witness:
        if self._witness is None:
            self._witness = Witness(self.folder, [log_key])
        else:
            self._witness.add_log_key(log_key)
        return self._witness

    def _pins(self) -> dict[str, str]:
        data = read_private_file(self.folder / PINS_FILE, MAX_PINS_BYTES)
        pins = json.loads(data) if data else {}
        return pins if isinstance(pins, dict) else {}

    def _pin(self, peer: str, log_vkey: str) -> None:
        pins = {**self._pins(), peer: log_vkey}
        write_private_file(self.folder / PINS_FILE, json.dumps(pins, sort_keys=True).encode())

    def answer(self, body: bytes, log_vkey: str, peer: str, sent_at: str) -> PeerAnswer:
        """Judge one checkpoint ``peer`` sent at ``sent_at`` (envelope time text).

        The first log key cosigned for a peer is pinned: another one is refused (a replaced
        archive). Nothing is raised for anything the peer controls.
        """
        pinned = self._pins().get(peer)
        if pinned is not None and pinned != log_vkey:
            return PeerAnswer(REFUSED, reason=f"the peer's log key changed (pinned {pinned})")
        try:
            log_key = Verifier.from_vkey(log_vkey)
            if log_key.alg != ALG_ED25519:
                raise NoteError("not an Ed25519 log key")
            _, _, note = parse_add_checkpoint(body)
            checkpoint, _, _ = open_checkpoint(note, log_key)
        except (NoteError, ValueError) as exc:
            return PeerAnswer(REFUSED, reason=f"malformed or unsigned checkpoint: {exc}")
        witness = self._serving(log_key)
        current = witness.cosigned(checkpoint.origin)
        if current is not None and sent_at < current.time:
            return PeerAnswer(STALE, reason="sent before the last cosignature")
        evidence = current.note.decode("utf-8") if current is not None else ""
        if current is not None and checkpoint.size < current.size:
            return PeerAnswer(
                REFUSED,
                checkpoint=evidence,
                size=current.size,
                reason=f"rolled back: size {checkpoint.size} after size {current.size} "
                "was cosigned",
            )
        reply = witness.add_checkpoint(body)
        text = reply.body.decode("utf-8", "replace").strip()
        if reply.status == 200:
            if pinned is None:
                self._pin(peer, log_vkey)
            return PeerAnswer(COSIGNED, cosignature=text + "\n", checkpoint=checkpoint.text)
        if reply.status == 409:
            return PeerAnswer(CONFLICT, size=int(text))
        return PeerAnswer(REFUSED, checkpoint=evidence, size=checkpoint.size, reason=text)
