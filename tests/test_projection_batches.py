"""Projections in the append transaction write ``last_seq`` once per transaction (issue 18).

The tracking record and the rows it vouches for still commit together: a process killed
in the middle of a transaction leaves neither, and a projection failing in the middle of
one is left behind exactly at the event before the failure. The sessions projection
buffers a group commit's turns until the commit; the builds in between read through the
buffer, so a group archives what one job a group does.
"""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from archive_provider.audit.replay import verify_projections
from archive_provider.domain import builders
from archive_provider.format.events import NewEvent, StoredEvent
from archive_provider.host.spill_kinds import turn_event
from archive_provider.projections.builtin import (
    SessionsProjection,
    live_counters,
    session_counters,
    transcript_rows,
    transcript_tail,
)
from archive_provider.projections.registry import default_projections
from archive_provider.storage.store import EventStore
from archive_provider.storage.writer import Build, Writer
from tests.conftest import traced

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EventStore]:
    opened = EventStore.open(tmp_path / "archive", projections=default_projections)
    yield opened
    opened.close()


def turn(store: EventStore, session: str, ordinal: int) -> NewEvent:
    parts = [store.hasher.part({"role": "user", "content": f"{session} message {ordinal}"})]
    return builders.turn(store.hasher, session, ordinal, parts, start=ordinal - 1, legacy=False)


def last_seqs(conn: sqlite3.Connection) -> dict[str, int]:
    return dict(conn.execute("SELECT name, last_seq FROM projection_state").fetchall())


def test_a_transaction_writes_each_last_seq_once(store: EventStore) -> None:
    with traced(store.conn) as statements, store.transaction():
        for n in (1, 2, 3):  # three jobs, as the writer groups them
            store.append_in_transaction([turn(store, "s1", n)])
            # a later build in the same transaction reads what the earlier ones projected
            assert live_counters(store, "s1") == (n, 0)
    updates = [s for s in statements if s.startswith("UPDATE projection_state")]
    assert len(updates) == len(store.projections)
    assert set(last_seqs(store.conn).values()) == {store.head().seq}


