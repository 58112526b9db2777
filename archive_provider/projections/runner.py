"""The projection runner: pulls events from the store and brings projections up to the log.

One pass serves every projection that is behind: the events in sequence order with their
payload and their parts' bodies (:func:`archive_provider.storage.store.iter_events`, so
projections never look a part up one at a time), only of the types some projection
handles, one event held at a time. Projections buffer rows and write them in batches,
``last_seq`` is written once at the end, and a long pass tells them so (FTS5 then merges
segments less often). Memory stays flat however long the log is. The store takes this
path when it catches up on open (it is handed a :class:`ProjectionSet`), the replay when
it rebuilds, as-of when it replays a prefix.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..storage.store import iter_events
from .base import TableProjection, check_order

Progress = Callable[[int], None]
PROGRESS_EVERY = 10000
BULK_EVENTS = 10000  # from this many events behind, projections are told a bulk load follows


class ProjectionSet(list[TableProjection]):
    """Projections in the order they are applied, which catch up through the runner."""

    def catch_up(self, conn: sqlite3.Connection, until_seq: int) -> int:
        """Bring every projection to ``until_seq`` (the store's catch-up on open)."""
        return apply_events(conn, self, until_seq=until_seq)


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
    handle, flush batches, one ``last_seq`` write at the end); any other implementation of
    the store's ``Projection`` contract gets ``apply`` per event.
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


def to_rebuild(conn: sqlite3.Connection, projections: Sequence[Any]) -> list[str]:
    """The names of ``projections`` the next writable open must rebuild from the log: those
    stored by another version of the projection (a release changed it) or not stored yet.

    Read only, so an opener that must not hold the write lock for a whole rebuild (the
    retention worker) can tell before it opens for writing and leave the rebuild to the
    writer.
    """
    try:
        stored = dict(conn.execute("SELECT name, version FROM projection_state").fetchall())
    except sqlite3.OperationalError:  # no state table, or one written before versions
        return [p.name for p in projections]
    return [p.name for p in projections if stored.get(p.name) != getattr(p, "version", None)]


def prepare_forgetting(
    conn: sqlite3.Connection, projections: Sequence[Any], seqs: frozenset[int]
) -> None:
    """Before an erasure's tombstones, in its transaction: each projection takes what its
    in-place forget needs of the bodies about to go (:meth:`TableProjection.prepare_forget`)."""
    for projection in projections:
        prepare = getattr(projection, "prepare_forget", None)
        if prepare is not None:
            prepare(conn, seqs)


def forget_erased(
    conn: sqlite3.Connection, projections: Sequence[Any], seqs: frozenset[int], head: int
) -> list[str]:
    """Have every projection forget what an erasure removed (inside its transaction).

    Each forgets in place (:meth:`TableProjection.forget`); one that cannot is dropped and
    replayed from the log on the spot, before the projections after it (which may read its
    tables) forget; ``head`` is the erasure event's seq (the transaction's head). Returns the
    names of those rebuilt.
    """
    check_order(projections)
    rebuilt = []
    for index, projection in enumerate(projections):
        forget = getattr(projection, "forget", None)
        if forget is not None and forget(conn, seqs):
            continue
        projection.drop(conn)
        projection.create(conn)
        apply_events(conn, projections[: index + 1], until_seq=head)
        rebuilt.append(projection.name)
    return rebuilt
