"""The archive's own projections: sessions, memory, recall, checkpoints, recalls served.

Each follows the contract of :mod:`.base` and is listed by :mod:`.registry`; the queries
over their tables live beside them here (and in :mod:`.recall` for search).

Determinism is what makes digests comparable: every row, including FTS5 rowids, is a
function of the log prefix alone, never of when or in which batches it was applied. A
projection's ``version`` is bumped whenever its tables or reducer change; a stored
projection of another version is dropped on open and rebuilt by the catch-up.

Reducers never raise on odd payloads (a missing key reads as empty) and store text with
lone surrogates replaced, so no event the log accepted can make a projection, or a replay,
fail.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from blake3 import blake3

from ..domain.evidence import bindable_text, message_text
from ..domain.memory_state import Entry, MemoryWrite, apply_write
from ..format.canonical import canonical_text, decode
from ..format.events import LoadedEvent, StoredEvent
from ..storage.sql import in_chunks, select_in
from ..storage.store import EventStore, payload_body, session_part_digests
from .base import TableProjection, event_part, event_text, events_at


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _digests(value: Any) -> list[str]:
    return [item for item in value if isinstance(item, str)] if isinstance(value, list) else []


def digest_key(digest: str) -> bytes | str:
    """A hex digest as projections store it: 32 bytes, half the hex (kept as text if odd)."""
    try:
        raw = bytes.fromhex(digest)
    except ValueError:
        return digest
    return raw if len(raw) == 32 and raw.hex() == digest else digest


def digest_hex(value: bytes | str) -> str:
    """A digest read back from a projection, as hex (what the API and the log's bodies use)."""
    return value.hex() if isinstance(value, bytes) else str(value)


#: The one FTS5 tokenizer: recall_fts indexes with it and search tokenizes queries with it.
TOKENIZER = "unicode61 remove_diacritics 2"

#: The recall index's content (FTS5 external content, docs/FORMAT.md 17): the text of a
#: message row is read from its payload, so the archive holds it once; ``recall_docs.text``
#: holds only what the payload cannot give by ``json_extract`` (memory entries, content made
#: of parts, text with NUL or lone surrogates). ``part`` is the message's position in its
#: event's part list (v2: 32 bytes each; v1: a JSON list of hex digests), so a row names
#: its payload in a byte or two. Once a body is erased its text reads as NULL, so an erasure
#: takes the rows out of the index before it clears the bodies
#: (:meth:`RecallProjection.prepare_forget`).
RECALL_TEXT_VIEW = (
    "CREATE VIEW IF NOT EXISTS recall_text AS SELECT d.rowid AS rowid,"
    " coalesce(d.text, json_extract(CAST(p.body AS TEXT), '$.content')) AS text,"
    " CASE WHEN d.rowid < 0 THEN 'memory' ELSE e.type END AS kind,"
    " CASE WHEN d.rowid < 0 THEN '' ELSE e.session END AS session, d.seq AS seq,"
    " coalesce(d.role, json_extract(CAST(p.body AS TEXT), '$.role')) AS role"
    " FROM recall_docs d LEFT JOIN events e ON e.seq = d.seq"
    " LEFT JOIN payloads p ON p.digest = CASE WHEN typeof(e.parts) = 'blob'"
    " THEN substr(e.parts, 32 * d.part + 1, 32) ELSE json_extract(e.parts, '$[' || d.part || ']')"
    " END"
)


# -- sessions --------------------------------------------------------------------------

#: session_links.relation for each switch reason; lineage follows these (not resume/reset/rewind)
LINEAGE_RELATIONS = frozenset({"start", "compression", "branch", "switch"})


def link_relation(body: Mapping[str, Any]) -> str:
    """What a session switch means for lineage, from the host's flags and reason."""
    if body.get("rewound"):
        return "rewind"
    if body.get("reset"):
        return "reset"
    reason = body.get("reason")
    if reason in ("compression", "branch", "resume"):
        return str(reason)
    return "switch"


class SessionsProjection(TableProjection):
    """Sessions, their counters and their lineage across switches, resets and compressions.

    ``transcript`` is the transcript as last archived, kept so the next turn's delta can be
    computed. A rewind (``/undo``) leaves it as it is until the next hand-off shows which
    messages the user rewound; ``turns_rewound`` then moves those rows to
    ``transcript_rewound`` (still in the log, no longer the current conversation). Digests
    are stored as 32 bytes (:func:`digest_key`), read back as hex.
    """

    name = "sessions"
    version = 4
    ddl = (
        "CREATE TABLE IF NOT EXISTS sessions (session TEXT PRIMARY KEY,"
        " first_seq INTEGER NOT NULL, last_seq INTEGER NOT NULL, started_at TEXT, ended_at TEXT,"
        " turns INTEGER NOT NULL DEFAULT 0, memory_writes INTEGER NOT NULL DEFAULT 0,"
        " checkpoints INTEGER NOT NULL DEFAULT 0, platform TEXT, agent_context TEXT)",
        "CREATE TABLE IF NOT EXISTS session_links (seq INTEGER PRIMARY KEY, session TEXT NOT NULL,"
        " parent TEXT NOT NULL, relation TEXT NOT NULL, reason TEXT, reset INTEGER NOT NULL,"
        " rewound INTEGER NOT NULL)",
        "CREATE INDEX IF NOT EXISTS session_links_session ON session_links(session, seq)",
        "CREATE TABLE IF NOT EXISTS transcript (session TEXT NOT NULL, position INTEGER NOT NULL,"
        " digest BLOB NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (session, position))"
        " WITHOUT ROWID",
        "CREATE TABLE IF NOT EXISTS transcript_rewound (rewound_seq INTEGER NOT NULL,"
        " position INTEGER NOT NULL, session TEXT NOT NULL, digest BLOB NOT NULL,"
        " seq INTEGER NOT NULL, PRIMARY KEY (rewound_seq, position)) WITHOUT ROWID",
        "CREATE INDEX IF NOT EXISTS transcript_rewound_seq ON transcript_rewound(seq)",
    )
    tables = {
        "sessions": "session",
        "session_links": "seq",
        "transcript": "session, position",
        "transcript_rewound": "rewound_seq, position",
    }
    handles = frozenset(
        {
            "session_started",
            "session_switched",
            "session_ended",
            "turn",
            "memory_write",
            "checkpoint",
            "turns_rewound",
        }
    )

    reads_parts: frozenset[str] = frozenset()
    batch_events = 5000
    _COUNTERS = {"turn": 2, "memory_write": 3, "checkpoint": 4}

    def __init__(self) -> None:
        # buffered until flush: session -> [first_seq, last_seq, turns, memory_writes, checkpoints]
        self._counts: dict[str, list[int]] = {}
        self._transcript: list[tuple[str, int, bytes | str, int]] = []
        self._lengths: dict[str, int] = {}  # transcript length per session, once read or written
        #: (turns, memory writes) read from ``sessions`` in the open transaction, until a
        #: flush changes the table: a group's builds read each session's row once
        self._stored: dict[str, tuple[int, int]] = {}
        self._rows_written = 0  # how often transcript rows were written out
        self._deferring = False  # in a deferred apply: the buffer waits for finish

    def reduce(self, conn: sqlite3.Connection, event: StoredEvent) -> None:
        kind, session, seq = event.type, event.session, event.seq
        counts = self._counts.get(session)
        if counts is None:
            counts = self._counts[session] = [seq, seq, 0, 0, 0]
        counts[1] = seq
        slot = self._COUNTERS.get(kind)
        if slot is not None:
            counts[slot] += 1
        if kind == "turn":
            body = _mapping(event.body)
            start = body.get("start")
            start = start if isinstance(start, int) and start >= 0 else 0
            self._record_transcript(conn, session, start, event.messages, seq)
        elif kind == "session_started":
            body = _mapping(event.body)
            conn.execute(
                "INSERT INTO sessions (session, first_seq, last_seq, started_at, platform,"
                " agent_context) VALUES (?1, ?2, ?2, ?3, ?4, ?5) ON CONFLICT(session) DO UPDATE"
                " SET started_at = coalesce(started_at, excluded.started_at),"
                " platform = excluded.platform, agent_context = excluded.agent_context",
                (
                    session,
                    seq,
                    event.time,
                    _text_or_none(body.get("platform")),
                    _text_or_none(body.get("agent_context")),
                ),
            )
            parent = body.get("parent_session_id")
            if isinstance(parent, str) and parent:
                conn.execute(
                    "INSERT INTO session_links VALUES (?, ?, ?, 'start', 'start', 0, 0)",
                    (seq, session, bindable_text(parent)),
                )
        elif kind == "session_switched":
            body = _mapping(event.body)
            parent = body.get("parent_session_id") or body.get("from") or ""
            conn.execute(
                "INSERT INTO session_links VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    seq,
                    session,
                    bindable_text(str(parent)),
                    link_relation(body),
                    _text_or_none(body.get("reason")),
                    int(bool(body.get("reset"))),
                    int(bool(body.get("rewound"))),
                ),
            )
        elif kind == "turns_rewound":
            start = _mapping(event.body).get("from_message")
            if isinstance(start, int) and start >= 0:
                self._rewind_transcript(conn, session, start, seq)
        elif kind == "session_ended":
            conn.execute(
                "INSERT INTO sessions (session, first_seq, last_seq, ended_at)"
                " VALUES (?1, ?2, ?2, ?3) ON CONFLICT(session) DO UPDATE SET"
                " ended_at = excluded.ended_at",
                (session, seq, event.time),
            )
        if not self._deferring and (
            len(self._counts) >= self.batch_events or len(self._transcript) >= self.batch_events
        ):
            self.flush(conn)

    def apply(self, conn: sqlite3.Connection, event: StoredEvent) -> None:
        """Inside the append transaction a turn's counters and transcript rows are buffered
        until :meth:`finish` (or until the store settles the projection before a build reads
        its tables), so a group commit writes them with one statement each, not a savepoint,
        an upsert and an insert per turn. Other events are applied at once.

        A turn that fails leaves the buffer as it was before it (the buffer is not written
        out by size here: it holds what the transaction appends); only a turn that rewrites
        the transcript writes the rows before it and deletes those it replaces at once
        (applying it again gives the same rows, so a catch-up from ``last_seq`` repairs a
        failure after that delete).
        """
        if not self.defers(event.type):
            super().apply(conn, event)
            return
        session = event.session
        counts = self._counts.get(session)
        kept = (len(self._transcript), None if counts is None else list(counts))
        length, written = self._lengths.get(session), self._rows_written
        self._deferring = True
        try:
            self.reduce(conn, event)
        except BaseException:
            # rows written out before a rewrite are earlier turns': only this turn's go
            del self._transcript[0 if self._rows_written != written else kept[0] :]
            if kept[1] is None:
                self._counts.pop(session, None)
            else:
                self._counts[session] = kept[1]
            if length is None:
                self._lengths.pop(session, None)
            else:
                self._lengths[session] = length
            raise
        finally:
            self._deferring = False
        self._moved = event.seq

    @staticmethod
    def defers(event_type: str) -> bool:
        """Whether :meth:`apply` only buffers this event's rows until :meth:`finish`: a turn."""
        return event_type == "turn"

    def counters(self, conn: sqlite3.Connection, session: str) -> tuple[int, int]:
        """(turns, memory writes) of ``session`` as a build in the open transaction sees
        them: the table's row (read once per transaction) plus the turns buffered."""
        stored = self._stored.get(session)
        if stored is None:
            stored = session_counters(conn, session)
            if conn.in_transaction:  # outside one, another process may write next
                self._stored[session] = stored
        counts = self._counts.get(session)
        return (stored[0] + counts[2], stored[1]) if counts else stored

    def buffered_tail(self, session: str) -> tuple[int, str] | None:
        """The last transcript row of ``session`` buffered and not written yet (position,
        digest): it is the session's last (a rewrite writes the buffer before it deletes)."""
        if session not in self._counts:
            return None
        for name, position, digest, _ in reversed(self._transcript):
            if name == session:
                return position, digest_hex(digest)
        return None

    def _record_transcript(
        self, conn: sqlite3.Connection, session: str, start: int, digests: list[str], seq: int
    ) -> None:
        """Positions from ``start`` on become ``digests``; an append (usual) deletes nothing."""
        length = self._lengths.get(session)
        if length is None:
            row = conn.execute(
                "SELECT max(position) FROM transcript WHERE session = ?", (session,)
            ).fetchone()
            length = -1 if row[0] is None else int(row[0])
            length += 1
        if start < length:  # the host rewrote its transcript: drop what this turn replaces
            self._flush_transcript(conn)
            conn.execute(
                "DELETE FROM transcript WHERE session = ? AND position >= ?", (session, start)
            )
        self._transcript.extend(
            (session, start + offset, digest_key(digest), seq)
            for offset, digest in enumerate(digests)
        )
        self._lengths[session] = start + len(digests) if digests else min(start, length)

    def _rewind_transcript(
        self, conn: sqlite3.Connection, session: str, start: int, seq: int
    ) -> None:
        """Move positions from ``start`` on out of the current conversation, keeping them."""
        self._flush_transcript(conn)
        conn.execute(
            "INSERT INTO transcript_rewound SELECT ?, position, session, digest, seq"
            " FROM transcript WHERE session = ? AND position >= ?",
            (seq, session, start),
        )
        conn.execute("DELETE FROM transcript WHERE session = ? AND position >= ?", (session, start))
        length = self._lengths.get(session)
        if length is not None:
            self._lengths[session] = min(length, start)

    def _flush_transcript(self, conn: sqlite3.Connection) -> None:
        if self._transcript:
            self._rows_written += 1
            conn.executemany("INSERT INTO transcript VALUES (?, ?, ?, ?)", self._transcript)
            self._transcript.clear()

    def flush(self, conn: sqlite3.Connection) -> None:
        """Write the counters (they add up, so the order of batches does not matter) and rows."""
        if self._counts:
            self._stored.clear()
            conn.executemany(
                "INSERT INTO sessions (session, first_seq, last_seq, turns, memory_writes,"
                " checkpoints) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(session) DO UPDATE SET"
                " first_seq = min(first_seq, excluded.first_seq),"
                " last_seq = max(last_seq, excluded.last_seq), turns = turns + excluded.turns,"
                " memory_writes = memory_writes + excluded.memory_writes,"
                " checkpoints = checkpoints + excluded.checkpoints",
                [(session, *counts) for session, counts in self._counts.items()],
            )
            self._counts.clear()
        self._flush_transcript(conn)
        if len(self._lengths) > self.batch_events:  # keep memory flat over many sessions
            self._lengths.clear()

    def discard(self) -> None:
        super().discard()
        self._counts.clear()
        self._transcript.clear()
        self._lengths.clear()
        self._stored.clear()

    def forget(self, conn: sqlite3.Connection, seqs: frozenset[int]) -> bool:
        """Transcripts hold digests and stay; an event whose body went is gone from a replay:
        its link, and its session's counters and start details, are derived again."""
        gone: dict[int, str] = dict(
            select_in(
                conn,
                "SELECT e.seq, e.session FROM events e JOIN erased x ON x.digest = e.payload"
                " WHERE e.seq IN ({})",
                seqs,
            )
        )
        for marks, chunk in in_chunks(gone):
            conn.execute(f"DELETE FROM session_links WHERE seq IN ({marks})", chunk)
        for session in sorted(set(gone.values())):
            self._recount(conn, session)
        return True

    def _recount(self, conn: sqlite3.Connection, session: str) -> None:
        """The session's row from its events that a replay reads (the session's only)."""
        self._stored.pop(session, None)
        kinds = sorted(self.handles)
        first, last, turns, writes, checkpoints = conn.execute(
            "SELECT min(e.seq), max(e.seq), sum(e.type = 'turn'), sum(e.type = 'memory_write'),"
            " sum(e.type = 'checkpoint') FROM events e WHERE e.session = ?"
            f" AND e.type IN ({', '.join('?' * len(kinds))})"
            " AND NOT EXISTS (SELECT 1 FROM erased x WHERE x.digest = e.payload)",
            (session, *kinds),
        ).fetchone()
        if first is None:
            conn.execute("DELETE FROM sessions WHERE session = ?", (session,))
            return
        starts = conn.execute(
            "SELECT e.time, p.body FROM events e JOIN payloads p ON p.digest = e.payload"
            " WHERE e.session = ? AND +e.type = 'session_started' AND p.body IS NOT NULL"
            " ORDER BY e.seq",
            (session,),
        ).fetchall()
        body = _mapping(decode(bytes(starts[-1][1]))) if starts else {}
        conn.execute(
            "UPDATE sessions SET first_seq = ?, last_seq = ?, turns = ?, memory_writes = ?,"
            " checkpoints = ?, started_at = ?, platform = ?, agent_context = ? WHERE session = ?",
            (
                first,
                last,
                turns,
                writes,
                checkpoints,
                starts[0][0] if starts else None,
                _text_or_none(body.get("platform")),
                _text_or_none(body.get("agent_context")),
                session,
            ),
        )


