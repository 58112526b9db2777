"""The projection contract: what every projection is, and the state row they share.

A projection owns a few tables in the archive database, is updated inside the append
transaction of the events it reflects, records its last applied sequence number in
``projection_state`` in that same transaction, and reports a digest of its state so
``verify --projections`` can compare live state with a replay (docs/DESIGN.md,
"Projections").
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from blake3 import blake3

from ..domain.evidence import bindable_text
from ..format.canonical import canonical_bytes, canonical_text, decode
from ..format.events import StoredEvent
from ..storage.sql import in_chunks
from ..storage.store import Projection, iter_events, part_body

STATE_DDL = (
    "CREATE TABLE IF NOT EXISTS projection_state (name TEXT PRIMARY KEY, last_seq INTEGER NOT NULL,"
    " version INTEGER NOT NULL DEFAULT 0)"
)
DIGEST_DOMAIN = b"hermes-archive/v1/projection\x00"


def event_part(conn: sqlite3.Connection, event: StoredEvent, digest: str) -> Any:
    """A part the event names, decoded: from the event if it carries it, else the table."""
    body = part_body(conn, event, digest)
    return None if body is None else decode(body)


def event_text(conn: sqlite3.Connection, event: StoredEvent, digest: Any) -> str:
    value = event_part(conn, event, digest) if isinstance(digest, str) else None
    return bindable_text(
        value if isinstance(value, str) else "" if value is None else canonical_text(value)
    )


class TableProjection(Projection):
    """The one projection contract's implementation: every projection subclasses it.

    :class:`~archive_provider.storage.store.Projection` is the contract the store calls
    (``create``, ``apply``, ``last_seq``); this base adds what the runner and replay need:
    DDL, version and state row, dispatch by event type, batches, digest over ordered rows.

    Subclasses set ``tables`` (table -> ORDER BY that makes its rows deterministic),
    ``handles`` (event types ``reduce`` is called for; other events only move
    ``last_seq``), ``reads_parts`` (the handled types whose parts' bodies ``reduce`` reads;
    a replay fetches no others) and ``requires`` (projections whose tables ``reduce``
    reads, which must be applied before it for the same event). ``reduce`` may buffer
    rows; ``flush`` writes them, and ``apply`` flushes after every event.

    Inside the store's append transaction ``last_seq`` is written once, by :meth:`finish`
    just before the commit (the rows and the tracking record commit together, or neither
    does); ``apply`` only remembers how far it got.
    """

    name = ""
    version = 1
    ddl: Sequence[str] = ()
    tables: dict[str, str] = {}
    #: table -> select list for the digest, when it is not ``*`` (e.g. to include a rowid)
    digest_select: dict[str, str] = {}
    handles: frozenset[str] = frozenset()
    reads_parts: frozenset[str] | None = None  # None: every handled type
    requires: tuple[str, ...] = ()
    #: the last seq applied in the open transaction, not written to projection_state yet
    _moved: int | None = None

    def part_types(self) -> frozenset[str]:
        return self.handles if self.reads_parts is None else self.reads_parts & self.handles

    def create(self, conn: sqlite3.Connection) -> None:
        """Create the tables; a projection stored by another version is dropped first."""
        ensure_state_table(conn)
        row = conn.execute(
            "SELECT version FROM projection_state WHERE name = ?", (self.name,)
        ).fetchone()
        if row is not None and row[0] != self.version:
            self.drop(conn)
        for statement in self.ddl:
            conn.execute(statement)
        conn.execute(
            "INSERT OR IGNORE INTO projection_state (name, last_seq, version) VALUES (?, 0, ?)",
            (self.name, self.version),
        )

    def drop(self, conn: sqlite3.Connection) -> None:
        for table in self.tables:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
        ensure_state_table(conn)
        conn.execute("DELETE FROM projection_state WHERE name = ?", (self.name,))

    def apply(self, conn: sqlite3.Connection, event: StoredEvent) -> None:
        """Apply one event inside the append transaction: its rows now (later builds in the
        transaction read them), ``last_seq`` in :meth:`finish`."""
        if event.type in self.handles:
            try:
                self.reduce(conn, event)
                self.flush(conn)
            except BaseException:
                moved = self._moved  # the events before this one stand; the store rolls it back
                self.discard()
                self._moved = moved
                raise
        self._moved = event.seq

    def finish(self, conn: sqlite3.Connection) -> None:
        """Before the commit: write what is buffered, then ``last_seq``, once per transaction."""
        try:
            self.flush(conn)
            if self._moved is not None:
                self.set_last_seq(conn, self._moved)
        finally:
            self.discard()  # the next transaction may follow another process's appends

    def reduce(self, conn: sqlite3.Connection, event: StoredEvent) -> None:
        raise NotImplementedError

    def flush(self, conn: sqlite3.Connection) -> None:
        """Write rows ``reduce`` buffered; nothing to do unless a subclass buffers."""

    def discard(self) -> None:
        """Forget buffered rows, anything cached from the database and the unwritten
        ``last_seq`` (end of a transaction); subclasses that buffer extend it."""
        self._moved = None

    def begin_bulk(self, conn: sqlite3.Connection) -> None:
        """Many events follow in this transaction (a replay, a long catch-up): tune for it."""

    def end_bulk(self, conn: sqlite3.Connection) -> None:
        """Undo :meth:`begin_bulk` before the transaction ends."""

    def prepare_forget(self, conn: sqlite3.Connection, seqs: frozenset[int]) -> None:
        """Before an erasure's tombstones: take what :meth:`forget` will need of the bodies
        about to go (an index forgets a row only when told the text it indexed)."""

    def forget(self, conn: sqlite3.Connection, seqs: frozenset[int]) -> bool:
        """Make the tables what a replay gives now that payloads of ``seqs`` are erased.

        Called in the erasure transaction, after the tombstones (docs/AUDIT.md): the log
        then reads as a replay would read it (erased parts absent, events whose body went
        skipped). ``seqs`` are every event that named an erased payload. Done in place, at a
        cost that follows what was erased, it returns True; False (this default) asks the
        caller to rebuild the projection from the log, which is always right but costs the
        events it handles.
        """
        return False

    def reduce_again(self, conn: sqlite3.Connection, seqs: Iterable[int]) -> None:
        """For tables keyed by their event's ``seq``: drop the rows of ``seqs`` and reduce
        those events again as the log now reads (an erased body: no row, like a replay)."""
        mine = sorted(seqs)
        for table in self.tables:
            for marks, chunk in in_chunks(mine):
                conn.execute(f"DELETE FROM {table} WHERE seq IN ({marks})", chunk)
        for event in events_at(conn, mine, self.handles, self.part_types()):
            self.reduce(conn, event)
        self.flush(conn)

    def set_last_seq(self, conn: sqlite3.Connection, seq: int) -> None:
        conn.execute("UPDATE projection_state SET last_seq = ? WHERE name = ?", (seq, self.name))

    def last_seq(self, conn: sqlite3.Connection) -> int:
        row = conn.execute(
            "SELECT last_seq FROM projection_state WHERE name = ?", (self.name,)
        ).fetchone()
        return int(row[0]) if row else 0

    def digest(self, conn: sqlite3.Connection) -> str:
        """BLAKE3 over the name, version and every row of every table, in a fixed order."""
        hasher = blake3(DIGEST_DOMAIN + f"{self.name}\x00{self.version}".encode())
        for table, order in self.tables.items():
            select = self.digest_select.get(table, "*")
            hasher.update(b"\x00table\x00" + table.encode() + b"\x00")
            for row in conn.execute(f"SELECT {select} FROM {table} ORDER BY {order}"):
                values = [bytes(v).hex() if isinstance(v, (bytes, memoryview)) else v for v in row]
                hasher.update(canonical_bytes(values) + b"\n")
        return hasher.hexdigest()


def events_at(
    conn: sqlite3.Connection,
    seqs: Iterable[int],
    types: Iterable[str] | None = None,
    part_types: Iterable[str] | None = None,
) -> Iterator[StoredEvent]:
    """The events at ``seqs`` (of ``types``), read as a replay reads them: one range read per
    run of consecutive seqs, erased parts absent, an event whose body was erased skipped."""
    ordered = sorted(set(seqs))
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        yield from iter_events(conn, ordered[start] - 1, ordered[end], types, part_types)
        start = end + 1


def ensure_state_table(conn: sqlite3.Connection) -> None:
    conn.execute(STATE_DDL)
    columns = {row[1] for row in conn.execute("PRAGMA table_info(projection_state)")}
    if "version" not in columns:  # written before projections had versions: rebuild them all
        conn.execute("ALTER TABLE projection_state ADD COLUMN version INTEGER NOT NULL DEFAULT 0")


def check_order(projections: Iterable[Any]) -> None:
    """Refuse a list where a projection comes before one it reads (see ``requires``)."""
    seen: set[str] = set()
    names = {getattr(p, "name", "") for p in projections}
    for projection in projections:
        for needed in getattr(projection, "requires", ()):
            if needed not in seen:
                where = "after" if needed in names else "with"
                raise ValueError(
                    f"projection {projection.name!r} must be applied {where} {needed!r}"
                )
        seen.add(projection.name)
