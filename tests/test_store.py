"""The SQLite log and its writer, on real files (docs/FORMAT.md sections 1, 6 and 7).

Tamper tests drop the append-only triggers (as an attacker with the file could), change the
database, and check that ``verify_database`` and the standalone verifier run as a separate
process both name the exact first bad sequence number.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from archive_provider.format import verifier
from archive_provider.format.canonical import CanonicalEncodingError, canonical_bytes
from archive_provider.format.digests import (
    Envelope,
    chain_hash,
    identity_digest,
    key_text,
    parts_text,
    payload_digest,
)
from archive_provider.format.events import AppendResult, NewEvent, StoredEvent
from archive_provider.storage.store import DB_NAME, KEY_NAME, EventStore, StoreError
from archive_provider.storage.writer import Writer, WriterUnavailable, writers

ROOT = Path(__file__).resolve().parents[1]
VERIFIER = ROOT / "archive_provider" / "format" / "verifier.py"
TRIGGERS = (
    "events_append_only_update",
    "events_append_only_delete",
    "payloads_immutable",
    "payloads_no_delete",
)


def turn(n: int, session: str = "s1", text: str | None = None) -> NewEvent:
    return NewEvent(
        "turn", session, {"session": session, "turn": n}, {"text": text or f"message {n}"}
    )


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return tmp_path / "home" / "archive"


@pytest.fixture
def store(folder: Path) -> Iterator[EventStore]:
    opened = EventStore.open(folder)
    yield opened
    opened.close()


def raw(folder: Path) -> sqlite3.Connection:
    """A plain connection, as an auditor or an attacker would open the file."""
    return sqlite3.connect(folder / DB_NAME, isolation_level=None)


# -- append and read back -------------------------------------------------------------------


def test_append_and_read_back(store: EventStore) -> None:
    message = store.hasher.part({"role": "user", "content": "hello"})
    first = NewEvent("session_started", "s1", {"session": "s1"}, {"platform": "cli"})
    second = NewEvent("turn", "s1", {"turn": 1, "m": [message.digest]}, {"turn": 1}, (message,))
    results = store.append([first, second])
    assert [(r.outcome, r.seq, r.type) for r in results] == [
        ("appended", 1, "session_started"),
        ("appended", 2, "turn"),
    ]
    events = list(store.events())
    assert [e.seq for e in events] == [1, 2]
    assert events[0].body == {"platform": "cli"} and events[0].key == {"session": "s1"}
    assert events[1].part_digests == [message.digest]
    assert store.payload(message.digest) == canonical_bytes({"role": "user", "content": "hello"})
    assert store.event(2) is not None and store.event(2).envelope.identity == results[1].identity  # type: ignore[union-attr]
    assert store.event(3) is None
    assert store.identity_seq(results[0].identity) == 1
    head = store.head()
    assert (head.seq, head.chain) == (2, events[1].chain)
    assert [e.seq for e in store.events(after_seq=1)] == [2]


def test_every_row_follows_the_chain_rule(store: EventStore) -> None:
    """Recompute each row's identity, payload digest and chain from the spec's formulas."""
    store.append([turn(1), turn(2)])
    store.append([turn(3)])
    previous = verifier.genesis(store.store_id)
    for event in store.events():
        envelope = event.envelope
        assert envelope.identity == identity_digest("turn", event.key)
        assert envelope.payload == payload_digest(store.key, event.body_bytes)
        assert envelope.key == key_text(event.key)
        assert event.chain == chain_hash(previous, envelope)
        previous = event.chain
    assert store.head().chain == previous


def test_same_event_twice_is_stored_once(store: EventStore) -> None:
    (first,) = store.append([turn(1)])
    (again,) = store.append([turn(1, text="a different body, the same identity")])
    assert (first.outcome, again.outcome) == ("appended", "already_archived")
    assert again.seq == first.seq and again.identity == first.identity
    assert store.conn.execute("SELECT count(*) FROM events").fetchone()[0] == 1
    assert next(store.events()).body == {"text": "message 1"}  # the first one stays
    assert store.head().seq == 1


def test_same_event_twice_in_one_batch(store: EventStore) -> None:
    results = store.append([turn(1), turn(1), turn(2)])
    assert [(r.outcome, r.seq) for r in results] == [
        ("appended", 1),
        ("already_archived", 1),
        ("appended", 2),
    ]


def test_payloads_and_parts_are_stored_once(store: EventStore) -> None:
    part = store.hasher.part({"role": "user", "content": "same"})
    store.append(
        [
            NewEvent("turn", "s", {"t": 1}, {"same": True}, (part,)),
            NewEvent("checkpoint", "s", {"t": 2}, {"same": True}, (part,)),
        ]
    )
    assert store.conn.execute("SELECT count(*) FROM payloads").fetchone()[0] == 2


def test_an_unencodable_event_rolls_back_the_whole_batch(store: EventStore) -> None:
    bad = NewEvent("turn", "s", {"turn": 2}, {"x": float("nan")})
    with pytest.raises(CanonicalEncodingError):
        store.append([turn(1), bad])
    assert store.conn.execute("SELECT count(*) FROM events").fetchone()[0] == 0
    assert store.conn.execute("SELECT count(*) FROM payloads").fetchone()[0] == 0
    assert store.head().seq == 0
    assert store.append([turn(1)])[0].seq == 1


def test_two_connections_never_fork_the_chain(folder: Path) -> None:
    """Two stores on one file (as two processes) read the head inside the write transaction."""
    one, two = EventStore.open(folder), EventStore.open(folder)
    try:
        for n in range(1, 21):
            (one if n % 2 else two).append([turn(n)])
        assert [e.seq for e in one.events()] == list(range(1, 21))
        assert verifier.verify_database(two.conn, two.key).ok
    finally:
        one.close()
        two.close()


def test_durable_append_sets_full_before_begin(store: EventStore) -> None:
    """SQLite changes the synchronous level only between transactions."""
    statements: list[str] = []
    store.conn.set_trace_callback(statements.append)
    store.append([turn(1)], durable=True)
    store.append([turn(2)])
    store.conn.set_trace_callback(None)
    begins = [i for i, sql in enumerate(statements) if sql.startswith("BEGIN")]
    assert statements[begins[0] - 1] == "PRAGMA synchronous = FULL"
    assert statements[begins[1] - 1] == "PRAGMA synchronous = NORMAL"
    other = sqlite3.connect(store.path)
    assert other.execute("SELECT count(*) FROM events").fetchone()[0] == 2
    other.close()


# -- the database refuses to rewrite history ----------------------------------------------


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("UPDATE events SET type = 'checkpoint' WHERE seq = 1", "events are append-only"),
        ("UPDATE events SET seq = 9 WHERE seq = 1", "events are append-only"),
        ("DELETE FROM events WHERE seq = 1", "events are append-only"),
        ("DELETE FROM events", "events are append-only"),
        ("UPDATE payloads SET body = x'00'", "payloads are immutable"),
        ("DELETE FROM payloads", "payloads are kept"),
    ],
)
def test_triggers_refuse_rewrites(store: EventStore, folder: Path, sql: str, message: str) -> None:
    store.append([turn(1)])
    conn = raw(folder)
    with pytest.raises(sqlite3.DatabaseError, match=message):
        conn.execute(sql)
    conn.close()
    assert verifier.verify_database(store.conn, store.key).ok


# -- files and permissions ------------------------------------------------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_folder_and_files_are_private(folder: Path) -> None:
    old = os.umask(0)  # even with a permissive umask
    try:
        store = EventStore.open(folder)
        store.append([turn(1)])
    finally:
        os.umask(old)
    try:
        assert _mode(folder) == 0o700
        assert _mode(folder / DB_NAME) == 0o600
        assert _mode(folder / KEY_NAME) == 0o600
        for side in ("-wal", "-shm"):
            path = folder / (DB_NAME + side)
            if path.exists():
                assert _mode(path) == 0o600, side
        key_text_on_disk = (folder / KEY_NAME).read_text()
        assert len(key_text_on_disk.strip()) == 64 and bytes.fromhex(key_text_on_disk) == store.key
        assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        store.close()


def test_reopen_keeps_store_id_key_and_head(folder: Path) -> None:
    first = EventStore.open(folder)
    first.append([turn(1)])
    identity = (first.store_id, first.key, first.head())
    first.close()
    again = EventStore.open(folder)
    assert (again.store_id, again.key, again.head()) == identity
    again.close()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "payload key .* is missing"),
        ("this is garbage\n", "is not hex text"),
        ("abcd\n", "must hold 32 bytes, found 2"),
    ],
)
def test_missing_or_malformed_key_is_a_clear_error(
    folder: Path, content: str | None, message: str
) -> None:
    EventStore.open(folder).close()
    key = folder / KEY_NAME
    if content is None:
        key.unlink()
    else:
        key.write_text(content)
    with pytest.raises(StoreError, match=message):
        EventStore.open(folder)


def test_open_without_create_or_readonly_needs_an_archive(folder: Path) -> None:
    with pytest.raises(StoreError, match="no archive"):
        EventStore.open(folder, create=False)
    with pytest.raises(StoreError, match="no archive"):
        EventStore.open(folder, readonly=True)
    assert not folder.exists()


def test_readonly_open_with_a_relative_path(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    EventStore.open(folder).close()
    monkeypatch.chdir(folder.parent)
    store = EventStore.open(Path("archive"), readonly=True)
    try:
        assert store.head().seq == 0
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            store.append([turn(1)])
    finally:
        store.close()


def test_a_corrupt_database_is_a_clear_error(folder: Path) -> None:
    EventStore.open(folder).close()
    for side in ("-wal", "-shm"):
        (folder / (DB_NAME + side)).unlink(missing_ok=True)
    (folder / DB_NAME).write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="cannot open the archive"):
        EventStore.open(folder)


def test_a_locked_database_is_not_called_corrupt(folder: Path) -> None:
    """A lock held beyond the busy timeout must not send the user to restore a backup."""
    EventStore.open(folder).close()
    locker = raw(folder)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreError, match="locked") as caught:
            EventStore.open(folder, busy_timeout_ms=50)
        assert "corrupt" not in str(caught.value) and "backup" not in str(caught.value)
    finally:
        locker.execute("COMMIT")
        locker.close()
    EventStore.open(folder).close()


def test_another_format_version_is_refused(folder: Path) -> None:
    EventStore.open(folder).close()
    conn = raw(folder)
    conn.execute("UPDATE meta SET value = '2' WHERE name = 'format_version'")
    conn.close()
    with pytest.raises(StoreError, match="format version 2"):
        EventStore.open(folder)


# -- tamper evidence ------------------------------------------------------------------------


@pytest.fixture
def log(folder: Path) -> Path:
    """Six events (two naming the same part), appended in three transactions."""
    store = EventStore.open(folder)
    shared = store.hasher.part({"role": "user", "content": "shared message"})
    store.append([NewEvent("session_started", "s1", {"session": "s1"}, {"platform": "cli"})])
    store.append(
        [
            NewEvent("turn", "s1", {"turn": 1}, {"turn": 1, "m": [shared.digest]}, (shared,)),
            turn(2),
            turn(3),
        ]
    )
    store.append(
        [NewEvent("checkpoint", "s1", {"cp": 1}, {"m": [shared.digest]}, (shared,)), turn(5)]
    )
    assert store.head().seq == 6
    store.close()
    conn = raw(folder)
    for trigger in TRIGGERS:
        conn.execute(f"DROP TRIGGER {trigger}")
    conn.close()
    return folder


def key_of(folder: Path) -> bytes:
    return bytes.fromhex((folder / KEY_NAME).read_text())


def verify_both(folder: Path) -> tuple[verifier.Report, dict[str, Any], int]:
    conn = sqlite3.connect(folder / DB_NAME, isolation_level=None)
    try:
        report = verifier.verify_database(conn, key_of(folder))
    finally:
        conn.close()
    done = subprocess.run(
        [sys.executable, str(VERIFIER), str(folder / DB_NAME), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=folder,
    )
    return report, json.loads(done.stdout), done.returncode


def assert_first_bad(folder: Path, seq: int, problem: str = "") -> None:
    report, cli, code = verify_both(folder)
    assert not report.ok
    assert report.first_bad_seq == seq, report.problem
    assert problem in (report.problem or "")
    assert code == 1
    assert cli["ok"] is False and cli["first_bad_seq"] == seq and cli["problem"] == report.problem


def test_untampered_log_verifies(log: Path) -> None:
    report, cli, code = verify_both(log)
    assert report.ok and report.events_checked == 6 and report.last_seq == 6
    assert code == 0 and cli["ok"] is True and cli["first_bad_seq"] is None


def _payload_of(conn: sqlite3.Connection, seq: int) -> str:
    return str(conn.execute("SELECT payload FROM events WHERE seq = ?", (seq,)).fetchone()[0])


def test_changed_payload_byte(log: Path) -> None:
    conn = raw(log)
    digest = _payload_of(conn, 3)
    body = bytearray(
        conn.execute("SELECT body FROM payloads WHERE digest = ?", (digest,)).fetchone()[0]
    )
    body[-3] ^= 0x01
    conn.execute("UPDATE payloads SET body = ? WHERE digest = ?", (bytes(body), digest))
    conn.close()
    assert_first_bad(log, 3, "does not match its bytes")


def test_changed_shared_part_names_the_first_event_using_it(log: Path) -> None:
    conn = raw(log)
    (parts,) = conn.execute("SELECT parts FROM events WHERE seq = 2").fetchone()
    conn.execute(
        "UPDATE payloads SET body = ? WHERE digest = ?", (b'"forged"', json.loads(parts)[0])
    )
    conn.close()
    assert_first_bad(log, 2, "part")


@pytest.mark.parametrize(
    ("column", "value", "problem"),
    [
        ("type", "session_ended", "identity"),
        ("time", "2020-01-01T00:00:00.000000Z", "chain hash"),
        ("session", "someone-else", "chain hash"),
        ("key", '{"session":"s1","turn":99}', "identity"),
        ("parts", "(SELECT parts FROM events WHERE seq = 2)", "chain hash"),  # real parts
        ("chain", "0" * 64, "chain hash"),
    ],
)
def test_changed_envelope_field(log: Path, column: str, value: str, problem: str) -> None:
    conn = raw(log)
    if value.startswith("(SELECT"):
        conn.execute(f"UPDATE events SET {column} = {value} WHERE seq = 4")
    else:
        conn.execute(f"UPDATE events SET {column} = ? WHERE seq = 4", (value,))
    conn.close()
    assert_first_bad(log, 4, problem)


def test_changed_type_with_recomputed_identity(log: Path) -> None:
    """Recomputing the identity does not help: the chain commits to the whole envelope."""
    conn = raw(log)
    (key,) = conn.execute("SELECT key FROM events WHERE seq = 4").fetchone()
    identity = verifier.identity_of("session_ended", key)
    conn.execute(
        "UPDATE events SET type = 'session_ended', identity = ? WHERE seq = 4", (identity,)
    )
    conn.close()
    assert_first_bad(log, 4, "chain hash")


def test_payload_pointer_moved_to_another_valid_payload(log: Path) -> None:
    conn = raw(log)
    conn.execute("UPDATE events SET payload = ? WHERE seq = 4", (_payload_of(conn, 6),))
    conn.close()
    assert_first_bad(log, 4, "chain hash")


def test_payload_rows_swapped(log: Path) -> None:
    conn = raw(log)
    a, b = _payload_of(conn, 3), _payload_of(conn, 5)
    body_a = conn.execute("SELECT body FROM payloads WHERE digest = ?", (a,)).fetchone()[0]
    body_b = conn.execute("SELECT body FROM payloads WHERE digest = ?", (b,)).fetchone()[0]
    conn.execute("UPDATE payloads SET body = ? WHERE digest = ?", (body_b, a))
    conn.execute("UPDATE payloads SET body = ? WHERE digest = ?", (body_a, b))
    conn.close()
    assert_first_bad(log, 3, "does not match its bytes")


def test_payload_row_missing(log: Path) -> None:
    conn = raw(log)
    conn.execute("DELETE FROM payloads WHERE digest = ?", (_payload_of(conn, 5),))
    conn.close()
    assert_first_bad(log, 5, "missing")


def test_middle_event_deleted(log: Path) -> None:
    conn = raw(log)
    conn.execute("DELETE FROM events WHERE seq = 3")
    conn.close()
    assert_first_bad(log, 3, "sequence gap")


def test_middle_event_deleted_and_later_ones_renumbered(log: Path) -> None:
    conn = raw(log)
    conn.execute("DELETE FROM events WHERE seq = 3")
    for seq in (4, 5, 6):
        conn.execute("UPDATE events SET seq = ? WHERE seq = ?", (seq - 1, seq))
    conn.close()
    assert_first_bad(log, 3, "chain hash")


def test_tail_truncated_with_head_left(log: Path) -> None:
    conn = raw(log)
    conn.execute("DELETE FROM events WHERE seq >= 5")
    conn.close()
    assert_first_bad(log, 5, "truncated")


def test_all_events_deleted_with_head_left(log: Path) -> None:
    conn = raw(log)
    conn.execute("DELETE FROM events")
    conn.close()
    assert_first_bad(log, 1, "truncated")


def test_two_events_swapped(log: Path) -> None:
    conn = raw(log)
    conn.execute("UPDATE events SET seq = -3 WHERE seq = 3")
    conn.execute("UPDATE events SET seq = 3 WHERE seq = 4")
    conn.execute("UPDATE events SET seq = 4 WHERE seq = -3")
    conn.close()
    assert_first_bad(log, 3, "chain hash")


def _forge(conn: sqlite3.Connection, key: bytes, seq: int, previous_chain: str) -> str:
    """Insert a well-formed event at ``seq`` chained correctly to ``previous_chain``."""
    body = canonical_bytes({"text": "forged"})
    payload = payload_digest(key, body)
    identity_key = {"session": "s1", "turn": 1000 + seq}
    envelope = Envelope(
        seq,
        "2026-01-01T00:00:00.000000Z",
        "turn",
        "s1",
        key_text(identity_key),
        identity_digest("turn", identity_key),
        payload,
        parts_text([]),
    )
    chain = chain_hash(previous_chain, envelope)
    conn.execute("INSERT OR IGNORE INTO payloads VALUES (?, ?)", (payload, body))
    conn.execute(
        "INSERT INTO events (seq, time, type, session, key, identity, payload, parts, chain) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            seq,
            envelope.time,
            "turn",
            "s1",
            envelope.key,
            envelope.identity,
            payload,
            envelope.parts,
            chain,
        ),
    )
    return chain


def _chain_at(conn: sqlite3.Connection, seq: int) -> str:
    return str(conn.execute("SELECT chain FROM events WHERE seq = ?", (seq,)).fetchone()[0])


def test_forged_event_appended_after_the_head(log: Path) -> None:
    conn = raw(log)
    _forge(conn, key_of(log), 7, _chain_at(conn, 6))
    conn.close()
    assert_first_bad(log, 7, "after the recorded head")


def test_forged_event_inserted_with_later_events_renumbered(log: Path) -> None:
    """The forged event itself verifies (its chain is right); its successor cannot."""
    conn = raw(log)
    for seq in (6, 5, 4):
        conn.execute("UPDATE events SET seq = ? WHERE seq = ?", (seq + 1, seq))
    _forge(conn, key_of(log), 4, _chain_at(conn, 3))
    conn.execute("UPDATE head SET seq = 7")
    conn.close()
    assert_first_bad(log, 5, "chain hash")


def test_forged_event_replacing_one_in_place(log: Path) -> None:
    conn = raw(log)
    conn.execute("DELETE FROM events WHERE seq = 4")
    _forge(conn, key_of(log), 4, _chain_at(conn, 3))
    conn.close()
    assert_first_bad(log, 5, "chain hash")


def test_head_chain_changed(log: Path) -> None:
    conn = raw(log)
    conn.execute("UPDATE head SET chain = ?", ("0" * 64,))
    conn.close()
    assert_first_bad(log, 6, "head")


def test_store_id_changed(log: Path) -> None:
    conn = raw(log)
    conn.execute("UPDATE meta SET value = ? WHERE name = 'store_id'", ("f" * 32,))
    conn.close()
    assert_first_bad(log, 1, "chain hash")


def test_a_blob_where_text_belongs_is_reported_not_crashed_on(log: Path) -> None:
    conn = raw(log)
    conn.execute("UPDATE events SET session = CAST('s1' AS BLOB) WHERE seq = 2")
    conn.close()
    assert_first_bad(log, 2, "malformed")


def test_known_limit_a_consistent_rewrite_of_the_tail_is_not_detected(log: Path) -> None:
    """Documented in FORMAT.md s7: whoever holds the file and the key can rewrite the tail
    (or roll the whole store back) consistently; only an external witness catches that."""
    conn = raw(log)
    conn.execute("DELETE FROM events WHERE seq >= 5")
    chain = _forge(conn, key_of(log), 5, _chain_at(conn, 4))
    conn.execute("UPDATE head SET seq = 5, chain = ?", (chain,))
    conn.close()
    report, cli, code = verify_both(log)
    assert report.ok and code == 0 and cli["last_seq"] == 5


def test_verifier_cli_with_a_path_needing_quoting(tmp_path: Path) -> None:
    folder = tmp_path / "backup #3 ?50%" / "archive"
    store = EventStore.open(folder)
    store.append([turn(1)])
    store.close()
    done = subprocess.run(
        [sys.executable, str(VERIFIER), str(folder / DB_NAME), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["events_checked"] == 1


def test_verifier_cli_without_a_key_fails_cleanly(log: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(VERIFIER),
            str(log / DB_NAME),
            "--key",
            str(tmp_path / "none"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    report = json.loads(done.stdout)
    assert done.returncode == 1 and report["ok"] is False and report["first_bad_seq"] is None
    assert "cannot read the archive" in report["problem"]


# -- the writer -----------------------------------------------------------------------------


def builder(*events: NewEvent) -> Callable[[EventStore], list[NewEvent]]:
    return lambda store: list(events)


class Recorder:
    """A projection that records every statement the writer's connection runs."""

    name = "recorder"

    def __init__(self) -> None:
        self.statements: list[str] = []

    def create(self, conn: sqlite3.Connection) -> None:
        conn.set_trace_callback(self.statements.append)

    def apply(self, conn: sqlite3.Connection, event: StoredEvent) -> None:
        pass

    def last_seq(self, conn: sqlite3.Connection) -> int:
        return 0