def _text_or_none(value: Any) -> str | None:
    if value is None:
        return None
    return bindable_text(value) if isinstance(value, str) else canonical_text(value)


def transcript_rows(conn: sqlite3.Connection, session: str) -> list[tuple[str, int]]:
    """(message digest, seq of the turn that archived it) of the current conversation."""
    return [
        (digest_hex(row[0]), int(row[1]))
        for row in conn.execute(
            "SELECT digest, seq FROM transcript WHERE session = ? ORDER BY position", (session,)
        )
    ]


def transcript_digests(conn: sqlite3.Connection, session: str) -> list[str]:
    return [digest for digest, _ in transcript_rows(conn, session)]


def pending_rewind(conn: sqlite3.Connection, session: str) -> int | None:
    """The seq of a rewind (``rewound=True`` switch) no later hand-off has answered yet.

    The host's rewind says neither which turns nor how many (docs/HOST.md §2.3): the next
    transcript it hands over does, so a rewind is pending until a turn (or the
    ``turns_rewound`` it causes) is archived after it.
    """
    row = conn.execute(
        "SELECT max(seq) FROM session_links WHERE session = ? AND rewound = 1", (session,)
    ).fetchone()
    if row is None or row[0] is None:
        return None
    later = conn.execute(
        "SELECT 1 FROM events WHERE session = ? AND seq > ?"
        " AND type IN ('turn', 'turns_rewound') LIMIT 1",
        (session, int(row[0])),
    ).fetchone()
    return None if later else int(row[0])


