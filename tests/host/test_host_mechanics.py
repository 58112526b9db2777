"""What the real hermes-agent 0.19.0 host does with a user-dir memory provider, offline.

These pin the mechanics the provider's own host tests rely on (contract tier A: A1, A9,
A10, A12 and the built-in memory write path), using the recording stub from
``stub_memory_plugin.py`` so they do not depend on our provider.
"""

from __future__ import annotations

import copy
import json
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from archive_provider.demo.fake_llm import FakeLLM, ToolCall

from . import hostkit
from .stub_memory_plugin import RecordingStubProvider

only_0_19 = pytest.mark.skipif(
    not hostkit.ON_0_19, reason=f"pins hermes-agent 0.19.0 behaviour (this host: {hostkit.HOST})"
)
NAME = "stubarchive"


def _provider(agent: Any) -> RecordingStubProvider:
    provider = hostkit.external_provider(agent)
    assert provider is not None, "memory provider was not activated"
    assert type(provider).__name__ == "RecordingStubProvider"
    return provider


# -- discovery (A1) ------------------------------------------------------------------


def test_user_dir_plugin_is_discovered_and_loaded(
    hermes_home: Path, install_memory_plugin: Any
) -> None:
    from plugins.memory import (
        discover_memory_providers,
        find_provider_dir,
        list_memory_provider_names,
        load_memory_provider,
    )

    plugin_dir = install_memory_plugin(NAME, description="stub for discovery")

    assert NAME in list_memory_provider_names()
    assert find_provider_dir(NAME) == plugin_dir
    first, second = load_memory_provider(NAME), load_memory_provider(NAME)
    assert type(first).__name__ == "RecordingStubProvider"
    # main (0.22) suffixes the module with its source's digest
    assert re.fullmatch(
        rf"{hostkit.USER_MEMORY_NAMESPACE}\.{NAME}(__source_[0-9a-f]{{16}})?",
        type(first).__module__,
    )
    assert first is not second  # register() runs again on every load
    assert first.name == NAME and first.is_available()
    assert (NAME, "stub for discovery", True) in discover_memory_providers()


@only_0_19  # main keys the module by its source, so another home's plugin is loaded anew
def test_loader_reuses_a_cached_module_across_hermes_homes(
    tmp_path: Path, hermes_home: Path, install_memory_plugin: Any, monkeypatch: Any
) -> None:
    """0.19.0 caches ``_hermes_user_memory.<name>`` by name, not by path: a second home with a
    same-named plugin still gets the first home's code unless the module is purged."""
    from plugins.memory import load_memory_provider

    install_memory_plugin(NAME, settings={"system_block": "FROM-HOME-A"})
    assert load_memory_provider(NAME).system_block == "FROM-HOME-A"

    other = tmp_path / "other_home"
    monkeypatch.setenv("HERMES_HOME", str(other))
    target = other / "plugins" / NAME
    target.mkdir(parents=True)
    (target / "__init__.py").write_text(hostkit.STUB_PLUGIN_SOURCE.read_text(), encoding="utf-8")
    (target / "stub_config.json").write_text(json.dumps({"system_block": "FROM-HOME-B"}))

    stale = load_memory_provider(NAME)
    assert (
        Path(sys.modules[type(stale).__module__].__file__).parent == hermes_home / "plugins" / NAME
    )
    hostkit.purge_user_plugin_modules(NAME)
    assert load_memory_provider(NAME).system_block == "FROM-HOME-B"


# -- full turns (A10) -----------------------------------------------------------------


