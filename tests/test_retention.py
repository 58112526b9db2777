"""Retention and erasure whose cost follows the batch, not the archive (issue 16).

What makes a batch cheap must not cost a guarantee: the events naming an erased payload are
found through ``part_reuse`` (kept by the append, built once for an older archive), a text
another event still names is kept, held data is skipped without stopping the pass, and the
full-text merge a pass leaves to its end is owed until it is done.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from freezegun import freeze_time

from archive_provider.audit import erasure
from archive_provider.audit.erasure import Scope
from archive_provider.domain import builders
from archive_provider.storage import store_pieces
from archive_provider.storage.store_pieces import PART_REUSE_FROM
from tests.conftest import open_v2
from tests.test_erasure import (
    OTHER,
    SECRET,
    SECRET_TERM,
    assert_gone,
    checkpoint,
    fts_terms,
    raw_hits,
    turn,
)

SHARED = "the shared sentence both sessions hold"


def steps(conn: sqlite3.Connection, work: Callable[[], object]) -> int:
    """SQLite virtual-machine steps (in tens) ``work`` runs: they grow with every row it
    reads, whatever the machine's speed."""
    done = 0

    def count() -> int:
        nonlocal done
        done += 1
        return 0

    conn.set_progress_handler(count, 10)
    try:
        work()
    finally:
        conn.set_progress_handler(None, 0)
    return done


def plan_steps(store: erasure.EventStore, session: str) -> int:
    return steps(store.conn, lambda: erasure.plan(store, Scope("session", {"session": session})))


def forget_steps(store: erasure.EventStore, session: str) -> int:
    """The steps of the projections forgetting an erased session again (rolled back)."""
    seqs = frozenset(
        s for (s,) in store.conn.execute("SELECT seq FROM events WHERE session = ?", (session,))
    )

    def forget() -> None:
        for projection in store.projections:
            projection.forget(store.conn, seqs)  # type: ignore[attr-defined]

    store.conn.execute("BEGIN")
    try:
        return steps(store.conn, forget)
    finally:
        store.conn.execute("ROLLBACK")


def sessions(
    store: erasure.EventStore, first: int, count: int, *, checkpoints: bool = False
) -> None:
    """Sessions s<first>.. of a start and three turns (each turn also says SHARED), and with
    ``checkpoints`` a checkpoint each (an event the plan still sweeps archive-wide)."""
    for n in range(first, first + count):
        name = f"s{n}"
        store.append(
            [
                builders.session_started(name, at="t0", details={"platform": "cli"}),
                *(
                    turn(store, name, k, [f"{name} said sentence {k} of many", SHARED], 2 * k)
                    for k in range(1, 4)
                ),
            ]
        )
        if not checkpoints:
            continue
        evidence = [store.hasher.part({"role": "user", "content": f"{name} said sentence 1"})]
        store.append([checkpoint(store, name, evidence)])


@pytest.mark.parametrize("checkpoints", [False, True])
def test_the_plan_reads_no_more_when_the_archive_is_ten_times_larger(
    home: Path, store: erasure.EventStore, checkpoints: bool
) -> None:
    sessions(store, 0, 20, checkpoints=checkpoints)
    small = plan_steps(store, "s0")
    sessions(store, 20, 180, checkpoints=checkpoints)
    large = plan_steps(store, "s0")
    # reading every event's parts: about 10x; with checkpoints, the sweep reading every
    # checkpoint: 91 -> 419 (main), now 66 -> 68
    assert large < small * 1.5, (small, large)
    found = erasure.plan(store, Scope("session", {"session": "s0"}))
    assert found.kept_shared == 1  # SHARED
    assert len(found.digests) == 3 + 1 + checkpoints  # its sentences, its start, evidence


def test_the_projections_forget_a_session_reading_no_more_in_a_larger_archive(
    store: erasure.EventStore,
) -> None:
    sessions(store, 0, 20, checkpoints=True)
    erasure.forget(store, Scope("session", {"session": "s0"}), reason="r")
    small = forget_steps(store, "s0")
    sessions(store, 20, 180, checkpoints=True)
    large = forget_steps(store, "s0")
    # the sessions projection read every session's start, recall every later checkpoint
    assert large < small * 1.25, (small, large)