def rewound_at(conn: sqlite3.Connection, seq: int) -> int | None:
    """The ``turns_rewound`` that took messages of turn event ``seq`` out of its session."""
    try:  # one query: ``log`` and the report ask it for every turn
        row = conn.execute(
            "SELECT min(rewound_seq) FROM transcript_rewound WHERE seq = ?", (seq,)
        ).fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):  # an archive whose projections are not built
            return None
        raise
    return None if row is None or row[0] is None else int(row[0])


def session_counters(conn: sqlite3.Connection, session: str) -> tuple[int, int]:
    """(turns, memory writes) archived so far for ``session``, as the table holds them."""
    row = conn.execute(
        "SELECT turns, memory_writes FROM sessions WHERE session = ?", (session,)
    ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def settled(store: EventStore) -> sqlite3.Connection:
    """The store's connection once the rows the sessions projection buffered in the open
    transaction are written: a build reads ``transcript`` through it."""
    store.settle(SessionsProjection.name)
    return store.conn


def transcript_tail(store: EventStore, session: str) -> tuple[int, str] | None:
    """The last message of ``session``'s transcript (position, digest) as a build inside the
    append transaction sees it, without writing what the sessions projection buffered."""
    for projection in store.projections:
        if isinstance(projection, SessionsProjection):
            buffered = projection.buffered_tail(session)
            if buffered is not None:
                return buffered
    row = store.conn.execute(
        "SELECT position, digest FROM transcript WHERE session = ? ORDER BY position DESC LIMIT 1",
        (session,),
    ).fetchone()
    return (int(row[0]), digest_hex(row[1])) if row else None


def live_counters(store: EventStore, session: str) -> tuple[int, int]:
    """(turns, memory writes) of ``session`` as a build inside the append transaction sees
    them: the table's counters plus the turns the sessions projection has buffered."""
    for projection in store.projections:
        if isinstance(projection, SessionsProjection):
            return projection.counters(store.conn, session)
    return session_counters(store.conn, session)


@dataclass(frozen=True)
class SessionLink:
    seq: int
    session: str
    parent: str
    relation: str
    reason: str | None


def session_links(conn: sqlite3.Connection, session: str | None = None) -> list[SessionLink]:
    """Every recorded switch (of one session, when given), in log order."""
    sql = "SELECT seq, session, parent, relation, reason FROM session_links"
    args: tuple[str, ...] = ()
    if session is not None:
        sql, args = sql + " WHERE session = ?", (session,)
    return [SessionLink(*row) for row in conn.execute(sql + " ORDER BY seq", args)]


def lineage(conn: sqlite3.Connection, session: str) -> list[SessionLink]:
    """The links from ``session`` back to where its conversation began.

    Follows, for each session, its latest link that continues a conversation (compression,
    branch, a parent named at start, an unexplained switch); a resume only names the
    session left, a reset starts a new conversation and a rewind stays in the session, so
    those end the walk.
    """
    chain: list[SessionLink] = []
    seen = {session}
    current = session
    while True:
        row = conn.execute(
            "SELECT seq, session, parent, relation, reason FROM session_links WHERE session = ?"
            " AND relation IN ({}) AND parent != session ORDER BY seq DESC LIMIT 1".format(
                ", ".join("?" * len(LINEAGE_RELATIONS))
            ),
            (current, *sorted(LINEAGE_RELATIONS)),
        ).fetchone()
        if row is None or row[2] in seen:
            return chain
        chain.append(SessionLink(*row))
        current = row[2]
        seen.add(current)


# -- memory ----------------------------------------------------------------------------


class MemoryProjection(TableProjection):
    """Built-in memory entries as they stand, plus the history of every change."""

    name = "memory"
    version = 2
    ddl = (
        "CREATE TABLE IF NOT EXISTS memory_entries (target TEXT NOT NULL,"
        " position INTEGER NOT NULL, content TEXT NOT NULL, entry INTEGER NOT NULL,"
        " seq INTEGER NOT NULL, PRIMARY KEY (target, position))",
        "CREATE TABLE IF NOT EXISTS memory_history (seq INTEGER PRIMARY KEY, time TEXT NOT NULL,"
        " session TEXT NOT NULL, target TEXT NOT NULL, action TEXT NOT NULL, entry INTEGER,"
        " position INTEGER, before TEXT, after TEXT, resolution TEXT NOT NULL,"
        " candidates INTEGER NOT NULL, merged INTEGER, metadata TEXT NOT NULL)",
        "CREATE INDEX IF NOT EXISTS memory_history_entry ON memory_history(entry)",
    )
    tables = {"memory_entries": "target, position", "memory_history": "seq"}
    handles = frozenset({"memory_write"})

    def reduce(self, conn: sqlite3.Connection, event: StoredEvent) -> None:
        body = _mapping(event.body)
        metadata = body.get("metadata")
        digest = body.get("content")
        content = event_part(conn, event, digest) if isinstance(digest, str) else None
        write = MemoryWrite.from_event(body, content)
        before = memory_entries(conn, write.target)
        after, change = apply_write(before, write, event.seq)
        if after != before:
            conn.execute("DELETE FROM memory_entries WHERE target = ?", (write.target,))
            conn.executemany(
                "INSERT INTO memory_entries VALUES (?, ?, ?, ?, ?)",
                [(write.target, i, e.content, e.entry, e.seq) for i, e in enumerate(after)],
            )
        conn.execute(
            "INSERT INTO memory_history VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                event.seq,
                event.time,
                event.session,
                write.target,
                write.action,
                change.entry,
                change.index,
                _bindable_or_none(change.before),
                change.after,
                change.resolution,
                change.candidates,
                change.merged,
                canonical_text(metadata if metadata is not None else {}),
            ),
        )

    def forget(self, conn: sqlite3.Connection, seqs: frozenset[int]) -> bool:
        """Each target an erased write touched is replayed from its own writes alone (a
        target's entries depend on nothing else), so the cost is that target's writes."""
        targets: set[str] = {
            t
            for (t,) in select_in(
                conn, "SELECT DISTINCT target FROM memory_history WHERE seq IN ({})", seqs
            )
        }
        if not targets:
            return True
        writes = [
            int(seq)
            for (seq,) in select_in(
                conn, "SELECT seq FROM memory_history WHERE target IN ({})", targets
            )
        ]
        for marks, chunk in in_chunks(targets):
            conn.execute(f"DELETE FROM memory_entries WHERE target IN ({marks})", chunk)
            conn.execute(f"DELETE FROM memory_history WHERE target IN ({marks})", chunk)
        for event in events_at(conn, writes, self.handles):
            self.reduce(conn, event)
        return True


