"""Replay: rebuild every projection from the log, atomically, and check live ones against it.

:func:`rebuild` drops and recreates every projection and replays the whole log into them
inside ONE write transaction. SQLite's DDL is transactional (FTS5 tables included: their
shadow tables are ordinary tables), so a crash or kill at any point leaves the old
projections exactly as they were; the WAL frames of the unfinished transaction are
ignored on the next open.

The replay streams through the projection runner (:mod:`archive_provider.projections.
runner`): one pass over the events with their parts' bodies, batched writes, one
``last_seq`` write at the end; memory stays flat however long the log is. A projection
catching up on open takes the same path.

:func:`verify_projections` copies the database with SQLite's backup API (a consistent
snapshot, even while a writer appends), rebuilds the copy and compares each projection's
digest before and after.
"""

from __future__ import annotations

import sqlite3
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InvalidRequest
from ..projections.registry import default_projections
from ..projections.runner import Progress, apply_events
from ..storage.store import head_seq
from ..storage.store_pieces import fill_tile_inner

if TYPE_CHECKING:
    from ..storage.store import EventStore


class ReplayError(InvalidRequest):
    """These projections cannot be rebuilt from scratch; the message names them."""


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
    An archive made before ``tile_inner`` existed also gets the inner rows of its full
    leaf tiles (FORMAT.md 14.5), in the same transaction.
    """
    projections = store.projections or default_projections(store.conn)
    with store.transaction():
        if store.tile_inner:
            fill_tile_inner(store.conn)
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
    from ..storage.store import DB_NAME, connect

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
