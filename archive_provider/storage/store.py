"""The SQLite shell around the log: one file per profile, append-only, hash-chained.

Layout under ``<HERMES_HOME>/archive/``: ``events.db`` (WAL) and ``payload.key`` (the
per-store BLAKE3 key, mode 0600). The schema is a documented interface (docs/FORMAT.md
section 6): an auditor can open it with ``sqlite3`` or ``sqlite-utils``.

One :class:`EventStore` owns one connection in autocommit mode; every append is one
explicit ``BEGIN IMMEDIATE`` transaction that reads the chain head, inserts payloads,
envelopes and projection updates, moves the head and commits, so two writers (even in two
processes) can never fork the chain and a reader never sees half a batch.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import shutil
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..domain.clock import now_text, utc_now
from ..errors import (
    ArchiveBusy,
    ArchiveDamaged,
    ArchiveError,
    ArchiveNotWritable,
    Failure,
    classify,
)
from ..format import digests_v2, merkle
from ..format.canonical import canonical_bytes
from ..format.digests import (
    KEY_BYTES,
    Envelope,
    key_text,
    parts_text,
)
from ..format.digests_v2 import FORMAT_VERSION
from ..format.events import AppendResult, LoadedEvent, NewEvent, Part, StoredEvent
from ..format.signed_note import (
    Checkpoint,
    Signature,
    Signer,
    Verifier,
    format_checkpoint,
    format_note,
)
from ..format.verifier import schema_problem
from .safe_files import (
    UnsafeFile,
    folder_problem,
    place_file,
    read_small,
    regular_file_problem,
    sync_dir,
)
from .sql import select_in
from .store_pieces import (
    CHECKPOINT_INTERVAL_S,
    COMMITTED_ROOTS_KEPT,
    MAKING_PREFIX,
    PART_REUSE_FROM,
    PART_REUSE_SCHEMA,
    QUOTING_FROM,
    QUOTING_SCHEMA,
    SCHEMA,
    SIGNING_KEY_ENV,
    SIGNING_KEY_NAME,
    STORE_KEY_NAME,
    TILE_INNER_SCHEMA,
    KeyFileError,
    PartHasher,
    TreeEdge,
    make_signer,
    quoted_by,
    read_signer,
    signing_key_path,
    split_parts,
    write_private,
)

log = logging.getLogger(__name__)

DB_NAME = "events.db"
KEY_NAME = "payload.key"
#: where ``migrate`` keeps a migrated v1 archive, beside the v2 one it made
V1_DB_NAME = "events.v1.db"
DEFAULT_BUSY_TIMEOUT_MS = 5000
#: events one transaction of the catch-up on open applies: a rebuild (a release changed a
#: projection) commits between batches, so another writer waits for one batch, not the log
CATCH_UP_BATCH = 10000

# Views that read as the story (docs/AUDIT.md section 6): derived from the log tables alone,
# so they hold no copy of any text, need no projection, and verification never reads them.
# Payload bodies are canonical JSON in UTF-8; the views show them as text.


def _audit_views(events_view: str, part: Callable[[str], str], author: str, sessions: str) -> str:
    """The audit views: ``audit_events`` and the story views read through it, a part found
    by ``part`` and a turn's author by ``author``."""
    return f"""
{events_view};
CREATE VIEW IF NOT EXISTS audit_turns AS
SELECT e.seq, e.time, e.session, json_extract(e.payload, '$.turn') AS turn,
       CAST(m.key AS INTEGER) + 1 AS position,
       json_extract(CAST(p.body AS TEXT), '$.role') AS role,
       json_extract(CAST(p.body AS TEXT), '$.name') AS name,
       coalesce(json_extract(CAST(a.body AS TEXT), '$.name'),
                json_extract(CAST(a.body AS TEXT), '$.id')) AS author,
       json_extract(CAST(a.body AS TEXT), '$.id') AS author_id,
       json_extract(CAST(a.body AS TEXT), '$.is_bot') AS author_is_bot,
       coalesce(nullif(json_extract(CAST(p.body AS TEXT), '$.content'), ''),
                json_extract(CAST(p.body AS TEXT), '$.tool_calls')) AS text,
       json_extract(CAST(p.body AS TEXT), '$.tool_call_id') AS tool_call_id,
       m.value AS message_digest, e.payload_digest, e.chain
FROM audit_events e, json_each(coalesce(json_extract(e.payload, '$.messages'), e.parts)) m
JOIN payloads p ON p.digest = {part("m.value")}
LEFT JOIN payloads a ON a.digest = {author}
WHERE e.type = 'turn';
CREATE VIEW IF NOT EXISTS audit_memory AS
SELECT e.seq, e.time, e.session, json_extract(e.payload, '$.action') AS action,
       json_extract(e.payload, '$.target') AS target,
       json_extract(CAST(c.body AS TEXT), '$') AS content,
       json_extract(e.payload, '$.metadata.old_text') AS old_text,
       json_extract(e.payload, '$.metadata.write_origin') AS origin,
       json_extract(e.payload, '$.metadata') AS metadata,
       json_extract(e.payload, '$.content') AS content_digest, e.payload_digest, e.chain
FROM audit_events e LEFT JOIN payloads c ON c.digest = {part("json_extract(e.payload, '$.content')")}
WHERE e.type = 'memory_write';
CREATE VIEW IF NOT EXISTS audit_checkpoints AS
SELECT e.seq, e.time, e.session, e.type = 'checkpoint' AS ok,
       json_extract(e.payload, '$.parent_session') AS parent_session,
       coalesce(json_array_length(e.payload, '$.evidence'),
                json_extract(e.payload, '$.evidence_count')) AS messages,
       json_extract(e.payload, '$.require_checkpoint') AS require_checkpoint,
       json_extract(e.payload, '$.host_api_version') AS host_api_version,
       json_extract(e.payload, '$.error') AS error,
       json_extract(e.payload, '$.evidence_digest') AS evidence_digest, e.payload_digest, e.chain
FROM audit_events e WHERE e.type IN ('checkpoint', 'checkpoint_failed');
CREATE VIEW IF NOT EXISTS audit_sessions AS
SELECT e.session, min(e.seq) AS first_seq, max(e.seq) AS last_seq,
       min(e.time) AS first_time, max(e.time) AS last_time, count(*) AS events,
       sum(e.type = 'turn') AS turns, sum(e.type = 'memory_write') AS memory_writes,
       sum(e.type = 'checkpoint') AS checkpoints, sum(e.type = 'recall_served') AS recalls,
       (SELECT json_extract(s.payload, '$.from') FROM audit_events s
        WHERE s.type = 'session_switched' AND s.session = e.session ORDER BY s.seq LIMIT 1)
         AS switched_from,
       (SELECT json_extract(s.payload, '$.reason') FROM audit_events s
        WHERE s.type = 'session_switched' AND s.session = e.session ORDER BY s.seq LIMIT 1)
         AS switch_reason,
       (SELECT json_extract(s.payload, '$.platform') FROM audit_events s
        WHERE s.type = 'session_started' AND s.session = e.session ORDER BY s.seq LIMIT 1)
         AS platform
FROM events e WHERE e.session != ''{sessions} GROUP BY e.session;
CREATE VIEW IF NOT EXISTS audit_recalls AS
SELECT e.seq, e.time, e.session, json_extract(e.payload, '$.turn') AS turn,
       json_extract(CAST(q.body AS TEXT), '$') AS query,
       json_extract(CAST(r.body AS TEXT), '$') AS result,
       json_extract(e.payload, '$.sources') AS sources,
       json_extract(e.payload, '$.query') AS query_digest,
       json_extract(e.payload, '$.result') AS result_digest, e.payload_digest, e.chain
FROM audit_events e
LEFT JOIN payloads q ON q.digest = {part("json_extract(e.payload, '$.query')")}
LEFT JOIN payloads r ON r.digest = {part("json_extract(e.payload, '$.result')")}
WHERE e.type = 'recall_served';
"""