def _bindable_or_none(text: str | None) -> str | None:
    return None if text is None else bindable_text(text)


def memory_entries(conn: sqlite3.Connection, target: str) -> list[Entry]:
    return [
        Entry(*row)
        for row in conn.execute(
            "SELECT content, entry, seq FROM memory_entries WHERE target = ? ORDER BY position",
            (target,),
        )
    ]


def memory_state(conn: sqlite3.Connection) -> dict[str, list[str]]:
    """Every target's entries as they stand (what MEMORY.md / USER.md should hold)."""
    state: dict[str, list[str]] = {}
    for target, content in conn.execute(
        "SELECT target, content FROM memory_entries ORDER BY target, position"
    ):
        state.setdefault(target, []).append(content)
    return state


@dataclass(frozen=True)
class MemoryEvent:
    """One change to a built-in memory entry, for ``hermes-archive history``."""

    seq: int
    time: str
    session: str
    target: str
    action: str
    entry: int | None
    before: str | None  # the previous content
    after: str | None
    resolution: str
    candidates: int
    merged: int | None
    metadata: dict[str, Any]  # the host's origin metadata (write_origin, session_id, old_text...)


def _as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {"$value": value}


def _memory_event(row: list[Any]) -> MemoryEvent:
    row[-1] = _as_dict(decode(row[-1]))  # metadata
    return MemoryEvent(*row)