class Threads:
    """A thread factory that remembers the threads it made (to check they end)."""

    def __init__(self) -> None:
        self.made: list[threading.Thread] = []

    def __call__(
        self, target: Callable[[], None], *, name: str, daemon: bool = True
    ) -> threading.Thread:
        thread = threading.Thread(target=target, name=name, daemon=daemon)
        self.made.append(thread)
        return thread


def test_writer_burst_of_10000_keeps_order_and_group_commits(folder: Path) -> None:
    recorder = Recorder()
    writer = Writer(folder, projections_factory=lambda: (recorder,))
    started, release = threading.Event(), threading.Event()

    def blocker(store: EventStore) -> list[NewEvent]:
        started.set()
        release.wait(10)
        return [turn(0)]

    try:
        first = writer.submit(blocker)
        assert started.wait(10)
        futures = [writer.submit(builder(turn(n))) for n in range(1, 10001)]
        release.set()
        results = [future.result(timeout=60) for future in [first, *futures]]
        assert [result.seq for (result,) in results] == list(range(1, 10002))
        assert all(result.outcome == "appended" for (result,) in results)
        transactions = [s for s in recorder.statements if s.startswith("BEGIN IMMEDIATE")]
        assert len(transactions) <= 25  # batches of up to 512 jobs, not one commit per job
    finally:
        report = writer.close()
    assert report.complete and report.unwritten == []
    store = EventStore.open(folder)
    try:
        seqs = [row[0] for row in store.conn.execute("SELECT seq FROM events ORDER BY seq")]
        assert seqs == list(range(1, 10002))
        assert [e.key["turn"] for e in store.events()] == list(range(10001))
        assert verifier.verify_database(store.conn, store.key).ok
    finally:
        store.close()


