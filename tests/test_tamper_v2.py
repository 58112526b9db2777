"""The nine tamper classes of agent-memory-integrity, on v2 archives, at two depths
(issue 15 "Done when"): **recent** (events after the newest signed checkpoint, which the
open-time proof verifies) must be refused at open, before anything is served; **deep**
(history before it) must be refused by the background walk, which withdraws service.

Our own implementations of the classes (agmi 0.6.3 installs, but drives stores through
adapters of its own; these edits are the ones its classes make to a SQLite store), made as
an attacker with the file would: triggers dropped, rows changed with plain SQL.
"""

from __future__ import annotations

import shutil
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from blake3 import blake3

from archive_provider.domain.clock import utc_now
from archive_provider.format.events import NewEvent
from archive_provider.storage.store import EventStore
from archive_provider.storage.witness import Witness
from archive_provider.storage.writer import Writer

COLUMNS = "time, type, session, key, identity, payload, parts, author, chain"
RECENT = 3  # events appended after the newest checkpoint before the crash


def _turn(store: EventStore, turn: int, text: str) -> NewEvent:
    part = store.hasher.part({"content": text, "role": "user"})
    body = {"turn": turn, "messages": [part.digest]}
    return NewEvent("turn", "s1", {"turn": turn}, body, (part,))


def _profile(tmp_path: Path, name: str) -> tuple[Path, Witness]:
    """A witnessed v2 archive: cosigned turns, then RECENT turns and a crash."""
    folder = tmp_path / name / "archive"
    EventStore.open(folder).close()
    witness = Witness(tmp_path / f"{name}.witness", folder)
    for turns, backup in ((range(1, 3), "deep"), (range(3, 8), "recent"), (range(8, 9), None)):
        writer = Writer(folder, witness=witness)
        for turn in turns:
            writer.append_durable(lambda s, t=turn: [_turn(s, t, f"{name} turn {t}")], timeout=30)
        assert writer.close().complete
        if backup:  # older copies of the whole folder, for the whole-store rollback
            shutil.copytree(folder, tmp_path / f"{name}.{backup}")
    store = EventStore.open(folder)
    store._last_signed = utc_now().timestamp()  # as a writer that signed a moment ago
    for turn in range(9, 9 + RECENT):
        store.append([_turn(store, turn, f"{name} recent {turn}")])
    store.conn.close()  # a crash: no closing checkpoint
    return folder, witness