def history(conn: sqlite3.Connection, text: str) -> list[MemoryEvent]:
    """Every change to the memory entries whose text ever contained ``text``, in log order.

    Matching is case-insensitive over each version of an entry (and the search text a
    write used), and an entry is followed through its replaces: asking for "dark mode"
    also shows that entry's later rewording and its removal.
    """
    needle = text.strip().casefold()
    rows = [
        _memory_event(list(row))
        for row in conn.execute(
            "SELECT seq, time, session, target, action, entry, before, after, resolution,"
            " candidates, merged, metadata FROM memory_history ORDER BY seq"
        )
    ]
    if not needle:
        return rows

    def mentions(row: MemoryEvent) -> bool:
        old_text = row.metadata.get("old_text")
        texts = (row.before, row.after, old_text if isinstance(old_text, str) else None)
        return any(t is not None and needle in t.casefold() for t in texts)

    entries = {row.entry for row in rows if row.entry is not None and mentions(row)}
    return [
        row
        for row in rows
        if row.entry in entries or row.merged in entries or (row.entry is None and mentions(row))
    ]


# -- recall ----------------------------------------------------------------------------


class RecallProjection(TableProjection):
    """FTS5 over archived messages, checkpoint evidence and current memory entries.

    Messages: the user and assistant prose of every turn, one row each; rowids count up
    from 1 in log order (so ``ORDER BY rowid DESC`` means newest first) and are assigned
    here, not by SQLite, so a replay gives every row the rowid it had. Checkpoint evidence
    adds only what its session's earlier turns and checkpoints did not hold (a message
    archived before the archive saw its turn, or one the host rewrote): found from the log
    itself, by digest and then by text (a v2 host strips ``tool_calls``), so the answer
    depends on nothing but the log prefix. Memory entries: rowid ``-seq`` of the write that
    set the content, kept equal to ``memory_entries`` (hence ``requires = ("memory",)``) by
    a diff, so a write touches only the rows that changed and the result does not depend on
    how far the memory projection had got when this one caught up.

    Rewound messages (``turns_rewound``) leave ``recall_fts`` for ``recall_rewound``: still
    in the log and shown as rewound, never recalled as the current conversation. Each turn's
    author, as the host stated it, is in ``recall_authors`` (search filters on it).

    ``recall_fts`` holds tokens only: its rows are ``recall_docs`` read through the view
    ``recall_text`` (:data:`RECALL_TEXT_VIEW`), so a message's text is stored once, in its
    payload. Such an index forgets a row only when told the text it indexed (FTS5's
    ``'delete'`` with the old values): every removal here, :meth:`prepare_forget` included,
    reads it from the view first.
    """

    name = "recall"
    version = 5
    ddl = (
        "CREATE TABLE IF NOT EXISTS recall_docs (rowid INTEGER PRIMARY KEY, seq INTEGER NOT NULL,"
        " part INTEGER, role TEXT, text TEXT)",
        "CREATE INDEX IF NOT EXISTS recall_docs_seq ON recall_docs(seq)",
        RECALL_TEXT_VIEW,
        "CREATE VIRTUAL TABLE IF NOT EXISTS recall_fts USING fts5(text, kind UNINDEXED,"
        " session UNINDEXED, seq UNINDEXED, role UNINDEXED, content = 'recall_text',"
        f" content_rowid = 'rowid', tokenize = '{TOKENIZER}')",
        "CREATE VIRTUAL TABLE IF NOT EXISTS recall_vocab USING fts5vocab(recall_fts, 'row')",
        "CREATE TABLE IF NOT EXISTS recall_rewound (rowid INTEGER PRIMARY KEY, text TEXT NOT NULL,"
        " kind TEXT NOT NULL, session TEXT NOT NULL, seq INTEGER NOT NULL, role TEXT,"
        " rewound_seq INTEGER NOT NULL)",
        "CREATE TABLE IF NOT EXISTS recall_authors (seq INTEGER PRIMARY KEY, author_id TEXT,"
        " author_name TEXT, is_bot INTEGER NOT NULL, source TEXT)",
        "CREATE INDEX IF NOT EXISTS recall_authors_id ON recall_authors(author_id)",
    )
    tables = {  # recall_vocab: the index's own tokens (recall_fts reads only the content)
        "recall_vocab": "term",
        "recall_docs": "rowid",
        "recall_rewound": "rowid",
        "recall_authors": "seq",
    }
    #: rows in rowid order but not their rowid values: an erasure in place leaves gaps
    #: where a replay numbers on (memory rows' rowids are -seq, a function of the log)
    digest_select = {
        "recall_docs": "seq, part, role, text",
        "recall_rewound": "text, kind, session, seq, role, rewound_seq",
        "recall_authors": "seq, author_id, author_name, is_bot, source",
    }
    handles = frozenset({"turn", "checkpoint", "memory_write", "turns_rewound"})
    reads_parts = frozenset({"turn", "checkpoint"})  # memory rows come from memory_entries
    requires = ("memory",)
    batch_rows = 2000
    #: FTS5 merges segments when this many share a level; 4 is its default. A bulk load
    #: with 16 merges less often (about a tenth less work) and queries as fast afterwards.
    automerge, bulk_automerge = 4, 16

    def __init__(self) -> None:
        self._rows: list[tuple[int, int, int | None, str | None, str | None]] = []
        self._texts: list[tuple[int, str]] = []  # (rowid, text) for the index
        self._next_rowid: int | None = None
        self._settled: int | None = None  # rows written up to this seq (None: as stored)

    def drop(self, conn: sqlite3.Connection) -> None:
        # recall_vocab and the index go before the tables they read; recall_indexed and
        # recall_seen were kept by versions 1 and 2, recall_memory by versions up to 4
        for table in ("recall_vocab", "recall_fts", "recall_indexed", "recall_seen"):
            conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute("DROP TABLE IF EXISTS recall_memory")
        conn.execute("DROP VIEW IF EXISTS recall_text")
        super().drop(conn)

    def digest(self, conn: sqlite3.Connection) -> str:
        """The tables' digest and the definitions of the index and of its content view.

        recall_fts's rows are what the view makes of recall_docs and the log (both checked
        elsewhere), so they are not read back one by one through the view (that read was
        most of ``verify --projections``); a view or index edited to read other text is
        still caught, and the index's own tokens are recall_vocab's rows.
        """
        schema = conn.execute(
            "SELECT group_concat(sql, char(0)) FROM (SELECT sql FROM sqlite_master"
            " WHERE name IN ('recall_fts', 'recall_text') ORDER BY name)"
        ).fetchone()[0]
        return blake3(f"{super().digest(conn)}\x00{schema}".encode()).hexdigest()

    def reduce(self, conn: sqlite3.Connection, event: StoredEvent) -> None:
        if event.type == "memory_write":
            self._index_memory(conn, bindable_text(str(_mapping(event.body).get("target"))))
            return
        if event.type == "turns_rewound":
            self.flush(conn)
            self._rewind(conn, event)
            return
        if self._next_rowid is None:
            top = conn.execute(  # rewound rows keep their rowids: never reuse them
                "SELECT max((SELECT max(rowid) FROM recall_docs),"
                " coalesce((SELECT max(rowid) FROM recall_rewound), 0))"
            ).fetchone()[0]
            self._next_rowid = max(int(top or 0), 0) + 1
        rows, texts, rowid, seq = self._rows, self._texts, self._next_rowid, event.seq
        if event.type == "turn":
            said = list(_messages(conn, event, "messages"))
            self._record_author(conn, event)
        else:
            said = self._unseen_evidence(conn, event)
        for message in said:
            rows.append((rowid, seq, *message.doc()))
            texts.append((rowid, message.text))
            rowid += 1
        self._next_rowid = rowid
        if len(rows) >= self.batch_rows:
            self.flush(conn)

    @staticmethod
    def _record_author(conn: sqlite3.Connection, event: StoredEvent) -> None:
        digest = event.author_digest
        author = _mapping(event_part(conn, event, digest) if digest else None)
        if not author:
            return
        conn.execute(
            "INSERT INTO recall_authors VALUES (?, ?, ?, ?, ?)",
            (
                event.seq,
                _text_or_none(author.get("id")),
                _text_or_none(author.get("name")),
                int(author.get("is_bot") is True),
                _text_or_none(author.get("source")),
            ),
        )

    @staticmethod
    def _rewind(conn: sqlite3.Connection, event: StoredEvent) -> None:
        """Move the rewound messages' rows out of the searchable index, keeping them."""
        body = _mapping(event.body)
        said = set(_prose(conn, event, "messages"))
        seqs = [seq for seq in body.get("turn_seqs") or [] if isinstance(seq, int)]
        for seq in seqs:
            for rowid, text, kind, session, role in conn.execute(
                "SELECT rowid, text, kind, session, role FROM recall_text"
                " WHERE seq = ? AND kind = 'turn'",
                (seq,),
            ).fetchall():
                if (role, text) in said:
                    conn.execute(
                        "INSERT INTO recall_rewound VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (rowid, text, kind, session, seq, role, event.seq),
                    )
                    _unindex(conn, rowid, text)

    @staticmethod
    def _unseen_evidence(conn: sqlite3.Connection, event: StoredEvent) -> list[Said]:
        """The checkpoint's messages its session's earlier turns and checkpoints did not hold."""
        earlier = list(session_part_digests(conn, event.session, ("turn", "checkpoint"), event.seq))
        held = set(earlier)
        digests = [d for d in _digests(_mapping(event.body).get("evidence")) if d not in held]
        if not digests:
            return []
        said: set[tuple[str, str]] = set()
        for digest in earlier:
            body = payload_body(conn, digest)
            if body is None:
                continue
            message = _read_json(body.decode())
            if isinstance(message, dict) and isinstance(message.get("role"), str):
                said.add((message["role"], bindable_text(message_text(message))))
        fresh = []
        for message in _messages(conn, event, "evidence", digests):
            item = (message.role, message.text)
            if item not in said:
                said.add(item)
                fresh.append(message)
        return fresh

    def flush(self, conn: sqlite3.Connection) -> None:
        if self._rows:
            conn.executemany("INSERT INTO recall_docs VALUES (?, ?, ?, ?, ?)", self._rows)
            conn.executemany("INSERT INTO recall_fts (rowid, text) VALUES (?, ?)", self._texts)
            self._rows.clear()
            self._texts.clear()

    def begin_bulk(self, conn: sqlite3.Connection) -> None:
        conn.execute(
            "INSERT INTO recall_fts (recall_fts, rank) VALUES ('automerge', ?)",
            (self.bulk_automerge,),
        )

    def end_bulk(self, conn: sqlite3.Connection) -> None:
        conn.execute(
            "INSERT INTO recall_fts (recall_fts, rank) VALUES ('automerge', ?)", (self.automerge,)
        )

    def discard(self) -> None:
        super().discard()
        self._rows.clear()
        self._texts.clear()
        self._next_rowid = None  # read again: outside a replay another writer may have added rows
        self._settled = None

    def apply(self, conn: sqlite3.Connection, event: StoredEvent) -> None:
        """Inside the append transaction, messages are buffered until :meth:`finish`.

        FTS5 writes its pending terms out as a new segment at every savepoint, and the
        store opens one per event and projection: inserting each turn's rows at once made a
        segment (and merges) per turn, the largest cost of ingest. Buffered, a whole batch
        is one insert. A memory write still indexes at once (it reads and deletes rows); the
        store finishes the buffered rows before it (see :meth:`defers`).
        """
        if not self.defers(event.type):
            super().apply(conn, event)
            return
        if not self._rows:
            self._settled = self._moved
        if event.type in self.handles:
            rows, rowid = len(self._rows), self._next_rowid
            try:
                self.reduce(conn, event)  # reads only: the store needs no savepoint for it
            except BaseException:
                del self._rows[rows:]  # nothing of the failing event is kept
                del self._texts[rows:]
                self._next_rowid = rowid
                raise
        self._moved = event.seq

    @staticmethod
    def defers(event_type: str) -> bool:
        """Whether :meth:`apply` only buffers this event's rows (until :meth:`finish`) and
        writes nothing else: all but a memory write."""
        return event_type != "memory_write"

    def finish(self, conn: sqlite3.Connection) -> None:
        """Before the commit: insert what :meth:`apply` buffered, in one statement, then
        ``last_seq``.

        If the insert fails, nothing of it stays and ``last_seq`` is written only as far
        as the rows are (the projection is behind; a replay rebuilds it).
        """
        try:
            if self._rows:
                conn.execute("SAVEPOINT recall_finish")
                try:
                    self.flush(conn)
                except sqlite3.OperationalError:
                    raise  # the environment, not the rows: the whole transaction fails
                except Exception:
                    conn.execute("ROLLBACK TO recall_finish")
                    conn.execute("RELEASE recall_finish")
                    if self._settled is not None:
                        self.set_last_seq(conn, self._settled)
                    raise
                conn.execute("RELEASE recall_finish")
            if self._moved is not None:
                self.set_last_seq(conn, self._moved)
        finally:
            self.discard()

    def prepare_forget(self, conn: sqlite3.Connection, seqs: frozenset[int]) -> None:
        """Take the message rows of the erased events out of the index while their bodies
        still say what it indexed; :meth:`forget` puts back those that stay."""
        for marks, chunk in in_chunks(seqs):
            conn.execute(
                "INSERT INTO recall_fts (recall_fts, rowid, text) SELECT 'delete', rowid, text"
                f" FROM recall_text WHERE rowid > 0 AND text IS NOT NULL AND seq IN ({marks})",
                chunk,
            )

    def forget(self, conn: sqlite3.Connection, seqs: frozenset[int]) -> bool:
        """Delete the rows of erased texts, touching only the erased events' rows.

        A turn keeps the rows of its messages still readable; a checkpoint (of a session
        that lost turn or checkpoint texts, from the first of them on) keeps what
        :meth:`_unseen_evidence` now finds, which can be more than it had (a message its
        session said, now erased, was not indexed again for it): then False, and the
        caller rebuilds the index. The kept rows of erased events go back into the index
        (:meth:`prepare_forget` took them out) under their own rowids. Memory rows follow
        ``memory_entries`` (forgotten first).
        """
        touched = sorted(seqs)
        first: dict[str, int] = {}
        read: set[int] = set()
        for marks, chunk in in_chunks(touched):
            for seq, session in conn.execute(
                f"SELECT seq, session FROM events WHERE type IN ('turn', 'checkpoint') AND seq IN ({marks})",
                chunk,
            ):
                first[session] = min(seq, first.get(session, seq))
            conn.execute(
                f"DELETE FROM recall_authors WHERE seq IN ({marks})"
                " AND EXISTS (SELECT 1 FROM events e JOIN erased x ON x.digest = e.author"
                " WHERE e.seq = recall_authors.seq)",
                chunk,
            )
        kept: list[int] = []
        for event in events_at(conn, touched, {"turn", "turns_rewound"}):
            read.add(event.seq)
            said = list(_prose(conn, event, "messages"))
            if event.type == "turns_rewound":
                moved = conn.execute(
                    "SELECT role, text FROM recall_rewound WHERE rewound_seq = ?", (event.seq,)
                ).fetchall()
                if not {(r or "", t) for r, t in moved} <= set(said):
                    return False  # a replay would leave those rows in the index
            elif not self._keep_only(conn, event.seq, "turn", said, seqs, kept):
                return False
        later: set[int] = set()
        for session, seq in first.items():
            later.update(
                s
                for (s,) in conn.execute(
                    "SELECT seq FROM events WHERE session = ? AND +type = 'checkpoint' AND seq >= ?",
                    (session, seq),
                )
            )
        for event in events_at(conn, later, {"checkpoint"}):
            read.add(event.seq)
            wanted = [(m.role, m.text) for m in self._unseen_evidence(conn, event)]
            if not self._keep_only(conn, event.seq, "checkpoint", wanted, seqs, kept):
                return False
        for seq in sorted(set(touched) - read):  # its body is erased: a replay skips it
            conn.execute("DELETE FROM recall_docs WHERE seq = ? AND rowid > 0", (seq,))
            conn.execute("DELETE FROM recall_rewound WHERE seq = ?", (seq,))
        for marks, chunk in in_chunks(kept):
            conn.execute(
                "INSERT INTO recall_fts (rowid, text) SELECT rowid, text FROM recall_text"
                f" WHERE rowid IN ({marks})",
                chunk,
            )
        targets = conn.execute(
            "SELECT role FROM recall_docs WHERE rowid < 0 UNION SELECT target FROM memory_entries"
        ).fetchall()
        for (target,) in targets:
            self._index_memory(conn, target)
        return True

    @staticmethod
    def _keep_only(
        conn: sqlite3.Connection,
        seq: int,
        kind: str,
        wanted: list[tuple[str, str]],
        erased: frozenset[int],
        kept: list[int],
    ) -> bool:
        """Delete the event's rows that ``wanted`` (its texts in order) no longer holds;
        False when ``wanted`` holds a text the rows do not (only a rebuild can add it).

        The rows of an erased event are out of the index already: those that stay are
        added to ``kept``, to go back in; another event's rows leave it as usual.
        """
        rows = conn.execute(
            "SELECT rowid, role, text, 'recall_docs' FROM recall_text"
            " WHERE seq = ? AND kind = ? AND rowid > 0",
            (seq, kind),
        ).fetchall()
        rows += conn.execute(
            "SELECT rowid, role, text, 'recall_rewound' FROM recall_rewound"
            " WHERE seq = ? AND kind = ?",
            (seq, kind),
        ).fetchall()
        indexed = seq not in erased
        at = 0
        for rowid, role, text, table in sorted(rows):
            if at < len(wanted) and wanted[at] == (role or "", text):
                at += 1
                if table == "recall_docs" and not indexed:
                    kept.append(rowid)
            elif table == "recall_rewound":
                conn.execute("DELETE FROM recall_rewound WHERE rowid = ?", (rowid,))
            elif indexed:
                _unindex(conn, rowid, text)
            else:
                conn.execute("DELETE FROM recall_docs WHERE rowid = ?", (rowid,))
        return at == len(wanted)

    @staticmethod
    def _index_memory(conn: sqlite3.Connection, target: str) -> None:
        """Make the target's memory rows equal its entries as they stand, touching only changes."""
        wanted = {
            -seq: content
            for content, seq in conn.execute(
                "SELECT content, seq FROM memory_entries WHERE target = ?", (target,)
            )
            if content.strip()
        }
        held = dict(
            conn.execute(
                "SELECT rowid, text FROM recall_docs WHERE rowid < 0 AND role = ?", (target,)
            ).fetchall()
        )
        for rowid in sorted(held.keys() - wanted.keys()):
            _unindex(conn, rowid, held[rowid])
        for rowid in sorted(wanted.keys() - held.keys()):
            conn.execute(
                "INSERT INTO recall_docs VALUES (?, ?, NULL, ?, ?)",
                (rowid, -rowid, target, wanted[rowid]),
            )
            conn.execute(
                "INSERT INTO recall_fts (rowid, text) VALUES (?, ?)", (rowid, wanted[rowid])
            )


