"""Each projection on real SQLite files: sessions, memory (and its history), recall, versions."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from archive_provider.audit.replay import projection_digests, rebuild
from archive_provider.domain import builders
from archive_provider.format.events import NewEvent, StoredEvent
from archive_provider.projections.base import TableProjection, check_order
from archive_provider.projections.builtin import (
    MemoryProjection,
    RecallProjection,
    SessionsProjection,
    history,
    lineage,
    memory_state,
    session_counters,
    session_links,
    transcript_digests,
)
from archive_provider.projections.registry import default_projections
from archive_provider.storage.store import EventStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EventStore]:
    opened = EventStore.open(tmp_path / "archive", projections=default_projections())
    yield opened
    opened.close()


@pytest.fixture
def before() -> int:
    """The seq before a test's first event (a log begins with store_created)."""
    return 1


def switch(session: str, parent: str, **details: Any) -> NewEvent:
    return builders.session_switched(
        session,
        previous=parent,
        at=f"{session}-{parent}-{details}",
        details={"parent_session_id": parent, **details},
    )


def turn(
    store: EventStore, session: str, ordinal: int, messages: list[Any], start: int
) -> NewEvent:
    parts = [store.hasher.part(m) for m in messages]
    return builders.turn(store.hasher, session, ordinal, parts, start=start, legacy=False)


def memory(
    store: EventStore, order: int, action: str, content: str, target: str = "user", **meta: Any
) -> NewEvent:
    return builders.memory_write(store.hasher, "s1", order, action, target, content, meta)


def recall_rows(store: EventStore) -> list[tuple[Any, ...]]:
    return store.conn.execute(
        "SELECT rowid, text, kind, session, role FROM recall_fts ORDER BY rowid"
    ).fetchall()


# -- sessions -------------------------------------------------------------------------------


def test_lineage_follows_compressions_and_branches_not_resumes_resets_or_rewinds(
    store: EventStore,
) -> None:
    store.append(
        [
            builders.session_started("a", at="1", details={"platform": "cli"}),
            switch("b", "a", reason="compression"),
            switch("c", "b", reason="branch"),
            switch("d", "c", reason="resume"),
            switch("e", "c", reset=True, reason="new_session"),
            switch("c", "", rewound=True),
            builders.session_started("f", at="2", details={"parent_session_id": "c"}),
            switch("g", "f"),  # a switch without a reason still names a parent
            switch("a", "g", reason="compression"),  # a cycle: the walk stops where it started
        ]
    )
    assert [link.parent for link in lineage(store.conn, "c")] == ["b", "a", "g", "f"]
    assert lineage(store.conn, "d") == [] and lineage(store.conn, "e") == []
    assert [(k.session, k.relation) for k in session_links(store.conn, "c")] == [
        ("c", "branch"),
        ("c", "rewind"),
    ]
    assert [link.relation for link in session_links(store.conn)] == [
        "compression",
        "branch",
        "resume",
        "reset",
        "rewind",
        "start",
        "switch",
        "compression",
    ]


def test_transcript_follows_appends_and_rewrites_and_a_rewind_keeps_it(
    store: EventStore, before: int
) -> None:
    m = [{"role": "user", "content": f"m{i}"} for i in range(6)]
    store.append([turn(store, "s1", 1, m[:2], 0), turn(store, "s1", 2, m[2:4], 2)])
    digests = [store.hasher.part(x).digest for x in m]
    assert transcript_digests(store.conn, "s1") == digests[:4]
    store.append([switch("s1", "", rewound=True)])
    assert transcript_digests(store.conn, "s1") == digests[:4]
    store.append([turn(store, "s1", 3, m[4:6], 1)])  # the host rewrote from position 1
    digests = [store.hasher.part(x).digest for x in m]  # v2: a new text's salt is drawn when stored
    assert transcript_digests(store.conn, "s1") == [digests[0], digests[4], digests[5]]
    assert session_counters(store.conn, "s1") == (3, 0)
    row = store.conn.execute(
        "SELECT first_seq, last_seq, turns FROM sessions WHERE session = 's1'"
    ).fetchone()
    assert row == (before + 1, before + 4, 3)


def test_session_rows_keep_start_end_and_counters(store: EventStore, before: int) -> None:
    store.append(
        [
            memory(store, 1, "add", "x"),
            builders.session_started(
                "s1", at="1", details={"platform": "cli", "agent_context": "primary"}
            ),
            builders.session_started("s1", at="2", details={"platform": "telegram"}),
            builders.session_ended("s1", at="3", message_count=0),
        ]
    )
    row = store.conn.execute(
        "SELECT first_seq, last_seq, started_at IS NOT NULL, ended_at IS NOT NULL, memory_writes,"
        " platform, agent_context FROM sessions"
    ).fetchone()
    assert row == (before + 1, before + 4, 1, 1, 1, "telegram", None)


