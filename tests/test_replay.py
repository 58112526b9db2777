"""Replay: incremental projections equal rebuilt ones, the rebuild is atomic, verify compares.

The property test drives random event sequences (turns, memory writes on both host
shapes, session switches including rewinds and resets, checkpoints, recall served) through
the real builders into a store on disk, one append at a time under a frozen clock, and
records the live projection digests after every event. ``test_asof.py`` reuses the same
sequences to check time travel against those snapshots.
"""

from __future__ import annotations

import itertools
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from archive_provider.audit.as_of import asof_projections, read_asof
from archive_provider.audit.replay import (
    ProjectionCheck,
    ReplayError,
    projection_digests,
    rebuild,
    verify_projections,
)
from archive_provider.domain import builders
from archive_provider.format.events import NewEvent
from archive_provider.projections.builtin import RecallProjection, SessionsProjection
from archive_provider.projections.registry import default_projections
from archive_provider.storage.store import (
    DB_NAME,
    STORE_KEY_NAME,
    EventStore,
    PayloadMissing,
    iter_events,
)

from .conftest import traced

ROOT = Path(__file__).resolve().parents[1]

START = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)
_folders = itertools.count()

# -- random event sequences ----------------------------------------------------------------

WORDS = [
    "tea",
    "green tea",
    "Oslo",
    "dark mode",
    "likes",
    "key",
    "shed",
    "café",
    "naïve",
    "x\ud800y",
]
TEXT = st.lists(st.sampled_from(WORDS), min_size=0, max_size=4).map(" ".join)
SESSIONS = st.sampled_from(["s1", "s2", "s3"])
MESSAGE = st.one_of(
    st.builds(
        lambda role, text: {"role": role, "content": text},
        st.sampled_from(["user", "assistant", "tool", "system"]),
        TEXT,
    ),
    st.builds(
        lambda text: {"role": "assistant", "content": text, "tool_calls": [{"id": "c1"}]}, TEXT
    ),
    st.builds(
        lambda text: {
            "role": "user",
            "content": [{"type": "text", "text": text}, {"type": "image"}],
        },
        TEXT,
    ),
    st.just("not a message"),
)
OPS = st.one_of(
    st.tuples(st.just("start"), SESSIONS, st.sampled_from(["", "s1", "s2"])),
    st.tuples(
        st.just("turn"), SESSIONS, st.lists(MESSAGE, min_size=1, max_size=4), st.integers(0, 3)
    ),
    st.tuples(
        st.just("memory"),
        st.sampled_from(["add", "replace", "remove"]),
        st.sampled_from(["memory", "user"]),
        TEXT,
        st.sampled_from(["", "tea", "mode", "Oslo", "key"]),
        st.booleans(),
    ),
    st.tuples(
        st.just("switch"),
        SESSIONS,
        st.sampled_from(["compression", "branch", "resume", "new_session", ""]),
        st.booleans(),
        st.booleans(),
    ),
    st.tuples(st.just("end"), SESSIONS),
    st.tuples(st.just("checkpoint"), SESSIONS, st.integers(0, 6)),
    st.tuples(st.just("failed"), SESSIONS),
    st.tuples(st.just("recall"), SESSIONS, TEXT, TEXT),
    st.tuples(st.just("delegation"), SESSIONS),
    st.tuples(st.just("tick"), st.sampled_from([0, 1, 90, 3600])),
)
SEQUENCES = st.lists(OPS, min_size=1, max_size=30)


@dataclass
class Run:
    """A store fed one event per transaction, with what the live projections said after each."""

    store: EventStore
    digests: dict[int, dict[str, str]] = field(default_factory=dict)  # seq -> live digests
    asof: dict[int, Any] = field(default_factory=dict)  # seq -> live as-of answer (no session)
    asof_by_session: dict[tuple[int, str], Any] = field(default_factory=dict)
    times: dict[int, str] = field(default_factory=dict)


