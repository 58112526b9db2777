"""ArchiveProvider against real SQLite files: hooks become events, checkpoints are durable."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

import jsonschema
import pytest

from archive_provider import ArchiveProvider, register
from archive_provider.domain.evidence import direct_evidence
from archive_provider.format.canonical import decode
from archive_provider.format.verifier import verify_database
from archive_provider.host.provider import CheckpointError
from archive_provider.host.schemas import load_envelope_schema, load_event_schema
from archive_provider.storage.store import archive_dir
from archive_provider.storage.writer import writers

from .conftest import event_rows, open_log

SYSTEM = {"role": "system", "content": "You are Hermes."}


def convo(*pairs: tuple[str, str]) -> list[dict[str, object]]:
    messages: list[dict[str, object]] = [SYSTEM]
    for user, assistant in pairs:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return messages


def flush(provider: ArchiveProvider) -> None:
    assert provider.core.writer is not None and provider.core.writer.flush(10)


def turn_messages(home: Path) -> list[list[dict[str, object]]]:
    store = open_log(home)
    try:
        return [
            [decode(store.payload(d) or b"") for d in event.messages]
            for event in store.events()
            if event.type == "turn"
        ]
    finally:
        store.close()


def test_register_builds_a_new_provider_each_time_and_touches_nothing(tmp_path: Path) -> None:
    class Ctx:
        def __init__(self) -> None:
            self.providers: list[ArchiveProvider] = []

        def register_memory_provider(self, provider: ArchiveProvider) -> None:
            self.providers.append(provider)

    ctx = Ctx()
    before = threading.active_count()
    register(ctx)
    register(ctx)
    assert ctx.providers[0] is not ctx.providers[1]
    assert ctx.providers[0].name == "archive" and ctx.providers[0].is_available()
    assert type(ctx.providers[0]).pre_compress_checkpoint_api_version == 2
    assert threading.active_count() == before
    assert list(tmp_path.iterdir()) == []


def test_full_transcript_resends_archive_only_new_messages(make_provider, tmp_path: Path) -> None:
    provider = make_provider()
    first = convo(("My cat is Miso", "Nice"))
    second = first + [
        {"role": "user", "content": "2+2?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{bad"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "4"},
        {"role": "assistant", "content": "4"},
    ]
    provider.sync_turn("My cat is Miso", "Nice", session_id="s1", messages=first)
    provider.sync_turn("2+2?", "4", session_id="s1", messages=second)
    provider.sync_turn("2+2?", "4", session_id="s1", messages=second)  # a re-send adds nothing
    flush(provider)
    turns = turn_messages(tmp_path / "home")
    assert turns == [first, second[3:]]
    assert [m["role"] for m in turns[1]] == ["user", "assistant", "tool", "assistant"]


def test_a_repeated_answer_in_a_later_turn_is_a_new_event(make_provider, tmp_path: Path) -> None:
    provider = make_provider()
    one = convo(("ok?", "yes"))
    two = convo(("ok?", "yes"), ("ok?", "yes"))
    provider.sync_turn("ok?", "yes", session_id="s1", messages=one)
    provider.sync_turn("ok?", "yes", session_id="s1", messages=two)
    flush(provider)
    assert [len(t) for t in turn_messages(tmp_path / "home")] == [3, 2]


def test_legacy_hosts_without_messages_archive_user_and_assistant(
    make_provider, tmp_path: Path
) -> None:
    provider = make_provider()
    provider.sync_turn("hi", "hello")
    provider.sync_turn("hi", "hello")
    flush(provider)
    assert (
        turn_messages(tmp_path / "home")
        == [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]] * 2
    )


def test_checkpoint_is_durable_before_return_and_visible_to_another_connection(
    make_provider, tmp_path: Path
) -> None:
    provider = make_provider()
    messages = convo(("alpha", "beta"), ("gamma", "delta"))
    receipt = provider.on_pre_compress(messages, require_checkpoint=True)
    assert receipt.startswith("Archive checkpoint ") and "4 messages archived" in receipt
    store = open_log(tmp_path / "home")  # its own connection, in either format
    try:
        (checkpoint,) = [e for e in store.events() if e.type == "checkpoint"]
        evidence = checkpoint.body["evidence"]
        stored = [decode(store.payload(d) or b"null") for d in evidence]
    finally:
        store.close()
    assert stored == direct_evidence(messages)


def test_checkpoints_are_idempotent_and_grow_by_the_new_messages(
    make_provider, tmp_path: Path
) -> None:
    provider = make_provider()
    messages = convo(("alpha", "beta"), ("gamma", "delta"))
    first = provider.on_pre_compress(messages, require_checkpoint=True)
    again = provider.on_pre_compress(list(messages), require_checkpoint=True)
    assert "already archived (all already stored)" in again
    assert first.split(":")[0] == again.split(":")[0]  # the same checkpoint digest
    grown = provider.on_pre_compress(
        messages + [{"role": "user", "content": "epsilon"}], require_checkpoint=True
    )
    assert "5 messages archived (1 newly stored)" in grown
    rows = event_rows(tmp_path / "home")
    assert [t for _, t, _ in rows].count("checkpoint") == 2


def test_concurrent_identical_checkpoints_make_one(make_provider, tmp_path: Path) -> None:
    providers = [make_provider(), make_provider()]  # same profile: one shared writer
    messages = convo(("same", "evidence"))
    receipts: list[str] = []
    threads = [
        threading.Thread(
            target=lambda p=p: receipts.append(p.on_pre_compress(messages, require_checkpoint=True))
        )
        for p in providers * 4
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(receipts) == 8
    assert sum("messages archived" in r for r in receipts) == 1
    assert [t for _, t, _ in event_rows(tmp_path / "home")].count("checkpoint") == 1


def test_required_checkpoint_raises_when_the_database_is_locked(
    make_provider, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("ARCHIVE_BUSY_TIMEOUT_S", "0.2")
    monkeypatch.setenv("ARCHIVE_CHECKPOINT_TIMEOUT_S", "5")
    provider = make_provider()
    flush(provider)
    blocker = sqlite3.connect(archive_dir(tmp_path / "home") / "events.db", isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(CheckpointError, match="locked"):
            provider.on_pre_compress(convo(("a", "b")), require_checkpoint=True)
        assert provider.on_pre_compress(convo(("a", "b"))) == ""  # best effort: no raise
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    flush(provider)
    types = [t for _, t, _ in event_rows(tmp_path / "home")]
    assert "checkpoint" not in types  # nothing half-present
    assert types.count("checkpoint_failed") == 2  # each failure recorded once the lock is gone
    assert "5 messages" not in provider.on_pre_compress(convo(("a", "b")), require_checkpoint=True)


def test_non_primary_contexts_write_no_turns_but_checkpoints_are_archived(
    make_provider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARCHIVE_SUBAGENT_TURNS", "false")  # on by default (docs/OPERATIONS.md)
    provider = make_provider(agent_context="subagent")
    provider.sync_turn("u", "a", messages=convo(("u", "a")))
    provider.on_memory_write("add", "memory", "fact")
    assert "archived" in provider.on_pre_compress(convo(("u", "a")), require_checkpoint=True)
    assert [t for _, t, _ in event_rows(tmp_path / "home") if t != "store_created"] == [
        "checkpoint"
    ]


def test_hostile_messages_are_archived_faithfully(make_provider, tmp_path: Path) -> None:
    provider = make_provider()
    huge = "x" * (5 * 1024 * 1024)
    messages = [
        "not a dict",
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "parts"},
                {"type": "image_url", "image_url": {"url": "u"}},
            ],
        },
        {"role": "assistant", "content": None},
        {"role": "weird-role", "content": "lone \ud800 surrogate and \u2028"},
        {"role": "user", "content": huge},
        {
            "role": "assistant",
            "content": "t",
            "tool_calls": [{"function": {"arguments": "{" * 100_000}}],
        },
        {"role": "user", "content": b"raw \xff bytes"},
    ]
    provider.sync_turn("", "", session_id="s1", messages=messages)
    flush(provider)
    (archived,) = turn_messages(tmp_path / "home")
    assert archived[0] == {"role": "$invalid", "$value": "not a dict"}
    assert archived[1:6] == messages[1:6]
    assert archived[6]["content"].encode("utf-8", "surrogateescape") == b"raw \xff bytes"


def test_two_profiles_in_one_process_never_mix(make_provider, tmp_path: Path) -> None:
    a = make_provider(tmp_path / "a")
    b = make_provider(tmp_path / "b")

    def drive(provider: ArchiveProvider, tag: str) -> None:
        messages: list[dict[str, object]] = [SYSTEM]
        for i in range(50):
            messages += [
                {"role": "user", "content": f"{tag} {i}"},
                {"role": "assistant", "content": f"{tag} ok"},
            ]
            provider.sync_turn("", "", session_id="s1", messages=list(messages))

    threads = [
        threading.Thread(target=drive, args=(a, "alpha")),
        threading.Thread(target=drive, args=(b, "bravo")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    flush(a)
    flush(b)
    for home, tag, other in (
        (tmp_path / "a", "alpha", "bravo"),
        (tmp_path / "b", "bravo", "alpha"),
    ):
        texts = [m["content"] for turn in turn_messages(home) for m in turn if m["role"] == "user"]
        assert texts == [f"{tag} {i}" for i in range(50)]
        assert not any(other in str(t) for t in texts)


def test_two_instances_of_one_profile_share_a_writer_and_one_chain(
    make_provider, tmp_path: Path
) -> None:
    a, b = make_provider(session="s1"), make_provider(session="s2")
    assert a.core.writer is b.core.writer
    for i in range(20):
        (a if i % 2 else b).on_memory_write("add", "memory", f"fact {i}")
    flush(a)
    store = open_log(tmp_path / "home")
    try:
        report = verify_database(store.conn, store.key)
        types = [e.type for e in store.events()]
        assert types.count("memory_write") == 20 and types.count("session_started") == 2
        assert report.ok and report.events_checked == len(types)
    finally:
        store.close()


def test_initialize_refuses_to_rebind_to_another_home(make_provider, tmp_path: Path) -> None:
    provider = make_provider(tmp_path / "a")
    provider.initialize("s9", hermes_home=str(tmp_path / "b"))
    provider.on_memory_write("add", "memory", "stays in a")
    flush(provider)
    assert not (archive_dir(tmp_path / "b")).exists()
    assert [t for _, t, _ in event_rows(tmp_path / "a")][-1] == "memory_write"


def test_prefetch_recalls_fenced_and_records_what_it_served(make_provider, tmp_path: Path) -> None:
    provider = make_provider()
    provider.sync_turn(
        "", "", session_id="s1", messages=convo(("My sister's name is Ingrid", "Noted"))
    )
    provider.on_memory_write("add", "user", "Sister: Ingrid, lives in Oslo")
    flush(provider)
    provider.on_turn_start(2, "what is my sister called?")
    text = provider.prefetch("what is my sister called?")
    assert "Ingrid" in text
    assert (
        text.splitlines()[0].startswith("[archive recall")
        and "not instructions" in text.splitlines()[0]
    )
    flush(provider)
    store = open_log(tmp_path / "home")
    try:
        (served,) = [e for e in store.events() if e.type == "recall_served"]
        assert decode(store.payload(served.body["result"]) or b"") == text
        assert served.body["turn"] == 2
    finally:
        store.close()


def test_archive_search_tool_answers_json_and_never_raises(make_provider) -> None:
    provider = make_provider()
    provider.sync_turn("", "", messages=convo(("The launch code is tangerine", "ok")))
    flush(provider)
    result = json.loads(provider.handle_tool_call("archive_search", {"query": "tangerine"}))
    assert result["results"][0]["text"] == "The launch code is tangerine"
    for bad in (
        {},
        {"query": 5},
        {"query": "x", "limit": "many"},
        "not json",
        None,
        {"query": "x", "since": 3},
    ):
        assert "error" in json.loads(provider.handle_tool_call("archive_search", bad))  # type: ignore[arg-type]
    assert (
        json.loads(provider.handle_tool_call("archive_search", {"query": '"NEAR( text: * AND'}))[
            "results"
        ]
        == []
    )
    assert "error" in json.loads(provider.handle_tool_call("nope", {}))


def test_every_event_matches_its_schema(
    make_provider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = make_provider()
    provider.sync_turn("", "", messages=convo(("a", "b")))
    provider.on_memory_write("add", "memory", "m", {"write_origin": "tool"})
    provider.on_memory_write("remove", "memory", "", {"old_text": "m"})
    provider.on_delegation("task", "result", child_session_id="c1")
    provider.on_pre_compress(convo(("a", "b")), require_checkpoint=True)
    provider.on_session_switch("s2", parent_session_id="s1", reset=False, reason="compression")
    provider.on_turn_start(1, "a")
    provider.prefetch("a b")
    provider.on_session_end(convo(("a", "b"), ("c", "d")))
    monkeypatch.setattr("archive_provider.host.provider.transcript_snapshot", _fault)
    provider.sync_turn("", "", messages=convo(("e", "f")))  # recorded as write_failed
    flush(provider)
    store = open_log(tmp_path / "home")
    try:
        events = list(store.events())
    finally:
        store.close()
    assert {e.type for e in events} >= {
        "write_failed",
        "session_started",
        "turn",
        "memory_write",
        "delegation",
        "checkpoint",
        "session_switched",
        "recall_served",
        "session_ended",
    }
    for event in events:
        jsonschema.validate(event.envelope.as_value(), load_envelope_schema())
        jsonschema.validate(event.body, load_event_schema(event.type))


def test_shutdown_drains_and_releases_the_writer(make_provider, tmp_path: Path) -> None:
    provider = make_provider()
    for i in range(500):
        provider.on_memory_write("add", "memory", f"fact {i}")
    provider.shutdown()
    assert archive_dir(tmp_path / "home").resolve() not in writers._writers
    assert [t for _, t, _ in event_rows(tmp_path / "home")].count("memory_write") == 500


def archived_turns(home: Path) -> list[tuple[list[dict[str, object]], list[object]]]:
    store = open_log(home)
    try:
        return [
            (
                [decode(store.payload(d) or b"") for d in e.messages],
                e.body.get("redactions", []),
            )
            for e in store.events()
            if e.type == "turn"
        ]
    finally:
        store.close()


def test_the_cached_delta_archives_exactly_what_the_full_path_does(
    make_provider, tmp_path: Path
) -> None:
    """One provider keeps its transcript cache; the other is new each turn (full path only)."""
    secret = "sk-proj-Abcdefghijklmnopqrstuvwxyz0123456789"
    cached = make_provider(tmp_path / "cached")
    messages: list[dict[str, object]] = [SYSTEM]
    script = [("hello", "hi"), (f"my key is {secret}", "noted"), ("again", "sure"), ("bye", "bye")]
    for user, answer in script:
        messages = messages + [
            {"role": "user", "content": user},
            {"role": "assistant", "content": answer},
        ]
        cached.sync_turn(user, answer, session_id="s1", messages=list(messages))
        fresh = make_provider(tmp_path / "full")
        fresh.sync_turn(user, answer, session_id="s1", messages=list(messages))
        fresh.shutdown()
    flush(cached)
    assert archived_turns(tmp_path / "cached") == archived_turns(tmp_path / "full")
    assert archived_turns(tmp_path / "cached")[1][1] == [
        {"path": "/messages/0/content", "kind": "api_key", "at": 10}
    ]


def test_a_message_changed_in_place_is_not_hidden_by_the_cache(
    make_provider, tmp_path: Path
) -> None:
    """The cache keeps copies: an answer the host edits in place is archived, not missed."""
    provider = make_provider()
    messages = convo(("first", "one"))
    provider.sync_turn("first", "one", session_id="s1", messages=messages)
    flush(provider)
    messages[2]["content"] = "one, edited"  # the host rewrote its last answer in the same list
    provider.sync_turn("first", "one, edited", session_id="s1", messages=messages)
    flush(provider)
    turns = [rows for rows, _ in archived_turns(tmp_path / "home")]
    assert turns[1] == [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "one, edited"},
    ]


def test_a_nested_part_changed_in_place_is_not_hidden_by_the_cache(
    make_provider, tmp_path: Path
) -> None:
    """A row that is not flat (content as a list of parts) is still copied deeply: the
    cache copies flat rows with ``dict()``, which would share a nested list."""
    provider = make_provider()
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": [{"type": "text", "text": "one"}]},
    ]
    provider.sync_turn("first", "one", session_id="s1", messages=messages)
    flush(provider)
    messages[2]["content"][0]["text"] = "one, edited"  # type: ignore[index]
    provider.sync_turn("first", "one, edited", session_id="s1", messages=messages)
    flush(provider)
    turns = [rows for rows, _ in archived_turns(tmp_path / "home")]
    assert turns[1][-1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "one, edited"}],
    }


class _Uncopyable:
    """A host object deepcopy refuses (it holds a lock), as tool results sometimes carry."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __repr__(self) -> str:
        return "<uncopyable>"