# -- memory ----------------------------------------------------------------------------------


def test_memory_history_on_both_host_shapes(store: EventStore, before: int) -> None:
    store.append(
        [
            memory(store, 1, "add", "Prefers dark mode", write_origin="tool"),
            memory(store, 2, "add", "Lives in Oslo"),
            memory(
                store, 3, "replace", "Prefers dark mode in the evening", old_text="dark mode"
            ),  # 0.19.0
            memory(
                store,
                4,
                "replace",
                "Prefers light mode",
                old_text="mode",
                previous_content="Prefers dark mode in the evening",
            ),  # newer host
            memory(store, 5, "remove", "", old_text="light"),
        ]
    )
    assert memory_state(store.conn) == {"user": ["Lives in Oslo"]}
    changes = history(store.conn, "DARK MODE")
    assert [(c.seq, c.action, c.resolution, c.before, c.after) for c in changes] == [
        (before + 1, "add", "appended", None, "Prefers dark mode"),
        (
            before + 3,
            "replace",
            "substring",
            "Prefers dark mode",
            "Prefers dark mode in the evening",
        ),
        (
            before + 4,
            "replace",
            "previous_content",
            "Prefers dark mode in the evening",
            "Prefers light mode",
        ),
        (before + 5, "remove", "substring", "Prefers light mode", None),
    ]
    assert {c.entry for c in changes} == {before + 1} and changes[0].metadata == {
        "write_origin": "tool"
    }
    assert (
        changes[1].metadata == {"old_text": "dark mode"}
        and changes[0].time
        and changes[0].session == "s1"
    )
    assert [c.seq for c in history(store.conn, "oslo")] == [before + 2]
    assert len(history(store.conn, "")) == 5


def test_memory_history_records_ambiguity_and_writes_it_could_not_place(store: EventStore) -> None:
    store.append(
        [
            memory(store, 1, "add", "tea: green"),
            memory(store, 2, "add", "tea: black"),
            memory(store, 3, "remove", "", old_text="tea"),
            memory(store, 4, "remove", "", old_text="coffee"),
            memory(
                store, 5, "replace", "likes jazz", old_text="music", previous_content="likes music"
            ),
        ]
    )
    assert memory_state(store.conn) == {"user": ["tea: black", "likes jazz"]}
    ambiguous = history(store.conn, "tea: green")
    assert [(c.resolution, c.candidates) for c in ambiguous] == [("appended", 0), ("ambiguous", 2)]
    assert [(c.resolution, c.entry) for c in history(store.conn, "coffee")] == [
        ("unresolved", None)
    ]
    assert [(c.before, c.after) for c in history(store.conn, "music")] == [
        ("likes music", "likes jazz")
    ]


def test_memory_targets_are_separate_and_a_merge_is_followed(
    store: EventStore, before: int
) -> None:
    store.append(
        [
            memory(store, 1, "add", "a", target="memory"),
            memory(store, 2, "add", "b", target="memory"),
            memory(store, 3, "add", "a", target="user"),
            memory(store, 4, "replace", "a", target="memory", old_text="b"),
        ]
    )
    assert memory_state(store.conn) == {"memory": ["a"], "user": ["a"]}
    merged = [c for c in history(store.conn, "b") if c.merged]
    assert [(c.seq, c.merged) for c in merged] == [(before + 4, before + 2)]


# -- recall ----------------------------------------------------------------------------------


def test_checkpoint_evidence_adds_only_texts_its_session_did_not_index(store: EventStore) -> None:
    said = {"role": "assistant", "content": "checking the file", "tool_calls": [{"id": "1"}]}
    stripped = {"role": "assistant", "content": "checking the file"}
    before = {"role": "user", "content": "said before the archive existed"}
    store.append([turn(store, "s1", 1, [{"role": "user", "content": "look"}, said], 0)])
    parts = [store.hasher.part(m) for m in (before, {"role": "user", "content": "look"}, stripped)]
    store.append(
        [
            builders.checkpoint(
                store.hasher,
                "s1",
                parts,
                parent_session="",
                host_api_version=2,
                require_checkpoint=True,
                received=3,
            )
        ]
    )
    store.append([turn(store, "s2", 1, [{"role": "user", "content": "look"}], 0)])
    assert recall_rows(store) == [
        (1, "look", "turn", "s1", "user"),
        (2, "checking the file", "turn", "s1", "assistant"),
        (3, "said before the archive existed", "checkpoint", "s1", "user"),
        (4, "look", "turn", "s2", "user"),
    ]


