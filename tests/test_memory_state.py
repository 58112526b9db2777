"""The pure memory reducer, alone and against hermes' own MemoryStore as the oracle."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from archive_provider.domain.memory_state import Entry, MemoryWrite, apply_write, locate


def run(writes: list[MemoryWrite], start: list[str] | None = None) -> tuple[list[str], list[Any]]:
    entries = [Entry(text, -i - 1, -i - 1) for i, text in enumerate(start or [])]
    changes = []
    for seq, write in enumerate(writes, 1):
        entries, change = apply_write(entries, write, seq)
        changes.append(change)
    return [entry.content for entry in entries], changes


def add(text: str) -> MemoryWrite:
    return MemoryWrite("add", "memory", text)


def test_add_strips_appends_and_ignores_an_existing_entry() -> None:
    entries, changes = run([add("  likes tea \n"), add("likes tea"), add("   ")])
    assert entries == ["likes tea"]
    assert [c.resolution for c in changes] == ["appended", "duplicate", "ignored"]
    assert changes[0].entry == 1 and changes[0].after == "likes tea"


def test_replace_and_remove_in_the_0_19_0_shape_find_the_entry_by_old_text() -> None:
    entries, changes = run(
        [
            add("User likes tea"),
            add("User lives in Oslo"),
            MemoryWrite("replace", "memory", "User likes green tea", old_text=" likes tea "),
            MemoryWrite("remove", "memory", "", old_text="Oslo"),
        ]
    )
    assert entries == ["User likes green tea"]
    replace, remove = changes[2], changes[3]
    assert (replace.resolution, replace.before, replace.after, replace.entry) == (
        "substring",
        "User likes tea",
        "User likes green tea",
        1,
    )
    assert (remove.resolution, remove.before, remove.after, remove.entry) == (
        "substring",
        "User lives in Oslo",
        None,
        2,
    )


def test_previous_content_of_newer_hosts_wins_over_an_ambiguous_old_text() -> None:
    entries, changes = run(
        [
            add("tea: green"),
            add("tea: black"),
            MemoryWrite(
                "replace", "memory", "tea: oolong", old_text="tea", previous_content="tea: black"
            ),
        ]
    )
    assert entries == ["tea: green", "tea: oolong"]
    assert changes[2].resolution == "previous_content" and changes[2].entry == 2


def test_previous_content_alone_is_enough() -> None:
    entries, changes = run(
        [add("a b c"), MemoryWrite("remove", "memory", "", previous_content="a b c")]
    )
    assert entries == [] and changes[1].resolution == "previous_content"


def test_ambiguous_old_text_prefers_an_exact_entry_then_the_first_match() -> None:
    # The host refuses several distinct matches, so these states only arise when the archive
    # missed writes; the documented rule still decides deterministically.
    start = ["dark mode please", "dark mode", "dark mode at night"]
    entries, changes = run([MemoryWrite("remove", "memory", "", old_text="dark mode")], start)
    assert entries == ["dark mode please", "dark mode at night"]
    assert (changes[0].resolution, changes[0].candidates) == ("exact", 3)
    entries, changes = run([MemoryWrite("replace", "memory", "light", old_text="mode")], start)
    assert entries == ["light", "dark mode", "dark mode at night"]
    assert (changes[0].resolution, changes[0].candidates, changes[0].before) == (
        "ambiguous",
        3,
        "dark mode please",
    )


def test_duplicates_of_one_text_are_not_ambiguous() -> None:
    entries, changes = run([MemoryWrite("remove", "memory", "", old_text="x")], ["x y", "x y", "z"])
    assert entries == ["x y", "z"] and changes[0].resolution == "substring"


def test_unresolved_replace_adds_the_new_content_and_remove_changes_nothing() -> None:
    entries, changes = run(
        [
            MemoryWrite(
                "replace",
                "memory",
                "new text",
                old_text="predates the archive",
                previous_content="predates the archive, old",
            ),
            MemoryWrite("remove", "memory", "", old_text="also unknown"),
            MemoryWrite("remove", "memory", ""),
        ]
    )
    assert entries == ["new text"]
    assert [c.resolution for c in changes] == ["unresolved"] * 3
    assert changes[0].before == "predates the archive, old" and changes[0].entry == 1
    assert changes[1].entry is None and changes[1].before is None


def test_refused_shapes_change_nothing() -> None:
    entries, changes = run(
        [
            add("keep"),
            MemoryWrite("replace", "memory", "  ", old_text="keep"),
            MemoryWrite("rename", "memory", "x", old_text="keep"),
        ],
        [],
    )
    assert entries == ["keep"] and [c.resolution for c in changes[1:]] == ["ignored", "ignored"]


def test_a_replace_that_duplicates_another_entry_collapses_them_like_the_host_reload() -> None:
    entries, changes = run(
        [add("a"), add("b"), add("c"), MemoryWrite("replace", "memory", "a", old_text="c")]
    )
    assert entries == ["a", "b"]
    assert changes[3].merged == 3 and changes[3].entry == 3
    entries, changes = run(
        [add("a"), add("b"), MemoryWrite("replace", "memory", "b", old_text="a")]
    )
    assert entries == ["b"] and changes[2].merged == 2 and changes[2].index == 0


def test_lineage_ids_survive_replaces() -> None:
    entries = [Entry("x", 1, 1)]
    entries, _ = apply_write(entries, MemoryWrite("replace", "memory", "y", old_text="x"), 5)
    assert entries == [Entry("y", 1, 5)]


def test_from_host_never_raises() -> None:
    write = MemoryWrite.from_host(None, 3, {"a": 1}, "not a mapping")
    assert (write.action, write.target, write.old_text) == ("None", "3", None)
    write = MemoryWrite.from_host("remove", "user", None, {"old_text": 5, "previous_content": "p"})
    assert (write.content, write.old_text, write.previous_content) == ("", None, "p")


def test_locate_without_any_search_text_is_unresolved() -> None:
    assert locate([Entry("a", 1, 1)], MemoryWrite("remove", "memory", "")) == (
        None,
        "unresolved",
        0,
    )


# -- against the host's MemoryStore -----------------------------------------------------

WORDS = st.sampled_from(["tea", "green tea", "Oslo", "dark mode", "likes", "User", "cat", "ca"])
TEXT = st.lists(WORDS, min_size=1, max_size=3).map(" ".join)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.sampled_from(["memory", "user"]), TEXT, st.none()),
        st.tuples(st.just("replace"), st.sampled_from(["memory", "user"]), TEXT, WORDS),
        st.tuples(st.just("remove"), st.sampled_from(["memory", "user"]), st.just(""), WORDS),
    ),
    max_size=25,
)


@pytest.fixture
def host_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    memory_tool = pytest.importorskip("tools.memory_tool")
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "home"))

    def fresh() -> Any:
        shutil.rmtree(tmp_path / "home", ignore_errors=True)
        store = memory_tool.MemoryStore(memory_char_limit=100000, user_char_limit=100000)
        store.load_from_disk()
        return store

    return fresh


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS, newer_host=st.booleans())
def test_the_reducer_follows_the_host_memory_tool(
    host_store: Any, ops: list[Any], newer_host: bool
) -> None:
    """Every write the host reports (it reports only successes) leaves both in the same state."""
    host = host_store()
    ours: dict[str, list[Entry]] = {"memory": [], "user": []}
    for seq, (action, target, content, old_text) in enumerate(ops, 1):
        before = list(dict.fromkeys(host._entries_for(target)))
        if action == "add":
            result = host.add(target, content)
        elif action == "replace":
            result = host.replace(target, old_text, content)
        else:
            result = host.remove(target, old_text)
        if not result.get("success"):
            continue  # the host does not tell providers about refused writes
        metadata: dict[str, Any] = {"old_text": old_text} if old_text else {}
        if newer_host and action != "add":
            metadata["previous_content"] = next(e for e in before if old_text.strip() in e)
        write = MemoryWrite.from_host(action, target, content, metadata)
        ours[target], change = apply_write(ours[target], write, seq)
        assert change.resolution not in ("ambiguous", "unresolved")
        for name in ("memory", "user"):
            assert [e.content for e in ours[name]] == list(dict.fromkeys(host._entries_for(name)))