def _part(hex_digest: str) -> str:
    """A part named in hex, found in its event's own ``parts`` (an indexed lookup, as
    SQLite before 3.41 has no ``unhex``)."""
    return (
        "(SELECT substr(x.parts, (nullif(instr(lower(hex(x.parts)), "
        f"{hex_digest}), 0) - 1) / 2 + 1, 32) FROM events x WHERE x.seq = e.seq)"
    )


#: The views (FORMAT.md 17): digests are 32-byte BLOBs, shown as hex;
#: a turn's author is the envelope's ``author``; the archive's own first events have no session.
AUDIT_VIEWS = _audit_views(
    events_view="""CREATE VIEW IF NOT EXISTS audit_events AS
SELECT e.seq, e.time, e.type, e.session, CAST(p.body AS TEXT) AS payload,
       (WITH RECURSIVE s(i) AS (SELECT 0 WHERE length(e.parts) > 0
                                UNION ALL SELECT i + 1 FROM s WHERE (i + 1) * 32 < length(e.parts))
        SELECT json_group_array(lower(hex(substr(e.parts, i * 32 + 1, 32)))) FROM s) AS parts,
       lower(hex(e.identity)) AS identity, lower(hex(e.payload)) AS payload_digest,
       lower(hex(e.chain)) AS chain
FROM events e JOIN payloads p ON p.digest = e.payload""",
    part=_part,
    author="(SELECT x.author FROM events x WHERE x.seq = e.seq)",
    sessions="\n  AND e.type NOT IN ('store_created', 'migrated_from')",
)


class StoreError(ArchiveError):
    """The store cannot be used; the message says what is wrong and how to fix it."""


class StoreBusy(StoreError, ArchiveBusy):
    """Another connection held the database beyond the busy timeout: retry."""


class StoreNotWritable(StoreError, ArchiveNotWritable):
    """This user or mount may not open the files: fix permissions or copy the folder."""


class StoreDamaged(StoreError, ArchiveDamaged):
    """The database cannot be read as an archive: restore it from backup."""


class NeedsMigration(StoreError):
    """A format-1 archive: this version serves format 2 only and reads 1 only to migrate it."""

    @classmethod
    def at(cls, folder: Path) -> NeedsMigration:
        return cls(
            f"the archive at {folder} is format version 1, which this version only migrates: "
            "stop Hermes and run `hermes-archive migrate` (docs/FORMAT.md 19)"
        )


class PayloadMissing(StoreDamaged):
    """An event's payload row is gone from the payloads table; the message names the event."""


class Projection(Protocol):
    """The one projection contract: derived state updated in the append transaction.

    Every projection implements it through :class:`archive_provider.projections.base.
    TableProjection`; the store calls these three (docs/DESIGN.md, "Projections"), and,
    when a projection has them, ``handles`` (the types it writes rows for: others get no
    savepoint), ``defers(type)`` (its ``apply`` for that type only buffers rows: no
    savepoint; the recall index, the sessions projection's turns), ``finish(conn)`` (write
    the buffer and ``last_seq`` before the commit, once per transaction) and ``discard()``
    (forget both after a rollback).
    """

    name: str

    def create(self, conn: sqlite3.Connection) -> None: ...

    def apply(self, conn: sqlite3.Connection, event: StoredEvent) -> None: ...

    def last_seq(self, conn: sqlite3.Connection) -> int: ...


@runtime_checkable
class ProjectionRunner(Protocol):
    """Projections that bring themselves up to the log in one streaming pass.

    :class:`archive_provider.projections.runner.ProjectionSet` is one; the store uses it
    to catch up on open when it is given one, and applies event by event otherwise. The
    runner reads the events through :func:`iter_events`: the store never imports it.
    """

    def catch_up(self, conn: sqlite3.Connection, until_seq: int) -> int: ...


@dataclass(frozen=True)
class Head:
    seq: int
    chain: str
    root: str | None = None  # the Merkle root at tree size seq (hex)


def archive_dir(hermes_home: str | os.PathLike[str]) -> Path:
    return Path(hermes_home) / "archive"


def _open_failure(db_path: Path, exc: sqlite3.DatabaseError, busy_timeout_ms: int) -> StoreError:
    """The error an open reports for ``exc``: a lock or a permission is never called damage."""
    failure = classify(exc)
    if failure is Failure.NOT_WRITABLE:
        return StoreNotWritable(
            f"cannot open the archive {db_path}: {exc}. This user may not read the "
            "file, or SQLite may not create events.db-shm beside a database in WAL "
            "mode here: check the permissions, or copy the archive folder (events.db "
            "with its -wal file, and its key files) somewhere you can write."
        )
    if failure is Failure.BUSY:
        return StoreBusy(
            f"the archive {db_path} is locked by another connection beyond the busy "
            f"timeout ({busy_timeout_ms} ms): {exc}. The file is not damaged; retry, or "
            "stop the process that holds the lock."
        )
    return StoreDamaged(
        f"cannot open the archive {db_path}: {exc}. If the file is corrupt, move it "
        "aside and restore the archive folder from backup; `hermes-archive verify` "
        "names the first bad event of a readable copy."
    )


def read_key(path: Path) -> bytes:
    """The store's key: v1's payload key or v2's lookup key (``store.key``), a regular file of
    hex text, read with a bound."""
    lookup = path.name == STORE_KEY_NAME
    what = "lookup key" if lookup else "payload key"
    try:
        key = bytes.fromhex(read_small(path, 4096).decode("ascii").strip())
    except UnsafeFile as exc:
        raise StoreError(f"the {what} cannot be used: {exc.strerror}") from None
    except FileNotFoundError:
        raise StoreError(
            f"the lookup key {path} is missing. Restore it from your backup, or make a new one "
            "(docs/RECOVER.md, 'Missing key'): only deduplication across the loss is lost."
            if lookup
            else f"the payload key {path} is missing; without it payload digests cannot be "
            "checked. Restore it from your backup (it lives beside events.db, so `hermes "
            "backup` includes it; give it mode 0600 again)."
        ) from None
    except (ValueError, UnicodeDecodeError):
        raise StoreError(f"the {what} {path} is not hex text; restore it from backup") from None
    if len(key) != KEY_BYTES:
        raise StoreError(f"the {what} {path} must hold {KEY_BYTES} bytes, found {len(key)}")
    return key