class _Incomparable:
    """A host object whose comparison raises, like an array's truth value."""

    def __eq__(self, other: object) -> bool:
        raise ValueError("the truth value is ambiguous")

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return "<incomparable>"


@pytest.mark.parametrize("odd", [_Uncopyable, _Incomparable])
def test_a_message_the_cache_cannot_copy_or_compare_still_archives_every_turn(
    make_provider, tmp_path: Path, odd: type
) -> None:
    """The transcript cache is best effort: such a message costs the fast path, not the turn."""
    cached = make_provider(tmp_path / "cached")
    messages: list[dict[str, object]] = [SYSTEM, {"role": "user", "content": "hi", "x": odd()}]
    messages.append({"role": "assistant", "content": "hello"})
    for user, answer in [("hi", "hello"), ("more", "sure"), ("last", "bye")]:
        if user != "hi":
            messages = [*messages, {"role": "user", "content": user}]
            messages.append({"role": "assistant", "content": answer})
        cached.sync_turn(user, answer, session_id="s1", messages=list(messages))
        fresh = make_provider(tmp_path / "full")
        fresh.sync_turn(user, answer, session_id="s1", messages=list(messages))
        fresh.shutdown()
    flush(cached)
    turns = [rows for rows, _ in archived_turns(tmp_path / "cached")]
    assert turns == [rows for rows, _ in archived_turns(tmp_path / "full")]
    assert [len(rows) for rows in turns] == [3, 2, 2]
    assert turns[0][1]["x"] == {"$type": odd.__name__, "$text": repr(odd())}  # tagged, kept


