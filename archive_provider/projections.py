"""Projections: every piece of derived state, rebuilt from the log at any time.

Each projection owns a few tables in the archive database, is updated inside the append
transaction of the events it reflects, records its last applied sequence number in
``projection_state`` in that same transaction, and can report a digest of its state so
``verify --projections`` can compare live state with a replay.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from blake3 import blake3

from .canonical import canonical_bytes, decode
from .events import StoredEvent
from .evidence import bindable_text, message_text
from .memory_state import apply_write

STATE_DDL = "CREATE TABLE IF NOT EXISTS projection_state (name TEXT PRIMARY KEY, last_seq INTEGER NOT NULL)"


def part_value(conn: sqlite3.Connection, digest: str) -> Any:
    row = conn.execute("SELECT body FROM payloads WHERE digest = ?", (digest,)).fetchone()
    return decode(bytes(row[0])) if row else None


class TableProjection:
    """Base: DDL, the state row, dispatch by event type, and a digest over ordered rows."""

    name = ""
    ddl: Sequence[str] = ()
    #: table name -> ORDER BY clause that makes its rows deterministic
    tables: dict[str, str] = {}
    handles: frozenset[str] = frozenset()

    def create(self, conn: sqlite3.Connection) -> None:
        conn.execute(STATE_DDL)
        for statement in self.ddl:
            conn.execute(statement)
        conn.execute("INSERT OR IGNORE INTO projection_state VALUES (?, 0)", (self.name,))

    def drop(self, conn: sqlite3.Connection) -> None:
        for table in self.tables:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute("DELETE FROM projection_state WHERE name = ?", (self.name,))

    def apply(self, conn: sqlite3.Connection, event: StoredEvent) -> None:
        if event.type in self.handles:
            self.reduce(conn, event)
        conn.execute("UPDATE projection_state SET last_seq = ? WHERE name = ?", (event.seq, self.name))

    def reduce(self, conn: sqlite3.Connection, event: StoredEvent) -> None:
        raise NotImplementedError

    def last_seq(self, conn: sqlite3.Connection) -> int:
        row = conn.execute("SELECT last_seq FROM projection_state WHERE name = ?", (self.name,)).fetchone()
        return int(row[0]) if row else 0

    def digest(self, conn: sqlite3.Connection) -> str:
        hasher = blake3(b"hermes-archive/v1/projection\x00" + self.name.encode())
        for table, order in self.tables.items():
            columns = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
            select = ", ".join(columns)
            hasher.update(table.encode() + b"\x00")
            for row in conn.execute(f"SELECT {select} FROM {table} ORDER BY {order}"):
                hasher.update(canonical_bytes([bytes(v).hex() if isinstance(v, bytes) else v for v in row]) + b"\n")
        return hasher.hexdigest()


class SessionsProjection(TableProjection):
    """Sessions, their counters and their lineage across switches, resets and compressions."""

    name = "sessions"
    ddl = (
        "CREATE TABLE IF NOT EXISTS sessions (session TEXT PRIMARY KEY, first_seq INTEGER, last_seq INTEGER,"
        " started_at TEXT, ended_at TEXT, turns INTEGER NOT NULL DEFAULT 0, memory_writes INTEGER NOT NULL DEFAULT 0,"
        " checkpoints INTEGER NOT NULL DEFAULT 0, platform TEXT, agent_context TEXT)",
        "CREATE TABLE IF NOT EXISTS session_links (seq INTEGER PRIMARY KEY, session TEXT NOT NULL,"
        " parent TEXT NOT NULL, reason TEXT, reset INTEGER NOT NULL, rewound INTEGER NOT NULL)",
        "CREATE TABLE IF NOT EXISTS transcript (session TEXT NOT NULL, position INTEGER NOT NULL,"
        " digest TEXT NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (session, position))",
    )
    tables = {"sessions": "session", "session_links": "seq", "transcript": "session, position"}
    handles = frozenset(
        {"session_started", "session_switched", "session_ended", "turn", "memory_write", "checkpoint"}
    )

    def _touch(self, conn: sqlite3.Connection, event: StoredEvent) -> None:
        conn.execute(
            "INSERT INTO sessions (session, first_seq, last_seq) VALUES (?, ?, ?) "
            "ON CONFLICT(session) DO UPDATE SET last_seq = excluded.last_seq",
            (event.session, event.seq, event.seq),
        )

    def reduce(self, conn: sqlite3.Connection, event: StoredEvent) -> None:
        self._touch(conn, event)
        body = event.body
        if event.type == "session_started":
            conn.execute(
                "UPDATE sessions SET started_at = coalesce(started_at, ?), platform = ?, agent_context = ? WHERE session = ?",
                (event.time, body.get("platform"), body.get("agent_context"), event.session),
            )
            parent = body.get("parent_session_id")
            if parent:
                conn.execute(
                    "INSERT INTO session_links VALUES (?, ?, ?, 'start', 0, 0)", (event.seq, event.session, parent)
                )
        elif event.type == "session_switched":
            conn.execute(
                "INSERT INTO session_links VALUES (?, ?, ?, ?, ?, ?)",
                (event.seq, event.session, body.get("parent_session_id") or body.get("from") or "",
                 body.get("reason"), int(bool(body.get("reset"))), int(bool(body.get("rewound")))),
            )
            if body.get("rewound"):
                conn.execute("DELETE FROM transcript WHERE session = ?", (event.session,))
        elif event.type == "session_ended":
            conn.execute("UPDATE sessions SET ended_at = ? WHERE session = ?", (event.time, event.session))
        elif event.type == "turn":
            conn.execute("UPDATE sessions SET turns = turns + 1 WHERE session = ?", (event.session,))
            self._record_transcript(conn, event.session, body["start"], body["messages"], event.seq)
        elif event.type == "memory_write":
            conn.execute("UPDATE sessions SET memory_writes = memory_writes + 1 WHERE session = ?", (event.session,))
        elif event.type == "checkpoint":
            conn.execute("UPDATE sessions SET checkpoints = checkpoints + 1 WHERE session = ?", (event.session,))

    @staticmethod
    def _record_transcript(conn: sqlite3.Connection, session: str, start: int, digests: Iterable[str], seq: int) -> None:
        """The transcript as last archived: kept so the next turn's delta can be computed."""
        conn.execute("DELETE FROM transcript WHERE session = ? AND position >= ?", (session, start))
        conn.executemany(
            "INSERT INTO transcript VALUES (?, ?, ?, ?)",
            [(session, start + offset, digest, seq) for offset, digest in enumerate(digests)],
        )