def file_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``, None when there is none.

    An open connection keeps the file it opened: when the database is replaced (a backup
    restored by renaming it into place) or removed, it goes on reading and committing to a
    file no one else will see. Compare this, taken before the open, with the path's now.
    """
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def connect(
    path: Path, *, readonly: bool = False, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS
) -> sqlite3.Connection:
    """Open a connection with the settings every part of the package relies on.

    Read-only, a WAL database still needs its ``-shm`` file, which SQLite cannot create in
    a folder it may not write (an archive copied to read-only media for an auditor). When
    no ``-wal`` or ``-shm`` file exists, no connection has the database open in WAL mode,
    so it is opened ``immutable`` instead: read as the file is, without the shared memory.
    """
    if readonly:
        quiescent = not any(path.with_name(path.name + end).exists() for end in ("-wal", "-shm"))
        immutable = quiescent and not os.access(path.parent, os.W_OK)
        conn = sqlite3.connect(
            f"{path.absolute().as_uri()}?mode=ro{'&immutable=1' if immutable else ''}",
            uri=True,
            isolation_level=None,
            check_same_thread=False,
        )
    else:
        conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
    return conn


class EventStore:
    """One archive database (docs/FORMAT.md Part II): append, read, head. Not thread-safe:
    one owner at a time.

    Digests are 32-byte BLOBs in the database and hex text in the API (envelopes, results,
    projections). Parts are resolved in the append transaction through the keyed lookup
    (:class:`PartHasher`); every append grows the Merkle tiles and writes the root with the
    head; checkpoints are signed at durable commits, at least every
    :data:`CHECKPOINT_INTERVAL_S` of commits, and at a clean close.
    """

    def __init__(
        self,
        path: Path,
        conn: sqlite3.Connection,
        key: bytes,
        store_id: str,
        projections: Sequence[Projection] = (),
        *,
        readonly: bool = False,
    ) -> None:
        self.path = path
        self.conn = conn
        self.key = key
        self.store_id = store_id
        self.projections = list(projections)
        self._runner = projections if isinstance(projections, ProjectionRunner) else None
        self.broken_projections: dict[str, str] = {}
        self._head: Head | None = None  # the head as appended so far, inside a transaction
        self._time = ""  # the time of the open transaction: every event it appends has it
        self.hasher = self.parts_hasher = PartHasher(key, conn)
        self.origin = digests_v2.origin(store_id)
        self.signer: Signer | None = (
            None if readonly else read_signer(signing_key_path(path.parent), self.origin)
        )
        self._tree: TreeEdge | None = None  # the edge as committed, kept between commits
        self._signed_now = False
        self._growing: merkle.TileAppender | None = None  # inside a transaction
        self._written_root: bytes | None = None  # the root _write_head wrote (once a commit)
        self._last_signed = 0.0  # POSIX time of the last checkpoint this store signed
        #: the roots of the trees this store committed, newest last (bounded): the serve-time
        #: proof trusts an unsigned head only when it is one of them (FORMAT.md 20.5 point 3)
        self.committed_roots: dict[int, bytes] = {}
        #: a copy laid out from central rows has no signing key: the key it was registered with
        self.registered_vkey: str | None = None
        # a read-only open of an older archive may lack it; the append writes the inner row
        # of each leaf tile it completes
        self.tile_inner = _has_table(conn, "tile_inner")

    @property
    def vkey(self) -> str:
        """The verifier key of this archive's signing key (``hermes-archive key``).

        Read from the signing key itself, never from ``meta.vkey`` (informational only).
        """
        if self.registered_vkey is not None and self.signer is None:
            return self.registered_vkey
        signer = self.signer or read_signer(signing_key_path(self.path.parent), self.origin)
        return signer.vkey

    # -- opening -------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        folder: str | os.PathLike[str],
        *,
        create: bool = True,
        readonly: bool = False,
        projections: Sequence[Projection]
        | Callable[[sqlite3.Connection], Sequence[Projection]] = (),
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        first_event: Callable[[EventStore], NewEvent] | None = None,
    ) -> EventStore:
        """Open (and with ``create``, make) the format-2 store in ``folder`` (``<home>/archive``).

        ``projections`` may be a function of the open connection, to keep the projections
        this archive holds (``projections.default_projections``). A new archive's first
        event is ``first_event(store)`` (default :func:`store_created`). A format-1 archive
        is refused (:class:`NeedsMigration`): only ``migrate`` reads it.
        """
        folder = Path(folder)
        db_path = folder / DB_NAME
        unsafe = [regular_file_problem(db_path)]
        if not readonly:  # the writer: only a folder this user alone may change
            unsafe.append(folder_problem(folder))
        problem = next((p for p in unsafe if p), None)
        if problem:
            raise StoreError(f"the archive at {folder} is refused: {problem}")
        new_store: tuple[str, Signer] | None = None
        made = False  # this open made the archive (its first checkpoint is signed now)
        if (
            create
            and not readonly
            and not folder.name.startswith(MAKING_PREFIX)
            and _schema_less(db_path)
            and _interrupted_keys(folder) is None
        ):  # an older version's making cut short before its keys were whole: set aside
            make_archive(folder, first_event)
            made = True
        elif (
            not readonly
            and not folder.name.startswith(MAKING_PREFIX)
            and any(folder.glob(MAKING_PREFIX + "*"))
            and db_path.exists()
            and not _schema_less(db_path)
        ):
            _tidy(folder)
        if not db_path.exists():
            if not create or readonly:
                raise StoreError(f"no archive at {db_path}")
            if not folder.name.startswith(MAKING_PREFIX):
                make_archive(folder, first_event)
                made = True
            else:  # inside make_archive: the keys and the file, then the schema below
                new_store = _make_keys(folder)
                # create the file 0600 before SQLite opens it
                os.close(os.open(db_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        try:
            conn = connect(db_path, readonly=readonly, busy_timeout_ms=busy_timeout_ms)
            if readonly and _unfinished(conn, folder):
                conn.close()
                raise StoreError(
                    f"the archive at {folder} was never finished (an older version's making of "
                    "it was cut short): the next start of Hermes with the archive provider "
                    "finishes it or sets it aside (docs/RECOVER.md, 'Unfinished archive')"
                )
            if new_store is None and not readonly and _meta_or_none(conn, "format_version") is None:
                new_store = _interrupted_keys(folder)
            if new_store is not None:
                _initialise(conn, *new_store)
            elif not readonly and _meta_or_none(conn, "format_version") == "1":
                conn.close()  # before anything is written to it
                raise NeedsMigration.at(folder)
            elif not readonly and not _has(conn, "view", "audit_events"):
                _add_audit_views(conn)
            if new_store is None and not readonly and _lacks_part_reuse(conn):
                _add_part_reuse(conn)
            if (
                not readonly
                and _meta_or_none(conn, "format_version") == str(FORMAT_VERSION)
                and not _has_table(conn, "tile_inner")
            ):
                conn.execute(TILE_INNER_SCHEMA)  # the tiles from now on have inner rows
            problem = schema_problem(conn)  # before reading anything a view could compute
            if problem:
                conn.close()
                raise StoreError(f"cannot open {db_path}: {problem}")
            store_id = cls._meta(conn, "store_id")
            version = int(cls._meta(conn, "format_version"))
        except sqlite3.DatabaseError as exc:
            raise _open_failure(db_path, exc, busy_timeout_ms) from exc
        if version == 1:
            conn.close()
            raise NeedsMigration.at(folder)
        if version != FORMAT_VERSION:
            conn.close()
            raise StoreError(
                f"{db_path} has format version {version}; this build reads {FORMAT_VERSION}"
            )
        key_path = folder / STORE_KEY_NAME
        problem = regular_file_problem(key_path)
        if problem:
            conn.close()
            raise StoreError(f"the archive at {folder} is refused: {problem}")
        try:
            key = read_key(key_path)
        except StoreError:
            conn.close()
            raise
        if callable(projections):
            projections = projections(conn)
        store = EventStore(db_path, conn, key, store_id, projections, readonly=readonly)
        if not readonly:
            try:  # an existing file takes its first write lock here
                store._create_projections()
            except sqlite3.DatabaseError as exc:
                conn.close()
                raise _open_failure(db_path, exc, busy_timeout_ms) from exc
        if new_store is not None or (not readonly and store.head().seq == 0):
            # a new store, or one a crash left before its first event
            store.append([(first_event or store_created)(store)], durable=True)
        elif made:
            store._last_signed = utc_now().timestamp()  # make_archive signed its first one
        return store

    @staticmethod
    def _meta(conn: sqlite3.Connection, name: str) -> str:
        row = conn.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise StoreError(
                f"the archive has no {name!r} in its meta table; it is not a hermes-archive store"
            )
        return str(row[0])

    def _create_projections(self) -> None:
        """Create missing projection tables and catch up any projection behind the log, at
        most :data:`CATCH_UP_BATCH` events per transaction.

        Each batch commits, so a writer in another process (or a command) waits for one
        batch however long the log is; another opener meanwhile joins the catch-up where
        the last batch left it (each batch reads ``last_seq`` and the head inside its own
        write transaction), and appends nothing until its own open has caught up.
        """
        more = self._catch_up_batch(create=True)
        while more:
            more = self._catch_up_batch(create=False)

    def _catch_up_batch(self, *, create: bool) -> bool:
        """One transaction of the catch-up; True when a projection is still behind.

        Given a :class:`ProjectionRunner`, the batch takes its streaming path (batched,
        one last_seq write); if a projection fails on it, or without a runner, the batch
        goes event by event so that only a failing projection is left behind (and no
        longer counted: the catch-up ends without it).
        """
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            if create:
                for projection in self.projections:
                    projection.create(self.conn)
            head = self.head().seq
            lowest = min(
                (
                    p.last_seq(self.conn)
                    for p in self.projections
                    if p.name not in self.broken_projections
                ),
                default=head,
            )
            until = min(head, lowest + CATCH_UP_BATCH)
            self.conn.execute("SAVEPOINT catch_up")
            try:
                if self._runner is None:
                    self._catch_up_event_by_event(until)
                else:
                    self._runner.catch_up(self.conn, until)
            except sqlite3.OperationalError:
                raise
            except Exception:
                self.conn.execute("ROLLBACK TO catch_up")
                self._catch_up_event_by_event(until)
            self._finish_projections()
            self.conn.execute("RELEASE catch_up")
            self.conn.execute("COMMIT")
        except BaseException:
            self.conn.execute("ROLLBACK")
            self._discard_projections()
            raise
        return until < head

    def _catch_up_event_by_event(self, until: int) -> None:
        behind = [(p, p.last_seq(self.conn)) for p in self.projections]
        start = min((seq for _, seq in behind), default=until)
        for event in self.events(start, until_seq=until):
            for projection, last in behind:
                if event.seq > last:
                    self._apply_projection(projection, event)

    def close(self) -> None:
        """Close; a writer first signs a checkpoint at the head when it is not signed yet."""
        if self.signer is not None:
            try:
                self.checkpoint()
            except sqlite3.Error:
                log.warning("archive: the closing checkpoint of %s was not signed", self.path)
        self.conn.close()

    # -- reading -------------------------------------------------------------------------

    def head(self) -> Head:
        """The last event's seq and chain value (inside a transaction: as appended so far)."""
        if self._head is not None:
            return self._head
        return self._read_head()

    def _read_head(self) -> Head:
        row = self.conn.execute("SELECT seq, chain, root FROM head WHERE id = 1").fetchone()
        if row is None:
            return Head(0, digests_v2.genesis(self.store_id).hex(), merkle.EMPTY_ROOT.hex())
        return Head(int(row[0]), bytes(row[1]).hex(), bytes(row[2]).hex())

    def events(self, after_seq: int = 0, *, until_seq: int | None = None) -> Iterator[LoadedEvent]:
        """Events in sequence order with their payloads, streamed (memory stays flat)."""
        return iter_events(self.conn, after_seq, until_seq, part_types=())

    def event(self, seq: int) -> StoredEvent | None:
        return next(self.events(seq - 1, until_seq=seq), None)

    def payload(self, digest: str) -> bytes | None:
        return payload_body(self.conn, digest)

    def unstored(self, digests: Iterable[str]) -> set[str]:
        """The payload digests among ``digests`` whose bodies the payloads table does not hold."""
        wanted = set(digests)
        return {d for d in wanted if payload_body(self.conn, d) is None}

    def identity_seq(self, identity: str) -> int | None:
        """The seq of the event with this identity digest, or None when it is not archived."""
        row = self.conn.execute(
            "SELECT seq FROM events WHERE identity = ?", (bytes.fromhex(identity),)
        ).fetchone()
        return int(row[0]) if row else None

    # -- appending -----------------------------------------------------------------------

    def append(self, events: Sequence[NewEvent], *, durable: bool = False) -> list[AppendResult]:
        """Append ``events`` in one transaction; durable means committed with synchronous=FULL.

        SQLite only changes the synchronous level between transactions, so the pragma is
        set before ``BEGIN``. Returns one result per event, in order.
        """
        with self.transaction(durable=durable):
            return self.append_in_transaction(events)

    @contextmanager
    def transaction(self, *, durable: bool = False) -> Iterator[None]:
        """One write transaction: the head is read at its start and written once at its end.

        Its events share one time, read from the clock when it begins: the time they were
        written together (unless :meth:`append_in_transaction` is given theirs).
        """
        conn = self.conn
        conn.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
        conn.execute("BEGIN IMMEDIATE")
        committed = False
        try:
            self._began()
            self._head = start = self._read_head()
            self._time = now_text()
            yield
            self._finish_projections()
            end = self._head
            if end != start:
                self._write_head(start, end, durable=durable)
            conn.execute("COMMIT")
            committed = True
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            self._discard_projections()
            raise
        finally:
            self._head = None
            self._ended(committed)

    def append_in_transaction(
        self, events: Iterable[NewEvent], *, time: str | None = None
    ) -> list[AppendResult]:
        """Resolve parts, compute identities, store payloads, envelopes and leaves.

        Parts are resolved first (a stored body by its lookup, checked byte for byte; a new
        one with a fresh salt), so the digests the body and key name are the ones stored; an
        event whose identity is already archived stores nothing, not even its new parts.
        ``time`` stamps them instead of the transaction's time: events taken in from the spill
        keep the time they were accepted, migrated ones their first time.
        """
        if self._head is None:
            raise RuntimeError("append_in_transaction needs an open transaction()")
        conn = self.conn
        seq, chain = self._head.seq, bytes.fromhex(self._head.chain)
        time = time or self._time
        if self._growing is None:
            self._growing = self._edge().appender()
        results: list[AppendResult] = []
        records: list[StoredEvent] = []
        batch: dict[str, int] = {}
        for event in events:
            # a part whose salt this transaction drew has a digest no event names yet: the
            # identity it enters is new, and is not looked up (a re-sent turn names stored
            # parts, so its identity is)
            parts, renamed, fresh = self._resolve(event.parts)
            author = self._resolve((event.author,))[0][0] if event.author else None
            body_value, key_value = event.body, event.key
            if renamed:
                body_value = rename_digests(body_value, renamed)
                key_value = rename_digests(key_value, renamed)
            key = key_text(key_value)
            part_list = parts_text([p.digest for p in parts])
            identity = digests_v2.identity(event.type, event.session, key, part_list).hex()
            existing = batch.get(identity) or (None if fresh else self.identity_seq(identity))
            if existing is not None:
                results.append(AppendResult("already_archived", existing, identity, event.type))
                continue
            body = canonical_bytes(body_value)
            salt = digests_v2.new_salt()
            payload = digests_v2.payload_digest(salt, body)
            rows: list[tuple[bytes, bytes, bytes | None, bytes]] = [(payload, salt, None, body)]
            new_parts = {
                p.lookup: p for p in (*parts, *((author,) if author else ())) if p.salt and p.lookup
            }  # a text named twice by one event is stored once
            for found, part in new_parts.items():
                assert part.salt is not None
                rows.append((bytes.fromhex(part.digest), part.salt, found, part.body))
                self.parts_hasher.pending.pop(found, None)  # stored now: found by its lookup
            _insert(conn, "INSERT INTO payloads (digest, salt, lookup, body) VALUES ", rows)
            seq += 1
            reused = {p.digest for p in parts if p.salt is None}  # stored by an earlier event
            if reused:
                _insert(
                    conn,
                    "INSERT OR IGNORE INTO part_reuse (digest, seq) VALUES ",
                    [(bytes.fromhex(d), seq) for d in sorted(reused)],
                )
            stored = (p.body for p in parts if p.salt is not None)  # a reuse: part_reuse
            quoted = quoted_by(self.key, event.type, body_value, stored)
            if quoted:
                _insert(
                    conn,
                    "INSERT OR IGNORE INTO quoting (quoted, seq) VALUES ",
                    [(q, seq) for q in quoted],
                )
            envelope = Envelope(
                seq,
                time,
                event.type,
                event.session,
                key,
                identity,
                payload.hex(),
                part_list,
                author.digest if author else None,
                FORMAT_VERSION,
            )
            data = envelope.canonical()
            chain = digests_v2.chain_of(chain, data)
            conn.execute(
                f"INSERT INTO events ({ENVELOPE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    seq,
                    time,
                    event.type,
                    event.session,
                    key,
                    bytes.fromhex(identity),
                    payload,
                    digests_v2.parts_blob(part_list),
                    bytes.fromhex(author.digest) if author else None,
                    chain,
                ),
            )
            self._growing.append([merkle.leaf_hash(data)])
            carried = {p.digest: p.body for p in (*parts, *((author,) if author else ()))}
            records.append(LoadedEvent(envelope, chain.hex(), body, carried))
            batch[identity] = seq
            results.append(AppendResult("appended", seq, identity, event.type))
        if not records:
            return results
        self._head = Head(seq, chain.hex())
        for record in records:
            for projection in self.projections:
                self._apply_projection(projection, record)
        return results

    def _resolve(self, parts: Iterable[Part | None]) -> tuple[list[Part], dict[str, str], bool]:
        """The parts as stored by this transaction, the digests that changed name, and
        whether any is fresh (:meth:`PartHasher.resolve`)."""
        resolved, renamed, fresh = [], {}, False
        for part in parts:
            assert part is not None
            final, new = self.parts_hasher.resolve(part)
            fresh = fresh or new
            if final.digest != part.digest:
                renamed[part.digest] = final.digest
            resolved.append(final)
        return resolved, renamed, fresh

    def _edge(self) -> TreeEdge:
        """The tree edge of the head: kept from the last commit, or read from the tiles."""
        seq = self._head.seq if self._head else self._read_head().seq
        if self._tree is None or self._tree.size != seq:
            self._tree = TreeEdge.read(seq, self.read_tile)
        return self._tree

    def read_tile(self, level: int, index: int) -> bytes | None:
        """One ``tiles`` row (``merkle.TileReader(store.read_tile, size)`` reads proofs)."""
        row = self.conn.execute(
            "SELECT hashes FROM tiles WHERE level = ? AND idx = ?", (level, index)
        ).fetchone()
        return bytes(row[0]) if row else None

    def _write_head(self, start: Head, end: Head, *, durable: bool) -> None:
        growing = self._growing
        assert growing is not None and growing.size == end.seq
        for (level, index), hashes in growing.changed().items():
            self.conn.execute(
                "INSERT INTO tiles (level, idx, hashes) VALUES (?, ?, ?) "
                "ON CONFLICT(level, idx) DO UPDATE SET hashes = excluded.hashes",
                (level, index, hashes),
            )
        inner = growing.inner()
        if inner and self.tile_inner:
            self.conn.executemany(
                "INSERT OR REPLACE INTO tile_inner (idx, hashes) VALUES (?, ?)", inner.items()
            )
        root = self._written_root = growing.root()
        self.conn.execute(
            "INSERT INTO head (id, seq, chain, root) VALUES (1, ?, ?, ?) ON CONFLICT(id) DO "
            "UPDATE SET seq = excluded.seq, chain = excluded.chain, root = excluded.root",
            (end.seq, bytes.fromhex(end.chain), root),
        )
        if durable or utc_now().timestamp() - self._last_signed >= CHECKPOINT_INTERVAL_S:
            self._sign(end.seq, root)

    def _began(self) -> None:
        # a part named before BEGIN may have been stored since (by another process): it
        # is looked up again, never taken as new on the strength of that earlier probe
        self.parts_hasher.pending.clear()

    def _ended(self, committed: bool) -> None:
        growing, self._growing = self._growing, None
        root, self._written_root = self._written_root, None
        self.parts_hasher.pending.clear()
        if committed and growing is not None:
            self._tree = TreeEdge(growing.size, growing.edge(), growing.compact())
            # the root the head row took; hashed here only when nothing moved the head
            self.committed_roots[growing.size] = root or growing.root()
            if len(self.committed_roots) > COMMITTED_ROOTS_KEPT:
                del self.committed_roots[next(iter(self.committed_roots))]
        elif not committed:
            self._tree = None  # a rollback: read the edge again next time
        if committed and self._signed_now:
            self._last_signed = utc_now().timestamp()
        self._signed_now = False

    def _sign(self, size: int, root: bytes) -> None:
        """Sign the checkpoint at ``size`` in this transaction (FORMAT.md 15)."""
        if self.signer is None:
            return
        text = format_checkpoint(Checkpoint(self.origin, size, root))
        signature = self.signer.sign(text)
        self.conn.execute(
            "INSERT INTO signed_checkpoints (size, root, time, signature) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(size) DO NOTHING",
            (size, root, self._time or now_text(), signature.data),
        )
        self._signed_now = True

    def checkpoint(self) -> bool:
        """Sign a checkpoint at the head when the newest one is older; True when it did."""
        if self.signer is None:
            return False
        with self.transaction(durable=True):
            head = self._read_head()
            row = self.conn.execute("SELECT max(size) FROM signed_checkpoints").fetchone()
            if head.seq == 0 or (row[0] is not None and row[0] >= head.seq):
                return False
            assert head.root is not None
            self._sign(head.seq, bytes.fromhex(head.root))
        return True

    def checkpoint_note(self, size: int | None = None) -> bytes | None:
        """The signed note of the checkpoint at ``size`` (default: the newest), cosigned.

        The text is rebuilt from the origin, size and root; the log's signature line first,
        then one line per stored cosignature (FORMAT.md 15.5). None when none is signed.
        """
        row = self.conn.execute(
            "SELECT size, root, signature FROM signed_checkpoints"
            + (" WHERE size = ?" if size is not None else " ORDER BY size DESC LIMIT 1"),
            () if size is None else (size,),
        ).fetchone()
        if row is None:
            return None
        text = format_checkpoint(Checkpoint(self.origin, int(row[0]), bytes(row[1])))
        log_key = Verifier.from_vkey(self.note_vkey())
        lines = [Signature(self.origin, log_key.key_id, bytes(row[2]))]
        for name, key_id, timestamp, signature in self.conn.execute(
            "SELECT name, key_id, timestamp, signature FROM cosignatures WHERE size = ?"
            " ORDER BY name, key_id",
            (row[0],),
        ):
            data = int(timestamp).to_bytes(8, "big") + bytes(signature)
            lines.append(Signature(str(name), int.from_bytes(bytes(key_id), "big"), data))
        return format_note(text, lines)

    def note_vkey(self) -> str:
        """The key that names the log's signature line of a note: the signing key's, or, when
        that key is lost, the one recorded at creation (``meta.vkey``). A note only names its
        key, so a wrong name fails wherever the note is checked with a pinned key; a lost key
        must not make the signed history unexportable (docs/RECOVER.md)."""
        try:
            return self.vkey
        except KeyFileError:
            recorded = _meta_or_none(self.conn, "vkey")
            if recorded is None:
                raise
            return recorded

    def settle(self, name: str) -> None:
        """Write out what projection ``name`` buffered in the open transaction, as before an
        event it does not defer: a build is about to read its tables."""
        for projection in self.projections:
            if projection.name == name:
                self._finish(projection)

    def _finish_projections(self) -> None:
        """Before the commit: let projections that buffer within a transaction write it out."""
        for projection in self.projections:
            self._finish(projection)

    def _finish(self, projection: Projection) -> None:
        """Write out what ``projection`` buffered. A failure leaves it behind (it rolls its
        rows back and its last_seq to before the transaction), as a failing ``apply`` does;
        the log's events are not affected."""
        finish = getattr(projection, "finish", None)
        if finish is None:
            return
        try:
            finish(self.conn)
        except sqlite3.OperationalError:
            raise
        except Exception as exc:
            self.broken_projections.setdefault(projection.name, f"{type(exc).__name__}: {exc}")
            log.error("archive projection %s failed and is left behind: %s", projection.name, exc)

    def _discard_projections(self) -> None:
        for projection in self.projections:
            discard = getattr(projection, "discard", None)
            if discard is not None:
                discard()

    def _apply_projection(self, projection: Projection, event: StoredEvent) -> None:
        """Apply one projection; a projection bug never costs the log an event.

        A failing projection is rolled back to before this event and left behind (its
        last_seq stays put) for the rest of this session, so status and
        ``verify --projections`` show it and a replay after the fix rebuilds it.
        Environmental errors (disk full, locks) still fail the whole transaction.
        """
        if projection.name in self.broken_projections:
            return
        defers = getattr(projection, "defers", None)
        if defers is not None and not defers(event.type):
            self._finish(projection)  # what it buffered goes first, outside the savepoint
            if projection.name in self.broken_projections:
                return
        handles = getattr(projection, "handles", None)
        if (isinstance(handles, frozenset) and event.type not in handles) or (
            defers is not None and defers(event.type)
        ):
            # it writes nothing now (rows and last_seq wait for finish): no savepoint needed
            try:
                projection.apply(self.conn, event)
            except sqlite3.OperationalError:
                raise
            except Exception as exc:
                self._left_behind(projection, event, exc)
            return
        self.conn.execute("SAVEPOINT projection")
        try:
            projection.apply(self.conn, event)
        except sqlite3.OperationalError:
            raise
        except Exception as exc:
            self.conn.execute("ROLLBACK TO projection")
            self._left_behind(projection, event, exc)
        self.conn.execute("RELEASE projection")

    def _left_behind(self, projection: Projection, event: StoredEvent, exc: Exception) -> None:
        self.broken_projections[projection.name] = f"seq {event.seq}: {type(exc).__name__}: {exc}"
        log.error(
            "archive projection %s failed at seq %d and is left behind: %s",
            projection.name,
            event.seq,
            exc,
        )


