"""The writer on real files: one thread per database, group commit, durable appends, failures."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from archive_provider.format import verifier
from archive_provider.format.canonical import CanonicalEncodingError
from archive_provider.format.events import AppendResult, NewEvent, StoredEvent
from archive_provider.storage.spill import read_records, segment_paths
from archive_provider.storage.store import STORE_KEY_NAME, EventStore
from archive_provider.storage.writer import Writer, WriterUnavailable, writers

from .test_store import raw, turn


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return tmp_path / "home" / "archive"


#: the seq of the first event a test appends (an archive begins with store_created)
FIRST_SEQ = 2


def turn_keys(folder: Path) -> list[str]:
    conn = raw(folder)
    try:
        return [
            r[0] for r in conn.execute("SELECT key FROM events WHERE type = 'turn' ORDER BY seq")
        ]
    finally:
        conn.close()


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
        first = FIRST_SEQ
        assert [result.seq for (result,) in results] == list(range(first, first + 10001))
        assert all(result.outcome == "appended" for (result,) in results)
        transactions = [s for s in recorder.statements if s.startswith("BEGIN IMMEDIATE")]
        assert len(transactions) <= 25  # batches of up to 512 jobs, not one commit per job
    finally:
        report = writer.close()
    assert report.complete and report.unwritten == []
    store = EventStore.open(folder)
    try:
        seqs = [row[0] for row in store.conn.execute("SELECT seq FROM events ORDER BY seq")]
        assert seqs == list(range(1, first + 10001))
        turns = [e.key["turn"] for e in store.events() if e.type == "turn"]
        assert turns == list(range(10001))
        assert verifier.verify_database(store.conn, store.key).ok
    finally:
        store.close()


def test_writer_durable_append_is_committed_on_return(folder: Path) -> None:
    writer = Writer(folder)
    first = FIRST_SEQ
    try:
        ordinary = writer.submit(builder(turn(1)))
        (result,) = writer.append_durable(builder(turn(2)), timeout=10)
        assert (result.outcome, result.seq) == ("appended", first + 1)
        assert ordinary.done() and ordinary.result()[0].seq == first  # committed with it, in order
        assert len(turn_keys(folder)) == 2
        (again,) = writer.append_durable(builder(turn(2)), timeout=10)
        assert (again.outcome, again.seq) == ("already_archived", first + 1)
    finally:
        assert writer.close().complete


def test_writer_close_reports_what_the_unopenable_store_kept(folder: Path) -> None:
    EventStore.open(folder).close()
    (folder / STORE_KEY_NAME).write_text("garbage, not a key\n")
    threads = Threads()
    writer = Writer(folder, thread_factory=threads)
    futures = [writer.submit(builder(turn(n)), label=f"turn {n}") for n in (1, 2, 3)]
    time.sleep(0.2)
    report = writer.close(timeout=5)
    assert report.unwritten == ["turn 1", "turn 2", "turn 3"]
    assert not report.complete
    assert report.error and "not hex" in report.error
    assert (report.pending, report.spilled, report.finished) == (3, 0, False)
    # what was lost is itself kept for the next open: a shutdown_drain record (HOST.md §3)
    (drain,) = [
        r for path in segment_paths(folder) for r in read_records(path, key=None)
    ]  # no witness: unkeyed
    assert drain.kind == "shutdown_drain"
    assert drain.args["unwritten_hooks"] == {"turn 1": 1, "turn 2": 1, "turn 3": 1}
    assert (drain.args["pending"], drain.args["unwritten"]) == (3, 3)
    for future in futures:
        with pytest.raises(WriterUnavailable, match="closed before this write landed"):
            future.result(timeout=1)
    assert not threads.made[0].is_alive()
    late = writer.submit(builder(turn(4)))
    with pytest.raises(WriterUnavailable, match="closed"):
        late.result(timeout=1)


def test_writer_durable_fails_fast_while_the_key_is_bad_then_recovers(folder: Path) -> None:
    EventStore.open(folder).close()
    key = folder / STORE_KEY_NAME
    good_key = key.read_text()
    key.write_text("garbage\n")
    writer = Writer(folder)
    try:
        queued = writer.submit(builder(turn(1)))
        began = time.monotonic()
        with pytest.raises(WriterUnavailable, match="lookup key"):
            writer.append_durable(builder(turn(2)), timeout=30)
        assert time.monotonic() - began < 5
        assert not queued.done()
        key.write_text(good_key)
        assert queued.result(timeout=10)[0].seq == FIRST_SEQ
        assert writer.append_durable(builder(turn(3)), timeout=10)[0].seq == FIRST_SEQ + 1
    finally:
        assert writer.close().complete
    assert turn_keys(folder) == [
        '{"session":"s1","turn":1}',
        '{"session":"s1","turn":3}',
    ]  # the failed durable event was not written behind its caller's back


def test_writer_locked_database_durable_fails_fast_ordinary_lands_later(folder: Path) -> None:
    first = FIRST_SEQ
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
        seqs = [future.result(timeout=10)[0].seq for future in queued]
        assert seqs == [first, first + 1, first + 2]
        assert writer.append_durable(builder(turn(4)), timeout=10)[0].seq == first + 3
    finally:
        if locker.in_transaction:
            locker.execute("COMMIT")
        locker.close()
        assert writer.close().complete
    assert [json.loads(key)["turn"] for key in turn_keys(folder)] == [1, 2, 3, 4]


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
    assert locker.execute("SELECT count(*) FROM events WHERE type = 'turn'").fetchone()[0] == 0
    locker.close()
    with pytest.raises(WriterUnavailable):
        future.result(timeout=1)


def test_writer_an_unencodable_event_does_not_wedge_the_queue(folder: Path) -> None:
    writer = Writer(folder)
    first = FIRST_SEQ
    try:
        before = writer.submit(builder(turn(1)))
        bad = writer.submit(builder(turn(2), NewEvent("turn", "s1", {"t": 3}, {"x": float("nan")})))
        bad_session = writer.submit(builder(NewEvent("turn", "\ud800", {"t": 4}, {})))
        after = writer.submit(builder(turn(5)))
        assert before.result(timeout=10)[0].seq == first
        assert after.result(timeout=10)[0].seq == first + 1
        with pytest.raises(CanonicalEncodingError, match="not a finite number"):
            bad.result(timeout=1)
        with pytest.raises(ValueError):
            bad_session.result(timeout=1)
        (durable,) = writer.append_durable(builder(turn(6)), timeout=10)
        assert durable.seq == first + 2
    finally:
        assert writer.close().complete
    store = EventStore.open(folder)
    try:  # the job that failed after inserting its payload (SQLite refused its session) left none
        named = {e.envelope.payload for e in store.events()}
        rows = store.conn.execute("SELECT digest FROM payloads")
        stored = {bytes(row[0]).hex() for row in rows}
        assert stored == named and len(named) == first + 2  # v2: store_created's body too
    finally:
        store.close()


def test_writer_refuses_to_build_on_a_damaged_log(folder: Path) -> None:
    store = EventStore.open(folder)
    store.append([turn(1), turn(2)])
    store.close()
    seq = FIRST_SEQ + 1
    conn = raw(folder)
    conn.execute("DROP TRIGGER events_no_update")
    conn.execute("UPDATE events SET time = 'x' WHERE seq = ?", (seq,))
    conn.close()
    writer = Writer(folder)
    with pytest.raises(WriterUnavailable, match=f"failed verification at seq {seq}"):
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
        assert future.result(timeout=10)[0].seq == FIRST_SEQ
    finally:
        report = writers.release(two)
    assert report is not None and report.complete
    fresh = writers.acquire(folder)  # the last release closed it; a new one is made
    try:
        assert fresh is not one
    finally:
        writers.release(fresh)


def test_a_durable_append_waits_for_the_open_time_proof_instead_of_failing(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After an unclean stop the first open verifies the whole log (32 s at a million events
    here); a checkpoint asked for meanwhile waits for the proof rather than failing closed."""
    import archive_provider.storage.writer as writer_module

    real_proof = writer_module.open_proof

    def slow_proof(*args: Any, **kwargs: Any) -> Any:
        time.sleep(3.0)  # a long verify, compressed
        return real_proof(*args, **kwargs)

    monkeypatch.setattr(writer_module, "open_proof", slow_proof)
    writer = Writer(folder)
    try:  # the proof takes three times the timeout given (which leaves the commit after it
        # room on a loaded machine)
        (result,) = writer.append_durable(
            lambda store: [NewEvent("checkpoint", "s1", {"n": 1}, {"n": 1})], timeout=1.0
        )
    finally:
        writer.close(10)
    assert result.outcome == "appended"


def test_an_edited_part_makes_the_writer_refuse(folder: Path) -> None:
    def said(text: str) -> Callable[[EventStore], list[NewEvent]]:
        def build(store: EventStore) -> list[NewEvent]:
            part = store.hasher.part({"role": "user", "content": "secret"})
            body = {"turn": 1, "messages": [part.digest], "text": text}
            return [NewEvent("turn", "s1", {"text": text}, body, (part,))]

        return build

    store = EventStore.open(folder)
    store.close()
    writer = Writer(folder)
    try:
        assert writer.append_durable(said("first"), timeout=10)[0].outcome == "appended"
        conn = raw(folder)  # edited under the open writer: its next append meets the row
        conn.execute("DROP TRIGGER payloads_erase_only")
        edited = conn.execute(
            'UPDATE payloads SET body = CAST(\'{"content":"secreT","role":"user"}\''
            " AS BLOB) WHERE CAST(body AS TEXT) LIKE '%\"secret\"%'"
        ).rowcount
        conn.close()
        assert edited == 1
        with pytest.raises(WriterUnavailable, match="edited after it was written.*are refused"):
            writer.append_durable(said("second"), timeout=10)
        assert writer.refused
    finally:
        writer.close(timeout=1)