def test_writer_durable_append_is_committed_on_return(folder: Path) -> None:
    writer = Writer(folder)
    try:
        ordinary = writer.submit(builder(turn(1)))
        (result,) = writer.append_durable(builder(turn(2)), timeout=10)
        assert (result.outcome, result.seq) == ("appended", 2)
        assert ordinary.done() and ordinary.result()[0].seq == 1  # committed with it, in order
        conn = raw(folder)
        assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == 2
        conn.close()
        (again,) = writer.append_durable(builder(turn(2)), timeout=10)
        assert (again.outcome, again.seq) == ("already_archived", 2)
    finally:
        assert writer.close().complete


def test_writer_close_reports_what_the_unopenable_store_kept(folder: Path) -> None:
    EventStore.open(folder).close()
    (folder / KEY_NAME).write_text("garbage, not a key\n")
    threads = Threads()
    writer = Writer(folder, thread_factory=threads)
    futures = [writer.submit(builder(turn(n)), label=f"turn {n}") for n in (1, 2, 3)]
    time.sleep(0.2)
    report = writer.close(timeout=5)
    assert report.unwritten == ["turn 1", "turn 2", "turn 3"]
    assert not report.complete
    assert report.error and "not hex" in report.error
    for future in futures:
        with pytest.raises(WriterUnavailable, match="closed before this write landed"):
            future.result(timeout=1)
    assert not threads.made[0].is_alive()
    late = writer.submit(builder(turn(4)))
    with pytest.raises(WriterUnavailable, match="closed"):
        late.result(timeout=1)