#: the events table's columns, in envelope order then the chain
ENVELOPE_COLUMNS = "seq, time, type, session, key, identity, payload, parts, author, chain"


def rename_digests(value: Any, renamed: Mapping[str, str]) -> Any:
    """``value`` with every text equal to a renamed digest replaced by its new name (the
    append's renaming; ``migrate`` checks a lineage with the same map from v1 to v2)."""
    if isinstance(value, str):
        return renamed.get(value, value)
    if isinstance(value, list):
        return [rename_digests(item, renamed) for item in value]
    if isinstance(value, dict):
        return {name: rename_digests(item, renamed) for name, item in value.items()}
    return value


def make_archive(folder: Path, first_event: Callable[[EventStore], NewEvent] | None) -> None:
    """Make a new archive in ``folder`` whole, or leave none (issue "Faults").

    Keys, schema, the first event and its signed checkpoint are made in a ``.making-<random>``
    folder inside ``folder``, fsynced, then placed by links that never replace a file: the
    keys first, ``events.db`` last. ``events.db`` appearing is the commit point: a fault
    before it leaves nothing an open takes for an archive, and the next open finishes the
    placing or removes what was made (:func:`_settle`). The first witness record follows at
    the writer's first commit, as for every archive not yet witnessed. Openers of one folder
    make it one at a time (a lock on the folder).
    """
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    with _making_lock(folder):
        _settle(folder)
        if (folder / DB_NAME).exists():
            return  # another opener made it meanwhile, or an interrupted making was finished
        signing = signing_key_path(folder)
        if signing.exists():
            raise KeyFileError(
                f"the signing key {signing} already exists and belongs to another archive (a "
                f"key signs for one store); point {SIGNING_KEY_ENV} at a new file for this one"
            )
        making = folder / (MAKING_PREFIX + secrets.token_hex(8))
        making.mkdir(mode=0o700)
        try:
            EventStore.open(making, first_event=first_event).close()
            _seal(making)
            _place(folder, making)
        except BaseException as exc:
            if _placed(folder, making):  # linked; only the folder's fsync after it failed
                log.warning("archive: %s made, but not synced: %s", folder / DB_NAME, exc)
            else:
                with contextlib.suppress(OSError):  # what stays is settled by the next open
                    _unmake(folder, making)
                if not isinstance(exc, (OSError, sqlite3.Error)):
                    raise
                raise StoreError(
                    f"the archive at {folder} could not be made ({exc}); nothing was left in "
                    "its place, the next open makes it again"
                ) from exc
        with contextlib.suppress(OSError):  # a leftover folder is removed by the next open
            shutil.rmtree(making)
            sync_dir(folder)