def test_a_text_said_in_many_sessions_is_kept_unless_the_scope_says_shared(
    home: Path, store: erasure.EventStore
) -> None:
    sessions(store, 0, 3)
    kept = erasure.forget(store, Scope("session", {"session": "s2"}), reason="r")
    assert kept.kept_shared == 1 and raw_hits(home, SHARED)
    # s0's first turn stored the text: no index lists it, and a shared erasure touches it too
    gone = erasure.forget(store, Scope("session", {"session": "s2", "shared": True}), reason="r")
    assert gone.payloads == 1 and gone.events == 1 + 9  # s2's start, every session's turns
    assert_gone(home, store, SHARED, "shared")


def test_the_append_lists_each_reuse_but_not_the_event_that_stored_the_text(
    store: erasure.EventStore,
) -> None:
    first = store.append([turn(store, "a", 1, [SHARED, SECRET])])[0].seq
    again = store.append([turn(store, "b", 1, [SHARED, SHARED])])[0].seq
    rows = store.conn.execute("SELECT digest, seq FROM part_reuse").fetchall()
    assert [seq for _, seq in rows] == [again]  # once, though b names it twice
    parts = store.conn.execute("SELECT parts FROM events WHERE seq = ?", (first,)).fetchone()[0]
    assert rows[0][0] == parts[:32]


def test_an_archive_made_before_part_reuse_is_indexed_by_its_first_erasure(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_pieces, "PART_REUSE_STEP", 1)  # one event per transaction
    folder = home / "archive"
    store = open_v2(folder)
    store.append([turn(store, "a", 1, [SECRET, SHARED])])
    store.append([turn(store, "b", 1, [SHARED])])
    store.close()
    conn = sqlite3.connect(folder / "events.db")  # as an archive of 0.1 left it
    conn.execute("DROP TABLE part_reuse")
    conn.execute("DELETE FROM meta WHERE name = ?", (PART_REUSE_FROM,))
    conn.commit()
    conn.close()
    store = open_v2(folder)
    try:
        store.append([turn(store, "c", 1, [SHARED])])  # appended after: listed by the append
        assert store.conn.execute("SELECT count(*) FROM part_reuse").fetchone()[0] == 1
        receipt = erasure.forget(store, Scope("session", {"session": "a"}), reason="r")
        assert receipt.kept_shared == 1  # b's reuse was found by the one-time pass
        assert store.conn.execute("SELECT count(*) FROM part_reuse").fetchone()[0] == 2
        assert raw_hits(home, SECRET) == [] and raw_hits(home, SHARED)
        gone = erasure.forget(store, Scope("session", {"session": "c", "shared": True}), reason="r")
        assert gone.events == 3  # a stored it (found by the one-time pass), b and c reused it
        assert_gone(home, store, SHARED, "shared")
    finally:
        store.close()


def test_a_first_batch_all_under_a_hold_does_not_end_the_retention_pass(
    home: Path, store: erasure.EventStore
) -> None:
    with freeze_time("2026-01-01T00:00:00Z"):
        store.append(
            [turn(store, "held", k, [f"held text number {k} for counsel"]) for k in (1, 2)]
        )
        store.append([turn(store, "old", 1, [SECRET])])
    with freeze_time("2026-09-01T00:00:00Z"):
        store.append([turn(store, "new", 1, [OTHER])])
        erasure.set_retention(store, 180, "policy", "ops", confirmed=True)
        erasure.add_hold(store, {"session": "held"}, "audit", "counsel")
        done = erasure.apply_retention(store, batch=2)
    assert [r.payloads for r in done] == [0, 1]  # the held batch, then the old turn's
    assert_gone(home, store, SECRET, SECRET_TERM)
    data = (home / "archive" / "events.db").read_bytes()
    assert b"held text number 2" in data and OTHER.encode() in data