def test_writer_durable_fails_fast_while_the_key_is_bad_then_recovers(folder: Path) -> None:
    EventStore.open(folder).close()
    key_file = folder / KEY_NAME
    good_key = key_file.read_text()
    key_file.write_text("garbage\n")
    writer = Writer(folder)
    try:
        queued = writer.submit(builder(turn(1)))
        began = time.monotonic()
        with pytest.raises(WriterUnavailable, match="payload key"):
            writer.append_durable(builder(turn(2)), timeout=30)
        assert time.monotonic() - began < 5
        assert not queued.done()
        key_file.write_text(good_key)
        assert queued.result(timeout=10)[0].seq == 1
        assert writer.append_durable(builder(turn(3)), timeout=10)[0].seq == 2
    finally:
        assert writer.close().complete
    conn = raw(folder)
    assert [r[0] for r in conn.execute("SELECT key FROM events ORDER BY seq")] == [
        '{"session":"s1","turn":1}',
        '{"session":"s1","turn":3}',
    ]  # the failed durable event was not written behind its caller's back
    conn.close()


def test_writer_locked_database_durable_fails_fast_ordinary_lands_later(folder: Path) -> None:
    writer = Writer(folder, busy_timeout_ms=100)
    assert writer.flush(10)  # the store is open
    locker = raw(folder)
    try:
        locker.execute("BEGIN EXCLUSIVE")
        queued = [writer.submit(builder(turn(n))) for n in (1, 2, 3)]
        time.sleep(0.3)
        began = time.monotonic()
        with pytest.raises(WriterUnavailable, match="could not commit.*locked"):
            writer.append_durable(builder(turn(99)), timeout=30)
        assert time.monotonic() - began < 5
        assert not any(future.done() for future in queued)
        assert not writer.healthy
        locker.execute("COMMIT")
        assert [future.result(timeout=10)[0].seq for future in queued] == [1, 2, 3]
        assert writer.append_durable(builder(turn(4)), timeout=10)[0].seq == 4
    finally:
        if locker.in_transaction:
            locker.execute("COMMIT")
        locker.close()
        assert writer.close().complete
    conn = raw(folder)
    turns = [json.loads(r[0])["turn"] for r in conn.execute("SELECT key FROM events ORDER BY seq")]
    assert turns == [1, 2, 3, 4]
    conn.close()