def test_memory_rows_follow_the_entries(store: EventStore, before: int) -> None:
    store.append([memory(store, 1, "add", "likes tea"), memory(store, 2, "add", "lives in Oslo")])
    store.append([memory(store, 3, "replace", "likes coffee", old_text="tea")])
    store.append([memory(store, 4, "remove", "", old_text="Oslo")])
    entry = -(before + 3)  # a memory row's id is minus the seq of the write that set it
    assert recall_rows(store) == [(entry, "likes coffee", "memory", "", "user")]
    assert store.conn.execute(
        "SELECT rowid, role, text FROM recall_docs WHERE rowid < 0"
    ).fetchall() == [(entry, "user", "likes coffee")]


def test_only_user_and_assistant_prose_is_indexed_and_odd_text_is_stored(store: EventStore) -> None:
    store.append(
        [
            turn(
                store,
                "s1",
                1,
                [
                    {"role": "system", "content": "system prompt"},
                    {"role": "tool", "content": "tool output"},
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "part one"}, {"type": "image_url"}],
                    },
                    {"role": "assistant", "content": None, "tool_calls": []},
                    {"role": "user", "content": "   "},
                    {"role": "user", "content": "lone \ud800 surrogate"},
                ],
                0,
            )
        ]
    )
    assert [row[1] for row in recall_rows(store)] == ["part one", "lone \ufffd surrogate"]


# -- robustness and versions -----------------------------------------------------------------


def test_reducers_accept_payloads_they_do_not_expect(store: EventStore) -> None:
    odd = [
        NewEvent("turn", "s1", {"n": 1}, {"messages": "not a list", "start": -4}),
        NewEvent(
            "turn", "s1", {"n": 2}, {"messages": ["0" * 64], "start": "x"}
        ),  # a part never stored
        NewEvent(
            "memory_write", "s1", {"n": 3}, {"action": "add", "target": ["odd"], "content": 5}
        ),
        NewEvent(
            "memory_write", "s1", {"n": 4}, {"action": "remove", "target": "user", "metadata": "x"}
        ),
        NewEvent("checkpoint", "s1", {"n": 5}, {}),
        NewEvent("checkpoint_failed", "s1", {"n": 6}, {"error": {"nested": True}}),
        NewEvent("recall_served", "s1", {"n": 7}, {"turn": "x", "query": 3}),
        NewEvent("session_started", "s1", {"n": 8}, {"platform": ["cli"], "parent_session_id": 7}),
        NewEvent("session_switched", "s2", {"n": 9}, {"reset": "yes", "reason": None}),
        NewEvent("session_ended", "s1", {"n": 10}, None),
    ]
    for event in odd:
        assert store.append([event])[0].outcome == "appended"
    assert store.broken_projections == {}
    assert [c.metadata for c in history(store.conn, "")] == [{}, {"$value": "x"}]
    live = projection_digests(store.conn)
    rebuild(store)
    assert projection_digests(store.conn) == live


def fill(store: EventStore) -> None:
    store.append(
        [
            builders.session_started("s1", at="1", details={}),
            turn(store, "s1", 1, [{"role": "user", "content": "hello there"}], 0),
            memory(store, 1, "add", "likes tea"),
        ]
    )


def test_a_projection_of_another_version_is_rebuilt_on_open(tmp_path: Path) -> None:
    folder = tmp_path / "archive"
    store = EventStore.open(folder, projections=default_projections())
    fill(store)
    live = projection_digests(store.conn)
    store.conn.execute("UPDATE projection_state SET version = 1 WHERE name = 'recall'")
    store.conn.execute("DELETE FROM recall_fts")
    store.close()
    store = EventStore.open(folder, projections=default_projections())
    assert projection_digests(store.conn) == live
    store.close()


def test_projection_state_from_before_versions_is_upgraded(before: int, tmp_path: Path) -> None:
    folder = tmp_path / "archive"
    store = EventStore.open(folder)
    fill(store)
    store.conn.execute(
        "CREATE TABLE projection_state (name TEXT PRIMARY KEY, last_seq INTEGER NOT NULL)"
    )
    store.conn.execute(
        "CREATE TABLE memory_entries (target TEXT, position INTEGER, content TEXT, seq INTEGER)"
    )
    store.conn.execute("INSERT INTO projection_state VALUES ('memory', ?)", (before + 3,))
    store.close()
    store = EventStore.open(folder, projections=default_projections())
    assert memory_state(store.conn) == {"user": ["likes tea"]}
    states = store.conn.execute("SELECT DISTINCT last_seq FROM projection_state").fetchall()
    assert states == [(before + 3,)]
    store.close()