def test_a_process_killed_mid_transaction_leaves_rows_and_last_seq_as_committed(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "archive"
    child = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        from archive_provider.domain import builders
        from archive_provider.projections.builtin import live_counters, settled, transcript_rows
        from archive_provider.projections.registry import default_projections
        from archive_provider.storage.store import EventStore

        store = EventStore.open({str(folder)!r}, projections=default_projections)

        def turn(n):
            part = store.hasher.part({{"role": "user", "content": f"said {{n}}"}})
            return builders.turn(store.hasher, "s1", n, [part], start=n - 1, legacy=False)

        store.append([turn(1)])
        with store.transaction():
            store.append_in_transaction([turn(2)])
            store.append_in_transaction([turn(3)])
            # turns 2 and 3 are projected in the open transaction (their transcript rows
            # written once a build reads them); last_seq is not
            assert live_counters(store, "s1")[0] == 3
            assert len(transcript_rows(settled(store), "s1")) == 3
            print("mid-transaction", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert "mid-transaction" in done.stdout
    conn = sqlite3.connect(folder / "events.db")
    try:
        head = conn.execute("SELECT seq FROM head").fetchone()[0]
        assert set(last_seqs(conn).values()) == {head}
        assert conn.execute("SELECT turns FROM sessions").fetchone()[0] == 1
        texts = [r[0] for r in conn.execute("SELECT text FROM recall_fts ORDER BY rowid")]
        assert texts == ["said 1"]
    finally:
        conn.close()
    check = verify_projections(folder, scratch_dir=tmp_path)
    assert check.ok, check.mismatched


def test_a_projection_failing_mid_transaction_is_left_at_the_event_before(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    reduce = SessionsProjection.reduce

    def picky(self: Any, conn: sqlite3.Connection, event: StoredEvent) -> None:
        reduce(self, conn, event)
        if event.type == "turn" and event.key.get("turn") == 2:
            raise ValueError("a reducer bug")

    monkeypatch.setattr(SessionsProjection, "reduce", picky)
    with store.transaction():
        seqs = [store.append_in_transaction([turn(store, "s1", n)])[0].seq for n in (1, 2, 3)]
    assert "sessions" in store.broken_projections
    states = last_seqs(store.conn)
    assert states.pop("sessions") == seqs[0]  # turn 1's rows stand, turn 2's were rolled back
    assert set(states.values()) == {seqs[2]}
    assert session_counters(store.conn, "s1") == (1, 0)


def test_a_group_of_turns_writes_its_session_rows_once(store: EventStore) -> None:
    """A group commit's turns reach ``sessions`` and ``transcript`` with one statement each
    and no savepoint per turn (session 5; before: a savepoint, an upsert and an insert per
    turn); a build in between sees them through ``live_counters`` (the session's row read
    once) and ``transcript_tail``."""
    with traced(store.conn) as statements, store.transaction():
        for n in (1, 2, 3):
            store.append_in_transaction([turn(store, "s1", n)])
            tail = transcript_tail(store, "s1")
            assert tail is not None and tail[0] == n - 1
            assert live_counters(store, "s1") == (n, 0)
        reads = [s for s in statements if "FROM sessions WHERE" in s]
        assert session_counters(store.conn, "s1") == (0, 0)  # buffered, not written yet
    assert [s for s in statements if s.startswith("SAVEPOINT projection")] == []
    assert len(reads) == 1  # the session's row, read once
    rows = [i for i, s in enumerate(statements) if s.startswith("INSERT INTO transcript")]
    events = [i for i, s in enumerate(statements) if s.startswith("INSERT INTO events")]
    assert len(rows) == 3 and min(rows) > max(events)  # one executemany at the commit
    assert len([s for s in statements if s.startswith("INSERT INTO sessions")]) == 1
    assert session_counters(store.conn, "s1") == (3, 0)
    assert [seq for _, seq in transcript_rows(store.conn, "s1")] == sorted(
        seq for _, seq in transcript_rows(store.conn, "s1")
    )
    assert len(transcript_rows(store.conn, "s1")) == 3


def _turn_job(session: str, rows: list[dict[str, str]], *, tail_only: bool = False) -> Build:
    """A turn as the provider builds it on the writer thread: counters and transcript read
    in the open transaction (the whole transcript, or only its new tail)."""
    snapshot = [dict(row) for row in rows]

    def build(store: EventStore) -> list[NewEvent]:
        turns, _ = live_counters(store, session)
        start = len(snapshot) - 2 if tail_only else None
        events, _ = turn_event(store, session, turns, snapshot[start or 0 :], start, False, True)
        return events

    return build


def test_a_group_with_failing_turns_archives_the_others_as_one_job_a_group_does(
    tmp_path: Path,
) -> None:
    """Jobs of one group build on the turns before them (counters, transcript: buffered by
    the sessions projection until the commit); a job whose build raises, and one that fails
    after writing rows (the batch is written again without it), leave the others archived
    exactly as when every job is its own group."""
    said = [{"role": "user", "content": f"question {n}"} for n in range(4)]
    answered = [{"role": "assistant", "content": f"answer {n}"} for n in range(4)]

    def jobs() -> list[Build | None]:
        one = [said[0], answered[0]]
        two = [*one, said[1], answered[1]]
        three = [*two, said[2], answered[2]]

        def broken(store: EventStore) -> list[NewEvent]:
            raise ValueError("a build that cannot be archived")

        return [
            _turn_job("s1", one),
            _turn_job("s2", [said[3], answered[3]]),
            broken,
            _turn_job("s1", two),
            None,  # fails after its first insert: SQLite refuses its session
            _turn_job("s1", three, tail_only=True),
            _turn_job("s1", three),  # re-sent: nothing new
        ]

    def archive(folder: Path, grouped: bool) -> list[tuple[Any, ...]]:
        writer = Writer(folder, projections_factory=default_projections)
        release = threading.Event()
        try:
            gate = writer.submit(lambda store: release.wait(10) and [])
            futures = []
            for build in jobs():
                if build is None:
                    build = _turn_job("\ud800", [said[0], answered[0]])
                futures.append(writer.submit(build))
                if not grouped:
                    release.set()
                    with contextlib.suppress(Exception):
                        futures[-1].result(timeout=10)
            release.set()
            gate.result(timeout=10)
            outcomes = []
            for future in futures:
                try:
                    outcomes.append([r.outcome for r in future.result(timeout=10)])
                except Exception as exc:
                    outcomes.append([type(exc).__name__])
        finally:
            assert writer.close().complete
        assert verify_projections(folder, scratch_dir=tmp_path).ok
        conn = sqlite3.connect(folder / "events.db")
        try:
            shape = [
                tuple(row)
                for row in conn.execute(
                    "SELECT session, first_seq, last_seq, turns, memory_writes FROM sessions"
                    " ORDER BY session"
                )
            ]
            shape += [
                tuple(row)
                for row in conn.execute(
                    "SELECT session, position, seq FROM transcript ORDER BY session, position"
                )
            ]
            shape += [
                tuple(row)
                for row in conn.execute("SELECT seq, session, key FROM events ORDER BY seq")
            ]
            return [outcomes, *shape]
        finally:
            conn.close()

    grouped = archive(tmp_path / "grouped" / "archive", grouped=True)
    alone = archive(tmp_path / "alone" / "archive", grouped=False)
    assert grouped == alone
    outcomes = grouped[0]
    assert outcomes[2] == ["ValueError"] and outcomes[6] == []
    assert [(row[0], row[3]) for row in grouped[1:] if len(row) == 5] == [("s1", 3), ("s2", 1)]
    positions = [row[1] for row in grouped[1:] if len(row) == 3 and row[0] == "s1"]
    assert positions == list(range(6))


def test_a_failing_turn_in_a_big_group_is_taken_back_whole(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group's buffer is not written out by size while turns are deferred, so a turn that
    fails takes back all of its rows, as the savepoint did: nothing of it is counted, and
    the projection is left at the event before."""
    reduce = SessionsProjection.reduce

    def picky(self: Any, conn: sqlite3.Connection, event: StoredEvent) -> None:
        reduce(self, conn, event)  # 2 rows buffered by turn 2: the size to write them out
        if event.type == "turn" and event.key.get("turn") == 2:
            raise ValueError("a reducer bug")

    monkeypatch.setattr(SessionsProjection, "reduce", picky)
    monkeypatch.setattr(SessionsProjection, "batch_events", 2)
    with store.transaction():
        seqs = [store.append_in_transaction([turn(store, "s1", n)])[0].seq for n in (1, 2, 3)]
    assert last_seqs(store.conn)["sessions"] == seqs[0]
    assert session_counters(store.conn, "s1") == (1, 0)  # turn 1 only, counted once
    assert len(transcript_rows(store.conn, "s1")) == 1
