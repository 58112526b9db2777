"""An archive whose projections must be rebuilt on open: only the writer rebuilds them.

A release that changes a projection's version (recall v5, sessions v4) leaves every archive
an older release made to be rebuilt from the log at the next open. The provider opens the
store twice at start-up: its writer, and the retention worker. Whichever took the write lock
first rebuilt the projections in one long transaction; when it was the retention worker, the
writer's own open waited out its busy timeout, logged the archive unavailable, withheld recall
and left the first turns to its retries (or the spill). The retention worker now never
rebuilds: it waits for the writer's proven open, and a pass that finds projections behind the
log leaves them to the writer.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from archive_provider.audit import erasure
from archive_provider.domain import builders
from archive_provider.format.events import NewEvent
from archive_provider.projections.builtin import RecallProjection, SessionsProjection
from archive_provider.projections.registry import default_projections
from archive_provider.storage.store import EventStore
from tests.conftest import open_v2
from tests.test_recall_index import as_an_older_release_left_it, versions

CAT = "my cat is called Ziggy Stardust and she sleeps on the ledger"
TURNS = 3000  # enough that the rebuild holds the write lock past the busy timeout below
STARTS = 4  # first starts after an upgrade (the race was lost about one start in three)


def turn(store: EventStore, session: str, ordinal: int, text: str) -> NewEvent:
    messages = [{"role": "user", "content": text}, {"role": "assistant", "content": "noted"}]
    parts = [store.hasher.part(m) for m in messages]
    return builders.turn(
        store.hasher, session, ordinal, parts, start=2 * (ordinal - 1), legacy=False
    )


def older_archive(home: Path) -> Path:
    """A profile whose archive an older release left: a retention policy (nothing expired
    yet), ``TURNS`` turns, recall v4 and sessions v3 to be rebuilt from the log."""
    store = open_v2(home / "archive")
    try:
        store.append([turn(store, "old", 1, CAT)])
        for start in range(2, TURNS + 2, 500):
            store.append(
                [
                    turn(store, "old", n, f"entry {n} of the ledger, weather in Lisbon, {n * 7}")
                    for n in range(start, min(start + 500, TURNS + 2))
                ]
            )
        erasure.set_retention(store, 3650, "policy", "ops", confirmed=True)
    finally:
        store.close()
    db_path = home / "archive" / "events.db"
    as_an_older_release_left_it(db_path)
    return db_path


def test_the_retention_worker_leaves_the_rebuild_to_the_writer(tmp_path: Path) -> None:
    """A retention pass on an archive whose projections are behind the log rebuilds nothing
    and erases nothing (its transaction would hold the lock for the whole rebuild); once
    the writer's open has rebuilt them, the next pass applies the policy."""
    home = tmp_path / "home"
    db_path = older_archive(home)
    worker = erasure.RetentionWorker(home / "archive", default_projections, lambda *a, **k: None)
    assert worker.run_once() == []
    state = versions(db_path)
    assert state["recall"][0] == 4 and state["sessions"][0] == 3  # not rebuilt by retention

    EventStore.open(home / "archive", projections=default_projections).close()  # the writer's
    state = versions(db_path)
    assert state["recall"][0] == RecallProjection.version
    assert state["sessions"][0] == SessionsProjection.version
    assert worker.run_once() == []  # the policy is read and applied: nothing has expired