def test_a_projection_failing_in_the_catch_up_is_left_behind_alone(
    before: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "archive"
    store = EventStore.open(folder)
    fill(store)
    store.close()

    def boom(self: Any, conn: sqlite3.Connection, event: StoredEvent) -> None:
        raise ValueError("a reducer bug")

    monkeypatch.setattr(MemoryProjection, "reduce", boom)
    store = EventStore.open(folder, projections=[SessionsProjection(), MemoryProjection()])
    assert "memory" in store.broken_projections
    assert [SessionsProjection().last_seq(store.conn), MemoryProjection().last_seq(store.conn)] == [
        before + 3,
        before + 2,
    ]
    store.close()


def test_a_plain_projection_gets_every_event_in_the_catch_up(before: int, tmp_path: Path) -> None:
    class Counter:
        name = "counter"

        def __init__(self) -> None:
            self.seen: list[int] = []

        def create(self, conn: sqlite3.Connection) -> None: ...

        def last_seq(self, conn: sqlite3.Connection) -> int:
            return self.seen[-1] if self.seen else 0

        def apply(self, conn: sqlite3.Connection, event: StoredEvent) -> None:
            self.seen.append(event.seq)

    folder = tmp_path / "archive"
    store = EventStore.open(folder)
    fill(store)
    store.close()
    counter = Counter()
    EventStore.open(folder, projections=[counter]).close()
    assert counter.seen == list(range(1, before + 4))  # v2: store_created too


def test_recall_must_come_after_memory() -> None:
    with pytest.raises(ValueError, match="after 'memory'"):
        check_order([RecallProjection(), MemoryProjection()])
    with pytest.raises(ValueError, match="with 'memory'"):
        check_order([RecallProjection()])
    check_order(default_projections())


def test_digests_cover_every_table_and_the_version(store: EventStore) -> None:
    fill(store)
    first = projection_digests(store.conn)

    class Bumped(SessionsProjection):
        version = SessionsProjection.version + 1

    assert Bumped().digest(store.conn) != first["sessions"]
    store.conn.execute("UPDATE transcript SET seq = 99")
    assert projection_digests(store.conn)["sessions"] != first["sessions"]
    assert isinstance(default_projections()[0], TableProjection)


def test_recall_rows_buffered_in_a_transaction_match_a_replay(store: EventStore) -> None:
    # turns, a memory write between them and more turns in one transaction: the buffered
    # rows go in before the memory write indexes, and the result is what a rebuild makes
    user = {"role": "user", "content": "heron by the lake"}
    reply = {"role": "assistant", "content": "blue heron, yes"}
    store.append(
        [
            turn(store, "s1", 1, [user, reply], 0),
            memory(store, 1, "add", "likes herons"),
            turn(store, "s1", 2, [{"role": "user", "content": "and the egret?"}], 2),
        ]
    )
    live = recall_rows(store)
    assert [row[2] for row in live] == ["memory", "turn", "turn", "turn"]
    assert RecallProjection().last_seq(store.conn) == store.head().seq
    before = projection_digests(store.conn, store.projections)
    rebuild(store)
    assert recall_rows(store) == live
    assert projection_digests(store.conn, store.projections) == before


def test_a_recall_insert_failing_at_the_commit_leaves_recall_behind_alone(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.append([turn(store, "s1", 1, [{"role": "user", "content": "first"}], 0)])
    behind = store.head().seq

    def broken(self: Any, conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO recall_docs VALUES (9, 2, NULL, 'x', 'x')")  # then undone
        raise ValueError("an index bug")

    monkeypatch.setattr(RecallProjection, "flush", broken)
    store.append([turn(store, "s1", 2, [{"role": "user", "content": "second"}], 1)])
    assert "recall" in store.broken_projections
    assert RecallProjection().last_seq(store.conn) == behind  # behind, and says so
    assert SessionsProjection().last_seq(store.conn) == store.head().seq
    assert store.conn.execute("SELECT count(*) FROM recall_docs").fetchone()[0] == 1
    assert [row[1] for row in recall_rows(store)] == ["first"]


def test_a_recall_reducer_failing_mid_batch_keeps_what_precedes_it(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    reduce = RecallProjection.reduce

    def picky(self: Any, conn: sqlite3.Connection, event: StoredEvent) -> None:
        reduce(self, conn, event)  # buffers its rows first: they must not survive the failure
        if event.key.get("turn") == 2:
            raise ValueError("a reducer bug")

    monkeypatch.setattr(RecallProjection, "reduce", picky)
    results = store.append(
        [
            turn(store, "s1", n, [{"role": "user", "content": f"message {n}"}], n - 1)
            for n in (1, 2, 3)
        ]
    )
    assert "recall" in store.broken_projections
    assert [row[1] for row in recall_rows(store)] == ["message 1"]
    assert RecallProjection().last_seq(store.conn) == results[0].seq
    assert SessionsProjection().last_seq(store.conn) == results[2].seq
