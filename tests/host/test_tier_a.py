"""Tier A acceptance (hermes-contract.md section 6): the real provider in the real 0.19.0 host.

Every check runs against real hermes-agent objects: ``plugins.memory`` discovery of the
plugin folder written by ``archive_provider.host.install``, the real ``MemoryManager``, real
``AIAgent`` turns against the loopback fake LLM, the real
``agent.conversation_compression.compress_context`` and the ``hermes`` CLI in a
subprocess. Assertions about the archive always read the log through a fresh connection,
so they see only what is committed.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import archive_provider.host.core as core_module
from archive_provider import ArchiveProvider
from archive_provider.demo.fake_llm import FakeLLM, ToolCall
from archive_provider.projections.recall import FENCE_OPEN
from archive_provider.storage.store import archive_dir

from . import hostkit
from .archive_kit import (
    NAME,
    REPO_ROOT,
    Recorder,
    all_payload_values,
    archive_provider_of,
    child_env,
    counts,
    events,
    flush,
    install_archive,
    live_and_replayed,
    messages_of,
    query,
    verify,
    wait_for,
    write_lock_held,
)
from .stub_memory_plugin import RecordingStubProvider

HERMES_BIN = Path(sys.executable).with_name("hermes")


@pytest.fixture
def manager(hermes_home: Path) -> Iterator[tuple[Any, ArchiveProvider]]:
    """A real 0.19.0 ``MemoryManager`` with our provider, initialized as the host does."""
    from agent.memory_manager import MemoryManager

    mm = MemoryManager()
    provider = ArchiveProvider()
    mm.add_provider(provider)
    mm.initialize_all("s1", platform="cli", agent_context="primary")
    yield mm, provider
    if not mm._shutting_down:
        mm.shutdown_all()


def _snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _thread_names() -> set[str]:
    return {t.name for t in threading.enumerate()}


# -- A1 user-dir discovery ------------------------------------------------------------


def test_a1_user_dir_discovery_lists_loads_and_describes_the_provider(hermes_home: Path) -> None:
    from plugins.memory import (
        discover_memory_providers,
        find_provider_dir,
        list_memory_provider_names,
        load_memory_provider,
    )

    folder = install_archive(hermes_home)
    description = yaml.safe_load((folder / "plugin.yaml").read_text(encoding="utf-8"))[
        "description"
    ]

    assert NAME in list_memory_provider_names()
    assert find_provider_dir(NAME) == folder
    first, second = load_memory_provider(NAME), load_memory_provider(NAME)
    assert isinstance(first, ArchiveProvider) and isinstance(second, ArchiveProvider)
    assert first is not second  # a new provider per register() (profile isolation)
    assert first.name == NAME
    assert (NAME, description, True) in discover_memory_providers()


def test_a1_register_and_is_available_create_no_files_and_no_threads(
    hermes_home: Path, tmp_path: Path
) -> None:
    from plugins.memory import discover_memory_providers, load_memory_provider

    install_archive(hermes_home)
    # The host's own first-use side effects (SOUL.md, logs/, skills/...) happen here.
    load_memory_provider(NAME)
    discover_memory_providers()
    files, threads = _snapshot(tmp_path), _thread_names()

    provider = load_memory_provider(NAME)  # runs register(ctx)
    assert provider.is_available()
    discover_memory_providers()  # register() + is_available() for every provider
    # main (0.22) suffixes the module name with its source's digest
    plugin = (
        sys.modules[f"{hostkit.USER_MEMORY_NAMESPACE}.{NAME}"]
        if hostkit.ON_0_19
        else next(
            module
            for name, module in sys.modules.items()
            if name.startswith(f"{hostkit.USER_MEMORY_NAMESPACE}.{NAME}__source_")
        )
    )
    registered: list[Any] = []
    plugin.register(
        type("Ctx", (), {"register_memory_provider": lambda self, p: registered.append(p)})()
    )
    assert len(registered) == 1 and registered[0].is_available()

    assert _snapshot(tmp_path) == files
    assert not archive_dir(hermes_home).exists()
    assert _thread_names() == threads
    assert not any(name.startswith("archive-writer") for name in _thread_names())


# -- A2 CLI wiring --------------------------------------------------------------------


def _hermes(hermes_home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(HERMES_BIN), *args],
        env=child_env(hermes_home, HOME=os.environ["HOME"]),
        cwd=str(hermes_home),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a2_cli_is_wired_for_the_active_provider_and_runs_in_a_subprocess(
    hermes_home: Path, user_home: Path
) -> None:
    from plugins.memory import discover_plugin_cli_commands

    install_archive(hermes_home)
    (command,) = discover_plugin_cli_commands()
    assert command["name"] == NAME
    assert command["handler_fn"].__name__ == f"{NAME}_command"

    status = _hermes(hermes_home, "memory", "status")
    assert status.returncode == 0, status.stderr
    assert re.search(r"Provider:\s+archive\b", status.stdout)
    assert re.search(r"Plugin:\s+installed ✓", status.stdout)
    assert re.search(r"Status:\s+available ✓", status.stdout)
    assert not archive_dir(hermes_home).exists()  # status loads the provider: no store opened

    provider = ArchiveProvider()
    provider.initialize("cli-session", hermes_home=str(hermes_home), platform="cli")
    receipt = provider.on_pre_compress([{"role": "user", "content": "wire the cli"}])
    provider.shutdown()
    assert receipt

    human = _hermes(hermes_home, "archive", "status")
    assert human.returncode == 0, human.stderr
    assert "Checkpoints: 1" in human.stdout
    machine = _hermes(hermes_home, "archive", "status", "--json")
    assert machine.returncode == 0, machine.stderr
    data = json.loads(machine.stdout)
    assert data["exists"] is True and data["archive"] == str(archive_dir(hermes_home))
    # the first checkpoint also records that the store is witnessed from now on
    by_type = data["events_by_type"]
    assert by_type.pop("store_created", 1) == 1  # a v2 store's own first event
    assert by_type == {"session_started": 1, "checkpoint": 1, "witness_accepted": 1}
    assert all(p["current"] for p in data["projections"].values())
    assert os.listdir(user_home) == []


# -- A3 registration rules ------------------------------------------------------------


def test_a3_registration_tools_second_provider_and_system_prompt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from agent.memory_manager import MemoryManager
    from toolsets import _HERMES_CORE_TOOLS

    mm = MemoryManager()
    provider = ArchiveProvider()
    mm.add_provider(provider)

    names = mm.get_all_tool_names()
    assert names == {s["name"] for s in provider.get_tool_schemas()} == {"archive_search"}
    assert not names & set(_HERMES_CORE_TOOLS)
    assert {s["name"] for s in mm.get_all_tool_schemas()} == names

    with caplog.at_level(logging.WARNING, logger="agent.memory_manager"):
        mm.add_provider(RecordingStubProvider("other"))
    assert "Rejected memory provider 'other'" in caplog.text
    assert [p.name for p in mm.providers] == [NAME]
    assert mm.get_all_tool_names() == names
    assert provider.system_prompt_block() in mm.build_system_prompt()


# -- A4 profile-scoped storage ----------------------------------------------------------


def test_a4_store_lives_only_under_the_injected_hermes_home(
    manager: tuple[Any, ArchiveProvider], hermes_home: Path, user_home: Path, tmp_path: Path
) -> None:
    mm, provider = manager
    flush(provider)
    created = _snapshot(tmp_path)
    ours = {p for p in created if p.startswith(str(Path("hermes_home") / "archive"))}
    assert str(Path("hermes_home") / "archive" / "events.db") in ours
    if hostkit.ON_0_19:
        assert created - ours == {"hermes_home", "user"}  # the fixture's two empty folders
    else:  # 0.22's manager makes its own first-use files in the profile (logs, SOUL.md, ...)
        assert {"hermes_home", "user"} <= created
        assert all(p.startswith("hermes_home") for p in created - ours - {"user"})
    assert os.listdir(user_home) == []
    assert [e.type for e in events(hermes_home)] == ["session_started"]
    assert events(hermes_home)[0].body["platform"] == "cli"

    # An explicitly injected home wins over $HERMES_HOME; the env profile is left alone.
    from agent.memory_manager import MemoryManager

    other = tmp_path / "profile_b"
    mm_b = MemoryManager()
    provider_b = ArchiveProvider()
    mm_b.add_provider(provider_b)
    mm_b.initialize_all("b1", platform="cli", agent_context="primary", hermes_home=str(other))
    flush(provider_b)
    mm_b.shutdown_all()
    assert [e.session for e in events(other)] == ["b1"]
    assert [e.session for e in events(hermes_home)] == ["s1"]
    assert os.listdir(user_home) == []


@pytest.mark.parametrize("context", ["subagent", "cron", "flush"])
def test_a4_non_primary_contexts_write_no_turns_or_memory_but_still_checkpoint(
    context: str, tmp_path: Path, user_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent.memory_manager import MemoryManager

    # a cron job's and a subagent's turns are archived unless the setting turns them off
    monkeypatch.setenv("ARCHIVE_CRON_TURNS", "false")
    monkeypatch.setenv("ARCHIVE_SUBAGENT_TURNS", "false")
    home = tmp_path / f"profile_{context}"
    mm = MemoryManager()
    provider = ArchiveProvider()
    mm.add_provider(provider)
    mm.initialize_all("child", platform="cli", agent_context=context, hermes_home=str(home))
    transcript = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    mm.on_turn_start(1, "hi")
    mm.sync_all("hi", "hello", session_id="child", messages=transcript)
    mm.on_memory_write("add", "memory", "a fact", metadata={"write_origin": "tool"})
    mm.on_session_switch("child2", parent_session_id="child", reset=True, reason="new_session")
    mm.on_session_end(transcript)
    assert mm.flush_pending(5)
    flush(provider)
    assert events(home) == []  # no session, turn, memory or switch events

    receipt = mm.on_pre_compress(transcript)  # a checkpoint request is always archived
    assert receipt
    assert [e.type for e in events(home)] == ["checkpoint"]
    mm.shutdown_all()
    assert os.listdir(user_home) == []


@pytest.mark.parametrize("context", ["subagent", "cron"])
def test_a4_cron_and_subagent_turns_are_archived_by_default(
    context: str, tmp_path: Path, user_home: Path
) -> None:
    from agent.memory_manager import MemoryManager

    home = tmp_path / f"profile_{context}"
    mm = MemoryManager()
    provider = ArchiveProvider()
    mm.add_provider(provider)
    mm.initialize_all("job", platform=context, agent_context=context, hermes_home=str(home))
    transcript = [
        {"role": "user", "content": "send the weekly report"},
        {"role": "assistant", "content": "Sent it to the team."},
    ]
    mm.sync_all(*(m["content"] for m in transcript), session_id="job", messages=transcript)
    mm.on_memory_write("add", "memory", "report sent", metadata={"write_origin": "tool"})
    assert mm.flush_pending(5)
    flush(provider)
    mm.shutdown_all()
    found = events(home)
    assert [e.type for e in found] == ["session_started", "turn", "memory_write"]
    assert found[0].body["agent_context"] == context
    assert [m["content"] for m in messages_of(home, found[1])] == [
        "send the weekly report",
        "Sent it to the team.",
    ]


# -- A5 prefetch bounds -----------------------------------------------------------------


def test_a5_prefetch_runs_on_the_prefetch_thread_within_the_timeout_and_survives_a_stall(
    hermes_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent.memory_manager import MemoryManager

    mm = MemoryManager(external_prefetch_timeout=0.5)
    provider = ArchiveProvider()
    mm.add_provider(provider)
    mm.initialize_all("s1", platform="cli", agent_context="primary")
    try:
        mm.sync_all(
            "Our launch codename is BLUEHERON",
            "Noted: BLUEHERON.",
            session_id="s1",
            messages=[
                {"role": "user", "content": "Our launch codename is BLUEHERON"},
                {"role": "assistant", "content": "Noted: BLUEHERON."},
            ],
        )
        assert mm.flush_pending(5)
        flush(provider)
        recorder = Recorder().wrap(provider, "prefetch")

        # The host joins the prefetch thread for 0.5 s and returns "" if it is still
        # running, so getting the recalled text back means it answered within the bound.
        text = mm.prefetch_all("what was the launch codename?")
        assert text.startswith(FENCE_OPEN) and "BLUEHERON" in text
        (call,) = recorder.of("prefetch")
        assert call.thread == f"memory-prefetch-{NAME}"
        assert call.result == text
        flush(provider)
        (served,) = events(hermes_home, "recall_served")
        assert served.session == "s1"

        # An injected stalled store: the host gives up after 0.5 s and returns "".
        release = threading.Event()
        real_search = core_module.search

        def stalled_search(*args: Any, **kwargs: Any) -> Any:
            release.wait(30)
            return real_search(*args, **kwargs)

        monkeypatch.setattr(core_module, "search", stalled_search)
        assert mm.prefetch_all("launch codename") == ""
        assert mm.prefetch_all("launch codename") == ""  # still stuck: skipped at once
        stuck = [t for t in threading.enumerate() if t.name == f"memory-prefetch-{NAME}"]
        assert stuck
        release.set()
        for thread in stuck:
            thread.join(10)
        monkeypatch.setattr(core_module, "search", real_search)
        assert "BLUEHERON" in mm.prefetch_all("launch codename")  # the provider survived
    finally:
        mm.shutdown_all()


# -- A6 sync ordering, dedup and replay --------------------------------------------------


def _turn(i: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = [{"role": "user", "content": f"question {i} about topic-{i}"}]
    if i == 2:  # a turn with a tool round trip: all roles are archived as sent
        rows += [
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c2", "type": "function", "function": {"name": "todo", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c2", "content": "{\"ok\": true}"},
        ]  # fmt: skip
    rows.append({"role": "assistant", "content": f"answer {i}"})
    return rows


def test_a6_full_transcript_syncs_land_in_order_deduplicated_and_replay_to_the_same_state(
    manager: tuple[Any, ArchiveProvider], hermes_home: Path, tmp_path: Path
) -> None:
    mm, provider = manager
    recorder = Recorder().wrap(provider, "sync_turn")
    transcript: list[dict[str, Any]] = []
    per_turn: list[list[dict[str, Any]]] = []
    for i in range(1, 6):
        rows = _turn(i)
        per_turn.append(rows)
        transcript += rows
        mm.sync_all(rows[0]["content"], rows[-1]["content"], session_id="s1",
                    messages=copy.deepcopy(transcript))  # fmt: skip
    assert mm.flush_pending(5)
    flush(provider)

    calls = recorder.of("sync_turn")
    assert {c.thread for c in calls} == {"mem-sync_0"}
    assert [len(c.kwargs["messages"]) for c in calls] == [2, 6, 8, 10, 12]
    assert [c.args[0] for c in calls] == [f"question {i} about topic-{i}" for i in range(1, 6)]

    turns = events(hermes_home, "turn")
    assert [t.body["turn"] for t in turns] == [1, 2, 3, 4, 5]
    assert [t.seq for t in turns] == sorted(t.seq for t in turns)
    assert {t.session for t in turns} == {"s1"}
    # full-transcript delivery: each turn stores only its own new rows
    assert [messages_of(hermes_home, t) for t in turns] == per_turn

    # the host re-sends the same transcript (a retry): nothing new is archived
    before = counts(hermes_home)
    mm.sync_all("again", "again", session_id="s1", messages=copy.deepcopy(transcript))
    assert mm.flush_pending(5)
    flush(provider)
    assert counts(hermes_home) == before

    live, replayed = live_and_replayed(hermes_home, tmp_path)
    assert live == replayed
    assert verify(hermes_home).ok


def test_a6_after_a_real_compaction_resent_transcripts_add_nothing(
    hermes_home: Path, offline_agent: Any, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """In-place compaction rewrites the transcript (same session id). The next turn archives
    only its own rows, and the transcript the host sends again at session end (or on a sync
    retry) must not archive that turn a second time."""
    from agent.conversation_compression import compress_context

    install_archive(hermes_home)
    fake_llm.set_script(["one", "two", "three"])
    agent = offline_agent()
    archive_provider_of(agent)  # our provider is the active one
    agent.context_compressor.compress = lambda messages, **_: [
        {
            "role": "user",
            "content": "[CONTEXT COMPACTION] earlier turns",
            "_compressed_summary": True,
        },
        *messages[-2:],
    ]

    r1 = agent.run_conversation("first question")
    r2 = agent.run_conversation("second question", conversation_history=r1["messages"])
    assert agent._memory_manager.flush_pending(5)
    compressed, _prompt = compress_context(agent, r2["messages"], "sys", approx_tokens=50_000,
                                           force=True)  # fmt: skip
    r3 = agent.run_conversation("third question", conversation_history=compressed)
    assert agent._memory_manager.flush_pending(5)
    agent._memory_manager.sync_all("third question", "three", session_id=agent.session_id,
                                   messages=list(r3["messages"]))  # a retried sync  # fmt: skip
    agent.shutdown_memory_provider(r3["messages"])  # on_session_end re-sends the transcript

    turns = events(hermes_home, "turn")
    assert [[m["content"] for m in messages_of(hermes_home, t)] for t in turns] == [
        ["first question", "one"],
        ["second question", "two"],
        ["third question", "three"],
    ]
    assert events(hermes_home)[-1].type == "session_ended"
    live, replayed = live_and_replayed(hermes_home, tmp_path)
    assert live == replayed


def test_a6_delta_rule_after_a_rewrite_in_isolation() -> None:
    """The pure delta rule behind the test above (digests stand for messages)."""
    from archive_provider.domain.evidence import new_messages_start

    def roles(digests: list[str]) -> list[str]:
        return ["user" if d.startswith(("u", "S")) else "assistant" for d in digests]

    archived = ["u1", "a1", "u2", "a2"]
    rewritten = ["S", "X", "u2", "a2", "u3", "a3"]  # compaction: summary + kept tail + turn 3
    assert new_messages_start(archived, rewritten, roles(rewritten)) == 4  # only u3, a3 are new
    after = ["u1", "a1", "u2", "a2", "u3", "a3"]  # what the projection then holds
    assert new_messages_start(after, rewritten, roles(rewritten)) == 6  # the same transcript again
    later = rewritten + ["u4", "a4", "u5", "a5"]  # a lost sync of turn 4, then turn 5
    assert new_messages_start(after, later, roles(later)) == 6
    # a first post-compaction turn with nothing kept in place starts at its user message
    assert new_messages_start(archived, ["S", "u3", "a3"], roles(["S", "u3", "a3"])) == 1
    # a retried last turn with a different answer is new again
    retried = ["u1", "a1", "u2", "b2"]
    assert new_messages_start(archived, retried, roles(retried)) == 2


# -- A7 v1 pre-compress path ------------------------------------------------------------

RAW_TRANSCRIPT: list[dict[str, Any]] = [
    {"role": "system", "content": "You are Hermes."},
    {"role": "user", "content": "[summary of earlier turns]", "_compressed_summary": True},
    {"role": "user", "content": "we ship on friday"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "todo", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "{\"todo\": \"ship\"}"},
    {"role": "assistant", "content": "Added it.", "tool_calls": [
        {"id": "c2", "type": "function", "function": {"name": "todo", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c2", "content": "done"},
    {"role": "user", "content": "budget is 10k"},
    {"role": "assistant", "content": "Budget noted."},
]  # fmt: skip
DIRECT_EVIDENCE: list[dict[str, Any]] = [
    {"role": "user", "content": "we ship on friday"},
    {"role": "assistant", "content": "Added it."},
    {"role": "user", "content": "budget is 10k"},
    {"role": "assistant", "content": "Budget noted."},
]


def test_a7_v1_call_archives_filtered_evidence_durably_and_returns_the_receipt(
    manager: tuple[Any, ArchiveProvider], hermes_home: Path
) -> None:
    mm, _provider = manager
    raw = copy.deepcopy(RAW_TRANSCRIPT)

    receipt = mm.on_pre_compress(raw)  # the 0.19.0 call shape: raw list, no flags

    # Read at once from another connection: committed before the return.
    (checkpoint,) = events(hermes_home, "checkpoint")
    assert messages_of(hermes_home, checkpoint) == DIRECT_EVIDENCE
    assert checkpoint.body["received_messages"] == len(RAW_TRANSCRIPT)
    assert checkpoint.body["require_checkpoint"] is False
    assert checkpoint.envelope.identity[:16] in receipt
    assert f"seq {checkpoint.seq}" in receipt and "4 messages" in receipt
    assert raw == RAW_TRANSCRIPT  # the caller's list is untouched


# -- A8 best-effort failure on 0.19.0 --------------------------------------------------


def test_a8_store_failure_is_swallowed_recorded_and_leaves_no_partial_archive(
    hermes_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from agent.memory_manager import MemoryManager

    monkeypatch.setenv("ARCHIVE_BUSY_TIMEOUT_S", "0.2")
    mm = MemoryManager()
    provider = ArchiveProvider()
    mm.add_provider(provider)
    mm.initialize_all("s1", platform="cli", agent_context="primary")
    try:
        first = [{"role": "user", "content": "first checkpoint"}]
        assert mm.on_pre_compress(first)
        before = counts(hermes_home)
        grown = first + [{"role": "assistant", "content": "UNIQUE-LOST-TEXT-5150"}]

        with write_lock_held(hermes_home):
            assert mm.on_pre_compress(grown) == ""  # swallowed by the provider and the host
            assert counts(hermes_home) == before  # nothing, not even part of it, is visible

        # Once the database is free, the failure marker lands (written separately)...
        assert wait_for(lambda: len(events(hermes_home, "checkpoint_failed")) == 1)
        flush(provider)
        (failed,) = events(hermes_home, "checkpoint_failed")
        assert "locked" in failed.body["error"] and failed.body["require_checkpoint"] is False
        assert failed.body["evidence_count"] == 2
        # ...and still no half checkpoint: one checkpoint, the lost text stored nowhere.
        assert len(events(hermes_home, "checkpoint")) == 1
        assert not any(
            "UNIQUE-LOST-TEXT-5150" in json.dumps(v) for v in all_payload_values(hermes_home)
        )
        assert query(hermes_home, "SELECT count(*) FROM checkpoint_failures") == [(1,)]

        # The marker can be surfaced later: the status command reports it.
        from archive_provider.cli import main as archive_cli

        assert archive_cli(["--home", str(hermes_home), "--json", "status"]) == 0
        status = json.loads(capsys.readouterr().out)
        assert status["events_by_type"]["checkpoint_failed"] == 1
        assert verify(hermes_home).ok
    finally:
        mm.shutdown_all()


# -- A9 real compaction hand-off ----------------------------------------------------------


def test_a9_real_compress_context_checkpoints_before_the_compressor_and_hands_over_the_receipt(
    hermes_home: Path, offline_agent: Any
) -> None:
    from agent.conversation_compression import compress_context

    install_archive(hermes_home)
    agent = offline_agent()
    provider = archive_provider_of(agent)
    recorder = Recorder().wrap(provider, "on_pre_compress", "on_session_switch")
    seen: list[dict[str, Any]] = []

    def fake_compress(messages, current_tokens=None, focus_topic=None, force=False,
                      memory_context=""):  # fmt: skip
        seen.append({
            "pre_compress_calls": len(recorder.of("on_pre_compress")),
            "checkpoints_committed": len(events(hermes_home, "checkpoint")),
            "memory_context": memory_context,
        })  # fmt: skip
        return [messages[0], {"role": "assistant", "content": "SUMMARY"}, messages[-1]]

    agent.context_compressor.compress = fake_compress
    messages = copy.deepcopy(RAW_TRANSCRIPT[2:])

    compressed, _prompt = compress_context(
        agent, messages, "sys", approx_tokens=100_000, force=True
    )

    (pre,) = recorder.of("on_pre_compress")
    # 0.19.0: the raw list, no flags; 0.22 says the checkpoint is not required (not configured)
    assert pre.error is None
    assert pre.kwargs == ({} if hostkit.ON_0_19 else {"require_checkpoint": False})
    assert len(seen) == 1
    assert seen[0]["pre_compress_calls"] == 1  # called once, before compress()
    assert seen[0]["checkpoints_committed"] == 1  # and already durable by then
    assert seen[0]["memory_context"] == pre.result != ""
    assert compressed[1]["content"] == "SUMMARY"
    (checkpoint,) = events(hermes_home, "checkpoint")
    assert messages_of(hermes_home, checkpoint) == DIRECT_EVIDENCE

    (switch,) = recorder.of("on_session_switch")
    assert switch.error is None
    assert switch.kwargs["reason"] == "compression" and switch.kwargs["reset"] is False
    flush(provider)
    (switched,) = events(hermes_home, "session_switched")
    assert switched.body["reason"] == "compression" and switched.body["reset"] is False
    assert switched.session == agent.session_id


# -- A10 full turns ------------------------------------------------------------------------


def test_a10_two_real_turns_then_shutdown(
    hermes_home: Path,
    user_home: Path,
    offline_agent: Any,
    fake_llm: FakeLLM,
    no_network: hostkit.NetworkGuard,
) -> None:
    install_archive(hermes_home)
    fake_llm.set_script(["Miso is a lovely name.", "Miso likes salmon."])
    agent = offline_agent()
    provider = archive_provider_of(agent)
    recorder = Recorder().wrap(provider, "prefetch", "sync_turn", "on_session_end", "shutdown")

    r1 = agent.run_conversation("My cat is called Miso")
    assert agent._memory_manager.flush_pending(5)
    flush(provider)  # turn 1 committed, so turn 2 can recall it
    r2 = agent.run_conversation("What food does Miso like?", conversation_history=r1["messages"])
    assert (r1["final_response"], r2["final_response"]) == (
        "Miso is a lovely name.",
        "Miso likes salmon.",
    )
    assert agent._memory_manager.flush_pending(5)

    first, second = fake_llm.requests
    assert provider.system_prompt_block() in FakeLLM.system_prompt(first)
    assert NAME + "_search" in FakeLLM.tool_names(first)
    user_text = FakeLLM.user_texts(second)[-1]
    block = user_text[user_text.index("<memory-context>") :]
    assert FENCE_OPEN in block and "My cat is called Miso" in block
    assert recorder.of("prefetch")[-1].result and "Miso" in recorder.of("prefetch")[-1].result

    syncs = recorder.of("sync_turn")
    assert [len(c.kwargs["messages"]) for c in syncs] == [2, 4]
    assert {c.thread for c in syncs} == {"mem-sync_0"}
    flush(provider)
    turns = events(hermes_home, "turn")
    assert [[m["content"] for m in messages_of(hermes_home, t)] for t in turns] == [
        ["My cat is called Miso", "Miso is a lovely name."],
        ["What food does Miso like?", "Miso likes salmon."],
    ]
    assert {t.session for t in turns} == {agent.session_id}

    writer = provider.core.writer
    agent.shutdown_memory_provider(r2["messages"])
    assert recorder.hooks()[-2:] == ["on_session_end", "shutdown"]
    assert provider.core.writer is None and writer is not None and not writer._thread.is_alive()
    log = events(hermes_home)
    assert log[-1].type == "session_ended" and log[-1].body["message_count"] == 4
    assert len(events(hermes_home, "turn")) == 2  # session end added no duplicate turn
    assert verify(hermes_home).ok
    assert os.listdir(user_home) == []
    assert no_network.blocked == []


# -- A11 tool dispatch ---------------------------------------------------------------------


def test_a11_tool_dispatch_json_errors_and_unknown_tools(
    manager: tuple[Any, ArchiveProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    mm, provider = manager
    mm.sync_all("the deploy key rotates monthly", "ok", session_id="s1", messages=[
        {"role": "user", "content": "the deploy key rotates monthly"},
        {"role": "assistant", "content": "ok"},
    ])  # fmt: skip
    assert mm.flush_pending(5)
    flush(provider)

    result = json.loads(mm.handle_tool_call("archive_search", {"query": "deploy key rotation"}))
    assert result["query"] == "deploy key rotation"
    assert [r["text"] for r in result["results"]][:1] == ["the deploy key rotates monthly"]

    # Bad input and internal failures come back as JSON errors, never as exceptions.
    assert "error" in json.loads(mm.handle_tool_call("archive_search", {"query": ""}))
    monkeypatch.setattr(core_module, "search", lambda *a, **k: 1 / 0)
    assert (
        "ZeroDivisionError"
        in json.loads(mm.handle_tool_call("archive_search", {"query": "x"}))["error"]
    )

    # If the provider itself raised, the host wraps it.
    def explode(*_a: Any, **_k: Any) -> str:
        raise RuntimeError("tool exploded")

    monkeypatch.setattr(provider, "handle_tool_call", explode)
    assert json.loads(mm.handle_tool_call("archive_search", {"query": "x"})) == {
        "error": "Memory tool 'archive_search' failed: tool exploded"
    }
    assert json.loads(mm.handle_tool_call("archive_nope", {})) == {
        "error": "No memory provider handles tool 'archive_nope'"
    }


# -- A12 mirrored memory writes ------------------------------------------------------------


def test_a12_committed_memory_tool_writes_are_archived_and_staged_ones_are_not(
    manager: tuple[Any, ArchiveProvider], hermes_home: Path
) -> None:
    mm, provider = manager
    args = {"action": "add", "target": "memory", "content": "x"}
    mm.notify_memory_tool_write('{"success": true}', args,
                                build_metadata=lambda: {"write_origin": "tool"})  # fmt: skip
    mm.notify_memory_tool_write('{"success": true, "staged": true}', {**args, "content": "y"},
                                build_metadata=lambda: {"write_origin": "tool"})  # fmt: skip
    flush(provider)

    (write,) = events(hermes_home, "memory_write")
    assert write.session == "s1"
    assert (write.body["action"], write.body["target"]) == ("add", "memory")
    assert write.body["metadata"] == {"write_origin": "tool"}
    assert query(hermes_home, "SELECT target, content FROM memory_entries") == [("memory", "x")]


def test_a12_a_real_memory_tool_call_is_mirrored_into_the_archive(
    hermes_home: Path, offline_agent: Any, fake_llm: FakeLLM
) -> None:
    install_archive(hermes_home)
    hostkit.write_hermes_config(hermes_home, {"memory": {"memory_enabled": True}})
    fake_llm.set_script([
        ToolCall("memory", {"action": "add", "target": "memory", "content": "User drinks oolong"},
                 id="call_add"),
        "saved",
    ])  # fmt: skip
    agent = offline_agent()
    provider = archive_provider_of(agent)

    agent.run_conversation("remember that I drink oolong")
    flush(provider)

    (write,) = events(hermes_home, "memory_write")
    assert (write.body["action"], write.body["target"]) == ("add", "memory")
    meta = write.body["metadata"]
    assert meta["write_origin"] == "assistant_tool" and meta["tool_call_id"] == "call_add"
    assert meta["session_id"] == agent.session_id == write.session
    assert query(hermes_home, "SELECT content FROM memory_entries WHERE target = 'memory'") == [
        ("User drinks oolong",)
    ]
    assert "User drinks oolong" in (hermes_home / "memories" / "MEMORY.md").read_text()


# -- A13 session boundaries ---------------------------------------------------------------


def test_a13_session_boundary_ends_before_it_switches_and_later_events_carry_the_new_id(
    manager: tuple[Any, ArchiveProvider], hermes_home: Path
) -> None:
    mm, provider = manager
    recorder = Recorder().wrap(provider, "on_session_end", "on_session_switch")
    first = [{"role": "user", "content": "old one"}, {"role": "assistant", "content": "ok"}]
    full = first + [{"role": "user", "content": "old two"}, {"role": "assistant", "content": "ok2"}]
    mm.sync_all("old one", "ok", session_id="s1", messages=first)

    mm.commit_session_boundary_async(full, new_session_id="s2", parent_session_id="s1")
    assert mm.flush_pending(5)

    assert recorder.hooks() == ["on_session_end", "on_session_switch"]
    (switch,) = recorder.of("on_session_switch")
    assert switch.args[0] == "s2"
    assert switch.kwargs == {"parent_session_id": "s1", "reset": True, "reason": "new_session"}

    mm.on_memory_write("add", "user", "prefers short answers")
    mm.sync_all("new one", "fine", session_id="s2", messages=[
        {"role": "user", "content": "new one"}, {"role": "assistant", "content": "fine"}])  # fmt: skip
    assert mm.flush_pending(5)
    assert mm.on_pre_compress([{"role": "user", "content": "new one"}])
    flush(provider)

    log = events(hermes_home)
    types = [e.type for e in log]
    ended, switched = types.index("session_ended"), types.index("session_switched")
    assert ended < switched
    assert log[ended].session == "s1" and log[switched].session == "s2"
    assert log[switched].body["from"] == "s1" and log[switched].body["reset"] is True
    # on_session_end archived what the last sync had not (the s1 rows "old two"/"ok2")
    s1_turns = [messages_of(hermes_home, e) for e in log[:ended] if e.type == "turn"]
    assert [m["content"] for turn in s1_turns for m in turn] == ["old one", "ok", "old two", "ok2"]
    assert [e.session for e in log[switched:]] == ["s2"] * len(log[switched:])
    assert {"memory_write", "turn", "checkpoint"} <= {e.type for e in log[switched + 1 :]}


# -- A14 shutdown drain --------------------------------------------------------------------


def test_a14_shutdown_drains_closes_rejects_late_writes_and_the_log_replays(
    manager: tuple[Any, ArchiveProvider],
    hermes_home: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    mm, provider = manager
    transcript: list[dict[str, Any]] = []
    for i in range(1, 9):
        transcript += [
            {"role": "user", "content": f"q{i}"},
            {"role": "assistant", "content": f"a{i}"},
        ]
        mm.sync_all(f"q{i}", f"a{i}", session_id="s1", messages=list(transcript))
    writer = provider.core.writer
    assert writer is not None

    mm.shutdown_all()  # no flush first: the drain itself must land every queued turn

    assert mm.shutdown_drain_state["status"] == "drained"
    assert provider.core.writer is None and not writer._thread.is_alive()
    assert [e.body["turn"] for e in events(hermes_home, "turn")] == list(range(1, 9))
    before = counts(hermes_home)

    with caplog.at_level(logging.WARNING):
        mm.sync_all("late", "write", session_id="s1",
                    messages=transcript + [{"role": "user", "content": "late"}])  # fmt: skip
        provider.sync_turn("late", "direct", session_id="s1", messages=[])
    assert "rejecting late write task" in caplog.text
    assert counts(hermes_home) == before

    live, replayed = live_and_replayed(hermes_home, tmp_path)
    assert live == replayed
    assert verify(hermes_home).ok

    # Reopening continues the same chain.
    again = ArchiveProvider()
    again.initialize("s1-resumed", hermes_home=str(hermes_home), platform="cli")
    again.shutdown()
    assert counts(hermes_home)["head"] == before["head"] + 1
    assert verify(hermes_home).ok


def test_a14_a_drain_the_writer_cannot_finish_is_archived_by_the_next_open(
    hermes_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The host's drain finishes (our hooks only enqueue), ours cannot (the log is locked):
    what it left is spilled and a ``shutdown_drain`` record says so on the next open."""
    from agent.memory_manager import MemoryManager

    from archive_provider.cli import main as archive_cli

    monkeypatch.setenv("ARCHIVE_DRAIN_TIMEOUT_S", "0.3")
    monkeypatch.setenv("ARCHIVE_BUSY_TIMEOUT_S", "0.1")
    mm = MemoryManager()
    provider = ArchiveProvider()
    mm.add_provider(provider)
    mm.initialize_all("s1", platform="cli", agent_context="primary")
    flush(provider)
    transcript: list[dict[str, Any]] = []
    with write_lock_held(hermes_home):
        for i in range(1, 6):
            transcript += [{"role": "user", "content": f"q{i}"},
                           {"role": "assistant", "content": f"a{i}"}]  # fmt: skip
            mm.sync_all(f"q{i}", f"a{i}", session_id="s1", messages=list(transcript))
        mm.on_memory_write("add", "memory", "kept across the restart")
        mm.shutdown_all()
        assert mm.shutdown_drain_state["status"] == "drained"  # the host's queue: all handed over
    assert events(hermes_home, "turn", "memory_write", "shutdown_drain") == []

    again = MemoryManager()
    reopened = ArchiveProvider()
    again.add_provider(reopened)
    again.initialize_all("s2", platform="cli", agent_context="primary")
    flush(reopened)
    again.shutdown_all()
    log = events(hermes_home)
    (drain,) = [e for e in log if e.type == "shutdown_drain"]
    # the locked log could not take them: the writer spilled them then, none at shutdown
    assert drain.body == {
        "pending": 0, "spilled": 0, "unwritten": 0, "unwritten_hooks": {},
        "finished": False, "timeout_s": 0.3, "error": drain.body["error"],
    }  # fmt: skip
    taken = [e.type for e in log if e.seq < drain.seq and e.session == "s1"]
    # it follows what it explains (0.19.0 mirrors memory writes inline, turns on its worker)
    assert sorted(taken[-6:]) == ["memory_write"] + ["turn"] * 5
    assert [e.body["turn"] for e in events(hermes_home, "turn")] == [1, 2, 3, 4, 5]
    assert archive_cli(["--home", str(hermes_home), "--json", "status"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["last_unfinished_drain"]["seq"] == drain.seq
    assert archive_cli(["--home", str(hermes_home), "status"]) == 0
    assert f"Last unfinished shutdown drain: seq {drain.seq}" in capsys.readouterr().out
    assert verify(hermes_home).ok


def test_a14_a_clean_shutdown_leaves_no_drain_record(
    manager: tuple[Any, ArchiveProvider], hermes_home: Path
) -> None:
    mm, provider = manager
    for i in range(20):
        mm.sync_all(f"q{i}", f"a{i}", session_id="s1")
    mm.shutdown_all()
    again = ArchiveProvider()
    again.initialize("s2", hermes_home=str(hermes_home), platform="cli")
    flush(again)
    again.shutdown()
    assert len(events(hermes_home, "turn")) == 20
    assert events(hermes_home, "shutdown_drain") == []


# -- A15 import hygiene --------------------------------------------------------------------


def test_a15_repo_root_does_not_shadow_hermes_modules() -> None:
    script = (
        "import json, importlib.util\n"
        "import archive_provider\n"
        "import agent, tools, plugins, utils\n"
        "names = ['agent', 'tools', 'plugins', 'utils', 'gateway', 'hermes_cli', 'providers',\n"
        "         'cron', 'cli', 'toolsets', 'model_tools', 'run_agent', 'hermes_constants',\n"
        "         'hermes_state']\n"
        "specs = {n: importlib.util.find_spec(n) for n in names}\n"
        "origins = {n: s.origin if s else None for n, s in specs.items()}\n"
        "origins['agent.__file__'] = agent.__file__\n"
        "origins['archive_provider'] = archive_provider.__file__\n"
        "print(json.dumps(origins))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=str(REPO_ROOT), capture_output=True, text=True,
        timeout=120, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    origins = json.loads(proc.stdout)
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    assert Path(origins.pop("archive_provider")).resolve().is_relative_to(REPO_ROOT)
    assert Path(origins["agent.__file__"]).resolve().is_relative_to(site)
    for name, origin in origins.items():
        if origin is None:
            continue  # not every listed name exists in every hermes version
        assert Path(origin).resolve().is_relative_to(site), f"{name} resolves to {origin}"
    for name in ("agent", "tools", "plugins", "utils"):
        assert origins[name] is not None