@only_0_19  # 0.22: author keywords, session ids on prefetch, another prefetch schedule
def test_two_turns_reach_the_model_and_the_provider_then_shutdown(
    hermes_home: Path,
    user_home: Path,
    install_memory_plugin: Any,
    offline_agent: Any,
    fake_llm: FakeLLM,
    no_network: hostkit.NetworkGuard,
) -> None:
    install_memory_plugin(NAME)
    fake_llm.set_script(["first answer", "second answer"])
    agent = offline_agent()
    provider = _provider(agent)

    (init,) = provider.of("initialize")
    assert init.thread == "MainThread"
    assert init.args["session_id"] == agent.session_id
    assert init.args["kwargs"]["hermes_home"] == str(hermes_home)
    assert init.args["kwargs"]["platform"] == "cli"
    assert init.args["kwargs"]["agent_context"] == "primary"
    assert {"agent_identity", "agent_workspace", "status_callback", "warning_callback"} <= set(
        init.args["kwargs"]
    )

    r1 = agent.run_conversation("hello there")
    r2 = agent.run_conversation("and again", conversation_history=r1["messages"])
    assert (r1["final_response"], r2["final_response"]) == ("first answer", "second answer")
    assert agent._memory_manager.flush_pending(5)

    # What reached the model.
    assert len(fake_llm.requests) == 2
    first = fake_llm.requests[0]
    assert provider.system_block in FakeLLM.system_prompt(first)
    user_text = FakeLLM.user_texts(first)[-1]
    assert user_text.startswith("hello there")
    assert "<memory-context>\n" in user_text and provider.recall_text in user_text
    assert {"memory", provider.tool_name} <= set(FakeLLM.tool_names(first))
    assert first["stream"] is True  # the host streams by default

    # What reached the provider, in order, and on which thread.
    hooks = [h for h in provider.hooks() if h not in {"system_prompt_block", "queue_prefetch"}]
    assert hooks == [
        "initialize",
        "on_turn_start",
        "prefetch",
        "sync_turn",
        "on_turn_start",
        "prefetch",
        "sync_turn",
    ]
    turn_starts = provider.of("on_turn_start")
    # 0.22 names the turn's author (none on the CLI); 0.19.0 sends no keywords
    author = (
        {} if hostkit.ON_0_19 else {"author_id": None, "author_name": None, "author_is_bot": False}
    )
    assert [(c.args["turn"], c.args["message"], c.args["kwargs"]) for c in turn_starts] == [
        (1, "hello there", author),
        (2, "and again", author),
    ]
    prefetches = provider.of("prefetch")
    assert {c.thread for c in prefetches} == {f"memory-prefetch-{NAME}"}
    assert [c.args["session_id"] for c in prefetches] == ["", ""]  # 0.19.0 passes no session id
    syncs = provider.of("sync_turn")
    assert {c.thread for c in syncs} == {"mem-sync_0"}
    assert [(c.args["user"], c.args["assistant"]) for c in syncs] == [
        ("hello there", "first answer"),
        ("and again", "second answer"),
    ]
    assert [len(c.args["messages"]) for c in syncs] == [2, 4]
    assert [m["role"] for m in syncs[1].args["messages"]] == ["user", "assistant"] * 2
    assert all(c.args["session_id"] == agent.session_id for c in syncs)
    assert {c.thread for c in provider.of("queue_prefetch")} == {"mem-sync_0"}

    # Session end: on_session_end, then shutdown, on the caller's thread.
    agent.shutdown_memory_provider(r2["messages"])
    assert provider.hooks()[-2:] == ["on_session_end", "shutdown"]
    assert len(provider.of("on_session_end")[0].args["messages"]) == 4
    assert agent._memory_manager.shutdown_drain_state["status"] == "drained"

    assert os.listdir(user_home) == []  # nothing leaked to ~
    assert no_network.blocked == []


def test_provider_tool_call_is_dispatched_through_the_agent_loop(
    install_memory_plugin: Any, offline_agent: Any, fake_llm: FakeLLM
) -> None:
    install_memory_plugin(NAME)
    agent = offline_agent()
    provider = _provider(agent)
    fake_llm.set_script(
        [ToolCall(provider.tool_name, {"query": "friday"}, id="call_recall_1"), "found nothing"]
    )

    result = agent.run_conversation("what did we decide?")

    assert result["final_response"] == "found nothing"
    (call,) = provider.of("handle_tool_call")
    assert call.args["tool_name"] == provider.tool_name
    assert call.args["args"] == {"query": "friday"}
    tool_rows = [m for m in result["messages"] if m["role"] == "tool"]
    assert json.loads(tool_rows[0]["content"])["tool"] == provider.tool_name
    # The tool result went back to the model on the follow-up request.
    assert fake_llm.requests[1]["messages"][-1]["tool_call_id"] == "call_recall_1"


# -- compaction hand-off (A9) ------------------------------------------------------------