def test_a_pass_cut_short_leaves_the_index_merge_owed_and_the_next_pass_makes_it(
    home: Path, store: erasure.EventStore
) -> None:
    term = "quuxblatherskite"  # one token: what an unmerged segment would still hold
    with freeze_time("2026-01-01T00:00:00Z"):
        store.append([turn(store, "old", 1, [f"{term} was said once"])])
        store.append([turn(store, "old", 2, ["and then something else was said"], 2)])
    with freeze_time("2026-09-01T00:00:00Z"):
        erasure.set_retention(store, 180, "policy", "ops", confirmed=True)
        cut = erasure.apply_retention(store, batch=1, between=lambda: False)
        assert len(cut) == 1 and cut[0].payloads == 1
        assert term not in fts_terms(store)  # out of every search at once
        assert erasure.merge_index(store)  # owed: the pass stopped before its merge
        assert not erasure.merge_index(store)  # made: nothing owed
        assert raw_hits(home, term) == []
        erasure.apply_retention(store, batch=1)
    assert_gone(home, store, "and then something else was said", "something")


def test_what_the_appends_list_equals_the_one_time_pass_over_the_log(
    store: erasure.EventStore,
) -> None:
    """Reuses across transactions, inside one transaction, within one event, by checkpoints,
    memory writes and recalls: the append's rows are exactly what reading the log gives."""
    words = ["yes", SHARED, "no", OTHER]
    store.append([turn(store, "a", 1, [words[0], words[1]]), turn(store, "b", 1, [words[1]])])
    store.append([turn(store, "c", 1, [words[0], words[0], words[2]])])
    evidence = [store.hasher.part({"role": "user", "content": w}) for w in words]
    store.append(
        [
            checkpoint(store, "a", evidence),
            builders.memory_write(store.hasher, "a", 1, "add", "user", SHARED, {}),
            builders.memory_write(store.hasher, "b", 1, "add", "user", SHARED, {}),
            builders.recall_served(
                store.hasher, "b", turn=2, query="yes", result=SHARED, sources=[2], at="t"
            ),
        ]
    )
    store.append([turn(store, "d", 1, [words[3], words[2]])])
    appended = set(store.conn.execute("SELECT digest, seq FROM part_reuse").fetchall())
    assert len(appended) >= 8
    with store.transaction():
        store.conn.execute("DELETE FROM part_reuse")
        store.conn.execute(
            "INSERT OR REPLACE INTO meta VALUES (?, ?)", (PART_REUSE_FROM, store.head().seq)
        )
    erasure.forget(store, Scope("event", {"seq": 1}), reason="index")  # store_created: none
    assert set(store.conn.execute("SELECT digest, seq FROM part_reuse").fetchall()) == appended


def provider_sessions(store: erasure.EventStore, first: int, count: int) -> None:
    """Sessions as a provider writes them: each turn followed by the recall served for it
    (its query the user's words, its result quoting the previous session, which it names as
    a source), and a checkpoint whose evidence repeats the session's words in the host's own
    message shape (another payload holding the same text)."""
    for n in range(first, first + count):
        name, said = f"s{n}", [f"s{n} said sentence {k} of many" for k in range(1, 4)]
        before = store.conn.execute(
            "SELECT max(seq) FROM events WHERE session = ? AND type = 'turn'", (f"s{n - 1}",)
        ).fetchone()[0]
        events = [builders.session_started(name, at="t0", details={"platform": "cli"})]
        for k, text in enumerate(said, 1):
            events.append(turn(store, name, k, [text], k - 1))
            events.append(
                builders.recall_served(
                    store.hasher,
                    name,
                    turn=k,
                    query=text,
                    result=f"> (earlier) s{n - 1} said sentence {k} of many",
                    sources=[before] if before else [],
                    at="t1",
                )
            )
        store.append(events)
        evidence = [
            store.hasher.part({"role": "user", "content": t, "tool_calls": []}) for t in said
        ]
        store.append([checkpoint(store, name, evidence)])