def _unindex(conn: sqlite3.Connection, rowid: int, text: str | None) -> None:
    """Take one row out of the index (told the text it indexed) and out of recall_docs."""
    if text is not None:
        conn.execute(
            "INSERT INTO recall_fts (recall_fts, rowid, text) VALUES ('delete', ?, ?)",
            (rowid, text),
        )
    conn.execute("DELETE FROM recall_docs WHERE rowid = ?", (rowid,))


_read_json = json.JSONDecoder().decode  # messages: only role and text are read


@dataclass(frozen=True)
class Said:
    """One message's prose as the index holds it, and where the view reads it from."""

    role: str
    text: str
    part: int | None  # its position in the event's part list (None: not listed there)
    content: Any  # the message's "content" as stored

    def doc(self) -> tuple[int | None, str | None, str | None]:
        """(part, role, text) of its recall_docs row: NULL where the view reads the payload.

        ``json_extract`` gives back a string content as stored unless it holds NUL (SQLite
        ends text there); anything else (parts, lone surrogates replaced) is stored.
        """
        if self.part is None:
            return None, self.role, self.text
        if self.content == self.text and "\x00" not in self.text:
            return self.part, None, None
        return self.part, None, self.text


def _messages(
    conn: sqlite3.Connection, event: StoredEvent, field_name: str, digests: list[str] | None = None
) -> Iterator[Said]:
    """Each user/assistant message of the event that has prose."""
    carried = event.parts if isinstance(event, LoadedEvent) else {}
    if digests is None:
        digests = (
            event.messages
            if field_name == "messages"
            else _digests(_mapping(event.body).get(field_name))
        )
    positions: dict[str, int] | None = None
    for digest in digests:
        body = carried.get(digest)
        message = _read_json(body.decode()) if body is not None else event_part(conn, event, digest)
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role == "user" or role == "assistant":
            text = bindable_text(message_text(message))
            if text and not text.isspace():
                if positions is None:
                    positions = {}
                    for index, listed in enumerate(event.part_digests):
                        positions.setdefault(listed, index)
                yield Said(role, text, positions.get(digest), message.get("content"))