class Driver:
    """Turns ops into events with the real builders, tracking what a provider would track."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.counter = itertools.count(1)
        self.turns: dict[str, int] = {}
        self.transcripts: dict[str, list[Any]] = {}
        self.writes = 0
        self.entries: list[str] = []

    def events(self, op: tuple[Any, ...]) -> list[NewEvent]:
        hasher, at = self.store.hasher, f"t{next(self.counter)}"
        kind = op[0]
        if kind == "start":
            return [
                builders.session_started(
                    op[1], at=at, details={"platform": "cli", "parent_session_id": op[2]}
                )
            ]
        if kind == "turn":
            session, messages, rewind = op[1], op[2], op[3]
            transcript = self.transcripts.setdefault(session, [])
            start = max(len(transcript) - rewind, 0)
            parts = [
                hasher.part(m if isinstance(m, dict) else {"role": "$invalid", "$value": m})
                for m in messages
            ]
            self.transcripts[session] = transcript[:start] + list(messages)
            self.turns[session] = self.turns.get(session, 0) + 1
            return [
                builders.turn(
                    hasher, session, self.turns[session], parts, start=start, legacy=False
                )
            ]
        if kind == "memory":
            action, target, content, old_text, newer = op[1:]
            metadata: dict[str, Any] = {"write_origin": "tool", "session_id": "s1"}
            if old_text:
                metadata["old_text"] = old_text
            if newer and action != "add":
                metadata["previous_content"] = next(
                    (e for e in self.entries if old_text and old_text in e), ""
                )
            if action == "add":
                self.entries.append(content)
            self.writes += 1
            return [
                builders.memory_write(
                    hasher,
                    "s1",
                    self.writes,
                    action,
                    target,
                    "" if action == "remove" else content,
                    metadata,
                )
            ]
        if kind == "switch":
            session, reason, reset, rewound = op[1:]
            details = {
                "parent_session_id": "" if rewound else "s1",
                "reset": reset,
                "rewound": rewound,
            }
            if reason:
                details["reason"] = reason
            return [builders.session_switched(session, previous="s1", at=at, details=details)]
        if kind == "end":
            return [builders.session_ended(op[1], at=at, message_count=3)]
        if kind == "checkpoint":
            session, count = op[1], op[2]
            from archive_provider.domain.evidence import archivable_message, direct_evidence

            evidence = [
                archivable_message(m)
                for m in direct_evidence(
                    [m for m in self.transcripts.get(session, []) if isinstance(m, dict)][-count:]
                    if count
                    else []
                )
            ]
            parts = [hasher.part(m) for m in evidence]
            return [
                builders.checkpoint(
                    hasher,
                    session,
                    parts,
                    parent_session="s1",
                    host_api_version=2,
                    require_checkpoint=True,
                    received=count,
                )
            ]
        if kind == "failed":
            return [
                builders.checkpoint_failed(
                    op[1], at=at, error="disk full", require_checkpoint=True, evidence_count=2
                )
            ]
        if kind == "recall":
            return [
                builders.recall_served(
                    hasher,
                    op[1],
                    turn=self.turns.get(op[1], 0),
                    query=op[2],
                    result=op[3],
                    sources=[1, 2],
                    at=at,
                )
            ]
        if kind == "delegation":
            return [
                builders.delegation(
                    hasher, op[1], task="t", result="r", child_session="c", details={}
                )
            ]
        return []


def drive(tmp_path: Path, ops: list[tuple[Any, ...]]) -> Iterator[Run]:
    """Append every op's events one per transaction, snapshotting live projections each time."""
    folder = tmp_path / f"run{next(_folders)}"
    with freeze_time(START) as frozen:
        store = EventStore.open(folder, projections=default_projections())
        run = Run(store)
        driver = Driver(store)
        sessions = {"s1", "s2", "s3"}
        try:
            for op in ops:
                if op[0] == "tick":
                    frozen.tick(timedelta(seconds=op[1]))
                    continue
                for event in driver.events(op):
                    result = store.append([event])[0]
                    if result.outcome != "appended":
                        continue
                    seq, conn = result.seq, store.conn
                    run.digests[seq] = projection_digests(conn)
                    run.times[seq] = store.event(seq).time  # type: ignore[union-attr]
                    run.asof[seq] = read_asof(conn, seq, run.times[seq], None)
                    for session in sessions:
                        run.asof_by_session[seq, session] = read_asof(
                            conn, seq, run.times[seq], session
                        )
            yield run
        finally:
            store.close()


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=SEQUENCES)
def test_incremental_projections_equal_a_replay(tmp_path: Path, ops: list[tuple[Any, ...]]) -> None:
    for run in drive(tmp_path, ops):
        store = run.store
        live = projection_digests(store.conn)
        assert rebuild(store) == store.head().seq - _unhandled(store)
        assert projection_digests(store.conn) == live
        # the catch-up on open takes the same path: drop two projections (recall after memory,
        # so it catches up while memory is already current) and reopen
        with store.transaction():
            RecallProjection().drop(store.conn)
            SessionsProjection().drop(store.conn)
        reopened = EventStore.open(store.path.parent, projections=default_projections())
        try:
            assert projection_digests(reopened.conn) == live
        finally:
            reopened.close()