def test_the_plan_in_a_provider_driven_archive_reads_no_more_when_it_is_ten_times_larger(
    home: Path, store: erasure.EventStore
) -> None:
    """A recall served each turn and a checkpoint per session: the quoting events are found
    through ``quoting``, not by reading every one (the sweep did: 85 -> 377 style growth)."""
    provider_sessions(store, 0, 20)
    small = plan_steps(store, "s5")
    provider_sessions(store, 20, 180)
    large = plan_steps(store, "s5")
    assert large < small * 1.25, (small, large)  # the sweep reading every one: 493 -> 3847
    found = erasure.plan(store, Scope("session", {"session": "s5"}))
    s6 = {
        s: kind
        for s, kind in store.conn.execute("SELECT seq, type FROM events WHERE session = 's6'")
    }
    # s6's recalls showed s5 (sources): their results go; their queries are s6's own words
    # and stay, so does s6's checkpoint evidence repeating them (FORMAT.md 13.4); s7's
    # recalls quote s6's turns, which stay, so they do
    assert {s for s, kind in s6.items() if kind == "recall_served"} <= found.touched
    assert not {s for s, kind in s6.items() if kind in ("turn", "checkpoint")} & found.touched
    # s5: start, 3 sentences, 3 recalls (query, result), checkpoint evidence (3);
    # s6: 3 recall results
    assert len(found.digests) == 1 + 3 + 6 + 3 + 3, len(found.digests)


def test_forgetting_in_a_provider_driven_archive_leaves_no_byte_and_no_key_of_the_text(
    home: Path, store: erasure.EventStore
) -> None:
    """The recalls and checkpoints quoting s5 lose those texts; ``quoting`` keeps no key of
    an erased text (it would confirm a guess with the store key), and keeps the rest."""
    from archive_provider.storage.store_pieces import quote_key

    provider_sessions(store, 0, 8)
    gone, kept = "s5 said sentence 2 of many", "s3 said sentence 2 of many"
    key = quote_key(store.key, gone)
    rows = "SELECT count(*) FROM quoting WHERE quoted = ?"
    assert store.conn.execute(rows, (key,)).fetchone()[0] == 2  # s5's recall, its checkpoint
    erasure.forget(store, Scope("session", {"session": "s5"}), reason="r")
    assert raw_hits(home, gone) == [] and raw_hits(home, "s5 said sentence") == []
    assert store.conn.execute(rows, (key,)).fetchone()[0] == 0
    assert store.conn.execute(rows, (quote_key(store.key, kept),)).fetchone()[0] == 2
    assert raw_hits(home, kept)
    assert_gone(home, store, gone, "s5")


def test_a_text_quoted_whole_in_another_session_is_found_through_quoting(
    home: Path, store: erasure.EventStore
) -> None:
    """A checkpoint of another session whose evidence holds the text (in the host's message
    shape: another payload) and the recall that then showed that checkpoint both lose it."""
    said = store.append([turn(store, "a", 1, [SECRET])])[0].seq
    store.append([turn(store, "b", 1, [OTHER])])
    evidence = [store.hasher.part({"role": "user", "content": SECRET, "tool_calls": []})]
    shown = store.append([checkpoint(store, "b", evidence, parent_session="a")])[0].seq
    store.append(
        [
            builders.recall_served(
                store.hasher,
                "c",
                turn=1,
                query="where does he live",
                result=f"> (checkpoint) {SECRET}",
                sources=[shown],
                at="t",
            )
        ]
    )
    receipt = erasure.forget(store, Scope("event", {"seq": said}), reason="r")
    assert receipt.payloads == 3  # the turn's message, the evidence, the recall's result
    assert_gone(home, store, SECRET, SECRET_TERM)
    assert OTHER.encode() in (home / "archive" / "events.db").read_bytes()
    assert raw_hits(home, "where does he live")  # the recall's query quotes nothing erased
    assert said < shown


