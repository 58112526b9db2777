"""Time travel: what the archive knew at a sequence number or a moment.

:func:`as_of` replays the log prefix up to the chosen event into a private in-memory
SQLite database with the very projection classes the live archive uses, then asks that
database the questions the live one would answer, so its answer is the projection built
from the log prefix (the property tests check it against the live projections as they stood
after every event). Only the event types the answer depends on are read (memory writes,
session starts and switches, checkpoints, recalls served): turns, the bulk of any log, are
skipped, so going back in a long archive costs a scan of its envelopes, not a replay.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from ..domain.clock import format_time, parse_time
from ..errors import InvalidRequest
from ..projections.base import TableProjection
from ..projections.builtin import (
    CheckpointsProjection,
    MemoryProjection,
    RecallServed,
    RecallsServedProjection,
    SessionLink,
    SessionsProjection,
    lineage,
    memory_state,
    recalls_served,
    session_links,
)
from ..projections.runner import apply_events
from ..storage.store import head_seq

if TYPE_CHECKING:
    from ..storage.store import EventStore


#: what an as-of answer reads; SessionsProjection only for its session_links (no turns)
ASOF_TYPES = frozenset(
    {
        "session_started",
        "session_switched",
        "memory_write",
        "checkpoint",
        "checkpoint_failed",
        "recall_served",
    }
)


def asof_projections() -> list[TableProjection]:
    """The projections an as-of answer is read from, in the order they are applied."""
    return [
        SessionsProjection(),
        MemoryProjection(),
        CheckpointsProjection(),
        RecallsServedProjection(),
    ]


#: projections an as-of rebuilds completely (their digests equal the live ones at that seq)
COMPLETE = ("memory", "checkpoints", "recalls_served")


@dataclass(frozen=True)
class AsOf:
    """The archive's view right after event ``seq`` (0: before the first event)."""

    seq: int
    time: str | None  # the time of event ``seq``
    session: str | None  # the session asked about, if any
    memory: dict[str, list[str]]  # target -> entries, as MEMORY.md / USER.md held them
    lineage: list[SessionLink]  # from ``session`` back to where its conversation began
    links: list[SessionLink]  # every session switch so far (of ``session``, when given)
    recalls: list[RecallServed]  # recall served so far (to ``session``, when given)
    authors: list[TurnAuthor]  # who wrote turns so far (in ``session``), as the host said
    digests: dict[str, str]  # digest of memory, checkpoints and recalls served at ``seq``

    @property
    def recall(self) -> RecallServed | None:
        """What the provider last returned as recall (for the turn in progress at ``seq``)."""
        return self.recalls[-1] if self.recalls else None


@dataclass(frozen=True)
class TurnAuthor:
    """A turn author as the host stated it, with how many turns and the last one by ``seq``."""

    id: str | None
    name: str | None
    is_bot: bool
    turns: int
    last_seq: int


def turn_authors(conn: sqlite3.Connection, until: int, session: str | None) -> list[TurnAuthor]:
    """Turn authors up to ``until``, from the recall projection's author rows (one per turn,
    never changed once written, so the rows up to a seq are exactly what the log said then)."""
    if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'recall_authors'").fetchone():
        return []
    sql = (
        "SELECT a.author_id, a.author_name, a.is_bot, count(*), max(a.seq)"
        " FROM recall_authors a JOIN events e ON e.seq = a.seq WHERE a.seq <= ?"
    )
    args: list[object] = [until]
    if session is not None:
        sql += " AND e.session = ?"
        args.append(session)
    sql += " GROUP BY a.author_id, a.author_name, a.is_bot ORDER BY max(a.seq)"
    return [
        TurnAuthor(row[0], row[1], bool(row[2]), int(row[3]), int(row[4]))
        for row in conn.execute(sql, args)
    ]


def resolve_seq(
    conn: sqlite3.Connection, *, seq: int | None = None, time: str | datetime | None = None
) -> int:
    """The prefix's last event: ``seq`` itself, the last appended by ``time``, or the head.

    For a time, the prefix ends before the first event stamped later than it, so the answer
    is always a prefix of the log even if the clock ever stepped back.
    """
    head = head_seq(conn)
    if seq is not None and time is not None:
        raise InvalidRequest("give a sequence number or a time, not both")
    if seq is not None:
        if not 0 <= seq <= head:
            raise InvalidRequest(f"seq {seq} is outside the log (0 .. {head})")
        return seq
    if time is None:
        return head
    if isinstance(time, datetime):
        moment = format_time(time if time.tzinfo else time.replace(tzinfo=timezone.utc))
    else:
        moment = format_time(parse_time(time))  # naive means UTC, as everywhere in the archive
    row = conn.execute("SELECT min(seq) FROM events WHERE time > ?", (moment,)).fetchone()
    return head if row[0] is None else int(row[0]) - 1


def as_of(
    store_or_conn: EventStore | sqlite3.Connection,
    *,
    seq: int | None = None,
    time: str | datetime | None = None,
    session: str | None = None,
) -> AsOf:
    """Memory, lineage and recalls served as they stood at ``seq`` or ``time`` (default: now)."""
    conn = store_or_conn if isinstance(store_or_conn, sqlite3.Connection) else store_or_conn.conn
    until = resolve_seq(conn, seq=seq, time=time)
    scratch = sqlite3.connect(":memory:", isolation_level=None)
    try:
        projections = asof_projections()
        scratch.execute("BEGIN")
        # parts arrive carried with their events; one the source no longer holds (erased)
        # is looked up here and found absent, never read from a table that is not there
        scratch.execute("CREATE TEMP TABLE payloads (digest BLOB PRIMARY KEY, body BLOB)")
        for projection in projections:
            projection.create(scratch)
        apply_events(scratch, projections, until_seq=until, source=conn, types=ASOF_TYPES)
        scratch.execute("COMMIT")
        answer = read_asof(scratch, until, event_time(conn, until), session)
        return replace(answer, authors=turn_authors(conn, until, session))
    finally:
        scratch.close()


def read_asof(conn: sqlite3.Connection, seq: int, time: str | None, session: str | None) -> AsOf:
    """Read an as-of answer from projections (the scratch ones, or live ones in tests)."""
    return AsOf(
        seq=seq,
        time=time,
        session=session,
        memory=memory_state(conn),
        lineage=lineage(conn, session) if session is not None else [],
        links=session_links(conn, session),
        recalls=recalls_served(conn, session),
        authors=turn_authors(conn, seq, session),  # none in a scratch database: see as_of
        digests={p.name: p.digest(conn) for p in asof_projections() if p.name in COMPLETE},
    )


def event_time(conn: sqlite3.Connection, seq: int) -> str | None:
    row = conn.execute("SELECT time FROM events WHERE seq = ?", (seq,)).fetchone()
    return str(row[0]) if row else None
