"""Projections in the append transaction write ``last_seq`` once per transaction (issue 18).

The tracking record and the rows it vouches for still commit together: a process killed
in the middle of a transaction leaves neither, and a projection failing in the middle of
one is left behind exactly at the event before the failure.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from archive_provider.audit.replay import verify_projections
from archive_provider.domain import builders
from archive_provider.format.events import NewEvent, StoredEvent
from archive_provider.projections.builtin import SessionsProjection, session_counters
from archive_provider.projections.registry import default_projections
from archive_provider.storage.store import EventStore
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
            assert session_counters(store.conn, "s1") == (n, 0)
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
            # rows of turns 2 and 3 are written in the open transaction; last_seq is not
            assert store.conn.execute("SELECT turns FROM sessions").fetchone()[0] == 3
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