def _unhandled(store: EventStore) -> int:
    types = set().union(*(p.handles for p in default_projections()))
    return sum(1 for event in store.events() if event.type not in types)


# -- atomicity -------------------------------------------------------------------------------


def fill(store: EventStore, turns: int, *, session: str = "s1") -> None:
    events: list[NewEvent] = [builders.session_started(session, at="0", details={})]
    for n in range(1, turns + 1):
        parts = [
            store.hasher.part({"role": "user", "content": f"question {n} about tea"}),
            store.hasher.part({"role": "assistant", "content": f"answer {n} about green tea"}),
        ]
        events.append(
            builders.turn(store.hasher, session, n, parts, start=2 * (n - 1), legacy=False)
        )
        if n % 50 == 0:
            events.append(
                builders.memory_write(store.hasher, session, n, "add", "memory", f"fact {n}", {})
            )
    with store.transaction():
        store.append_in_transaction(events)


def test_rebuild_returns_events_replayed_and_reports_progress(tmp_path: Path) -> None:
    store = EventStore.open(tmp_path / "a", projections=default_projections())
    fill(store, 30)
    store.append(
        [
            builders.delegation(
                store.hasher, "s1", task="t", result="r", child_session="c", details={}
            )
        ]
    )
    seen: list[int] = []
    assert (
        rebuild(store, progress=seen.append) == 31 + 0
    )  # 1 start + 30 turns; delegation is skipped
    assert seen[-1] == store.head().seq
    store.close()


def test_rebuild_refuses_a_projection_it_cannot_drop(tmp_path: Path) -> None:
    class Plain:
        name = "plain"

    store = EventStore.open(tmp_path / "a")
    store.projections = [Plain()]  # type: ignore[list-item]
    with pytest.raises(ReplayError, match="plain"):
        rebuild(store)
    store.close()


def test_rebuild_without_projections_uses_the_default_set(tmp_path: Path) -> None:
    store = EventStore.open(tmp_path / "a")
    fill(store, 5)
    rebuild(store)
    assert store.conn.execute("SELECT count(*) FROM recall_fts").fetchone()[0] == 10
    store.close()


def test_a_failing_rebuild_leaves_the_old_projections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = EventStore.open(tmp_path / "a", projections=default_projections())
    fill(store, 20)
    before = projection_digests(store.conn)

    def boom(self: Any, conn: sqlite3.Connection, event: Any) -> None:
        raise RuntimeError("bug in a reducer")

    monkeypatch.setattr(SessionsProjection, "reduce", boom)
    with pytest.raises(RuntimeError):
        rebuild(store)
    monkeypatch.undo()
    assert projection_digests(store.conn) == before
    assert store.conn.execute("SELECT count(*) FROM recall_fts").fetchone()[0] == 40
    store.close()


KILLED_CHILD = textwrap.dedent("""
    import sys
    from archive_provider.projections.registry import default_projections
    from archive_provider.audit.replay import rebuild
    from archive_provider.storage.store import EventStore

    store = EventStore.open(sys.argv[1], projections=default_projections())

    def progress(seq):
        if seq < store.head().seq:
            print("replaying", seq, flush=True)
            sys.stdin.readline()  # wait here, mid-transaction, until the parent kills us

    rebuild(store, progress=progress)
    print("finished", flush=True)
""")