def _prose(
    conn: sqlite3.Connection, event: StoredEvent, field_name: str, digests: list[str] | None = None
) -> Iterator[tuple[str, str]]:
    """(role, text) of each user/assistant message of the event that has prose."""
    for message in _messages(conn, event, field_name, digests):
        yield message.role, message.text


# -- checkpoints and recalls served ----------------------------------------------------


class CheckpointsProjection(TableProjection):
    name = "checkpoints"
    ddl = (
        "CREATE TABLE IF NOT EXISTS checkpoints (seq INTEGER PRIMARY KEY, time TEXT NOT NULL,"
        " session TEXT NOT NULL, parent_session TEXT, evidence_digest TEXT NOT NULL,"
        " messages INTEGER NOT NULL, host_api_version INTEGER,"
        " require_checkpoint INTEGER NOT NULL)",
        "CREATE TABLE IF NOT EXISTS checkpoint_failures (seq INTEGER PRIMARY KEY,"
        " time TEXT NOT NULL, session TEXT NOT NULL, error TEXT NOT NULL,"
        " require_checkpoint INTEGER NOT NULL)",
    )
    tables = {"checkpoints": "seq", "checkpoint_failures": "seq"}
    handles = frozenset({"checkpoint", "checkpoint_failed"})
    reads_parts: frozenset[str] = frozenset()

    def forget(self, conn: sqlite3.Connection, seqs: frozenset[int]) -> bool:
        self.reduce_again(conn, seqs)  # a failure whose body (its error text) went has no row
        return True

    def reduce(self, conn: sqlite3.Connection, event: StoredEvent) -> None:
        body = _mapping(event.body)
        required = int(bool(body.get("require_checkpoint")))
        if event.type == "checkpoint":
            version = body.get("host_api_version")
            conn.execute(
                "INSERT INTO checkpoints VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    event.seq,
                    event.time,
                    event.session,
                    _text_or_none(body.get("parent_session")),
                    str(body.get("evidence_digest", "")),
                    len(_digests(body.get("evidence"))),
                    version if isinstance(version, int) else None,
                    required,
                ),
            )
        else:
            conn.execute(
                "INSERT INTO checkpoint_failures VALUES (?, ?, ?, ?, ?)",
                (
                    event.seq,
                    event.time,
                    event.session,
                    _text_or_none(body.get("error")) or "",
                    required,
                ),
            )


