"""The witness: the chain head kept outside the database folder, and the open-time proof.

Every check ``verify`` makes is computed from the database alone, so it cannot see a
*whole-store rollback*: an older copy of the entire archive folder put back verifies
perfectly. The witness catches that. It is a small JSON file outside the database folder
(env ``ARCHIVE_WITNESS_DIR``, default ``<HERMES_HOME>.archive-witness/``)
holding the store id and the last head (sequence number and chain value) this machine saw
committed. On open the archive must still contain that head: same store, at least that many
events, and the same chain value at that sequence number.

When it is written (docs/DESIGN.md, invariant 6): only after a ``synchronous=FULL`` commit (a
checkpoint) and on close (after a WAL checkpoint, which syncs the log and the database), so
the witness can lag the database but never lead it, even across a power loss. ``sync_turn``
never touches it.

The open-time proof (:func:`open_proof`), run by the writer before anything is appended:

* **fast path**: a clean close records a fingerprint of the database file (size and
  BLAKE3 of every byte, taken with the write-ahead log empty). If the file is still exactly
  those bytes and no write-ahead log exists, the log is the one verified and written before,
  so nothing needs re-reading: the cost is one pass of BLAKE3 over the file (about 0.5 s
  for a 1.6 GB, one-million-event archive).
* **slow path** (after a crash, a write by another process, or any change at all): the
  whole log is verified (every identity, payload, part and chain value; about 34 s at one
  million events on the reference machine), then the witness head is compared.

A deliberate restore from backup looks exactly like a rollback; ``hermes-archive witness
accept --reason ...`` re-anchors the witness and records a ``witness_accepted`` event.

Finding the witness (issue 22 point 1). Its location comes from outside the profile only
(``ARCHIVE_WITNESS_DIR`` or the default), never from ``archive/config.json``. Each record
is kept twice: under a name derived from the archive's real path and under one derived
from the store's id, so an archive reached through a symlink or moved elsewhere still finds
its witness. The first time a store is witnessed the writer appends a ``witness_accepted``
event (reason ``first witness``) to the chained log; a store whose log holds such an event
but for which no witness record is found is refused (the witness was deleted or moved),
never treated as new. docs/AUDIT.md says what this does and does not catch.
"""

from __future__ import annotations

import errno
import getpass
import hashlib
import json
import logging
import os
import socket
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from blake3 import blake3

from ..domain.clock import now_text
from ..errors import ArchiveDamaged
from ..format.events import NewEvent
from ..format.verifier import verify_database
from .outside import WITNESS_ENV, InsideProfile, outside_value
from .safe_files import UnsafeFile, folder_problem, read_small, write_private_file
from .store import V1_DB_NAME

log = logging.getLogger(__name__)

WITNESS_SUFFIX = ".archive-witness"
WITNESS_FORMAT = 1
#: a record that also pins the log key and holds the last cosigned checkpoint (FORMAT.md 16.1)
WITNESS_FORMAT_V2 = 2


class WitnessMismatch(ArchiveDamaged):
    """The archive does not contain the head the witness recorded (rollback or replacement)."""


def migrated_from(conn: sqlite3.Connection) -> str | None:
    """The v1 store a migrated archive was made from (none for any other archive)."""
    found = conn.execute("SELECT value FROM meta WHERE name = 'migrated_from'").fetchone()
    return str(found[0]) if found else None


def half_migrated(archive: Path, store_id: str, seen: WitnessRecord) -> str:
    """The refusal of a v2 archive whose ``migrate`` stopped before the witness moved to it:
    the witness still names the v1 store, kept whole beside it; and the way to finish."""
    return (
        f"witness mismatch: the archive at {archive} is store {store_id}, made by "
        f"`hermes-archive migrate` from store {seen.store_id}, which the witness last saw at "
        f"seq {seen.seq}: the migration stopped before it finished (the v1 archive is kept "
        f"whole as {archive / V1_DB_NAME}). Check that the new archive holds every v1 event, "
        f"`hermes-archive verify --lineage {archive / V1_DB_NAME}`, then finish it: "
        '`hermes-archive witness accept --reason "migration finished"`; if the check fails, '
        "put the v1 archive back and migrate again (docs/RECOVER.md, 'A migration stopped "
        "half-way')."
    )


def default_witness_dir(hermes_home: str | os.PathLike[str]) -> Path:
    """``<HERMES_HOME>.archive-witness``: beside the profile, outside its backups."""
    home = Path(hermes_home).expanduser().absolute()
    return home.parent / (home.name + WITNESS_SUFFIX)


