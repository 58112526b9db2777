"""The remote witness set of an archive, read from its log (docs/FORMAT.md 16.2, 18).

The set is log content: ``witness_added`` and ``witness_removed`` events, read in order from
the chained log and never from a file inside the profile, so nothing in the archive folder
can add or remove a witness without leaving a chained, signed record of it. This module
builds those events, reads the set, runs the background submitter for a writer
(:func:`start_submitter`), and says how far each witness lags (:func:`lag_from_log` for
``status``, :func:`check_remote` for ``verify --witnesses``, which asks each witness for the
checkpoint it last cosigned and checks it against this archive's tree).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..domain.clock import now_text
from ..format import merkle
from ..format.events import NewEvent
from ..format.signed_note import (
    Checkpoint,
    NoteError,
    Signature,
    Verifier,
    cosigner_verifier,
    open_checkpoint,
)
from ..storage.store import DB_NAME, connect, payload_body
from ..storage.threads import ThreadFactory
from .client import (
    ProofSource,
    WitnessEndpoint,
    WitnessSubmitter,
    WitnessUnreachable,
    _connection,
)

if TYPE_CHECKING:
    from ..storage.store import EventStore

MAX_ANSWER_BYTES = 64 * 1024


class BadWitness(ValueError):
    """A witness URL or key that cannot be added (the message says why)."""


def cosigner_key(vkey: str) -> Verifier:
    """The witness's cosigner key (type 0x04), given in that form or as the Ed25519 key of
    type 0x01 (both are C2SP's; :func:`cosigner_verifier`)."""
    try:
        return cosigner_verifier(vkey)
    except NoteError as exc:
        raise BadWitness(f"{vkey!r} is not a verifier key: {exc}") from None


def witness_added(url: str | None, vkey: str, reason: str, who: dict[str, Any]) -> NewEvent:
    """The event that adds a remote witness (FORMAT.md 18); ``url`` None for a peer witness
    reached over another channel (a hivemind peer over Matrix)."""
    verifier = cosigner_key(vkey)
    if url is not None:
        try:
            _connection(url, 1.0)
        except WitnessUnreachable as exc:
            raise BadWitness(str(exc)) from None
    vkey = verifier.vkey  # recorded in one form, whichever was given
    body = {"name": verifier.name, "vkey": vkey, "url": url, "who": who, "reason": reason}
    return NewEvent("witness_added", "archive", {"vkey": vkey}, body)


def witness_removed(vkey: str, reason: str, who: dict[str, Any]) -> NewEvent:
    """The event that removes one; the caller has had the explicit acceptance (``--yes``)."""
    vkey = cosigner_key(vkey).vkey
    at = now_text()
    body = {"vkey": vkey, "who": who, "reason": reason, "accepted": True}
    return NewEvent("witness_removed", "archive", {"vkey": vkey, "at": at}, body)


def witness_refused(vkey: str, peer: str, reason: str, evidence: str) -> NewEvent:
    """A peer witness refused this archive's checkpoint; ``evidence`` is the note it last
    cosigned, which ``verify --witnesses`` checks against the tree (FORMAT.md 18)."""
    vkey = cosigner_key(vkey).vkey
    at = now_text()
    body = {"vkey": vkey, "peer": peer, "reason": reason, "checkpoint": evidence, "at": at}
    # one event per piece of evidence: a peer that keeps refusing adds nothing new
    key = {"vkey": vkey, "checkpoint": hashlib.sha256(evidence.encode()).hexdigest()}
    return NewEvent("witness_refused", "archive", key, body)


def refused_checkpoint(conn: sqlite3.Connection, vkey: str) -> str | None:
    """The evidence of the newest ``witness_refused`` of the witness ``vkey``, if any."""
    for (payload,) in conn.execute(
        "SELECT payload FROM events WHERE type = 'witness_refused' ORDER BY seq DESC"
    ):
        digest = payload.hex() if isinstance(payload, bytes) else str(payload)
        raw = payload_body(conn, digest)
        if raw is None:
            continue
        body = json.loads(raw)
        if body.get("vkey") == vkey and isinstance(body.get("checkpoint"), str):
            return str(body["checkpoint"])
    return None


def witness_set(conn: sqlite3.Connection) -> list[WitnessEndpoint]:
    """The remote witnesses the log names now: every addition not removed later, in order."""
    return [WitnessEndpoint(body["url"], vkey) for vkey, body in _witnesses(conn).items()]


def peer_witness_keys(conn: sqlite3.Connection, peer: str) -> set[str]:
    """The cosigner keys the log names now for the hivemind peer ``peer`` (each added on the
    peer's first verified cosignature with it): the keys its word is checked against."""
    return {
        vkey
        for vkey, body in _witnesses(conn).items()
        if body["url"] is None
        and isinstance(body.get("who"), dict)
        and body["who"].get("peer") == peer
    }


def _witnesses(conn: sqlite3.Connection) -> dict[str, dict[str, Any]]:
    """The ``witness_added`` body of every witness the log names now, by key, in order."""
    found: dict[str, dict[str, Any]] = {}
    rows = conn.execute(
        "SELECT type, payload FROM events WHERE type IN ('witness_added', 'witness_removed') "
        "ORDER BY seq"
    ).fetchall()
    for type_, payload in rows:
        digest = payload.hex() if isinstance(payload, bytes) else str(payload)
        raw = payload_body(conn, digest)
        if raw is None:
            continue  # an erased body names no witness
        body = json.loads(raw)
        if type_ == "witness_added":
            found[body["vkey"]] = body
        else:
            found.pop(body["vkey"], None)
    return found


def cosigned_sizes(
    conn: sqlite3.Connection, endpoints: Sequence[WitnessEndpoint]
) -> dict[str, Any]:
    """By vkey: (largest size cosigned, its cosignature timestamp) from ``cosignatures``."""
    sizes: dict[str, Any] = {}
    for endpoint in endpoints:
        verifier = endpoint.verifier
        row = conn.execute(
            "SELECT size, timestamp FROM cosignatures WHERE name = ? AND key_id = ? "
            "ORDER BY size DESC LIMIT 1",
            (verifier.name, verifier.key_id.to_bytes(4, "big")),
        ).fetchone()
        sizes[endpoint.vkey] = (int(row[0]), int(row[1])) if row else None
    return sizes


def lag_from_log(conn: sqlite3.Connection, head_seq: int) -> list[dict[str, Any]]:
    """Per witness of the set: the size it cosigned (stored cosignatures) and how far behind."""
    endpoints = witness_set(conn)
    sizes = cosigned_sizes(conn, endpoints)
    rows = []
    for endpoint in endpoints:
        cosigned = sizes[endpoint.vkey]
        rows.append(
            {
                "url": endpoint.url,  # None: a peer witness
                "name": endpoint.verifier.name,
                "vkey": endpoint.vkey,
                "cosigned_size": cosigned[0] if cosigned else None,
                "cosigned_timestamp": cosigned[1] if cosigned else None,
                "head": head_seq,
                "behind": head_seq - (cosigned[0] if cosigned else 0),
            }
        )
    return rows


def _latest_of(endpoint: WitnessEndpoint, origin: str, timeout: float) -> bytes | None:
    """The checkpoint the witness last cosigned for ``origin`` (its monitoring endpoint)."""
    assert endpoint.url is not None
    connection, prefix = _connection(endpoint.url, timeout)
    hashed = hashlib.sha256(origin.encode("utf-8")).hexdigest()
    try:
        connection.request("GET", f"{prefix}/{hashed}/checkpoint")
        response = connection.getresponse()
        answer = response.read(MAX_ANSWER_BYTES + 1)
    except (OSError, http.client.HTTPException) as exc:
        raise WitnessUnreachable(f"{endpoint.url}: {exc or type(exc).__name__}") from None
    finally:
        connection.close()
    if response.status == 404:
        return None
    if response.status != 200 or len(answer) > MAX_ANSWER_BYTES:
        raise WitnessUnreachable(f"{endpoint.url}: HTTP {response.status}")
    return answer


def check_remote(
    store: EventStore, timeout: float = 5.0, vkey: str | None = None
) -> list[dict[str, Any]]:
    """Ask each witness of the set what it last cosigned and check that against the tree.

    ``consistent`` is False when the witness cosigned a checkpoint this archive's tree does
    not contain (the archive was rolled back below it or rewritten after it). ``vkey`` is the
    log key pinned outside the archive (the local witness's); default: the signing key's.
    """
    head = store.head()
    log_key = Verifier.from_vkey(vkey or store.vkey)
    rows = lag_from_log(store.conn, head.seq)
    for row, endpoint in zip(rows, witness_set(store.conn), strict=True):
        row.update(witness_size=None, consistent=None, error=None)
        if endpoint.url is None:  # a peer witness: what it said is in the log
            evidence = refused_checkpoint(store.conn, endpoint.vkey)
            if evidence is None:
                row["witness_size"] = row["cosigned_size"]
                row["consistent"] = True if row["cosigned_size"] is not None else None
                if row["cosigned_size"] is None:
                    row["error"] = "the peer has cosigned no checkpoint of this archive yet"
                continue
            note: bytes | None = evidence.encode("utf-8")
        else:
            try:
                note = _latest_of(endpoint, store.origin, timeout)
            except WitnessUnreachable as exc:
                row["error"] = f"unreachable: {exc}"
                continue
        if note is None:
            row["error"] = "the witness has cosigned no checkpoint of this archive"
            continue
        try:
            checkpoint, _, cosigned = open_checkpoint(note, log_key, [endpoint.verifier])
            if not cosigned:
                raise NoteError("no cosignature of this witness on it")
        except NoteError as exc:
            row["error"] = f"its checkpoint does not verify: {exc}"
            row["consistent"] = False
            continue
        row["witness_size"] = checkpoint.size
        row["consistent"] = tree_contains(store, checkpoint)
        if not row["consistent"]:
            row["error"] = (
                f"the witness cosigned size {checkpoint.size} with a root this archive "
                "does not have: the archive was rolled back or rewritten after it"
            )
        row["behind"] = head.seq - checkpoint.size
    return rows


def tree_contains(store: EventStore, checkpoint: Checkpoint) -> bool:
    """Whether this archive's tree holds ``checkpoint`` (its size, with that root)."""
    head = store.head()
    if checkpoint.size > head.seq:
        return False
    try:
        reader = merkle.TileReader(store.read_tile, checkpoint.size)
        return merkle.root(checkpoint.size, reader) == checkpoint.root
    except merkle.ProofError:
        return False


def latest_checkpoint(folder: Path) -> tuple[bytes, ProofSource] | None:
    """The newest signed checkpoint note of the archive in ``folder`` and a source of
    consistency proofs to it, each read on a read-only connection of its own."""
    from ..storage.store import EventStore

    reader = EventStore.open(folder, create=False, readonly=True)
    try:
        note = reader.checkpoint_note()
    finally:
        reader.close()
    if note is None:
        return None

    def proofs(old: int, new: int) -> list[bytes]:
        conn = connect(folder / DB_NAME, readonly=True)
        try:

            def read_tile(level: int, index: int) -> bytes | None:
                row = conn.execute(
                    "SELECT hashes FROM tiles WHERE level = ? AND idx = ?", (level, index)
                ).fetchone()
                return bytes(row[0]) if row else None

            return merkle.consistency_proof(old, new, merkle.TileReader(read_tile, new))
        finally:
            conn.close()

    return note, proofs


def store_cosignature(folder: Path, size: int, sig: Signature) -> None:
    """Keep a verified cosignature of the checkpoint at ``size`` (a short write of its own)."""
    conn = connect(folder / DB_NAME)
    try:
        conn.execute(
            "INSERT OR IGNORE INTO cosignatures (size, name, key_id, timestamp, signature) "
            "VALUES (?, ?, ?, ?, ?)",
            (size, sig.name, sig.key_id.to_bytes(4, "big"), sig.timestamp, sig.data[8:]),
        )
    finally:
        conn.close()


def start_submitter(store: EventStore, thread_factory: ThreadFactory) -> WitnessSubmitter | None:
    """Submit each new checkpoint to every witness of the set, from background threads.

    Each thread reads the latest note and proofs on a read-only connection of its own and
    stores each verified cosignature with a short write of its own: never the writer's
    connection, never a turn's or a checkpoint's time (DESIGN invariant 12). Peer witnesses
    (no URL) are asked over their own channel (:mod:`.peer`), not here.
    """
    endpoints = [e for e in witness_set(store.conn) if e.url is not None]
    if not endpoints:
        return None
    folder = store.path.parent
    known = {
        vkey: size
        for vkey, found in cosigned_sizes(store.conn, endpoints).items()
        if found
        for size in (found[0],)
    }

    def on_cosigned(endpoint: WitnessEndpoint, checkpoint: Checkpoint, sig: Signature) -> None:
        store_cosignature(folder, checkpoint.size, sig)

    submitter = WitnessSubmitter(
        endpoints,
        lambda: latest_checkpoint(folder),
        on_cosigned,
        known_sizes=known,
        thread_factory=thread_factory,
    )
    submitter.start()
    submitter.notify()
    return submitter