def _attacker(folder: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(folder / "events.db", isolation_level=None)
    # the names first: dropping while the SELECT is open upgrades its read snapshot, which
    # fails at once (no busy wait) when a live writer committed since
    triggers = conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall()
    for (name,) in triggers:
        conn.execute(f"DROP TRIGGER {name}")
    return conn


def _target(conn: sqlite3.Connection, depth: str) -> int:
    """A turn at the chosen depth: after the newest checkpoint, or well before it."""
    newest = conn.execute("SELECT max(size) FROM signed_checkpoints").fetchone()[0]
    turns = [s for (s,) in conn.execute("SELECT seq FROM events WHERE type = 'turn' ORDER BY seq")]
    return [s for s in turns if s > newest][1] if depth == "recent" else turns[2]


def content(folder: Path, other: Path, seq: int) -> None:
    conn = _attacker(folder)
    (parts,) = conn.execute("SELECT parts FROM events WHERE seq = ?", (seq,)).fetchone()
    changed = conn.execute(
        "UPDATE payloads SET body = ? WHERE digest = ?",
        (b'{"content":"I never said that","role":"user"}', parts[:32]),
    ).rowcount
    assert changed == 1


def truncation(folder: Path, other: Path, seq: int) -> None:
    _attacker(folder).execute("DELETE FROM events WHERE seq >= ?", (seq,))


def deletion(folder: Path, other: Path, seq: int) -> None:
    _attacker(folder).execute("DELETE FROM events WHERE seq = ?", (seq,))


def reorder(folder: Path, other: Path, seq: int) -> None:
    conn = _attacker(folder)
    a = conn.execute(f"SELECT {COLUMNS} FROM events WHERE seq = ?", (seq,)).fetchone()
    b = conn.execute(f"SELECT {COLUMNS} FROM events WHERE seq = ?", (seq - 1,)).fetchone()
    conn.execute("DELETE FROM events WHERE seq IN (?, ?)", (seq, seq - 1))
    conn.execute(f"INSERT INTO events (seq, {COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)", (seq - 1, *a))
    conn.execute(f"INSERT INTO events (seq, {COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)", (seq, *b))


def forged_insertion(folder: Path, other: Path, seq: int) -> None:
    """A new event with a well-formed payload put in at ``seq``; later events move up."""
    conn = _attacker(folder)
    row = list(conn.execute(f"SELECT {COLUMNS} FROM events WHERE seq = ?", (seq,)).fetchone())
    salt = b"\x01" * 32
    body = b'{"turn":99,"messages":[]}'
    digest = blake3(b"hermes-archive/v2/payload\x00" + salt + body).digest()
    conn.execute("INSERT INTO payloads (digest, salt, body) VALUES (?, ?, ?)", (digest, salt, body))
    row[3], row[5] = '{"turn":99}', digest
    row[4] = blake3(b"forged identity").digest()
    conn.execute("UPDATE events SET seq = seq + 1000000 WHERE seq >= ?", (seq,))
    conn.execute("UPDATE events SET seq = seq - 1000000 + 1 WHERE seq >= 1000000")
    conn.execute(f"INSERT INTO events (seq, {COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)", (seq, *row))


def cross_profile(folder: Path, other: Path, seq: int) -> None:
    """The other profile's event at ``seq`` (and its payloads) replayed into this one."""
    conn = _attacker(folder)
    source = sqlite3.connect(other / "events.db")
    row = source.execute(f"SELECT {COLUMNS} FROM events WHERE seq = ?", (seq,)).fetchone()
    for payload in source.execute("SELECT digest, salt, lookup, body FROM payloads"):
        conn.execute("INSERT OR IGNORE INTO payloads VALUES (?, ?, ?, ?)", payload)
    source.close()
    conn.execute("DELETE FROM events WHERE seq = ?", (seq,))
    conn.execute(f"INSERT INTO events (seq, {COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)", (seq, *row))


def rollback_replay(folder: Path, other: Path, seq: int) -> None:
    """An earlier event of this store replayed in place of the one at ``seq``."""
    conn = _attacker(folder)
    row = conn.execute(f"SELECT {COLUMNS} FROM events WHERE seq = ?", (seq - 2,)).fetchone()
    conn.execute("DELETE FROM events WHERE seq IN (?, ?)", (seq, seq - 2))
    conn.execute(f"INSERT INTO events (seq, {COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)", (seq, *row))


def metadata(folder: Path, other: Path, seq: int) -> None:
    _attacker(folder).execute(
        "UPDATE events SET time = '2020-01-01T00:00:00.000000Z' WHERE seq = ?", (seq,)
    )


def whole_store_rollback(folder: Path, other: Path, seq: int) -> None:
    """An older copy of the whole folder put back: the last cosigned session missing
    (recent), or all but the first (deep)."""
    depth = "recent" if seq > _newest(folder) else "deep"
    shutil.rmtree(folder)
    shutil.copytree(folder.parent.parent / f"{folder.parent.name}.{depth}", folder)


def _newest(folder: Path) -> int:
    conn = sqlite3.connect(folder / "events.db")
    try:
        return int(conn.execute("SELECT max(size) FROM signed_checkpoints").fetchone()[0])
    finally:
        conn.close()


CLASSES: dict[str, Callable[[Path, Path, int], None]] = {
    "content": content,
    "truncation": truncation,
    "deletion": deletion,
    "reorder": reorder,
    "forged insertion": forged_insertion,
    "cross-profile replay": cross_profile,
    "rollback replay": rollback_replay,
    "metadata": metadata,
    "whole-store rollback": whole_store_rollback,
}


def _settled(writer: Writer) -> None:
    deadline = time.monotonic() + 60  # a liveness bound, never a performance claim
    while not (writer.proven.is_set() or writer.refused) and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.mark.parametrize("depth", ["recent", "deep"])
@pytest.mark.parametrize("name", list(CLASSES))
def test_tampered_memory_is_never_served(tmp_path: Path, name: str, depth: str) -> None:
    folder, witness = _profile(tmp_path, "a")
    other, _ = _profile(tmp_path, "b")
    conn = sqlite3.connect(folder / "events.db")
    seq = _target(conn, depth)
    conn.close()
    CLASSES[name](folder, other, seq)

    writer = Writer(folder, witness=witness)
    try:
        _settled(writer)  # the eager open-time proof has run (passed or refused)
        walk = writer._walk
        if depth == "recent":
            # damage in the served set: refused by the open-time proof itself, at once
            assert walk is None and not writer.proven.is_set(), (name, writer.last_proof)
        else:  # elsewhere: refused by the background walk (or at once, when it can be)
            assert walk is None or walk.wait(60)
        assert writer.refused is not None, (name, depth, writer.last_proof)
        assert not writer.proven.is_set()  # recall is withheld from now on
        with pytest.raises(Exception, match="refused|witness mismatch|failed verification"):
            writer.append_durable(lambda s: [_turn(s, 100, "after the tamper")], timeout=60)
    finally:
        writer.close()