def test_an_archive_made_before_quoting_is_indexed_by_its_first_erasure(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_pieces, "QUOTING_STEP", 1)  # one quoting event per transaction
    folder = home / "archive"
    store = open_v2(folder)
    provider_sessions(store, 0, 3)
    appended = set(store.conn.execute("SELECT quoted, seq FROM quoting").fetchall())
    store.close()
    conn = sqlite3.connect(folder / "events.db")  # as an archive of an earlier 0.2.0 left it
    conn.execute("DROP TABLE quoting")
    conn.execute("DELETE FROM meta WHERE name = ?", (store_pieces.QUOTING_FROM,))
    conn.commit()
    conn.close()
    store = open_v2(folder)
    try:
        assert store.conn.execute("SELECT count(*) FROM quoting").fetchone()[0] == 0
        erasure._index_reuse(store)  # what the first erasure runs first
        assert set(store.conn.execute("SELECT quoted, seq FROM quoting").fetchall()) == appended
        store.conn.execute("DELETE FROM quoting")  # and again, by the erasure itself
        owed = (store_pieces.QUOTING_FROM, str(store.head().seq))
        store.conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", owed)
        receipt = erasure.forget(store, Scope("session", {"session": "s1"}), reason="r")
        assert store_pieces.index_owed(store.conn, store_pieces.QUOTING_FROM, store.head().seq) == 0
        # s1, and the results of s2's recalls (they showed s1; FORMAT.md 13.4)
        assert receipt.payloads == 1 + 3 + 6 + 3 + 3
        assert raw_hits(home, "s1 said sentence") == []
        left = set(store.conn.execute("SELECT quoted, seq FROM quoting").fetchall())
        # what the one-time pass listed is what the appends had, less the erased texts' keys
        assert left < appended and not {seq for _, seq in appended - left} - receipt_events(store)
    finally:
        store.close()


def receipt_events(store: erasure.EventStore) -> set[int]:
    """The events of sessions s1 and s2 (what the erasure of s1 touched)."""
    return {
        s for (s,) in store.conn.execute("SELECT seq FROM events WHERE session IN ('s1', 's2')")
    }


def test_a_text_kept_because_other_sessions_say_it_keeps_its_quotes_and_costs_no_more(
    home: Path, store: erasure.EventStore
) -> None:
    """SHARED is said in every session and repeated by every session's checkpoint in the
    host's message shape (s0 has no checkpoint): forgetting s0 keeps the text
    (``kept_shared``), so its quotes stay too (the sweep erased every checkpoint's copy), and
    the plan does not read every checkpoint repeating it."""
    shaped = {"role": "user", "content": SHARED, "tool_calls": []}

    def add(first: int, count: int) -> None:
        sessions(store, first, count)
        for n in range(max(first, 1), first + count):
            evidence = [store.hasher.part(shaped)]
            store.append([checkpoint(store, f"s{n}", evidence)])

    add(0, 20)
    small = plan_steps(store, "s0")
    add(20, 180)
    large = plan_steps(store, "s0")
    assert large < small * 1.25, (small, large)
    receipt = erasure.forget(store, Scope("session", {"session": "s0"}), reason="r")
    assert receipt.kept_shared == 1 and receipt.events == 4  # s0's start and turns
    assert raw_hits(home, "s0 said sentence") == []
    data = (home / "archive" / "events.db").read_bytes()
    assert b'"tool_calls":[]' in data  # the other sessions' checkpoints keep their evidence


def test_forgetting_what_a_recall_showed_keeps_the_words_of_the_session_it_was_served_in(
    home: Path, store: erasure.EventStore
) -> None:
    """b's recall showed a's turn, so it goes whole, its query (b's own words) with it; b's
    turn and b's checkpoint naming the same message stay (the sweep erased them: the
    checkpoint names a payload holding the query's text)."""
    said_b = "b asks where the harbour office is"
    a = store.append([turn(store, "a", 1, [SECRET])])[0].seq
    b_turn = turn(store, "b", 1, [said_b])
    store.append(
        [
            b_turn,
            builders.recall_served(
                store.hasher, "b", turn=1, query=said_b, result=f"> {SECRET}", sources=[a], at="t"
            ),
        ]
    )
    store.append(
        [
            # the evidence as the turn said it
            checkpoint(store, "b", [store.hasher.part({"role": "user", "content": said_b})])
        ]
    )
    receipt = erasure.forget(store, Scope("session", {"session": "a"}), reason="r")
    assert receipt.events == 2  # a's turn, b's recall
    assert_gone(home, store, SECRET, SECRET_TERM)
    assert raw_hits(home, said_b)  # b's turn and checkpoint still hold b's words