def test_real_compress_context_calls_on_pre_compress_before_the_compressor(
    install_memory_plugin: Any, offline_agent: Any
) -> None:
    from agent.conversation_compression import compress_context

    install_memory_plugin(NAME, settings={"pre_compress_text": "RECEIPT seq 1-4 digest abc"})
    agent = offline_agent()
    provider = _provider(agent)
    seen: list[dict[str, Any]] = []

    def fake_compress(messages, current_tokens=None, focus_topic=None, force=False,
                      memory_context=""):  # fmt: skip
        seen.append(
            {
                "hooks_so_far": provider.hooks(),
                "memory_context": memory_context,
                "current_tokens": current_tokens,
                "force": force,
            }
        )
        return [messages[0], {"role": "assistant", "content": "SUMMARY"}, messages[-1]]

    agent.context_compressor.compress = fake_compress
    messages = [
        {"role": "user", "content": "ship friday"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "todo", "arguments": "{}"}}
        ]},
        {"role": "tool", "content": "{}", "tool_call_id": "c1"},
        {"role": "assistant", "content": "noted"},
        {"role": "user", "content": "budget 10k"},
        {"role": "assistant", "content": "ok"},
    ]  # fmt: skip
    raw = copy.deepcopy(messages)

    compressed, _prompt = compress_context(
        agent, messages, "sys", approx_tokens=100_000, force=True
    )

    assert len(seen) == 1
    assert seen[0]["hooks_so_far"].count("on_pre_compress") == 1  # called before compress()
    assert seen[0]["memory_context"] == "RECEIPT seq 1-4 digest abc"
    assert (seen[0]["current_tokens"], seen[0]["force"]) == (100_000, True)
    (pre,) = provider.of("on_pre_compress")
    assert pre.thread == threading.current_thread().name
    assert pre.args["messages"] == raw  # 0.19.0: the raw transcript, tool rows included
    assert pre.args["require_checkpoint"] is False and pre.args["kwargs"] == {}
    assert compressed[1]["content"] == "SUMMARY"
    # Without a session DB (and with in-place compaction) the id does not rotate.
    (switch,) = provider.of("on_session_switch")
    assert switch.args["new_session_id"] == agent.session_id
    assert switch.args["kwargs"] == {
        "parent_session_id": agent.session_id,
        "reset": False,
        "reason": "compression",
    }
    assert provider.hooks().index("on_pre_compress") < provider.hooks().index("on_session_switch")


def test_compression_with_a_session_db_also_ends_the_provider_session(
    hermes_home: Path, install_memory_plugin: Any, offline_agent: Any
) -> None:
    """With ``state.db`` attached, 0.19.0 calls ``commit_memory_session`` during compaction:
    ``on_session_end`` arrives between ``on_pre_compress`` and ``on_session_switch``."""
    from agent.conversation_compression import compress_context
    from hermes_state import SessionDB

    install_memory_plugin(NAME)
    agent = offline_agent(session_db=SessionDB(hermes_home / "state.db"))
    provider = _provider(agent)
    agent.context_compressor.compress = lambda messages, **_: [
        messages[0],
        {"role": "assistant", "content": "SUMMARY"},
        messages[-1],
    ]
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"},
    ]

    compress_context(agent, messages, "sys", approx_tokens=10_000, force=True)

    tail = [h for h in provider.hooks() if h != "system_prompt_block"][-3:]
    assert tail == ["on_pre_compress", "on_session_end", "on_session_switch"]
    assert provider.of("on_session_switch")[0].args["kwargs"]["reason"] == "compression"


# -- built-in memory writes --------------------------------------------------------------


