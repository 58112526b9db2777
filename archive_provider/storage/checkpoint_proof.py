"""The local witness's cosigned checkpoint, the open-time proof that costs what is new, and
the background walk over older history (docs/FORMAT.md 16.1 and 20.4).

* :func:`advance` moves the local witness from the checkpoint it cosigned to the newest one
  only after checking the log's signature with the key pinned in the witness record and a
  consistency proof read from the tiles; then it cosigns (``cosignature/v1``, the witness's
  own key in its folder), stores the cosignature in ``cosignatures`` and writes the record.
* :func:`open_proof_from_checkpoint` is the open-time proof: the newest checkpoint's
  signature and its consistency with the witnessed one (O(log n) tile reads), then only the
  events after it. Without a cosigned checkpoint yet, :func:`witness.open_proof` (the clean
  close's fingerprint, or the whole log verified once) stands in.
* :class:`BackgroundWalk` checks the history before that checkpoint in bounded slices,
  off the host's and the writer's threads, and reports damage the moment it finds it.

Where the walk's progress lives, and why an attacker cannot use it to skip work: in the
witness record (``walked``: size, root, chain value, complete), outside the archive folder,
so whoever can write the folder cannot mark history as walked. A walk resumes from
``walked`` only when it was interrupted (not complete) and the tiles still give the same
root at that size; a complete walk is started again from the first event at the next open
that is not a byte-identical clean-close reopen. What a resumed walk does not re-read (rows
at or below ``walked`` edited between the interruption and the resume, without touching the
tiles) is what any single pass leaves to the serve-time proof of each excerpt (20.5) and to
the next full walk.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blake3 import blake3

from ..domain.clock import utc_now
from ..format import merkle
from ..format.digests_v2 import genesis
from ..format.signed_note import (
    ALG_COSIGNATURE_V1,
    Checkpoint,
    NoteError,
    Signer,
    Verifier,
    checked_checkpoint,
    open_checkpoint,
)
from ..format.verifier import envelope_bytes_v2, verify_range_v2
from .safe_files import UnsafeFile, read_small
from .witness import Proof, Witness, WitnessMismatch

if TYPE_CHECKING:
    from .store import EventStore

log = logging.getLogger(__name__)

COSIGNER_KEY = "witness.key"
COSIGNER_NAME = "local.hermes-archive.invalid/witness"
#: the background walk reads this many events per slice, then pauses (bounded I/O)
WALK_SLICE = 2000
WALK_PAUSE_S = 0.02
#: progress is written to the witness record at most this often (slices)
WALK_SAVE_EVERY = 25

FIX = (
    "If you restored this archive from a backup on purpose, run "
    '`hermes-archive witness accept --reason "restored from backup ..."`; otherwise the '
    "archive was rolled back or rewritten: keep this copy aside and restore the newest backup "
    "(docs/RECOVER.md, 'Witness mismatch')."
)


def cosigner(directory: Path) -> Signer:
    """The local witness's own cosigner key (type 0x04) in its folder; made on first use,
    in the type 0x01 form Go's note signers read (a file of type 0x04 is read too).

    OSError when it cannot be used: the archive goes on, the witness lags (and says why).
    """
    path = directory / COSIGNER_KEY
    for _ in range(2):
        try:
            signer = Signer.from_private_key(read_small(path, 4096).decode("ascii"))
        except FileNotFoundError:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            signer = Signer.generate(COSIGNER_NAME)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue  # another process made it first: read theirs
            with os.fdopen(fd, "w") as handle:
                handle.write(signer.private_key + "\n")
                handle.flush()
                try:
                    os.fsync(handle.fileno())
                except OSError as exc:  # written whole: what it keys stays readable
                    log.warning(
                        "archive: the local witness key %s is written but not synced (%s): a crash "
                        "before the disk syncs it sets aside the spill records it keyed "
                        "(RECOVER.md, 'Damaged spill')",
                        path,
                        exc,
                    )
            return signer.as_cosigner()
        except (UnsafeFile, UnicodeDecodeError, NoteError) as exc:
            raise OSError(f"the local witness key {path} cannot be used: {exc}") from None
        return signer if signer.alg == ALG_COSIGNATURE_V1 else signer.as_cosigner()
    raise OSError(f"the local witness key {path} cannot be read")


#: the BLAKE3 derive_key context of the spill key (FORMAT.md, "Spill file")
SPILL_KEY_CONTEXT = "hermes-archive 2026-12-04 spill record authentication v2"


def spill_key(witness: Witness | None) -> bytes | None:
    """The key spill records are authenticated with: derived from the local witness's own
    key, in its folder outside the profile, and the archive's real path (profiles sharing a
    witness folder do not share it), so whoever can write ``archive/spill/`` cannot write a
    record the writer takes in. None without a usable witness folder (records are
    then checked unkeyed, and a witnessed writer sets them aside as unauthenticated)."""
    if witness is None or witness.folder_problem():
        return None
    try:
        signer = cosigner(witness.directory)
    except OSError as exc:
        log.warning("archive: spill records cannot be authenticated: %s", exc)
        return None
    material = signer.private_key.encode("ascii") + b"\x00" + os.fsencode(witness.archive)
    return blake3(material, derive_key_context=SPILL_KEY_CONTEXT).digest()


def check_consistent(store: EventStore, old: Checkpoint, new: Checkpoint) -> None:
    """Raise WitnessMismatch unless the tiles prove ``new`` extends ``old`` (RFC 9162)."""
    if new.size < old.size:
        raise WitnessMismatch(
            f"witness mismatch: the newest signed checkpoint of the archive is size {new.size}, "
            f"but the witness cosigned size {old.size} (rolled back by {old.size - new.size} "
            f"events). {FIX}"
        )
    try:
        reader = merkle.TileReader(store.read_tile, new.size)
        if merkle.root(new.size, reader) != new.root:
            raise merkle.ProofError(f"the tiles do not give the signed root at size {new.size}")
        if old.size == 0:
            return
        proof = merkle.consistency_proof(old.size, new.size, reader) if new.size > old.size else []
        merkle.verify_consistency(old.size, new.size, old.root, new.root, proof)
    except merkle.ProofError as exc:
        raise WitnessMismatch(
            f"witness mismatch: the archive's checkpoint of size {new.size} is not consistent "
            f"with the checkpoint of size {old.size} the witness cosigned ({exc}): the history "
            f"was rewritten. {FIX}"
        ) from None


def _witnessed(record: Any) -> tuple[Verifier, Checkpoint]:
    """The pinned log key and the checkpoint of a v2 witness record."""
    try:
        return checked_checkpoint(record.log_vkey, record.checkpoint)
    except NoteError as exc:
        raise WitnessMismatch(
            f"the witness record's checkpoint is unreadable ({exc}); treat the archive as "
            f"suspect. {FIX}"
        ) from None


def pinned(witness: Witness) -> tuple[str, Checkpoint] | None:
    """The log key and the checkpoint the local witness pinned and cosigned (outside the
    profile), or None before it cosigned one: what served excerpts are proven from
    (FORMAT.md 20.5). Read it before the log: the witness advances only after a commit, so
    the log read next holds that tree. Raises WitnessMismatch when it cannot be read."""
    record = witness.read()
    if record is not None:
        record = witness.read_for(record.store_id) or record
    if record is None or record.checkpoint is None or record.log_vkey is None:
        return None
    return record.log_vkey, _witnessed(record)[1]


def _newest(store: EventStore, log_key: Verifier) -> Checkpoint | None:
    note = store.checkpoint_note()
    if note is None:
        return None
    try:
        return open_checkpoint(note, log_key)[0]
    except NoteError as exc:
        raise WitnessMismatch(
            f"witness mismatch: the archive's newest checkpoint is not signed by the log key the "
            f"witness pinned ({exc}): the signing key or the checkpoints were replaced. {FIX}"
        ) from None


def advance(
    witness: Witness, store: EventStore, *, fingerprint: dict[str, Any] | None = None
) -> bool:
    """Cosign the newest checkpoint and move the witness record to it (FORMAT.md 16.1).

    Call only after the FULL commit of what the checkpoint covers. Raises WitnessMismatch
    when the newest checkpoint is not signed by the pinned key or not consistent with the
    cosigned one (nothing is cosigned then); False when the record could not be written.
    """
    head = store.head()
    record = witness.read_for(store.store_id)
    log_vkey = record.log_vkey if record is not None and record.log_vkey else store.vkey
    log_key = Verifier.from_vkey(log_vkey)
    newest = _newest(store, log_key)
    if newest is None:
        return witness.write(store.store_id, head.seq, head.chain, fingerprint=fingerprint)
    if record is not None and record.checkpoint is not None:
        check_consistent(store, _witnessed(record)[1], newest)
    try:
        return _cosign(witness, store, newest, log_vkey, fingerprint)
    except (OSError, sqlite3.Error, NoteError) as exc:  # weaker until the next commit, never down
        witness.last_error = f"the local witness could not cosign size {newest.size}: {exc}"
        log.warning("archive: %s", witness.last_error)
        return False


def _cosign(
    witness: Witness,
    store: EventStore,
    newest: Checkpoint,
    log_vkey: str,
    fingerprint: dict[str, Any] | None,
) -> bool:
    """Cosign ``newest`` (proven consistent), store the cosignature, write the record."""
    head = store.head()
    signer = cosigner(witness.directory)
    cosignature = signer.cosign(newest.text, max(1, int(utc_now().timestamp())))
    with store.transaction():
        store.conn.execute(
            "INSERT OR IGNORE INTO cosignatures (size, name, key_id, timestamp, signature) "
            "VALUES (?, ?, ?, ?, ?)",
            (
                newest.size,
                cosignature.name,
                cosignature.key_id.to_bytes(4, "big"),
                cosignature.timestamp,
                cosignature.data[8:],
            ),
        )
    note = store.checkpoint_note(newest.size)
    assert note is not None
    return witness.write(
        store.store_id,
        head.seq,
        head.chain,
        fingerprint=fingerprint,
        log_vkey=log_vkey,
        checkpoint=note.decode("utf-8"),
    )


def compact_range(size: int, reader: merkle.TileReader) -> merkle.CompactRange:
    """The compact range of the tree at ``size`` (one node per set bit, largest first),
    read from tiles that may since have grown (``read_edge`` wants them exactly that wide)."""
    hashes, start = [], 0
    for level in range(size.bit_length() - 1, -1, -1):
        if size >> level & 1:
            hashes.append(reader(level, start >> level))
            start += 1 << level
    return merkle.CompactRange(size, hashes)


def _leaf_at(conn: sqlite3.Connection, seq: int) -> tuple[bytes, bytes] | None:
    """The leaf hash of the envelope stored at ``seq`` and its chain value."""
    row = conn.execute(
        "SELECT seq, time, type, session, key, identity, payload, parts, author, chain "
        "FROM events WHERE seq = ?",
        (seq,),
    ).fetchone()
    if row is None:
        return None
    try:
        data = envelope_bytes_v2(*row[:9])
    except (TypeError, ValueError, AttributeError):
        return None
    return merkle.leaf_hash(data), bytes(row[9])


def open_proof_from_checkpoint(store: EventStore, witness: Witness) -> Proof | None:
    """The open-time proof of FORMAT.md 20.4; None when the witness holds no checkpoint yet
    (the caller then verifies the whole log once)."""
    started = time.monotonic()

    def failed(problem: str, seq: int | None = None, *, by_witness: bool = False) -> Proof:
        return Proof(False, "checkpoint", problem, seq, time.monotonic() - started, by_witness)

    try:
        record = witness.read_for(store.store_id)
        if record is None or record.checkpoint is None or record.log_vkey is None:
            return None
        witness.check(store.conn, store.store_id)
        log_key, witnessed = _witnessed(record)
        newest = _newest(store, log_key)
        if newest is None:
            raise WitnessMismatch(
                f"witness mismatch: the archive has no signed checkpoint, but the witness "
                f"cosigned size {witnessed.size}. {FIX}"
            )
        check_consistent(store, witnessed, newest)
    except WitnessMismatch as exc:
        return failed(str(exc), by_witness=True)
    head, size = store.head(), newest.size
    if head.seq < size:
        return failed(f"the head {head.seq} is behind the signed checkpoint {size}", head.seq + 1)
    if size:
        reader = merkle.TileReader(store.read_tile, size)
        found = _leaf_at(store.conn, size)
        if found is None or found[0] != reader(0, size - 1):
            return failed(
                f"seq {size}: the envelope is not the leaf the signed checkpoint covers", size
            )
        chain = found[1]
    else:
        chain = genesis(store.store_id)
    report, leaves, last_chain = verify_range_v2(store.conn, size, chain, head.seq)
    if not report.ok:
        return Proof(
            False, "checkpoint", report.problem, report.first_bad_seq, time.monotonic() - started
        )
    if len(leaves) != head.seq - size or last_chain.hex() != head.chain:
        return failed(
            f"the events after seq {size} do not reach the recorded head {head.seq}", size + 1
        )
    try:
        tree = compact_range(size, merkle.TileReader(store.read_tile, size))
    except merkle.ProofError as exc:
        return failed(f"the tiles cannot be read at size {size}: {exc}", size or None)
    for leaf in leaves:
        tree.append(leaf)
    if head.root is None or tree.root().hex() != head.root:
        return failed("the events after the signed checkpoint are not the tree's leaves", size + 1)
    return Proof(True, "checkpoint", None, None, time.monotonic() - started)


@dataclass
class WalkState:
    """What ``status`` shows of the background walk."""

    target: int
    done: int = 0
    complete: bool = False
    problem: str | None = None
    first_bad_seq: int | None = None
    started: float = 0.0
    seconds: float = 0.0


class BackgroundWalk:
    """Checks the history before the open-time proof's checkpoint, slice by slice.

    ``connect()`` gives a read-only connection of its own; ``on_damage(problem)`` is called
    (once) the moment a slice fails, so service is withdrawn at once.
    """

    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        witness: Witness,
        store_id: str,
        target: Checkpoint,
        on_damage: Callable[[str], None],
        thread_factory: Callable[..., threading.Thread],
    ) -> None:
        self._connect, self._witness, self._store_id = connect, witness, store_id
        self._target, self._on_damage = target, on_damage
        self._stop = threading.Event()
        self.state = WalkState(target.size)
        self._thread = thread_factory(self._run, name="archive-walk")

    def start(self) -> None:
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the walk to end (complete, damaged or stopped); True when it ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        self.state.started = time.monotonic()
        try:
            conn = self._connect()
        except Exception as exc:  # walk again at the next open
            log.warning("archive: the background walk could not start: %s", exc)
            return
        try:
            self._walk(conn)
        except Exception as exc:
            log.exception("archive: the background walk failed")
            self._damage(f"the background walk could not read the archive: {exc}", None)
        finally:
            self.state.seconds = time.monotonic() - self.state.started
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def _read_tile(self, conn: sqlite3.Connection) -> Callable[[int, int], bytes | None]:
        def read(level: int, index: int) -> bytes | None:
            row = conn.execute(
                "SELECT hashes FROM tiles WHERE level = ? AND idx = ?", (level, index)
            ).fetchone()
            return bytes(row[0]) if row else None

        return read

    def _start(self, conn: sqlite3.Connection) -> tuple[int, bytes, merkle.CompactRange]:
        """Where to begin: an interrupted walk's progress if the tiles still agree, else 0."""
        try:
            record = self._witness.read_for(self._store_id)
        except WitnessMismatch:
            record = None
        walked = record.walked if record is not None else None
        read_tile = self._read_tile(conn)
        if isinstance(walked, dict) and not walked.get("complete"):
            try:
                size = int(walked["size"])
                root, chain = bytes.fromhex(walked["root"]), bytes.fromhex(walked["chain"])
                if 0 < size <= self._target.size:
                    reader = merkle.TileReader(read_tile, size)
                    if merkle.root(size, reader) == root:
                        return size, chain, compact_range(size, reader)
            except (KeyError, TypeError, ValueError):
                pass  # unusable progress: walk from the start
        return 0, genesis(self._store_id), merkle.CompactRange()

    def _walk(self, conn: sqlite3.Connection) -> None:
        at, chain, tree = self._start(conn)
        target = self._target.size
        self.state.done = at
        read_tile = self._read_tile(conn)
        slices = 0
        while at < target and not self._stop.is_set():
            until = min(target, at + WALK_SLICE)
            report, leaves, chain = verify_range_v2(conn, at, chain, until)
            if not report.ok:
                self._damage(report.problem or "damaged", report.first_bad_seq)
                return
            if len(leaves) != until - at:
                self._damage(f"events are missing between seq {at} and {until}", at + 1)
                return
            for leaf in leaves:
                tree.append(leaf)
            try:
                tiles_root = merkle.root(until, merkle.TileReader(read_tile, until))
            except merkle.ProofError as exc:
                self._damage(f"the tiles cannot be read at size {until}: {exc}", at + 1)
                return
            if tree.root() != tiles_root:
                self._damage(
                    f"the envelopes of seq {at + 1} to {until} are not the tree's leaves "
                    "(a row was edited)",
                    at + 1,
                )
                return
            at = self.state.done = until
            slices += 1
            if slices % WALK_SAVE_EVERY == 0:
                self._save(at, tree.root(), chain, complete=False)
            self._stop.wait(WALK_PAUSE_S)
        if at >= target:
            if tree.root() != self._target.root and target:
                self._damage("the walked history is not the signed checkpoint's", None)
                return
            self.state.complete = True
            self._save(at, tree.root(), chain, complete=True)
        else:
            self._save(at, tree.root(), chain, complete=False)

    def _save(self, size: int, root: bytes, chain: bytes, *, complete: bool) -> None:
        record = self._witness.read_for(self._store_id)
        if record is None:
            return
        walked = {"size": size, "root": root.hex(), "chain": chain.hex(), "complete": complete}
        self._witness.write(self._store_id, record.seq, record.chain, walked=walked)

    def _damage(self, problem: str, seq: int | None) -> None:
        self.state.problem, self.state.first_bad_seq = problem, seq
        self._on_damage(
            f"the background walk found damage in older history"
            f"{f' at seq {seq}' if seq else ''}: {problem}"
        )