def test_sigkill_mid_replay_leaves_the_old_projections_and_digests(tmp_path: Path) -> None:
    folder = tmp_path / "a"
    store = EventStore.open(folder, projections=default_projections())
    fill(store, 12000)
    before = projection_digests(store.conn)
    state = store.conn.execute(
        "SELECT name, last_seq, version FROM projection_state ORDER BY name"
    ).fetchall()
    store.close()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_CHILD, str(folder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = child.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("replaying"), line
        wal = folder / (DB_NAME + "-wal")
        assert wal.exists() and wal.stat().st_size > 0  # the child has written part of the rebuild
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == -signal.SIGKILL
    reopened = EventStore.open(folder, projections=default_projections())
    try:
        assert projection_digests(reopened.conn) == before
        assert (
            reopened.conn.execute(
                "SELECT name, last_seq, version FROM projection_state ORDER BY name"
            ).fetchall()
            == state
        )
        assert rebuild(reopened) > 0 and projection_digests(reopened.conn) == before
    finally:
        reopened.close()


# -- verify --projections ----------------------------------------------------------------------


def test_verify_projections_agrees_on_a_healthy_archive_and_leaves_it_untouched(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "a"
    store = EventStore.open(folder, projections=default_projections())
    fill(store, 100)
    head = store.head().seq
    store.close()
    mtime = (folder / DB_NAME).stat().st_mtime_ns
    seen: list[int] = []
    check = verify_projections(folder, progress=seen.append, scratch_dir=tmp_path)
    assert isinstance(check, ProjectionCheck)
    assert check.ok and check.mismatched == [] and check.live == check.rebuilt
    assert set(check.live) == {p.name for p in default_projections()}
    assert check.head == head and set(check.last_seq.values()) == {head} and seen[-1] == head
    assert check.as_dict()["ok"] is True
    assert (folder / DB_NAME).stat().st_mtime_ns == mtime
    assert list(tmp_path.glob("hermes-archive-verify-*")) == []


def test_verify_projections_names_a_damaged_projection(tmp_path: Path) -> None:
    folder = tmp_path / "a"
    store = EventStore.open(folder, projections=default_projections())
    fill(store, 60)
    store.conn.execute("UPDATE memory_entries SET content = 'tampered' WHERE position = 0")
    store.conn.execute("DELETE FROM recall_fts WHERE rowid = 3")
    store.close()
    check = verify_projections(folder)
    assert not check.ok and check.mismatched == ["memory", "recall"]
    assert check.live["sessions"] == check.rebuilt["sessions"]


def test_the_recall_digest_reads_the_index_definition_not_each_row_through_its_view(
    tmp_path: Path,
) -> None:
    """recall_fts's rows are its content view over recall_docs and the log: the digest hashes
    the view's and the index's definitions instead of reading every row through the view
    (most of `verify --projections`), and a view edited to read other text is still caught."""
    folder = tmp_path / "a"
    store = EventStore.open(folder, projections=default_projections())
    fill(store, 60)
    recall = next(p for p in default_projections() if p.name == "recall")
    with traced(store.conn) as statements:
        recall.digest(store.conn)
    assert statements and not [s for s in statements if "recall_text" in s.split("WHERE")[0]]
    (view,) = store.conn.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'recall_text'"
    ).fetchone()
    store.conn.execute("DROP VIEW recall_text")
    store.conn.execute(view.replace("coalesce(d.text,", "coalesce(upper(d.text),", 1))
    store.close()
    check = verify_projections(folder)
    assert not check.ok and check.mismatched == ["recall"]


def test_verify_projections_reports_a_projection_that_has_not_caught_up(tmp_path: Path) -> None:
    folder = tmp_path / "a"
    store = EventStore.open(folder)  # no projections: nothing was ever built
    fill(store, 3)
    store.close()
    check = verify_projections(folder)
    assert not check.ok and set(check.mismatched) == set(check.rebuilt)
    assert all(value.startswith("unavailable") for value in check.live.values())
    with pytest.raises(FileNotFoundError):
        verify_projections(tmp_path / "nowhere")


# -- streaming and memory ----------------------------------------------------------------------


def test_iter_events_carries_parts_and_filters_by_type(tmp_path: Path) -> None:
    store = EventStore.open(tmp_path / "a")
    first = 2  # the session's start: the log begins with store_created
    fill(store, 3)
    turns = list(iter_events(store.conn, 0, None, {"turn"}))
    assert [e.seq for e in turns] == [first + 1, first + 2, first + 3]
    assert all(set(e.parts) == set(e.messages) for e in turns)
    assert [e.seq for e in iter_events(store.conn, first + 1, first + 2)] == [first + 2]
    assert list(iter_events(store.conn, 0, None, set())) == []
    store.conn.execute("DROP TRIGGER payloads_no_delete")
    store.conn.execute(
        "DELETE FROM payloads WHERE digest = (SELECT payload FROM events WHERE seq = ?)",
        (first + 2,),
    )
    with pytest.raises(PayloadMissing, match=f"event {first + 2}"):
        list(iter_events(store.conn))
    store.close()


def _peak_traced(folder: Path) -> int:
    store = EventStore.open(folder)
    tracemalloc.start()
    try:
        rebuild(store)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        store.close()


def test_replay_memory_does_not_grow_with_the_log(tmp_path: Path) -> None:
    small, large = tmp_path / "small", tmp_path / "large"
    for folder, turns in ((small, 3000), (large, 15000)):
        store = EventStore.open(folder)
        fill(store, turns)
        store.close()
    peak_small, peak_large = _peak_traced(small), _peak_traced(large)
    assert peak_large < peak_small * 1.5 + 512 * 1024, (peak_small, peak_large)


def test_batched_and_single_appends_give_the_same_projections(tmp_path: Path) -> None:
    """Two stores share one key, so a text gets one digest in both (the lookup key finds the
    part, salted once, that the events name)."""
    with freeze_time(START):
        one = EventStore.open(tmp_path / "one", projections=default_projections())
        # a store is made with its own keys: give it one's lookup key, then reopen
        EventStore.open(tmp_path / "two").close()
        key = STORE_KEY_NAME
        (tmp_path / "two" / key).write_bytes((tmp_path / "one" / key).read_bytes())
        two = EventStore.open(tmp_path / "two", projections=default_projections())
        events = []
        for n in range(1, 40):
            parts = [one.hasher.part({"role": "user", "content": f"q {n}"})]
            events.append(builders.turn(one.hasher, "s1", n, parts, start=n - 1, legacy=False))
            if n % 7 == 0:
                events.append(
                    builders.memory_write(one.hasher, "s1", n, "add", "memory", f"m {n}", {})
                )
            if n % 11 == 0:
                events.append(
                    builders.checkpoint(
                        one.hasher,
                        "s1",
                        parts,
                        parent_session="",
                        host_api_version=2,
                        require_checkpoint=False,
                        received=1,
                    )
                )
        for event in events:
            one.append([event])
        two.append(events)
        assert projection_digests(one.conn) == projection_digests(two.conn)
        one.close()
        two.close()


def test_asof_projections_are_a_subset_in_order() -> None:
    names = [p.name for p in asof_projections()]
    assert names == ["sessions", "memory", "checkpoints", "recalls_served"]


def test_loaded_events_decode_bodies_as_canonical_decode_does() -> None:
    from archive_provider.format.canonical import canonical_bytes, decode
    from archive_provider.format.digests import Envelope
    from archive_provider.format.events import LoadedEvent

    value = {
        "a": 2**63 - 1,
        "b": -(2**63),
        "c": 2.0**63,
        "d": 1.5,
        "e": "x\ud800",
        "f": [None, True, 1e-7],
    }
    body = canonical_bytes(value)
    event = LoadedEvent(Envelope(1, "t", "turn", "s", "{}", "i", "p", "[]"), "c", body)
    assert event.body == decode(body)
    assert [type(v) for v in event.body.values()] == [type(v) for v in decode(body).values()]


def test_a_bulk_replay_tunes_fts_merging_and_restores_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import archive_provider.projections.runner as runner_module

    store = EventStore.open(tmp_path / "a", projections=default_projections())
    fill(store, 300)
    live = projection_digests(store.conn)
    monkeypatch.setattr(runner_module, "BULK_EVENTS", 1)
    rebuild(store)
    assert projection_digests(store.conn) == live
    config = store.conn.execute("SELECT v FROM recall_fts_config WHERE k = 'automerge'").fetchone()
    assert config == (RecallProjection.automerge,)
    store.close()