class _Unprintable:
    """A session id whose text cannot be taken."""

    def __str__(self) -> str:
        raise RuntimeError("no text for this id")


def _fault(*args: object, **kwargs: object) -> None:
    """An injected bug: what the hook guard exists for."""
    raise RuntimeError("injected fault")


def test_a_transcript_that_is_not_a_list_is_archived_as_one_tagged_row(
    make_provider, tmp_path: Path
) -> None:
    """Whatever shape arrives is archived as sent: nothing consumed, split or dropped."""
    provider = make_provider()
    odd: list[object] = [42, "a transcript as text", {"role": "user", "content": "one dict"}]
    for index, value in enumerate(odd):
        provider.sync_turn("u", "a", session_id=f"s{index}", messages=value)
    rows = (m for m in [{"role": "user", "content": "lazy"}])
    provider.sync_turn("u", "a", session_id="lazy", messages=rows)
    provider.on_session_end(7)
    flush(provider)
    turns = turn_messages(tmp_path / "home")
    assert turns[:3] == [
        [{"role": "$invalid", "$value": 42}],
        [{"role": "$invalid", "$value": "a transcript as text"}],
        [{"role": "user", "content": "one dict"}],
    ]
    assert turns[3][0]["$value"]["$type"] == "generator"
    assert next(rows) == {"role": "user", "content": "lazy"}  # the host's iterator is untouched
    assert turns[4] == [{"role": "$invalid", "$value": 7}]