def transcript_digests(conn: sqlite3.Connection, session: str) -> list[str]:
    return [row[0] for row in conn.execute("SELECT digest FROM transcript WHERE session = ? ORDER BY position", (session,))]


def session_counters(conn: sqlite3.Connection, session: str) -> tuple[int, int]:
    """(turns, memory writes) archived so far for ``session``."""
    row = conn.execute("SELECT turns, memory_writes FROM sessions WHERE session = ?", (session,)).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


class MemoryProjection(TableProjection):
    """Built-in memory entries as they stand, plus the history of every change."""

    name = "memory"
    ddl = (
        "CREATE TABLE IF NOT EXISTS memory_entries (target TEXT NOT NULL, position INTEGER NOT NULL,"
        " content TEXT NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (target, position))",
        "CREATE TABLE IF NOT EXISTS memory_history (seq INTEGER PRIMARY KEY, time TEXT NOT NULL, session TEXT NOT NULL,"
        " target TEXT NOT NULL, action TEXT NOT NULL, position INTEGER, before TEXT, after TEXT,"
        " resolution TEXT NOT NULL, metadata TEXT NOT NULL)",
    )
    tables = {"memory_entries": "target, position", "memory_history": "seq"}
    handles = frozenset({"memory_write"})

    def reduce(self, conn: sqlite3.Connection, event: StoredEvent) -> None:
        body = event.body
        target = str(body.get("target"))
        content = part_value(conn, body["content"])
        content = bindable_text(content if isinstance(content, str) else str(content))
        metadata = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
        entries = [row[0] for row in conn.execute(
            "SELECT content FROM memory_entries WHERE target = ? ORDER BY position", (target,))]
        after, change = apply_write(entries, str(body.get("action")), target, content, metadata)
        if after != entries:
            conn.execute("DELETE FROM memory_entries WHERE target = ?", (target,))
            conn.executemany(
                "INSERT INTO memory_entries VALUES (?, ?, ?, ?)",
                [(target, i, text, event.seq) for i, text in enumerate(after)],
            )
        conn.execute(
            "INSERT INTO memory_history VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (event.seq, event.time, event.session, target, change.action, change.index, change.before,
             change.after, change.resolution, canonical_bytes(metadata).decode()),
        )