@contextmanager
def _making_lock(folder: Path) -> Iterator[None]:
    """Openers of one folder make (or tidy) its archive one at a time."""
    lock = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
    finally:
        os.close(lock)  # and with it the lock


def _tidy(folder: Path) -> None:
    """Remove what a making left beside a whole archive (its folder, with copies of keys)."""
    with _making_lock(folder):
        _settle(folder)


def _making_keys(folder: Path, making: Path) -> list[tuple[Path, Path]]:
    """The key files of an archive being made, each with where it is placed."""
    places = [
        (making / SIGNING_KEY_NAME, signing_key_path(folder)),
        (making / STORE_KEY_NAME, folder / STORE_KEY_NAME),
        (making / KEY_NAME, folder / KEY_NAME),
    ]
    return [(source, target) for source, target in places if source.exists()]


def _seal(making: Path) -> None:
    """Check that the closed database holds every commit in its own file, and fsync it."""
    db = making / DB_NAME
    wal = making / (DB_NAME + "-wal")
    if wal.exists() and wal.stat().st_size:
        raise StoreError(f"{db} was not checkpointed when it was closed")
    for end in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            (making / (DB_NAME + end)).unlink()
    fd = os.open(db, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    sync_dir(making)


def _place(folder: Path, making: Path) -> None:
    """Link the made archive's keys into place, then its database (the commit point)."""
    for source, target in _making_keys(folder, making):
        if not _same_bytes(source, target):  # placed before an interruption
            place_file(source, target)
    place_file(making / DB_NAME, folder / DB_NAME)


def _placed(folder: Path, making: Path) -> bool:
    """Whether the database made in ``making`` is the one in ``folder``."""
    made, placed = file_identity(making / DB_NAME), file_identity(folder / DB_NAME)
    return made is not None and made == placed


def _same_bytes(one: Path, other: Path) -> bool:
    try:
        return read_small(one) == read_small(other)
    except OSError:
        return False


def _unmake(folder: Path, making: Path) -> None:
    """Remove the keys an unfinished making placed (their bytes are its own), then it."""
    for source, target in _making_keys(folder, making):
        if _same_bytes(source, target):
            target.unlink()
            sync_dir(target.parent)
    shutil.rmtree(making)
    sync_dir(folder)


def _whole(making: Path) -> bool:
    """Whether ``making`` holds a finished archive: sealed, with its first event."""
    db = making / DB_NAME
    if not db.exists() or (making / (DB_NAME + "-wal")).exists():
        return False
    try:
        conn = sqlite3.connect(f"{db.absolute().as_uri()}?mode=ro&immutable=1", uri=True)
        try:
            version = _meta_or_none(conn, "format_version")  # v1 begins with no event
            return version == "1" or (version is not None and head_seq(conn) >= 1)
        finally:
            conn.close()
    except sqlite3.Error:
        return False


def _schema_less(db_path: Path) -> bool:
    """Whether ``db_path`` is a file with no schema at all (a making cut short), not missing."""
    try:
        if db_path.stat().st_size == 0:
            return True
        conn = sqlite3.connect(f"{db_path.absolute().as_uri()}?mode=ro", uri=True)
        try:
            return conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
        finally:
            conn.close()
    except (OSError, sqlite3.Error):
        return False


def _unfinished(conn: sqlite3.Connection, folder: Path) -> bool:
    """Whether an open archive file is an older version's making cut short (no schema yet,
    and the key files it was being made with)."""
    empty = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
    return empty and any((folder / n).exists() for n in (STORE_KEY_NAME, KEY_NAME))


def _settle(folder: Path) -> None:
    """Before a new archive is made in ``folder`` (under its lock): finish or remove what an
    interrupted making left, and set aside an older version's half-made archive.

    A ``.making-`` folder whose archive is whole is placed (its database was not yet); one
    that is not is removed with the keys it placed (matched byte for byte: they are its own
    random keys). Key files with no database (or an empty one) beside them are an older
    version's making cut short: they are moved to ``unfinished-<time>/`` (never deleted) with
    one line, and docs/RECOVER.md says what to do if they were not.
    """
    for making in sorted(folder.glob(MAKING_PREFIX + "*")):
        if making.is_symlink() or not making.is_dir():
            continue
        if _placed(folder, making):
            pass  # only its removal was interrupted
        elif not (folder / DB_NAME).exists() and _whole(making):
            try:
                _place(folder, making)
                log.warning("archive: %s was made whole; its placing is finished now", folder)
            except FileExistsError:
                _unmake(folder, making)
                continue
        else:
            _unmake(folder, making)
            log.warning("archive: removed an unfinished new archive (%s)", making.name)
            continue
        shutil.rmtree(making)
        sync_dir(folder)
    db_path = folder / DB_NAME
    if db_path.exists() and not _schema_less(db_path):
        return
    names = [DB_NAME + end for end in ("", "-wal", "-shm")] + [
        STORE_KEY_NAME,
        KEY_NAME,
        SIGNING_KEY_NAME,
    ]
    left = [folder / n for n in names if (folder / n).exists()]
    if not left:
        return
    aside = folder / f"unfinished-{utc_now().strftime('%Y%m%dT%H%M%S%fZ')}"
    aside.mkdir(mode=0o700)
    for path in left:
        os.replace(path, aside / path.name)
    sync_dir(aside)
    sync_dir(folder)
    log.warning(
        "archive: %s held an archive whose making was cut short (%s, no events); they are "
        "set aside in %s and a new archive is made (docs/RECOVER.md, 'Unfinished archive')",
        folder,
        ", ".join(p.name for p in left),
        aside.name,
    )


def _make_keys(folder: Path) -> tuple[str, Signer]:
    """A new store's id, lookup key and signing key (FORMAT.md 10 and 15.2)."""
    store_id = secrets.token_hex(16)
    key_path = folder / STORE_KEY_NAME
    if key_path.exists():
        raise StoreError(
            f"{key_path} exists but there is no events.db beside it: move the old key aside "
            "(or restore events.db from backup) before a new archive is made here"
        )
    signing = signing_key_path(folder)
    if signing.exists():
        raise KeyFileError(
            f"the signing key {signing} already exists and belongs to another archive (a key "
            f"signs for one store); point {SIGNING_KEY_ENV} at a new file for this one"
        )
    signer = make_signer(signing, digests_v2.origin(store_id))
    write_private(key_path, secrets.token_bytes(KEY_BYTES).hex() + "\n")
    return store_id, signer


def _interrupted_keys(folder: Path) -> tuple[str, Signer] | None:
    """The id and signing key of an archive whose making a crash cut short after its keys
    were written and events.db was created, before its schema was committed: the open takes
    the making up again instead of turning the file into a v1 store without a key."""
    if (folder / KEY_NAME).exists() or not (folder / STORE_KEY_NAME).exists():
        return None
    path = signing_key_path(folder)
    try:
        name = Signer.from_private_key(read_small(path, 4096).decode("ascii")).name
        read_key(folder / STORE_KEY_NAME)  # a key torn by the fault: set aside instead
    except (OSError, UnsafeFile, UnicodeDecodeError, ValueError, StoreError):
        return None  # the open sets the unfinished archive aside (_settle)
    store_id = name.rpartition("/")[2]
    return store_id, read_signer(path, digests_v2.origin(store_id))


def _initialise(conn: sqlite3.Connection, store_id: str, signer: Signer) -> None:
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise StoreError(f"SQLite refused WAL mode (got {mode!r})")
    conn.execute("BEGIN IMMEDIATE")
    try:
        if _meta_or_none(conn, "format_version") is not None:
            conn.execute("COMMIT")  # another opener made it first, from the same key files
            return
        for statement in (SCHEMA + ";\n" + AUDIT_VIEWS).split(";\n"):
            if statement.strip():
                conn.execute(statement)
        conn.executemany(
            "INSERT INTO meta VALUES (?, ?)",
            [
                ("format_version", str(FORMAT_VERSION)),
                ("store_id", store_id),
                ("origin", digests_v2.origin(store_id)),
                ("vkey", signer.vkey),
                ("created", now_text()),
                (PART_REUSE_FROM, "0"),
                (QUOTING_FROM, "0"),
            ],
        )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def store_created(store: EventStore) -> NewEvent:
    """The first event of a new archive (FORMAT.md 18)."""
    return NewEvent(
        "store_created",
        "archive",
        {},
        {
            "format_version": FORMAT_VERSION,
            "store_id": store.store_id,
            "origin": store.origin,
            "vkey": store.vkey,
            "created": EventStore._meta(store.conn, "created"),
        },
    )


def _has(conn: sqlite3.Connection, kind: str, name: str) -> bool:
    """Whether the schema holds a ``kind`` ('table', 'view') called ``name``."""
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = ? AND name = ?", (kind, name))
    return row.fetchone() is not None


def _add_audit_views(conn: sqlite3.Connection) -> None:
    """Give an archive made before the audit views had them (views hold no data)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        for statement in AUDIT_VIEWS.split(";\n"):
            if statement.strip():
                conn.execute(statement)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


#: the erasure indexes an archive made before them: (table, its schema, its meta row)
_ERASURE_INDEXES = (
    ("part_reuse", PART_REUSE_SCHEMA, PART_REUSE_FROM),
    ("quoting", QUOTING_SCHEMA, QUOTING_FROM),
)


def _lacks_part_reuse(conn: sqlite3.Connection) -> bool:
    """An archive made before ``part_reuse`` or ``quoting`` existed (a v1 file has no use
    for them)."""
    if _meta_or_none(conn, "format_version") != str(FORMAT_VERSION):
        return False
    return any(not _has(conn, "table", name) for name, _, _ in _ERASURE_INDEXES)


def _add_part_reuse(conn: sqlite3.Connection) -> None:
    """Give an older archive ``part_reuse`` and ``quoting``: the appends from now on
    write them; the events already there are indexed by the first erasure
    (:func:`store_pieces.index_part_reuse`, :func:`store_pieces.index_quoting`)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        for name, schema, owed in _ERASURE_INDEXES:
            if not _has(conn, "table", name):  # another process may have made it
                conn.execute(schema)
                conn.execute(
                    "INSERT OR REPLACE INTO meta VALUES (?, ?)", (owed, str(head_seq(conn)))
                )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    found = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
    return conn.execute(found, (name,)).fetchone() is not None


def _meta_or_none(conn: sqlite3.Connection, name: str) -> str | None:
    try:
        row = conn.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
    except sqlite3.OperationalError:  # a new, empty file: no meta table yet
        return None
    return None if row is None else str(row[0])


_ROWS_PER_STATEMENT = 8


def _insert(conn: sqlite3.Connection, head: str, rows: Sequence[Sequence[object]]) -> None:
    """Insert ``rows``: a few in one multi-row statement, many with ``executemany``.

    The writer appends one small job at a time, where one statement with a few rows costs
    less than ``executemany`` stepping one row per call.
    """
    marks = "(" + ", ".join("?" * len(rows[0])) + ")"
    if len(rows) > _ROWS_PER_STATEMENT:
        conn.executemany(head + marks, rows)
    else:
        conn.execute(head + ", ".join([marks] * len(rows)), [v for row in rows for v in row])


def iter_events(
    conn: sqlite3.Connection,
    after_seq: int = 0,
    until_seq: int | None = None,
    types: Iterable[str] | None = None,
    part_types: Iterable[str] | None = None,
) -> Iterator[LoadedEvent]:
    """Events in sequence order with their payload and parts' bodies, streamed.

    The one way events are read back: digests read as bytes, handed on as hex. Each event
    (of ``types``, when given) comes with its payload and its parts' bodies, for events of
    ``part_types`` only when given (none when empty). An erased event body (FORMAT.md 12.4)
    is skipped, an erased part is simply not carried; any other missing payload raises
    :class:`PayloadMissing` (the log was damaged behind the triggers' back).
    """
    if types is not None and not set(types):
        return
    where, args = _range(after_seq, until_seq, types)
    rows = conn.execute(
        "SELECT e.seq, e.time, e.type, e.session, e.key, e.identity, e.payload, e.parts,"
        " e.author, e.chain, p.body FROM events e LEFT JOIN payloads p ON p.digest = e.payload"
        f"{where} ORDER BY e.seq",
        args,
    )
    carry = (
        set(part_types if part_types is not None else types or ())
        if (part_types is not None or types is not None)
        else None
    )
    lookup = conn.cursor()
    for row in rows:
        seq, time, type_, session, key, identity, payload, parts, author, chain, body = row
        if body is None:
            if lookup.execute("SELECT 1 FROM erased WHERE digest = ?", (payload,)).fetchone():
                continue  # an erased event body (FORMAT.md 12.4): nothing to read or replay
            raise PayloadMissing(f"event {seq}: its payload {bytes(payload).hex()} is missing")
        envelope = digests_v2.envelope_of_row(
            seq, time, type_, session, key, identity, payload, parts, author
        )
        carried: dict[str, bytes] = {}
        if parts and (carry is None or type_ in carry):
            for digest, part in select_in(
                lookup,
                "SELECT digest, body FROM payloads WHERE digest IN ({}) AND body IS NOT NULL",
                split_parts(parts),
            ):
                carried[bytes(digest).hex()] = bytes(part)
        yield LoadedEvent(envelope, bytes(chain).hex(), bytes(body), carried)


def _range(after: int, until: int | None, types: Iterable[str] | None) -> tuple[str, list[Any]]:
    where = " WHERE e.seq > ?"
    args: list[Any] = [after]
    if until is not None:
        where += " AND e.seq <= ?"
        args.append(until)
    if types is not None:
        wanted = sorted(set(types))
        where += f" AND +e.type IN ({', '.join('?' * len(wanted))})"  # '+': scan by rowid
        args.extend(wanted)
    return where, args


def payload_body(conn: sqlite3.Connection, digest: str) -> bytes | None:
    """A payload's bytes by hex digest, or None when the table does not hold it (or it is
    erased)."""
    try:
        raw = bytes.fromhex(digest)
    except ValueError:
        return None
    row = conn.execute(
        "SELECT body FROM payloads WHERE digest = ? AND body IS NOT NULL", (raw,)
    ).fetchone()
    return bytes(row[0]) if row else None


def salted_payload(conn: sqlite3.Connection, digest: str) -> tuple[bytes, bytes] | None:
    """A payload's ``(salt, body)`` by hex digest, or None (absent, or erased).

    What a disclosure, a proof file or a serve-time check needs: BLAKE3(payload domain ‖
    salt ‖ body) must equal the digest (FORMAT.md 12.5, 20.5).
    """
    row = conn.execute(
        "SELECT salt, body FROM payloads WHERE digest = ? AND body IS NOT NULL",
        (bytes.fromhex(digest),),
    ).fetchone()
    return (bytes(row[0]), bytes(row[1])) if row else None


def salted_payloads(
    conn: sqlite3.Connection, digests: Sequence[bytes]
) -> dict[bytes, tuple[bytes, bytes]]:
    """:func:`salted_payload` of many digests in one query (absent or erased ones left out):
    a whole-archive export asks for every body, and a query each cost twice the probe."""
    marks = ",".join("?" * len(digests))
    rows = conn.execute(
        f"SELECT digest, salt, body FROM payloads WHERE digest IN ({marks}) AND body IS NOT NULL",
        digests,
    )
    return {bytes(digest): (bytes(salt), bytes(body)) for digest, salt, body in rows}


def session_part_digests(
    conn: sqlite3.Connection, session: str, types: Sequence[str], before_seq: int
) -> Iterator[str]:
    """The part digests (hex, in log order) of ``session``'s events of ``types`` before a seq."""
    marks = ", ".join("?" * len(types))
    for (parts,) in conn.execute(
        f"SELECT parts FROM events WHERE session = ? AND type IN ({marks}) AND seq < ?"
        " ORDER BY seq",
        (session, *types, before_seq),
    ):
        yield from (digest.hex() for digest in split_parts(parts))


def part_body(conn: sqlite3.Connection, event: StoredEvent, digest: str) -> bytes | None:
    """The one way to read a part: carried by the event when the reader loaded it, else looked up."""
    carried = event.parts.get(digest) if isinstance(event, LoadedEvent) else None
    return carried if carried is not None else payload_body(conn, digest)


@dataclass(frozen=True)
class ServeBasis:
    """What the open-time proof established about the file a session serves from.

    Served excerpts are proven with these (DESIGN.md, "Trust boundary"), never with what the
    file at the path says later: a different file there (another inode, another store id)
    or another format is not this basis, and serves nothing until it is proven like a first
    open.
    """

    file: tuple[int, int] | None  # file_identity of events.db at the proven open
    store_id: str
    vkey: str | None  # the log's verifier key (None when the signing key is unusable)

    @classmethod
    def of(cls, store: EventStore, file: tuple[int, int] | None) -> ServeBasis:
        try:
            vkey: str | None = store.vkey
        except KeyFileError:
            vkey = None
        return cls(file, store.store_id, vkey)

    def problem(self, conn: sqlite3.Connection) -> str | None:
        """Why the database on ``conn`` is not the one proven, or None."""
        found = (_meta_or_none(conn, "store_id"), _meta_or_none(conn, "format_version"))
        if found != (self.store_id, str(FORMAT_VERSION)):
            return (
                f"it is store {found[0]} format {found[1]}, but the open-time proof established "
                f"store {self.store_id} format {FORMAT_VERSION}"
            )
        return None


def reader_vkey(folder: Path, conn: sqlite3.Connection) -> str | None:
    """The key a reader proves served text with (projections.recall.Prover's ``vkey``): the
    log's verifier key, derived from the signing key; None when it cannot be read, so
    nothing is proven and nothing is served (FORMAT.md 20.5)."""
    store_id = _meta_or_none(conn, "store_id") or ""
    try:
        signer = read_signer(signing_key_path(folder), digests_v2.origin(store_id))
    except KeyFileError as exc:
        log.error("archive: served recall cannot be proven: %s", exc)
        return None
    return signer.vkey


def head_time(conn: sqlite3.Connection) -> str:
    """The time of the last event of the log on ``conn`` ('' when it is empty)."""
    row = conn.execute("SELECT time FROM events ORDER BY seq DESC LIMIT 1").fetchone()
    return str(row[0]) if row else ""


def head_seq(conn: sqlite3.Connection) -> int:
    """The last sequence number of the log on ``conn`` (0 when it is empty)."""
    row = conn.execute("SELECT seq FROM head WHERE id = 1").fetchone()
    return int(row[0]) if row else 0
