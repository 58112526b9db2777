"""Write a format-1 archive of any size quickly, for tests of ``migrate`` at scale.

No product code writes format 1 any more (0.2.0 only migrates it), and the frozen archive
0.1.0 wrote (tests/fixtures/v1_archive) holds 11 events. This writes what 0.1.0 wrote for
a run of conversations, by docs/FORMAT.md Part I: the log's tables, indexes and triggers of
section 6 as that frozen archive has them, and the digests, envelopes and chain of
sections 3 to 5 (``archive_provider.format.digests``, pinned by tests/vectors/chain.json),
inserted with one ``executemany`` per table. Turn events have the shape 0.1.0 gave them
(``body.messages`` names the two messages, which are the event's parts).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from archive_provider.format.canonical import canonical_bytes
from archive_provider.format.digests import (
    Envelope,
    chain_hash,
    genesis_chain,
    identity_digest,
    key_text,
    parts_text,
    payload_digest,
)

FROZEN = Path(__file__).parent / "fixtures" / "v1_archive" / "events.db"
LOG_TABLES = ("meta", "events", "payloads", "head")
STORE_ID = "5eed0f1a2b3c4d5e6f708192a3b4c5d6"
KEY = bytes(range(7, 39))
#: turns per session: a session_started, then this many turns of two messages each
TURNS_PER_SESSION = 49


def messages(session: int, turn: int) -> list[dict[str, str]]:
    """The two messages of a turn; every text is distinct, so a lost one is noticed."""
    return [
        {"content": f"Session {session} turn {turn}: where did the heron fish?", "role": "user"},
        {"content": f"By the river, session {session} turn {turn}.", "role": "assistant"},
    ]


def events_in(sessions: int) -> int:
    """The number of events :func:`write_v1_archive` writes for ``sessions``."""
    return sessions * (1 + TURNS_PER_SESSION)


def _time(session: int) -> str:
    """One write transaction per session: its events share this time (FORMAT.md 4)."""
    hours, seconds = divmod(session, 3600)
    return f"2026-11-01T{hours % 24:02d}:{seconds // 60:02d}:{seconds % 60:02d}.000000Z"


@dataclass(frozen=True)
class V1Event:
    """One event as 0.1.0's writer took it: its parts as their canonical bytes."""

    time: str
    type: str
    session: str
    key: dict[str, Any]
    body: Any
    parts: tuple[bytes, ...] = ()


def _events(sessions: int) -> Iterator[V1Event]:
    for number in range(1, sessions + 1):
        session, at = f"sess-{number:05d}", _time(number)
        started = {"agent_context": "primary", "host": "0.19.0", "platform": "cli"}
        yield V1Event(at, "session_started", session, {"at": at, "session": session}, started)
        for turn in range(1, TURNS_PER_SESSION + 1):
            parts = tuple(canonical_bytes(m) for m in messages(number, turn))
            digests = [payload_digest(KEY, p) for p in parts]
            key = {"messages": digests, "session": session, "turn": turn}
            body = {"legacy_shape": False, "messages": digests, "start": 2 * turn - 2, "turn": turn}
            yield V1Event(at, "turn", session, key, body, parts)


def write_v1_archive(folder: Path, sessions: int) -> int:
    """A format-1 archive in ``folder`` (``<home>/archive``) of ``sessions`` conversations;
    returns its number of events (:func:`events_in`)."""
    return write_v1_log(folder, STORE_ID, KEY, _events(sessions))


def write_v1_log(folder: Path, store_id: str, key: bytes, events: Iterable[V1Event]) -> int:
    """A format-1 archive in ``folder`` (made here) holding ``events``; returns how many."""
    folder.mkdir(parents=True, mode=0o700)
    (folder / "payload.key").write_text(key.hex() + "\n")
    os.chmod(folder / "payload.key", 0o600)
    frozen = sqlite3.connect(f"{FROZEN.absolute().as_uri()}?mode=ro", uri=True)
    marks = ",".join("?" * len(LOG_TABLES))
    schema = [
        sql
        for (sql,) in frozen.execute(
            f"SELECT sql FROM sqlite_master WHERE tbl_name IN ({marks}) AND sql IS NOT NULL"
            " ORDER BY rowid",
            LOG_TABLES,
        )
    ]
    frozen.close()
    conn = sqlite3.connect(folder / "events.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("BEGIN")
    for statement in schema:
        conn.execute(statement)
    conn.executemany(
        "INSERT INTO meta VALUES (?, ?)",
        [("format_version", "1"), ("store_id", store_id), ("created", _time(0))],
    )
    chain = genesis_chain(store_id)
    rows: list[tuple[object, ...]] = []
    payloads: dict[str, bytes] = {}
    for seq, event in enumerate(events, start=1):
        body = canonical_bytes(event.body)
        payload = payload_digest(key, body)
        digests = [payload_digest(key, p) for p in event.parts]
        payloads[payload] = body
        payloads.update(zip(digests, event.parts, strict=True))
        envelope = Envelope(
            seq,
            event.time,
            event.type,
            event.session,
            key_text(event.key),
            identity_digest(event.type, event.key),
            payload,
            parts_text(digests),
        )
        chain = chain_hash(chain, envelope)
        rows.append((*(getattr(envelope, f) for f in _COLUMNS), chain))
    conn.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    conn.executemany("INSERT INTO payloads VALUES (?, ?)", payloads.items())
    if rows:
        conn.execute("INSERT INTO head VALUES (1, ?, ?)", (len(rows), chain))
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    os.chmod(folder / "events.db", 0o600)
    return len(rows)


_COLUMNS = ("seq", "time", "type", "session", "key", "identity", "payload", "parts")