def witness_dir_for(hermes_home: str | os.PathLike[str]) -> Path:
    """Where the witness of ``hermes_home`` lives: ``ARCHIVE_WITNESS_DIR``, else the default.

    Never a setting read from inside the profile: that folder is what the witness protects
    (:class:`InsideProfile` when the profile's ``.env`` sets the variable or it points inside).
    """
    chosen = outside_value(WITNESS_ENV, hermes_home)
    return Path(chosen).expanduser() if chosen else default_witness_dir(hermes_home)


FIRST_WITNESS_REASON = "first witness of this archive"


def first_witnessed_seq(conn: sqlite3.Connection) -> int | None:
    """The seq of the first ``witness_accepted`` event: the log knows it has been witnessed."""
    row = conn.execute("SELECT min(seq) FROM events WHERE type = 'witness_accepted'").fetchone()
    return int(row[0]) if row and row[0] is not None else None


#: how much of the file ``fingerprint_file`` holds at once: large enough for BLAKE3's threads
FINGERPRINT_CHUNK = 8 * 1024 * 1024


def fingerprint_file(path: Path) -> dict[str, Any]:
    """Size and BLAKE3 of every byte of ``path``, read in chunks (multi-threaded hashing,
    memory bounded: a mapped file would count its whole size in the process's RSS)."""
    hasher = blake3(max_threads=blake3.AUTO)
    chunk = bytearray(FINGERPRINT_CHUNK)
    view = memoryview(chunk)
    size = 0
    with open(path, "rb", buffering=0) as handle:
        while read := handle.readinto(chunk):
            hasher.update(view[:read])
            size += read
    return {"size": size, "blake3": hasher.hexdigest()}


def who() -> dict[str, Any]:
    """The user, host and process that accept a witness (for the ``witness_accepted`` event)."""
    try:
        user = getpass.getuser()
    except Exception:  # no login name in some containers
        user = f"uid {os.geteuid()}"
    return {"user": user, "host": socket.gethostname(), "pid": os.getpid()}


def witness_accepted(head: Any, reason: str, previous: Any) -> NewEvent:
    """The ``witness_accepted`` event: who accepted the log's head ``head``, when and why,
    beside the witness record it replaces (``previous``; None when there was none)."""
    at = now_text()
    body = {
        "reason": reason,
        **who(),
        "at": at,
        "previous_witness": previous,
        "accepted_head": {"seq": head.seq, "chain": head.chain},
    }
    return NewEvent("witness_accepted", "", {"at": at, "seq": head.seq, "chain": head.chain}, body)


def first_witness_event(head: Any) -> NewEvent:
    """The event that records, in the chained log, that the store is witnessed from now on
    (so a missing witness later is a refusal, not a new archive)."""
    return witness_accepted(head, FIRST_WITNESS_REASON, None)


@dataclass(frozen=True)
class WitnessRecord:
    store_id: str
    seq: int
    chain: str
    time: str
    archive: str
    fingerprint: dict[str, Any] | None = None
    accepted: dict[str, Any] | None = None  # set by `witness accept`: who, why, when
    log_vkey: str | None = None  # v2: the log's verifier key, pinned at the first record
    checkpoint: str | None = None  # v2: the newest checkpoint it cosigned (note text)
    walked: dict[str, Any] | None = None  # v2: the background walk's progress (FORMAT 20.4)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.checkpoint is None:
            for name in ("log_vkey", "checkpoint", "walked"):
                del data[name]
            return {"format": WITNESS_FORMAT, **data}
        return {"format": WITNESS_FORMAT_V2, **data}