def test_writer_close_under_a_lock_never_writes_what_it_reported(folder: Path) -> None:
    """close() reports an event as unwritten; it must not land afterwards."""
    threads = Threads()
    writer = Writer(folder, busy_timeout_ms=50, thread_factory=threads)
    assert writer.flush(10)
    locker = raw(folder)
    locker.execute("BEGIN EXCLUSIVE")
    future = writer.submit(builder(turn(1)), label="turn 1")
    time.sleep(1.0)
    report = writer.close(timeout=0.1)
    assert len(report.unwritten) == 1 and "turn" in report.unwritten[0]
    locker.execute("COMMIT")
    threads.made[0].join(5)
    assert not threads.made[0].is_alive()
    assert locker.execute("SELECT count(*) FROM events").fetchone()[0] == 0
    locker.close()
    with pytest.raises(WriterUnavailable):
        future.result(timeout=1)


def test_writer_an_unencodable_event_does_not_wedge_the_queue(folder: Path) -> None:
    writer = Writer(folder)
    try:
        before = writer.submit(builder(turn(1)))
        bad = writer.submit(builder(turn(2), NewEvent("turn", "s1", {"t": 3}, {"x": float("nan")})))
        bad_session = writer.submit(builder(NewEvent("turn", "\ud800", {"t": 4}, {})))
        after = writer.submit(builder(turn(5)))
        assert before.result(timeout=10)[0].seq == 1
        assert after.result(timeout=10)[0].seq == 2
        with pytest.raises(CanonicalEncodingError, match="not a finite number"):
            bad.result(timeout=1)
        with pytest.raises(ValueError):
            bad_session.result(timeout=1)
        (durable,) = writer.append_durable(builder(turn(6)), timeout=10)
        assert durable.seq == 3
    finally:
        assert writer.close().complete
    store = EventStore.open(folder)
    try:  # the job that failed after inserting its payload (SQLite refused its session) left none
        named = {e.envelope.payload for e in store.events()}
        stored = {row[0] for row in store.conn.execute("SELECT digest FROM payloads")}
        assert stored == named and len(named) == 3
    finally:
        store.close()