@only_0_19  # 0.22 mirrors through the same manager method, with its own task ids
def test_builtin_memory_tool_writes_reach_on_memory_write(
    hermes_home: Path, install_memory_plugin: Any, offline_agent: Any, fake_llm: FakeLLM
) -> None:
    """Path on 0.19.0: model calls ``memory`` -> ``agent/tool_executor.py`` runs
    ``tools.memory_tool.memory_tool`` -> ``MemoryManager.notify_memory_tool_write(result, args,
    build_metadata=agent._build_memory_write_metadata(task_id, tool_call_id))`` ->
    ``on_memory_write(action, target, content, metadata=...)`` for each committed op."""
    install_memory_plugin(NAME)
    hostkit.write_hermes_config(hermes_home, {"memory": {"memory_enabled": True}})
    fake_llm.set_script(
        [
            ToolCall("memory", {"action": "add", "target": "memory", "content": "User likes tea"},
                     id="call_add"),
            "saved",
            [
                ToolCall("memory", {"action": "replace", "target": "memory",
                                    "old_text": "likes tea", "content": "User likes green tea"},
                         id="call_replace"),
                ToolCall("memory", {"action": "remove", "target": "user", "old_text": "absent"},
                         id="call_bad_remove"),
            ],
            ToolCall("memory", {"target": "memory", "operations": [
                {"action": "add", "content": "Budget is 10k"},
                {"action": "remove", "old_text": "green tea"},
            ]}, id="call_batch"),
            "edited",
        ]
    )  # fmt: skip
    agent = offline_agent()
    assert agent._memory_store is not None  # memory.memory_enabled turns the built-in store on
    provider = _provider(agent)

    r1 = agent.run_conversation("remember that I like tea")
    agent.run_conversation("now edit it", conversation_history=r1["messages"])

    writes = [
        (c.args["action"], c.args["target"], c.args["content"], c.args["metadata"], c.thread)
        for c in provider.of("on_memory_write")
    ]
    base = {
        "write_origin": "assistant_tool",
        "execution_context": "foreground",
        "session_id": agent.session_id,
        "platform": "cli",
        "tool_name": "memory",
    }
    task_ids = {w[3].pop("task_id") for w in writes}
    assert len(task_ids) == 2  # one task id per run_conversation turn
    assert writes == [
        ("add", "memory", "User likes tea", {**base, "tool_call_id": "call_add"}, "MainThread"),
        (
            "replace",
            "memory",
            "User likes green tea",
            {**base, "tool_call_id": "call_replace", "old_text": "likes tea"},
            "MainThread",
        ),
        # the failed remove (no match) is not mirrored; the batch is expanded per op
        ("add", "memory", "Budget is 10k", {**base, "tool_call_id": "call_batch"}, "MainThread"),
        (
            "remove",
            "memory",
            "",
            {**base, "tool_call_id": "call_batch", "old_text": "green tea"},
            "MainThread",
        ),
    ]
    assert "Budget is 10k" in (hermes_home / "memories" / "MEMORY.md").read_text()


@pytest.mark.parametrize(
    ("result", "mirrored"),
    [
        ('{"success": true}', True),
        ('{"success": true, "staged": true, "pending_id": "p1"}', False),
        ('{"success": false, "error": "nope"}', False),
        ("not json", False),
    ],
    ids=["committed", "staged", "failed", "garbage"],
)
def test_notify_memory_tool_write_mirrors_only_committed_writes(
    result: str, mirrored: bool
) -> None:
    from agent.memory_manager import MemoryManager

    manager = MemoryManager()
    provider = RecordingStubProvider(NAME)
    manager.add_provider(provider)
    manager.notify_memory_tool_write(
        result,
        {"action": "add", "target": "memory", "content": "x"},
        build_metadata=lambda: {"write_origin": "tool"},
    )
    calls = [
        (c.args["action"], c.args["content"], c.args["metadata"])
        for c in provider.of("on_memory_write")
    ]
    assert calls == ([("add", "x", {"write_origin": "tool"})] if mirrored else [])


# -- 0.19.0 specifics that differ from main ------------------------------------------------


@only_0_19
def test_add_provider_keeps_a_provider_whose_schemas_raise() -> None:
    """Main probes ``get_tool_schemas()`` before touching state (#9948); 0.19.0 appends the
    provider first, so a raising schema call propagates *and* leaves it registered."""
    from agent.memory_manager import MemoryManager

    class Broken(RecordingStubProvider):
        def get_tool_schemas(self) -> list[dict[str, Any]]:
            raise RuntimeError("schemas exploded")

    manager = MemoryManager()
    with pytest.raises(RuntimeError, match="schemas exploded"):
        manager.add_provider(Broken("broken"))
    assert [p.name for p in manager.providers] == ["broken"]


@only_0_19
def test_register_that_raises_after_registering_falls_back_to_a_default_instance(
    install_memory_plugin: Any,
) -> None:
    """Main keeps the provider registered before ``register()`` raised; 0.19.0 drops it and
    instantiates the first ``MemoryProvider`` subclass in the module with no arguments."""
    from plugins.memory import load_memory_provider

    source = hostkit.STUB_PLUGIN_SOURCE.read_text(encoding="utf-8") + (
        "\n\ndef register(ctx):\n"
        '    ctx.register_memory_provider(RecordingStubProvider("late"))\n'
        '    raise RuntimeError("late failure")\n'
    )
    install_memory_plugin("late", source={"__init__.py": source})

    provider = load_memory_provider("late")
    assert type(provider).__name__ == "RecordingStubProvider"
    assert provider.name == "stubarchive"  # the class default, not the registered "late"