class Witness:
    """The witness file of one archive folder. Thread-safe; writes are atomic and fsynced."""

    def __init__(self, directory: Path, archive: Path, *, refusal: str | None = None) -> None:
        self.directory = Path(directory)
        #: why no witness may be used (its location came from inside the profile): every
        #: read is then a mismatch and nothing is written
        self.refusal = refusal
        self.archive = Path(os.path.realpath(archive))
        name = hashlib.blake2b(str(self.archive).encode("utf-8"), digest_size=8).hexdigest()
        self.path = self.directory / f"{name}.json"
        self._lock = threading.Lock()
        self.last_error: str | None = None

    @classmethod
    def for_home(cls, hermes_home: str | os.PathLike[str]) -> Witness:
        home = Path(hermes_home).expanduser().absolute()
        try:
            return cls(witness_dir_for(home), home / "archive")
        except InsideProfile as exc:
            return cls(default_witness_dir(home), home / "archive", refusal=str(exc))

    def id_path(self, store_id: str) -> Path:
        """The record kept under the store's identity (found wherever the archive is)."""
        name = hashlib.blake2b(store_id.encode("utf-8"), digest_size=8).hexdigest()
        return self.directory / f"store-{name}.json"

    def folder_problem(self) -> str | None:
        """Why the witness folder cannot be trusted (its location set from inside the profile,
        another owner, writable by others)."""
        if self.refusal:
            return self.refusal
        problem = folder_problem(self.directory)
        return f"the witness folder is not safe: {problem}" if problem else None

    # -- reading -------------------------------------------------------------------------

    def read(self) -> WitnessRecord | None:
        """The record under the archive's path, or None. Unreadable means mismatch."""
        return self._read(self.path)

    def read_for(self, store_id: str) -> WitnessRecord | None:
        """The newest record of ``store_id``: under its identity or under the archive's path."""
        found = [
            record
            for record in (self._read(self.id_path(store_id)), self.read())
            if record is not None and record.store_id == store_id
        ]
        return max(found, key=lambda record: record.seq, default=None)

    def _read(self, path: Path) -> WitnessRecord | None:
        problem = self.folder_problem()
        if problem:
            raise WitnessMismatch(f"{problem.rstrip('.')}. Appends are refused until it is fixed.")
        try:
            text = read_small(path).decode("utf-8")
        except FileNotFoundError:
            return None
        except (UnsafeFile, UnicodeDecodeError) as exc:
            raise WitnessMismatch(
                f"the witness file {path} is unreadable ({exc}); if you did not change it, "
                "treat the archive as suspect. After checking the archive, run "
                '`hermes-archive witness accept --reason "..."` to write a new witness.'
            ) from None
        try:
            data = json.loads(text)
            if data.get("format") not in (WITNESS_FORMAT, WITNESS_FORMAT_V2):
                raise ValueError(f"witness format {data.get('format')!r}")
            v2 = data["format"] == WITNESS_FORMAT_V2
            return WitnessRecord(
                store_id=str(data["store_id"]),
                seq=int(data["seq"]),
                chain=str(data["chain"]),
                time=str(data.get("time", "")),
                archive=str(data.get("archive", "")),
                fingerprint=data.get("fingerprint"),
                accepted=data.get("accepted"),
                log_vkey=str(data["log_vkey"]) if v2 else None,
                checkpoint=str(data["checkpoint"]) if v2 else None,
                walked=data.get("walked") if v2 else None,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise WitnessMismatch(
                f"the witness file {path} is unreadable ({exc}); if you did not change "
                "it, treat the archive as suspect. After checking the archive, run "
                '`hermes-archive witness accept --reason "..."` to write a new witness.'
            ) from None

    def state(self) -> tuple[int, int] | None:
        """(mtime_ns, size) of the witness file, to notice that it changed."""
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    # -- writing -------------------------------------------------------------------------

    def write(
        self,
        store_id: str,
        seq: int,
        chain: str,
        *,
        fingerprint: dict[str, Any] | None = None,
        accepted: dict[str, Any] | None = None,
        force: bool = False,
        log_vkey: str | None = None,
        checkpoint: str | None = None,
        walked: dict[str, Any] | None = None,
    ) -> bool:
        """Record a head the database holds durably. Never moves backwards unless ``force``.

        A v2 record (``checkpoint`` given, or kept from the current record) also pins the
        log key and holds the checkpoint it cosigned; the caller proved consistency first
        (:func:`archive_provider.storage.checkpoint_proof.advance`). Returns False (and logs,
        never raises) when the witness could not be written: the archive stays usable, only
        rollback detection is weaker until the next write.
        """
        record = WitnessRecord(
            store_id,
            int(seq),
            chain,
            now_text(),
            str(self.archive),
            fingerprint,
            accepted,
            log_vkey,
            checkpoint,
            walked,
        )
        with self._lock:
            try:
                problem = self.folder_problem()
                if problem:
                    raise OSError(errno.EPERM, problem)
                if not force:
                    try:
                        current = self.read_for(store_id)
                    except WitnessMismatch:
                        current = None
                    if current is not None and (
                        current.seq > seq
                        or (
                            current.seq == seq
                            and fingerprint is None
                            and current.fingerprint is None
                            and (checkpoint is None or checkpoint == current.checkpoint)
                            and walked is None
                        )
                    ):
                        return True  # never regress; an equal head needs no rewrite
                    if current is not None:
                        record = replace(
                            record,
                            accepted=accepted or current.accepted,
                            log_vkey=log_vkey or current.log_vkey,
                            checkpoint=checkpoint or current.checkpoint,
                            walked=walked if walked is not None else current.walked,
                        )
                text = json.dumps(record.as_dict(), indent=1, sort_keys=True) + "\n"
                self._write_atomic(self.id_path(store_id), text)
                self._write_atomic(self.path, text)
                self.last_error = None
                return True
            except OSError as exc:
                message = (
                    f"the witness {self.path} could not be written ({exc}); rollback "
                    f"detection is weaker until it can be. Make {self.directory} writable."
                )
                if message != self.last_error:
                    log.warning("archive: %s", message)
                self.last_error = message
                return False

    def _write_atomic(self, path: Path, text: str) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_private_file(path, text.encode("utf-8"))

    # -- comparing -----------------------------------------------------------------------

    def check(self, conn: sqlite3.Connection, store_id: str) -> WitnessRecord | None:
        """Raise :class:`WitnessMismatch` unless the archive still holds the witnessed head.

        Both records are compared (the one under the archive's path, the one under the
        store's id); with neither, a log that has been witnessed before is refused.
        """
        fix = (
            "If you restored this archive from a backup on purpose, run "
            '`hermes-archive witness accept --reason "restored from backup ..."`; '
            "otherwise the archive was rolled back or replaced: keep this copy aside for "
            "investigation and restore the newest backup."
        )
        at_path = self.read()
        if at_path is not None and at_path.store_id != store_id:
            if migrated_from(conn) == at_path.store_id:
                raise WitnessMismatch(half_migrated(self.archive, store_id, at_path))
            raise WitnessMismatch(
                f"witness mismatch: the archive at {self.archive} is store {store_id}, but the "
                f"witness {self.path} last saw store {at_path.store_id} at seq {at_path.seq} "
                f"there (the archive was replaced). {fix}"
            )
        record = self.read_for(store_id)
        pinned = record or at_path
        if pinned is not None and pinned.log_vkey is not None:
            found = conn.execute("SELECT value FROM meta WHERE name = 'format_version'").fetchone()
            if found is None or str(found[0]) != "2":
                raise WitnessMismatch(
                    f"witness mismatch: the witness {self.directory} pinned a format-2 log with "
                    f"its key, but the archive at {self.archive} is format "
                    f"{found[0] if found else 'unknown'}: a format the witness did not pin is "
                    f"refused (the archive was replaced). {fix}"
                )
        if record is None:
            first = first_witnessed_seq(conn)
            if first is not None:
                raise WitnessMismatch(
                    f"witness missing: the archive at {self.archive} (store {store_id}) was "
                    f"witnessed (its log records that at seq {first}), but no witness of it is "
                    f"in {self.directory}: the witness was deleted, or its location changed "
                    f"(ARCHIVE_WITNESS_DIR). {fix}"
                )
            return None
        row = conn.execute("SELECT chain FROM events WHERE seq = ?", (record.seq,)).fetchone()
        head = conn.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0]
        if record.seq > 0 and row is None:
            raise WitnessMismatch(
                f"witness mismatch: the archive ends at seq {head}, but the witness "
                f"{self.directory} saw seq {record.seq} committed at {record.time} (rolled back "
                f"by {record.seq - head} events). {fix}"
            )
        stored = None if row is None else row[0].hex() if isinstance(row[0], bytes) else row[0]
        if row is not None and stored != record.chain:  # v2 stores the chain as 32 bytes
            raise WitnessMismatch(
                f"witness mismatch: the event at seq {record.seq} is not the one the witness "
                f"{self.directory} saw at {record.time} (the history was replaced). {fix}"
            )
        return record


