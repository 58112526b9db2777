"""Replay: rebuild every projection from the log, atomically, and check live ones against it.

:func:`rebuild` drops and recreates every projection and replays the whole log into them
inside ONE write transaction. SQLite's DDL is transactional (FTS5 tables included: their
shadow tables are ordinary tables), so a crash or kill at any point leaves the old
projections exactly as they were; the WAL frames of the unfinished transaction are
ignored on the next open.

The replay streams (:func:`iter_events`): the events in sequence order with their payload
and their parts' bodies (so projections never look a part up one at a time), only of the
types some projection handles, one event held at a time. Projections buffer rows and write
them in batches, ``last_seq`` is written once at the end, and a bulk load tells them so
(FTS5 then merges segments less often). Memory stays flat however long the log is; it
takes the same path when a projection catches up on open.

:func:`verify_projections` copies the database with SQLite's backup API (a consistent
snapshot, even while a writer appends), rebuilds the copy and compares each projection's
digest before and after.
"""

from __future__ import annotations

import sqlite3
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .digests import Envelope
from .projections import LoadedEvent, TableProjection, check_order, default_projections

if TYPE_CHECKING:
    from .store import EventStore

Progress = Callable[[int], None]
PROGRESS_EVERY = 10000
BULK_EVENTS = 10000  # from this many events behind, projections are told a bulk load follows

_EVENT_COLUMNS = (
    "e.seq, e.time, e.type, e.session, e.key, e.identity, e.payload, e.parts, e.chain, p.body"
)


class ReplayError(RuntimeError):
    """The log cannot be replayed (a payload is missing); the message names the event."""


def iter_events(
    conn: sqlite3.Connection,
    after_seq: int = 0,
    until_seq: int | None = None,
    types: Iterable[str] | None = None,
    part_types: Iterable[str] | None = None,
) -> Iterator[LoadedEvent]:
    """Events in sequence order with their payload and parts' bodies, streamed.

    Two statements walk ``events`` by rowid side by side (no sort, no per-part query): one
    yields each event (of ``types``, when given) with its payload, the other each part
    (``json_each`` over the envelope's part list, in list order) with its body, for events
    of ``part_types`` only when given. A part whose body is missing (an erasure) is simply
    not carried.
    """
    if types is not None and not set(types):
        return
    where, args = _range(after_seq, until_seq, types)
    events = conn.execute(
        f"SELECT {_EVENT_COLUMNS} FROM events e LEFT JOIN payloads p ON p.digest = e.payload{where}"
        " ORDER BY e.seq",
        args,
    )
    part_where, part_args = _range(
        after_seq, until_seq, part_types if part_types is not None else types
    )
    parts = iter(())
    if part_types is None or set(part_types):
        parts = conn.execute(
            "SELECT e.seq, j.value, q.body FROM events e JOIN json_each(e.parts) j"
            f" JOIN payloads q ON q.digest = j.value{part_where} AND e.parts != '[]'"
            " ORDER BY e.seq",
            part_args,
        )
    part = next(parts, None)
    for row in events:
        seq = row[0]
        carried: dict[str, bytes] = {}
        while part is not None and part[0] <= seq:
            if part[0] == seq:
                carried[part[1]] = part[2]
            part = next(parts, None)
        yield _loaded(row, carried)


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


def _loaded(row: Sequence[Any], parts: dict[str, bytes]) -> LoadedEvent:
    seq, time, type_, session, key, identity, payload, part_list, chain, body = row[:10]
    if body is None:
        raise ReplayError(f"event {seq}: its payload {payload} is missing from the payloads table")
    envelope = Envelope(seq, time, type_, session, key, identity, payload, part_list)
    return LoadedEvent(envelope, chain, body, parts)


def apply_events(
    conn: sqlite3.Connection,
    projections: Sequence[Any],
    *,
    until_seq: int,
    progress: Progress | None = None,
    source: sqlite3.Connection | None = None,
    types: Iterable[str] | None = None,
) -> int:
    """Bring every projection from its own ``last_seq`` to ``until_seq``; return events applied.

    Runs inside the caller's transaction; events are read from ``source`` (as-of replays a
    file's log into an in-memory database), by default from ``conn`` itself, and only of
    ``types`` when given (as-of needs no turns).
    :class:`TableProjection` instances get the fast path (reduce only the types they
    handle, flush batches, one ``last_seq`` write at the end); any other projection (the
    store's ``Projection`` protocol) gets ``apply`` per event.
    """
    check_order(projections)
    start = {id(p): p.last_seq(conn) for p in projections}
    behind = [p for p in projections if start[id(p)] < until_seq]
    if not behind:
        return 0
    generic = [p for p in behind if not isinstance(p, TableProjection)]
    handled = None if generic else set().union(*(p.handles for p in behind))
    if types is not None:
        handled = set(types) if handled is None else handled & set(types)
    with_parts = None if generic else set().union(*(p.part_types() for p in behind))
    if with_parts is not None and handled is not None:
        with_parts &= handled
    tables = [p for p in behind if isinstance(p, TableProjection)]
    steps: dict[str, list[tuple[Callable[[sqlite3.Connection, Any], None], int]]] = {}
    count = 0
    bulk = [p for p in tables if until_seq - start[id(p)] >= BULK_EVENTS]
    for projection in bulk:
        projection.begin_bulk(conn)
    try:
        for event in iter_events(
            source or conn, min(start[id(p)] for p in behind), until_seq, handled, with_parts
        ):
            todo = steps.get(event.type)
            if todo is None:
                todo = steps[event.type] = [
                    (p.reduce, start[id(p)])
                    if isinstance(p, TableProjection)
                    else (p.apply, start[id(p)])
                    for p in behind
                    if not isinstance(p, TableProjection) or event.type in p.handles
                ]
            seq = event.seq
            for step, after in todo:
                if seq > after:
                    step(conn, event)
            count += 1
            if progress is not None and count % PROGRESS_EVERY == 0:
                progress(seq)
        for projection in tables:
            projection.flush(conn)
            projection.set_last_seq(conn, until_seq)
        for projection in bulk:
            projection.end_bulk(conn)
    finally:
        for projection in tables:
            projection.discard()
    if progress is not None:
        progress(until_seq)
    return count


