"""The SQLite log on real files: append, read back, triggers, files and opening (docs/FORMAT.md
sections 1 and 6). Tampering is in test_tampering.py, the writer in test_writer.py.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from archive_provider.format import verifier
from archive_provider.format.canonical import CanonicalEncodingError, canonical_bytes
from archive_provider.format.events import NewEvent
from archive_provider.storage.store import (
    DB_NAME,
    STORE_KEY_NAME,
    EventStore,
    StoreError,
)
from archive_provider.storage.store_pieces import SIGNING_KEY_NAME
from tests.conftest import traced

# The store's API, files and opening; the format's own rules (digests, parts, tiles,
# checkpoints) are tested in test_store_v2.py. An archive begins with store_created (seq 1).

ROOT = Path(__file__).resolve().parents[1]
#: the files of a closed archive
FILES = [DB_NAME, SIGNING_KEY_NAME, STORE_KEY_NAME]
VERIFIER = ROOT / "archive_provider" / "format" / "verifier.py"


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
        ("appended", 2, "session_started"),
        ("appended", 3, "turn"),
    ]
    events = list(store.events(after_seq=1))
    assert [e.seq for e in events] == [2, 3]
    assert events[0].body == {"platform": "cli"} and events[0].key == {"session": "s1"}
    assert events[1].part_digests == [message.digest]
    assert store.payload(message.digest) == canonical_bytes({"role": "user", "content": "hello"})
    assert store.event(3) is not None and store.event(3).envelope.identity == results[1].identity  # type: ignore[union-attr]
    assert store.event(4) is None
    assert store.identity_seq(results[0].identity) == 2
    head = store.head()
    assert (head.seq, head.chain) == (3, events[1].chain)
    assert [e.seq for e in store.events(after_seq=2)] == [3]


def test_same_event_twice_is_stored_once(store: EventStore) -> None:
    (first,) = store.append([turn(1)])
    (again,) = store.append([turn(1, text="a different body, the same identity")])
    assert (first.outcome, again.outcome) == ("appended", "already_archived")
    assert again.seq == first.seq and again.identity == first.identity
    assert store.conn.execute("SELECT count(*) FROM events WHERE type = 'turn'").fetchone()[0] == 1
    assert next(store.events(after_seq=1)).body == {"text": "message 1"}  # the first one stays
    assert store.head().seq == 2


def test_same_event_twice_in_one_batch(store: EventStore) -> None:
    results = store.append([turn(1), turn(1), turn(2)])
    assert [(r.outcome, r.seq) for r in results] == [
        ("appended", 2),
        ("already_archived", 2),
        ("appended", 3),
    ]


def test_an_unencodable_event_rolls_back_the_whole_batch(store: EventStore) -> None:
    bad = NewEvent("turn", "s", {"turn": 2}, {"x": float("nan")})
    with pytest.raises(CanonicalEncodingError):
        store.append([turn(1), bad])
    assert store.conn.execute("SELECT count(*) FROM events").fetchone()[0] == 1
    assert store.conn.execute("SELECT count(*) FROM payloads").fetchone()[0] == 1
    assert store.head().seq == 1
    assert store.append([turn(1)])[0].seq == 2


def test_two_connections_never_fork_the_chain(folder: Path) -> None:
    """Two stores on one file (as two processes) read the head inside the write transaction."""
    one, two = EventStore.open(folder), EventStore.open(folder)
    try:
        for n in range(1, 21):
            (one if n % 2 else two).append([turn(n)])
        assert [e.seq for e in one.events()] == list(range(1, 22))
        assert verifier.verify_database(two.conn, two.key).ok
    finally:
        one.close()
        two.close()


def test_durable_append_sets_full_before_begin(store: EventStore) -> None:
    """SQLite changes the synchronous level only between transactions."""
    with traced(store.conn) as statements:
        store.append([turn(1)], durable=True)
        store.append([turn(2)])
    begins = [i for i, sql in enumerate(statements) if sql.startswith("BEGIN")]
    assert statements[begins[0] - 1] == "PRAGMA synchronous = FULL"
    assert statements[begins[1] - 1] == "PRAGMA synchronous = NORMAL"
    other = sqlite3.connect(store.path)
    assert other.execute("SELECT count(*) FROM events").fetchone()[0] == 3
    other.close()


# -- the database refuses to rewrite history ----------------------------------------------


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("UPDATE events SET type = 'checkpoint' WHERE seq = 1", "events are append-only"),
        ("UPDATE events SET seq = 9 WHERE seq = 1", "events are append-only"),
        ("DELETE FROM events WHERE seq = 1", "events are append-only"),
        ("DELETE FROM events", "events are append-only"),
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
        assert _mode(folder / STORE_KEY_NAME) == _mode(folder / SIGNING_KEY_NAME) == 0o600
        for side in ("-wal", "-shm"):
            path = folder / (DB_NAME + side)
            if path.exists():
                assert _mode(path) == 0o600, side
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
        (None, "lookup key .* is missing"),
        ("this is garbage\n", "is not hex text"),
        ("abcd\n", "must hold 32 bytes, found 2"),
    ],
)
def test_missing_or_malformed_key_is_a_clear_error(
    folder: Path, content: str | None, message: str
) -> None:
    EventStore.open(folder).close()
    key = folder / STORE_KEY_NAME
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
        assert store.head().seq == 1
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
    """A lock held beyond the busy timeout must not send the user to restore a backup (the
    file takes its first write lock when its projections are made)."""
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
    conn.execute("UPDATE meta SET value = '3' WHERE name = 'format_version'")
    conn.close()
    with pytest.raises(StoreError, match="format version 3"):
        EventStore.open(folder)


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
    assert sorted(p.name for p in folder.iterdir()) == FILES
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
            assert [e.body for e in reader.events(after_seq=1)] == [{"text": "kept"}]
        finally:
            reader.close()
        assert sorted(p.name for p in folder.iterdir()) == FILES  # nothing made
    finally:
        folder.chmod(0o755)