def test_status_names_the_projections_an_open_will_rebuild(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Caught up to the head but stored by an older release: status said "all current"."""
    from archive_provider.cli import main

    home = tmp_path / "home"
    older_archive(home)
    capsys.readouterr()
    assert main(["--home", str(home), "--json", "status"]) == 0
    projections = json.loads(capsys.readouterr().out)["projections"]
    assert {n for n, p in projections.items() if p["rebuild"]} == {"recall", "sessions"}
    assert not projections["recall"]["current"] and projections["memory"]["current"]
    assert main(["--home", str(home), "status"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("Projections:"))
    assert "older release" in line and "recall, sessions" in line


def test_the_first_start_after_an_upgrade_archives_the_first_turn_and_serves_recall(
    tmp_path: Path, make_provider: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The provider's first start on an archive to rebuild, with the retention worker
    running: the writer rebuilds, the first turn is archived at once (no unavailable store,
    no spill, no write failure), recall is served from the rebuilt index and the retention
    pass runs after the rebuild."""
    home = tmp_path / "home"
    db_path = older_archive(home)
    config = home / "archive" / "config.json"
    config.write_text(json.dumps({"busy_timeout_s": 0.2}))

    with caplog.at_level(logging.WARNING):
        for start in range(STARTS):  # which thread opens first is the scheduler's choice
            if start:
                as_an_older_release_left_it(db_path)  # the next start rebuilds again
            provider = make_provider(home, session=f"new-{start}")
            retention = provider.core.retention
            assert retention is not None
            provider.sync_turn("what is the weather", "sunny", session_id=f"new-{start}")
            assert "Ziggy" in provider.prefetch("what is my cat called", session_id=f"new-{start}")
            assert retention.passed.wait(120)
            writer = provider.core.writer
            assert writer is not None and writer.flush(timeout=60)
            provider.shutdown()

    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "unavailable" in m or "locked" in m], said
    assert not [m for m in said if "retention not applied" in m], said
    assert not list((home / "archive").glob("spill/*")), "nothing went to the spill"
    store = EventStore.open(home / "archive", create=False, readonly=True)
    try:
        turns = store.conn.execute(
            "SELECT count(DISTINCT session) FROM events WHERE session LIKE 'new-%' AND type = 'turn'"
        ).fetchone()[0]
        kinds = {t for (t,) in store.conn.execute("SELECT DISTINCT type FROM events")}
        head = store.head().seq
    finally:
        store.close()
    assert turns == STARTS and not kinds & {"write_failed", "spill_taken"}, kinds
    state = versions(db_path)
    assert state["recall"] == (RecallProjection.version, head)
    assert state["sessions"] == (SessionsProjection.version, head)


def test_close_does_not_wait_for_a_writer_that_never_proves(tmp_path: Path) -> None:
    """A worker told to wait for the writer's proof stops at close though none came."""
    never = threading.Event()
    worker = erasure.RetentionWorker(
        tmp_path / "archive",
        default_projections,
        lambda target, name, daemon: threading.Thread(target=target, name=name, daemon=daemon),
        ready=never,
    ).start()
    worker.close(timeout=30)
    assert worker.passes == 0


def test_a_rebuild_on_open_commits_in_batches_and_lets_another_writer_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The rebuild holds the write lock for one batch at a time: between two batches another
    writer (here a second open, with no busy timeout at all) gets the lock, joins the
    catch-up where it stands and appends; the first open then finishes, and the projections
    equal a replay of the whole log, the other writer's turn included. ``search`` between
    two batches refuses the half-built index rather than answer from it."""
    from archive_provider.audit.replay import verify_projections
    from archive_provider.cli import main
    from archive_provider.storage import store as store_module

    home = tmp_path / "home"
    db_path = older_archive(home)
    monkeypatch.setattr(store_module, "CATCH_UP_BATCH", 1000)
    begins = 0
    other_seq: list[int] = []
    searched: list[int] = []

    def projections_traced(conn: Any) -> Any:
        def statement(sql: str) -> None:
            nonlocal begins
            if sql.startswith("BEGIN IMMEDIATE"):
                begins += 1
                if begins == 2:  # the first batch committed; the second has not begun
                    other_writer()

        conn.set_trace_callback(statement)
        return default_projections(conn)

    def other_writer() -> None:
        searched.append(main(["--home", str(home), "search", "Ziggy"]))
        other = EventStore.open(
            home / "archive", projections=default_projections, busy_timeout_ms=0
        )
        try:
            [result] = other.append([turn(other, "other", 1, "a turn between two batches")])
            other_seq.append(result.seq)
        finally:
            other.close()

    first = EventStore.open(home / "archive", projections=projections_traced)
    try:
        first.conn.set_trace_callback(None)
        assert other_seq, "no other writer got in during the rebuild"
        assert searched == [1] and "recall index is behind the log" in capsys.readouterr().err
        head = first.head().seq
    finally:
        first.close()
    check = verify_projections(home / "archive")
    assert check.ok, check.mismatched
    state = versions(db_path)
    assert state["recall"] == (RecallProjection.version, head)
    assert state["sessions"] == (SessionsProjection.version, head)
    assert head == other_seq[0]