def test_a_hook_that_fails_leaves_a_write_failed_event(
    make_provider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host swallows hook errors at DEBUG; the log must still show that input was lost."""
    provider = make_provider()
    with monkeypatch.context() as patched:  # a fault on the caller's thread
        patched.setattr("archive_provider.host.provider.transcript_snapshot", _fault)
        provider.sync_turn("u", "a", session_id="s1", messages=convo(("u", "a")))
    # and in the writer
    monkeypatch.setattr("archive_provider.domain.builders.memory_write", _fault)
    provider.on_memory_write("add", "memory", "lost", {})
    provider.sync_turn("next", "fine", session_id="s1", messages=convo(("next", "fine")))
    flush(provider)
    flush(provider)  # the failure record is queued when the failed job is reported
    store = open_log(tmp_path / "home")
    try:
        events = list(store.events())
    finally:
        store.close()
    failed = [e.body for e in events if e.type == "write_failed"]
    assert failed == [
        {"hook": "sync_turn", "error": "RuntimeError: injected fault"},
        {"hook": "memory_write", "error": "RuntimeError: injected fault"},
    ]
    assert [e.type for e in events].count("turn") == 1  # the hooks after a failure still work


def test_a_required_checkpoint_of_odd_rows_is_archived_not_refused(
    make_provider, tmp_path: Path
) -> None:
    """Rows whose role is a list or whose truth is ambiguous do not block compression."""

    class Ambiguous:
        def __bool__(self) -> bool:
            raise ValueError("ambiguous")

        def __repr__(self) -> str:
            return "<ambiguous>"

    provider = make_provider()
    messages = [
        *convo(("question", "answer")),
        {"role": ["user"], "content": "odd role"},
        {"role": "assistant", "content": "with prose", "tool_calls": Ambiguous()},
    ]
    receipt = provider.on_pre_compress(messages, require_checkpoint=True)
    assert "3 messages archived" in receipt
    store = open_log(tmp_path / "home")
    try:
        (checkpoint,) = [e for e in store.events() if e.type == "checkpoint"]
        evidence = [decode(store.payload(d) or b"") for d in checkpoint.body["evidence"]]
    finally:
        store.close()
    assert evidence[-1] == {"role": "assistant", "content": "with prose"}


def test_odd_session_ids_are_archived_and_kept_apart(make_provider, tmp_path: Path) -> None:
    """An id without a text is described; ids differing in a lone surrogate stay two sessions."""
    provider = make_provider()
    for session in (_Unprintable(), "a\ud800", "a\udfff"):
        provider.sync_turn("u", "a", session_id=session, messages=convo(("u", "a")))
    provider.on_delegation("t", "r", child_session_id="c\ud83d\ude00")  # a pair as two points
    flush(provider)
    rows = event_rows(tmp_path / "home")
    turns = [session for _, kind, session in rows if kind == "turn"]
    assert turns == ["<_Unprintable without a text>", "a\\ud800", "a\\udfff"]
    store = open_log(tmp_path / "home")
    try:
        (delegation,) = [e for e in store.events() if e.type == "delegation"]
    finally:
        store.close()
    assert delegation.body["child_session"] == "c\U0001f600"


def test_the_tool_answer_is_text_the_host_can_encode(make_provider) -> None:
    """A lone surrogate in the query is echoed back; the answer must still be UTF-8."""
    provider = make_provider()
    answer = provider.handle_tool_call("archive_search", {"query": "zebra \ud800"})
    answer.encode("utf-8")
    assert isinstance(json.loads(answer), dict)