def test_writer_refuses_to_build_on_a_damaged_log(folder: Path) -> None:
    store = EventStore.open(folder)
    store.append([turn(1), turn(2)])
    store.close()
    conn = raw(folder)
    conn.execute("DROP TRIGGER events_append_only_update")
    conn.execute("UPDATE events SET time = 'x' WHERE seq = 2")
    conn.close()
    writer = Writer(folder)
    with pytest.raises(WriterUnavailable, match="failed verification at seq 2"):
        writer.append_durable(builder(turn(3)), timeout=10)
    assert writer.refused and not writer.healthy
    writer.close(timeout=1)


def test_registry_shares_one_writer_per_folder(folder: Path) -> None:
    one = writers.acquire(folder)
    two = writers.acquire(folder / ".." / "archive")
    try:
        assert one is two
        assert writers.release(one) is None  # still held by the other provider
        future: Future[list[AppendResult]] = two.submit(builder(turn(1)))
        assert future.result(timeout=10)[0].seq == 1
    finally:
        report = writers.release(two)
    assert report is not None and report.complete
    fresh = writers.acquire(folder)  # the last release closed it; a new one is made
    try:
        assert fresh is not one
    finally:
        writers.release(fresh)


def test_a_closed_archive_in_a_read_only_folder_can_be_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An auditor's copy on read-only media: no -wal/-shm, and SQLite may not create them.

    Root may write anywhere, so as root the folder is made to read as unwritable.
    """
    folder = tmp_path / "archive"
    store = EventStore.open(folder)
    store.append([NewEvent("turn", "s1", {"n": 1}, {"text": "kept"})])
    store.close()
    assert sorted(p.name for p in folder.iterdir()) == [DB_NAME, KEY_NAME]
    folder.chmod(0o555)
    if os.geteuid() == 0:
        real_access = os.access
        monkeypatch.setattr(
            "archive_provider.storage.store.os.access",
            lambda path, mode: False if Path(path) == folder else real_access(path, mode),
        )
    try:
        reader = EventStore.open(folder, create=False, readonly=True)
        try:
            assert [e.body for e in reader.events()] == [{"text": "kept"}]
        finally:
            reader.close()
        assert sorted(p.name for p in folder.iterdir()) == [DB_NAME, KEY_NAME]  # nothing made
    finally:
        folder.chmod(0o755)


def test_a_durable_append_waits_for_the_open_time_proof_instead_of_failing(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After an unclean stop the first open verifies the whole log (32 s at a million events
    here); a checkpoint asked for meanwhile waits for the proof rather than failing closed."""
    import archive_provider.storage.writer as writer_module

    real_proof = writer_module.open_proof

    def slow_proof(*args: Any, **kwargs: Any) -> Any:
        time.sleep(1.5)  # a long verify, compressed
        return real_proof(*args, **kwargs)

    monkeypatch.setattr(writer_module, "open_proof", slow_proof)
    writer = Writer(folder)
    try:  # the proof takes five times the timeout given
        (result,) = writer.append_durable(
            lambda store: [NewEvent("checkpoint", "s1", {"n": 1}, {"n": 1})], timeout=0.3
        )
    finally:
        writer.close(10)
    assert result.outcome == "appended"