@dataclass
class Proof:
    """What the open-time proof found: ``ok``, the path taken, and the problem if any."""

    ok: bool
    path: str  # "fingerprint" | "verify" | "none"
    problem: str | None = None
    first_bad_seq: int | None = None
    seconds: float = 0.0
    witness: bool = False  # True when the witness (not the log itself) objected


def fast_path_ok(db_path: Path, witness: Witness | None) -> bool:
    """True when the database file is byte-identical to the fingerprint of a clean close."""
    if witness is None:
        return False
    try:
        record = witness.read()
    except WitnessMismatch:
        return False
    if record is None or not record.fingerprint:
        return False
    wal = db_path.with_name(db_path.name + "-wal")
    try:
        if wal.exists() and wal.stat().st_size > 0:
            return False
        if db_path.stat().st_size != record.fingerprint.get("size"):
            return False
        return fingerprint_file(db_path) == record.fingerprint
    except OSError:
        return False


def open_proof(
    conn: sqlite3.Connection,
    key: bytes,
    store_id: str,
    *,
    fast: bool,
    witness: Witness | None,
    progress: Callable[[int], None] | None = None,
) -> Proof:
    """The check run before the first append: fingerprint or full verify, then the witness.

    ``fast`` is the result of :func:`fast_path_ok`, computed *before* the store was opened
    (opening may write projection bookkeeping, which changes the file).
    """
    import time

    started = time.monotonic()
    path = "fingerprint" if fast else "verify"
    if not fast:
        report = verify_database(conn, key, progress=progress)
        if not report.ok:
            return Proof(
                False, path, report.problem, report.first_bad_seq, time.monotonic() - started
            )
    if witness is not None:
        try:
            witness.check(conn, store_id)
        except WitnessMismatch as exc:
            return Proof(False, path, str(exc), None, time.monotonic() - started, witness=True)
    return Proof(True, path, None, None, time.monotonic() - started)