class RecallsServedProjection(TableProjection):
    name = "recalls_served"
    ddl = (
        "CREATE TABLE IF NOT EXISTS recalls_served (seq INTEGER PRIMARY KEY, time TEXT NOT NULL,"
        " session TEXT NOT NULL, turn INTEGER NOT NULL, query TEXT NOT NULL,"
        " result TEXT NOT NULL, sources TEXT NOT NULL)",
        "CREATE INDEX IF NOT EXISTS recalls_served_session ON recalls_served(session, seq)",
    )
    tables = {"recalls_served": "seq"}
    handles = frozenset({"recall_served"})

    def forget(self, conn: sqlite3.Connection, seqs: frozenset[int]) -> bool:
        self.reduce_again(conn, seqs)  # an erased query or result reads as ''
        return True

    def reduce(self, conn: sqlite3.Connection, event: StoredEvent) -> None:
        body = _mapping(event.body)
        turn = body.get("turn")
        conn.execute(
            "INSERT INTO recalls_served VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                event.seq,
                event.time,
                event.session,
                turn if isinstance(turn, int) else 0,
                event_text(conn, event, body.get("query")),
                event_text(conn, event, body.get("result")),
                canonical_text(body.get("sources", [])),
            ),
        )


@dataclass(frozen=True)
class RecallServed:
    seq: int
    time: str
    session: str
    turn: int
    query: str
    result: str
    sources: list[int]


def recalls_served(conn: sqlite3.Connection, session: str | None = None) -> list[RecallServed]:
    """What the provider returned as recall (for one session, when given), in log order."""
    sql = "SELECT seq, time, session, turn, query, result, sources FROM recalls_served"
    args: tuple[str, ...] = ()
    if session is not None:
        sql, args = sql + " WHERE session = ?", (session,)
    served = []
    for row in map(list, conn.execute(sql + " ORDER BY seq", args)):
        row[-1] = decode(row[-1])  # sources
        served.append(RecallServed(*row))
    return served