def head_seq(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT seq FROM head WHERE id = 1").fetchone()
    return int(row[0]) if row else 0


def rebuild_connection(
    conn: sqlite3.Connection, projections: Sequence[Any], progress: Progress | None = None
) -> int:
    """Drop, recreate and replay ``projections`` on ``conn`` (inside the caller's transaction)."""
    cannot = [getattr(p, "name", repr(p)) for p in projections if not hasattr(p, "drop")]
    if cannot:
        raise ReplayError(f"projections without drop() cannot be rebuilt from scratch: {cannot}")
    for projection in reversed(projections):
        projection.drop(conn)
    for projection in projections:
        projection.create(conn)
    return apply_events(conn, projections, until_seq=head_seq(conn), progress=progress)


def rebuild(store: EventStore, progress: Progress | None = None) -> int:
    """Rebuild every projection of ``store`` from scratch in one transaction; events replayed.

    Uses the store's projections, or the default set when it was opened without any.
    ``progress`` is called with the sequence number reached, every few thousand events.
    """
    projections = store.projections or default_projections(store.conn)
    with store.transaction():
        return rebuild_connection(store.conn, projections, progress)


def projection_digests(
    conn: sqlite3.Connection, projections: Sequence[Any] | None = None
) -> dict[str, str]:
    """Each projection's digest (the default set when none are given), by name."""
    return {
        p.name: p.digest(conn)
        for p in (default_projections(conn) if projections is None else projections)
    }


@dataclass(frozen=True)
class ProjectionCheck:
    """Live projections compared with a replay of the same snapshot of the log."""

    ok: bool
    live: dict[str, str]
    rebuilt: dict[str, str]
    mismatched: list[str]
    head: int = 0
    last_seq: dict[str, int] = field(default_factory=dict)  # live last_seq per projection
    events: int = 0  # events replayed

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "live": self.live,
            "rebuilt": self.rebuilt,
            "mismatched": self.mismatched,
            "head": self.head,
            "last_seq": self.last_seq,
            "events": self.events,
        }


def _live_digest(conn: sqlite3.Connection, projection: Any) -> str:
    try:
        return str(projection.digest(conn))
    except sqlite3.OperationalError as exc:  # the projection was never created in this archive
        return f"unavailable: {exc}"


def verify_projections(
    archive_folder: Path,
    progress: Progress | None = None,
    *,
    projections: Sequence[Any] | None = None,
    scratch_dir: Path | None = None,
) -> ProjectionCheck:
    """Copy ``<archive_folder>/events.db``, rebuild the copy, compare digests with the live ones.

    The live database is only read (through the backup API). A projection is mismatched
    when its digests differ or its ``last_seq`` is not the head (it has not caught up).
    The scratch copy lives in ``scratch_dir`` (the system temporary folder by default).
    """
    from .store import DB_NAME, connect

    source_path = Path(archive_folder) / DB_NAME
    if not source_path.exists():
        raise FileNotFoundError(f"no archive at {source_path}")
    with tempfile.TemporaryDirectory(prefix="hermes-archive-verify-", dir=scratch_dir) as scratch:
        copy_path = Path(scratch) / DB_NAME  # in a folder only we can read (mode 0700)
        copy = sqlite3.connect(copy_path, isolation_level=None)
        try:
            source = connect(source_path, readonly=True)
            try:
                source.backup(copy)
            finally:
                source.close()
            projections = list(default_projections(copy) if projections is None else projections)
            live = {p.name: _live_digest(copy, p) for p in projections}
            last = {p.name: p.last_seq(copy) if _has_state(copy) else 0 for p in projections}
            head = head_seq(copy)
            # a throw-away copy: no journal, no fsync (it is deleted, never rolled back)
            copy.execute("PRAGMA journal_mode = OFF")
            copy.execute("PRAGMA synchronous = OFF")
            copy.execute("BEGIN IMMEDIATE")
            events = rebuild_connection(copy, projections, progress)
            rebuilt = projection_digests(copy, projections)
            copy.execute("COMMIT")
        finally:
            copy.close()
    mismatched = [
        name for name in rebuilt if live.get(name) != rebuilt[name] or last.get(name) != head
    ]
    return ProjectionCheck(not mismatched, live, rebuilt, mismatched, head, last, events)


def _has_state(conn: sqlite3.Connection) -> bool:
    return (
        conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'projection_state'"
        ).fetchone()
        is not None
    )