class RecallProjection(TableProjection):
    """FTS5 over archived messages, checkpoint evidence and current memory entries."""

    name = "recall"
    ddl = (
        "CREATE VIRTUAL TABLE IF NOT EXISTS recall_fts USING fts5(text, kind UNINDEXED, session UNINDEXED,"
        " seq UNINDEXED, role UNINDEXED, tokenize = 'unicode61 remove_diacritics 2')",
        "CREATE VIRTUAL TABLE IF NOT EXISTS recall_vocab USING fts5vocab(recall_fts, 'row')",
        "CREATE TABLE IF NOT EXISTS recall_indexed (digest TEXT PRIMARY KEY) WITHOUT ROWID",
    )
    tables = {"recall_fts": "rowid", "recall_indexed": "digest"}
    handles = frozenset({"turn", "checkpoint", "memory_write"})

    def drop(self, conn: sqlite3.Connection) -> None:
        conn.execute("DROP TABLE IF EXISTS recall_vocab")
        super().drop(conn)

    def digest(self, conn: sqlite3.Connection) -> str:
        hasher = blake3(b"hermes-archive/v1/projection\x00recall")
        for row in conn.execute("SELECT rowid, text, kind, session, seq, role FROM recall_fts ORDER BY rowid"):
            hasher.update(canonical_bytes(list(row)) + b"\n")
        for (digest,) in conn.execute("SELECT digest FROM recall_indexed ORDER BY digest"):
            hasher.update(digest.encode() + b"\n")
        return hasher.hexdigest()

    def reduce(self, conn: sqlite3.Connection, event: StoredEvent) -> None:
        if event.type == "memory_write":
            self._index_memory(conn, str(event.body.get("target")))
            return
        digests = event.body["messages"] if event.type == "turn" else event.body["evidence"]
        kind = "turn" if event.type == "turn" else "checkpoint"
        for digest in digests:
            if conn.execute("INSERT OR IGNORE INTO recall_indexed VALUES (?)", (digest,)).rowcount == 0:
                continue  # the same message already indexed (a turn and a checkpoint share it)
            message = part_value(conn, digest)
            if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
                continue
            text = bindable_text(message_text(message))
            if text.strip():
                conn.execute(
                    "INSERT INTO recall_fts (text, kind, session, seq, role) VALUES (?, ?, ?, ?, ?)",
                    (text, kind, event.session, event.seq, message.get("role")),
                )

    @staticmethod
    def _index_memory(conn: sqlite3.Connection, target: str) -> None:
        """Re-index one target's entries as they stand (MemoryProjection is applied first)."""
        conn.execute("DELETE FROM recall_fts WHERE kind = 'memory' AND role = ?", (target,))
        conn.execute(
            "INSERT INTO recall_fts (text, kind, session, seq, role) SELECT content, 'memory', '', seq, target"
            " FROM memory_entries WHERE target = ? AND trim(content) != '' ORDER BY position",
            (target,),
        )


class CheckpointsProjection(TableProjection):
    name = "checkpoints"
    ddl = (
        "CREATE TABLE IF NOT EXISTS checkpoints (seq INTEGER PRIMARY KEY, time TEXT NOT NULL, session TEXT NOT NULL,"
        " parent_session TEXT, evidence_digest TEXT NOT NULL, messages INTEGER NOT NULL, host_api_version INTEGER,"
        " require_checkpoint INTEGER NOT NULL)",
        "CREATE TABLE IF NOT EXISTS checkpoint_failures (seq INTEGER PRIMARY KEY, time TEXT NOT NULL,"
        " session TEXT NOT NULL, error TEXT NOT NULL, require_checkpoint INTEGER NOT NULL)",
    )
    tables = {"checkpoints": "seq", "checkpoint_failures": "seq"}
    handles = frozenset({"checkpoint", "checkpoint_failed"})

    def reduce(self, conn: sqlite3.Connection, event: StoredEvent) -> None:
        body = event.body
        if event.type == "checkpoint":
            conn.execute(
                "INSERT INTO checkpoints VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (event.seq, event.time, event.session, body.get("parent_session"), body["evidence_digest"],
                 len(body["evidence"]), body.get("host_api_version"), int(bool(body.get("require_checkpoint")))),
            )
        else:
            conn.execute(
                "INSERT INTO checkpoint_failures VALUES (?, ?, ?, ?, ?)",
                (event.seq, event.time, event.session, body.get("error", ""), int(bool(body.get("require_checkpoint")))),
            )


class RecallsServedProjection(TableProjection):
    name = "recalls_served"
    ddl = (
        "CREATE TABLE IF NOT EXISTS recalls_served (seq INTEGER PRIMARY KEY, time TEXT NOT NULL, session TEXT NOT NULL,"
        " turn INTEGER NOT NULL, query TEXT NOT NULL, result TEXT NOT NULL, sources TEXT NOT NULL)",
    )
    tables = {"recalls_served": "seq"}
    handles = frozenset({"recall_served"})

    def reduce(self, conn: sqlite3.Connection, event: StoredEvent) -> None:
        body = event.body
        conn.execute(
            "INSERT INTO recalls_served VALUES (?, ?, ?, ?, ?, ?, ?)",
            (event.seq, event.time, event.session, body["turn"], bindable_text(str(part_value(conn, body["query"]))),
             bindable_text(str(part_value(conn, body["result"]))), canonical_bytes(body.get("sources", [])).decode()),
        )


def default_projections() -> list[TableProjection]:
    """Every projection the archive keeps, in the order they are applied."""
    from hivemind.peers import PeersProjection  # only peer events reach it; it imports this module

    return [SessionsProjection(), MemoryProjection(), RecallProjection(), CheckpointsProjection(),
            RecallsServedProjection(), PeersProjection()]
