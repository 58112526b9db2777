"""Tier B acceptance (hermes-contract.md section 6): checkpoint API v2 semantics (main).

hermes-agent 0.19.0 predates checkpoint API v2, so these drive the real provider through
the contract-mirror harness in ``v2_host`` (which re-exports the host's own objects when a
native v2 host is installed): main's manager fan-out with signature inspection, the
evidence filter, the ``compression.checkpoint_required`` gate and its refusals. Everything
the provider archives is read back through fresh connections (B3: from another process).
"""

from __future__ import annotations

import contextvars
import copy
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from archive_provider import ArchiveProvider
from archive_provider.domain.evidence import direct_evidence
from archive_provider.format.canonical import canonical_bytes
from archive_provider.host.hermes import HOST_CHECKPOINT_API_VERSION, spawn_thread
from archive_provider.host.provider import CheckpointError

from . import hostkit
from . import v2_host as h
from .archive_kit import (
    HOST_TESTS,
    Recorder,
    all_payload_values,
    archive_provider_of,
    child_env,
    counts,
    db_path,
    events,
    flush,
    install_archive,
    live_and_replayed,
    messages_of,
    open_view,
    run_child,
    verify,
    wait_for,
    write_lock_held,
)
from .stub_memory_plugin import RecordingStubProvider

RAW: list[dict[str, Any]] = [
    {"role": "system", "content": "You are Hermes."},
    {"role": "user", "content": "[summary of earlier turns]", "_compressed_summary": True},
    {"role": "user", "content": "we ship on friday"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "todo", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "{\"todo\": \"ship\"}"},
    {"role": "assistant", "content": "Added it.", "tool_calls": [
        {"id": "c2", "type": "function", "function": {"name": "todo", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c2", "content": "done"},
    {"role": "user", "content": "budget is 10k"},
    {"role": "assistant", "content": "Budget noted."},
]  # fmt: skip


def evidence_of(raw: list[Any]) -> list[dict[str, Any]]:
    return h.direct_messages_for_pre_compress_memory(raw)


EVIDENCE = evidence_of(RAW)


@pytest.fixture
def v2(hermes_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, ArchiveProvider]]:
    """A v2 manager (mirror or native) with our provider, initialized like the host does.

    The busy timeout is short so an injected lock fails a checkpoint in 0.2 s."""
    monkeypatch.setenv("ARCHIVE_BUSY_TIMEOUT_S", "0.2")
    mm = h.V2MemoryManager()
    provider = ArchiveProvider()
    mm.add_provider(provider)
    mm.initialize_all("s1", platform="cli", agent_context="primary", parent_session_id="s0")
    flush(provider)  # the store exists (session_started), so it can be locked
    yield mm, provider
    if not mm._shutting_down:
        mm.shutdown_all()


def checkpoint_events(home: Path) -> list[Any]:
    return events(home, "checkpoint")


# -- B1 capability ---------------------------------------------------------------------


def test_b1_provider_advertises_v2_and_the_manager_sees_it_a_v1_control_does_not() -> None:
    provider = ArchiveProvider()
    assert type(provider).pre_compress_checkpoint_api_version == 2
    assert h.checkpoint_api_version_of(provider) == 2 == h.PRE_COMPRESS_CHECKPOINT_API_VERSION

    ours = h.V2MemoryManager()
    ours.add_provider(provider)
    assert ours.supports_pre_compress_checkpoint(2) is True
    assert ours.supports_pre_compress_checkpoint(3) is False

    control = h.V2MemoryManager()
    control.add_provider(RecordingStubProvider("legacy"))
    assert control.supports_pre_compress_checkpoint(2) is False


# -- B2 flag delivery ------------------------------------------------------------------


def test_b2_provider_gets_the_evidence_and_the_flag_and_tolerates_unknown_kwargs(
    v2: tuple[Any, ArchiveProvider], hermes_home: Path
) -> None:
    mm, provider = v2
    assert h.accepts_require_checkpoint(ArchiveProvider().on_pre_compress)
    recorder = Recorder().wrap(provider, "on_pre_compress")

    receipt = mm.on_pre_compress(copy.deepcopy(RAW), evidence_messages=evidence_of(RAW),
                                 require_checkpoint=True)  # fmt: skip
    (required,) = recorder.of("on_pre_compress")
    assert required.args == (EVIDENCE,) and required.args[0] != RAW
    assert required.kwargs == {"require_checkpoint": True}
    assert required.result == receipt != ""
    (first,) = checkpoint_events(hermes_home)
    assert messages_of(hermes_home, first) == EVIDENCE
    assert first.body["require_checkpoint"] is True

    grown = RAW + [{"role": "user", "content": "and hire two people"}]
    mm.on_pre_compress(copy.deepcopy(grown), evidence_messages=evidence_of(grown))
    best_effort = recorder.of("on_pre_compress")[1]
    assert best_effort.kwargs == {"require_checkpoint": False}
    assert checkpoint_events(hermes_home)[-1].body["require_checkpoint"] is False

    # A newer host may pass more (tool_evidence, ordinals...): still a checkpoint.
    newer = grown + [{"role": "assistant", "content": "noted, two hires"}]
    receipt = provider.on_pre_compress(
        evidence_of(newer), require_checkpoint=True, tool_evidence=[{"role": "tool"}],
        checkpoint_api_version=3, evidence_ordinals=[0, 1], unknown=object(),
    )  # fmt: skip
    assert "archived" in receipt
    assert messages_of(hermes_home, checkpoint_events(hermes_home)[-1]) == evidence_of(newer)


# -- B3 durable before return --------------------------------------------------------------


def test_b3_checkpoint_is_committed_with_full_sync_and_visible_to_another_process_on_return(
    v2: tuple[Any, ArchiveProvider], hermes_home: Path
) -> None:
    mm, provider = v2
    store = provider.core.writer._store  # type: ignore[union-attr]
    assert store is not None
    statements: list[str] = []
    store.conn.set_trace_callback(statements.append)
    try:
        receipt = mm.on_pre_compress(copy.deepcopy(RAW), evidence_messages=evidence_of(RAW),
                                     require_checkpoint=True)  # fmt: skip
        at_return = list(statements)
    finally:
        store.conn.set_trace_callback(None)

    # The transaction that holds the checkpoint committed under synchronous=FULL before
    # on_pre_compress returned (SQLite only changes the level between transactions).
    full = at_return.index("PRAGMA synchronous = FULL")
    assert at_return[full + 1] == "BEGIN IMMEDIATE"
    assert "COMMIT" in at_return[full + 2 :]

    seen = run_child("read", hermes_home)  # a fresh connection in another process
    (checkpoint,) = seen["checkpoints"]
    assert checkpoint["all_parts_present"] is True
    assert checkpoint["evidence"] == EVIDENCE
    assert checkpoint["identity"][:16] in receipt
    assert f"seq {checkpoint['seq']}" in receipt
    assert seen["verify_ok"] is True


def test_b3_kill_9_right_after_the_return_loses_nothing(tmp_path: Path, hermes_home: Path) -> None:
    home = tmp_path / "killed_profile"
    transcript = tmp_path / "transcript.json"
    transcript.write_text(json.dumps(RAW), encoding="utf-8")
    child = subprocess.Popen(
        [
            sys.executable,
            str(HOST_TESTS / "archive_child.py"),
            "checkpoint_then_hang",
            str(transcript),
        ],
        env=child_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = child.stdout.readline()  # type: ignore[union-attr]
        os.kill(child.pid, signal.SIGKILL)  # immediately after on_pre_compress returned
    finally:
        child.kill()
        _out, err = child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert line, f"the child printed no receipt:\n{err}"
    receipt = json.loads(line)["receipt"]

    (checkpoint,) = events(home, "checkpoint")
    assert messages_of(home, checkpoint) == EVIDENCE
    assert checkpoint.envelope.identity[:16] in receipt
    assert f"seq {checkpoint.seq}" in receipt
    assert verify(home).ok


# -- B4 fail-closed propagation and B5 no partial success ----------------------------------


def test_b4_required_checkpoint_failure_propagates_our_exception_unchanged(
    v2: tuple[Any, ArchiveProvider], hermes_home: Path
) -> None:
    mm, provider = v2
    recorder = Recorder().wrap(provider, "on_pre_compress")
    with write_lock_held(hermes_home), pytest.raises(CheckpointError) as raised:
        mm.on_pre_compress(copy.deepcopy(RAW), evidence_messages=evidence_of(RAW),
                           require_checkpoint=True)  # fmt: skip
    (call,) = recorder.of("on_pre_compress")
    assert raised.value is call.error  # re-raised unchanged by the manager
    assert type(raised.value) is CheckpointError
    assert "locked" in str(raised.value)


def test_b4_the_gate_turns_our_failure_into_blocked_missing_prerequisite(
    v2: tuple[Any, ArchiveProvider], hermes_home: Path
) -> None:
    mm, _provider = v2
    with write_lock_held(hermes_home), pytest.raises(h.CompressionCheckpointUnavailable) as raised:
        h.pre_compress_memory_context(SimpleNamespace(_memory_manager=mm), copy.deepcopy(RAW), True)
    assert str(raised.value).startswith("BLOCKED_MISSING_PREREQUISITE")
    assert isinstance(raised.value.__cause__, CheckpointError)
    assert checkpoint_events(hermes_home) == []


def test_b4_armed_compress_context_never_calls_the_compressor_and_is_retryable(
    hermes_home: Path, offline_agent: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARCHIVE_BUSY_TIMEOUT_S", "0.2")
    install_archive(hermes_home)
    agent = offline_agent()
    provider = archive_provider_of(agent)
    flush(provider)
    compressed_calls: list[dict[str, Any]] = []

    def compressor(messages, current_tokens=None, focus_topic=None, force=False,
                   memory_context=""):  # fmt: skip
        compressed_calls.append({"memory_context": memory_context})
        return [messages[0], {"role": "assistant", "content": "SUMMARY"}, messages[-1]]

    agent.context_compressor.compress = compressor
    messages = copy.deepcopy(RAW[2:])
    before = copy.deepcopy(messages)

    with (
        write_lock_held(hermes_home),
        pytest.raises(h.CompressionCheckpointUnavailable, match="^BLOCKED_MISSING_PREREQUISITE"),
    ):
        h.compress_context_v2(agent, messages, "sys", approx_tokens=100_000, force=True,
                              checkpoint_required=True)  # fmt: skip
    assert compressed_calls == []
    assert messages == before
    assert checkpoint_events(hermes_home) == []

    # The same attempt, once the store is back, goes through with our receipt.
    compressed, _prompt = h.compress_context_v2(agent, messages, "sys", approx_tokens=100_000,
                                                force=True)  # fmt: skip
    (checkpoint,) = checkpoint_events(hermes_home)
    assert messages_of(hermes_home, checkpoint) == evidence_of(RAW[2:])
    assert checkpoint.body["require_checkpoint"] is True
    assert len(compressed_calls) == 1
    assert checkpoint.envelope.identity[:16] in compressed_calls[0]["memory_context"]
    assert compressed[1]["content"] == "SUMMARY"


def test_b5_failed_required_checkpoint_leaves_nothing_half_written_and_an_audit_event(
    v2: tuple[Any, ArchiveProvider], hermes_home: Path
) -> None:
    mm, provider = v2
    raw = RAW + [{"role": "user", "content": "UNIQUE-B5-TEXT-7731"}]
    before = counts(hermes_home)
    with write_lock_held(hermes_home):
        with pytest.raises(CheckpointError):
            mm.on_pre_compress(copy.deepcopy(raw), evidence_messages=evidence_of(raw),
                               require_checkpoint=True)  # fmt: skip
        assert counts(hermes_home) == before

    assert wait_for(lambda: len(events(hermes_home, "checkpoint_failed")) == 1)
    flush(provider)
    after = counts(hermes_home)
    assert after["events"] == before["events"] + 1  # the audit event, and nothing else
    (failed,) = events(hermes_home, "checkpoint_failed")
    assert failed.body["require_checkpoint"] is True
    assert failed.body["evidence_count"] == len(evidence_of(raw))
    assert checkpoint_events(hermes_home) == []
    assert not any("UNIQUE-B5-TEXT-7731" in json.dumps(v) for v in all_payload_values(hermes_home))

    # A retry commits the complete checkpoint in one go.
    mm.on_pre_compress(
        copy.deepcopy(raw), evidence_messages=evidence_of(raw), require_checkpoint=True
    )
    (checkpoint,) = checkpoint_events(hermes_home)
    assert messages_of(hermes_home, checkpoint) == evidence_of(raw)
    assert checkpoint.seq > failed.seq
    assert verify(hermes_home).ok


# -- B6 idempotent retries -------------------------------------------------------------


def test_b6_same_evidence_twice_is_one_archive_and_a_grown_transcript_adds_only_new_rows(
    v2: tuple[Any, ArchiveProvider], hermes_home: Path
) -> None:
    mm, _provider = v2
    first = mm.on_pre_compress(copy.deepcopy(RAW), evidence_messages=evidence_of(RAW),
                               require_checkpoint=True)  # fmt: skip
    once = counts(hermes_home)
    again = mm.on_pre_compress(copy.deepcopy(RAW), evidence_messages=evidence_of(RAW),
                               require_checkpoint=True)  # fmt: skip
    assert counts(hermes_home) == once
    assert "already archived" in again and "(all already stored)" in again
    assert first.split(":")[0] == again.split(":")[0]  # same checkpoint identity

    new_rows = [{"role": "user", "content": "also hire two people"},
                {"role": "assistant", "content": "Two hires noted."}]  # fmt: skip
    grown = RAW + new_rows
    receipt = mm.on_pre_compress(copy.deepcopy(grown), evidence_messages=evidence_of(grown),
                                 require_checkpoint=True)  # fmt: skip
    after = counts(hermes_home)
    assert "(2 newly stored)" in receipt
    assert after["events"] == once["events"] + 1  # one small checkpoint record
    assert after["payloads"] == once["payloads"] + len(new_rows) + 1  # new rows + its body
    old, new = checkpoint_events(hermes_home)
    assert new.body["evidence"][: len(old.body["evidence"])] == old.body["evidence"]


def test_b6_concurrent_calls_with_the_same_evidence_make_one_checkpoint(
    v2: tuple[Any, ArchiveProvider], hermes_home: Path
) -> None:
    mm, _provider = v2
    barrier = threading.Barrier(2)
    receipts: list[str] = []
    errors: list[BaseException] = []

    def attempt() -> None:
        try:
            barrier.wait(5)
            receipts.append(mm.on_pre_compress(copy.deepcopy(RAW), evidence_messages=evidence_of(RAW),
                                               require_checkpoint=True))  # fmt: skip
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=attempt) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert len(receipts) == 2
    (checkpoint,) = checkpoint_events(hermes_home)
    assert sorted("already archived" in r for r in receipts) == [False, True]
    assert all(checkpoint.envelope.identity[:16] in r for r in receipts)


# -- B7 evidence discipline ---------------------------------------------------------------

ANYTHING: list[Any] = [
    "a bare string row",
    None,
    {"role": "developer", "content": "dev note"},
    {"role": "function", "name": "f", "content": "fn out"},
    *RAW,
    {"role": "assistant", "content": "summary prose", "_compressed_summary": True},
    {"role": "assistant", "content": [{"type": "text", "text": "list prose"}], "tool_calls": [
        {"id": "c3", "type": "function", "function": {"name": "todo", "arguments": "{}"}}]},
    {"role": "user", "content": [{"type": "text", "text": "look"},
                                 {"type": "image_url", "image_url": {"url": "data:,x"}}]},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c4", "type": "function", "function": {"name": "todo", "arguments": "{}"}}]},
]  # fmt: skip


def test_b7_stored_evidence_is_direct_only_and_identical_from_raw_and_from_host_evidence(
    v2: tuple[Any, ArchiveProvider], hermes_home: Path
) -> None:
    mm, _provider = v2
    host_evidence = evidence_of(ANYTHING)
    assert direct_evidence(host_evidence) == host_evidence  # our filter is idempotent on it
    assert direct_evidence(ANYTHING) == host_evidence  # and equals the host's on raw input

    # v2 host: filtered evidence under the gate; 0.19.0-style: the raw list, best effort.
    v2_receipt = mm.on_pre_compress(copy.deepcopy(ANYTHING), evidence_messages=host_evidence,
                                    require_checkpoint=True)  # fmt: skip
    raw_receipt = mm.on_pre_compress(copy.deepcopy(ANYTHING))
    assert "already archived" in raw_receipt  # the very same archive from the raw list
    assert v2_receipt.split(":")[0] == raw_receipt.split(":")[0]

    (checkpoint,) = checkpoint_events(hermes_home)
    stored = messages_of(hermes_home, checkpoint)
    assert stored == host_evidence
    assert [m["content"] for m in stored][:1] == ["we ship on friday"]
    for row in stored:
        assert row["role"] in {"user", "assistant"}
        assert "tool_calls" not in row and "_compressed_summary" not in row


# -- B8 redacted copies -------------------------------------------------------------------

SECRET = "sk-proj-" + "Q7w8E9r0T1y2U3i4O5p6A7s8D9f0G1h2J3k4"


def test_b8_redacted_copies_are_stored_as_received_and_nobody_is_mutated(
    v2: tuple[Any, ArchiveProvider], hermes_home: Path
) -> None:
    mm, provider = v2
    raw = [
        {"role": "user", "content": f"my key is {SECRET}, keep it safe"},
        {"role": "assistant", "content": "I will not repeat it."},
    ]
    callers = copy.deepcopy(raw)
    recorder = Recorder().wrap(provider, "on_pre_compress")

    mm.on_pre_compress(raw, evidence_messages=evidence_of(raw), require_checkpoint=True)

    (call,) = recorder.of("on_pre_compress")
    received = call.args[0]
    assert SECRET not in json.dumps(received)  # the host handed over a scrubbed copy
    assert received[0]["content"] != raw[0]["content"]
    assert received == list(call.args_before[0])  # the provider did not mutate its input
    assert raw == callers  # nor did anything touch the caller's list
    (checkpoint,) = checkpoint_events(hermes_home)
    assert messages_of(hermes_home, checkpoint) == received  # stored exactly as received
    provider.shutdown()
    for path in db_path(hermes_home).parent.iterdir():
        assert SECRET.encode() not in path.read_bytes(), f"secret found in {path.name}"


# -- B9 context propagation ---------------------------------------------------------------

PROBE: contextvars.ContextVar[str] = contextvars.ContextVar("archive_b9_probe")


def _in_profile(home: Path, fn: Any) -> Any:
    """Run ``fn`` in a fresh context scoped to profile ``home`` (as multiplexed hosts do)."""
    import hermes_constants as hc

    def scoped() -> Any:
        hc.set_hermes_home_override(home)
        PROBE.set(f"caller:{home.name}")
        return fn()

    return contextvars.copy_context().run(scoped)


def test_b9_background_threads_see_the_callers_context_and_write_under_its_home(
    tmp_path: Path, hermes_home: Path
) -> None:
    import hermes_constants as hc

    profile = tmp_path / "profile_ctx"
    seen: dict[str, Any] = {}

    def helper_thread() -> None:
        seen["helper"] = (PROBE.get(None), hc.get_hermes_home_override())

    def start() -> ArchiveProvider:
        thread = spawn_thread(helper_thread, name="archive-b9-probe")
        thread.start()
        thread.join(5)
        provider = ArchiveProvider()
        provider.initialize("ctx-session", platform="cli", agent_context="primary")  # no home kwarg
        return provider

    provider = _in_profile(profile, start)
    try:
        assert seen["helper"] == ("caller:profile_ctx", str(profile))
        assert PROBE.get(None) is None  # the test's own context was never touched

        def probe_on_writer(store: Any) -> list[Any]:
            seen["writer"] = (threading.current_thread().name, PROBE.get(None),
                              hc.get_hermes_home_override(), str(store.path))  # fmt: skip
            return []

        provider.core.writer.submit(probe_on_writer).result(10)  # type: ignore[union-attr]
        name, probe, override, store_path = seen["writer"]
        assert name.startswith("archive-writer") and name != threading.current_thread().name
        assert (probe, override) == ("caller:profile_ctx", str(profile))
        assert Path(store_path) == db_path(profile.resolve())
        flush(provider)
        assert [e.type for e in events(profile)] == ["session_started"]
        assert not db_path(hermes_home).exists()  # not the launch profile's ($HERMES_HOME)
    finally:
        provider.shutdown()


def test_b9_profile_switch_a_b_a_keeps_each_profiles_events_in_its_own_store(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    home_a, home_b = tmp_path / "profile_a", tmp_path / "profile_b"

    def start(session: str) -> Any:
        def run() -> ArchiveProvider:
            provider = ArchiveProvider()
            provider.initialize(session, platform="cli", agent_context="primary")
            provider.sync_turn(f"hello from {session}", "hi", session_id=session, messages=[
                {"role": "user", "content": f"hello from {session}"},
                {"role": "assistant", "content": "hi"}])  # fmt: skip
            return provider

        return run

    a1 = _in_profile(home_a, start("a1"))
    b1 = _in_profile(home_b, start("b1"))
    a2 = _in_profile(home_a, start("a2"))
    providers = [a1, b1, a2]
    try:
        # A hook reaching a1 from B's scope still lands in a1's own store.
        _in_profile(home_b, lambda: a1.on_memory_write("add", "memory", "fact for A"))
        _in_profile(home_b, lambda: a1.on_pre_compress([{"role": "user", "content": "A evidence"}]))
        with caplog.at_level(logging.ERROR, logger="archive_provider.host.provider"):
            a1.initialize("hijack", hermes_home=str(home_b), platform="cli")  # refused loudly
        assert "refuses to write into" in caplog.text
        a1.on_memory_write("add", "memory", "still A")
        for provider in providers:
            flush(provider)
        sessions_a = {e.session for e in events(home_a)}
        sessions_b = {e.session for e in events(home_b)}
        assert sessions_a == {"a1", "a2"}
        assert sessions_b == {"b1"}
        assert [e.session for e in events(home_a, "memory_write")] == ["a1", "a1"]
        assert [e.session for e in events(home_a, "checkpoint")] == ["a1"]
        assert len(events(home_a, "turn")) == 2 and len(events(home_b, "turn")) == 1
    finally:
        for provider in providers:
            provider.shutdown()


# -- B10 time budget -----------------------------------------------------------------------


def test_b10_a_2000_row_checkpoint_completes_offline(
    v2: tuple[Any, ArchiveProvider], hermes_home: Path, no_network: hostkit.NetworkGuard
) -> None:
    mm, _provider = v2
    raw: list[dict[str, Any]] = [{"role": "system", "content": "You are Hermes."}]
    for i in range(1000):
        raw.append({"role": "user", "content": f"message {i}: " + "lorem ipsum dolor " * 8})
        if i % 10 == 0:
            raw.append({"role": "tool", "tool_call_id": f"t{i}", "content": "tool output " * 20})
        raw.append({"role": "assistant", "content": f"reply {i}: " + "sit amet " * 12})
    evidence = evidence_of(raw)
    assert len(evidence) == 2000

    started = time.perf_counter()
    receipt = mm.on_pre_compress(raw, evidence_messages=evidence, require_checkpoint=True)
    elapsed = time.perf_counter() - started
    print(f"\nB10: checkpoint of {len(evidence)} evidence rows took {elapsed:.3f} s")

    # Completing at all (under require_checkpoint) means it committed inside the provider's
    # own bounded wait (checkpoint_timeout_s); the time itself is reported, not asserted.
    assert "2000 messages archived (2000 newly stored)" in receipt
    (checkpoint,) = checkpoint_events(hermes_home)
    assert len(checkpoint.body["evidence"]) == 2000
    assert no_network.blocked == []


# -- B11 gate ergonomics -----------------------------------------------------------------


def test_b11_startup_warning_for_a_v1_provider_and_silence_for_ours(
    caplog: pytest.LogCaptureFixture,
) -> None:
    legacy = h.V2MemoryManager()
    legacy.add_provider(RecordingStubProvider("legacy"))
    ours = h.V2MemoryManager()
    ours.add_provider(ArchiveProvider())

    with caplog.at_level(logging.DEBUG, logger="agent.conversation_compression"):
        h.warn_checkpoint_required_without_capable_provider(
            SimpleNamespace(compression_checkpoint_required=True, _memory_manager=legacy)
        )
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "compression.checkpoint_required" in warnings[0].getMessage()
    assert "legacy" in warnings[0].getMessage()

    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="agent.conversation_compression"):
        h.warn_checkpoint_required_without_capable_provider(
            SimpleNamespace(compression_checkpoint_required=True, _memory_manager=ours)
        )
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


# -- B12 bare-signature compatibility -----------------------------------------------------


class BareArchive(ArchiveProvider):
    """Attribute 2, but the docs example's bare signature: the host never sends the flag."""

    def on_pre_compress(self, messages):  # type: ignore[override]
        return super().on_pre_compress(messages)


def test_b12_a_bare_signature_variant_still_archives_and_counts_as_a_checkpoint(
    hermes_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARCHIVE_BUSY_TIMEOUT_S", "0.2")
    mm = h.V2MemoryManager()
    bare = BareArchive()
    mm.add_provider(bare)
    mm.initialize_all("s1", platform="cli", agent_context="primary")
    try:
        assert not h.accepts_require_checkpoint(bare.on_pre_compress)
        receipt = mm.on_pre_compress(
            copy.deepcopy(RAW), evidence_messages=evidence_of(RAW), require_checkpoint=True
        )  # no "No active memory provider"
        assert receipt and "archived" in receipt
        (checkpoint,) = checkpoint_events(hermes_home)
        assert messages_of(hermes_home, checkpoint) == EVIDENCE
        assert checkpoint.body["require_checkpoint"] is False  # it never saw the flag

        # Why we keep the keyword: without the flag a failure is best effort, returns "",
        # and the host still counts it as a successful checkpoint. Ours raises instead.
        grown = RAW + [{"role": "user", "content": "lost if bare"}]
        with write_lock_held(hermes_home):
            assert mm.on_pre_compress(copy.deepcopy(grown), evidence_messages=evidence_of(grown),
                                      require_checkpoint=True) == ""  # fmt: skip
        assert len(checkpoint_events(hermes_home)) == 1
    finally:
        mm.shutdown_all()


# -- B13 replay and audit ---------------------------------------------------------------


def test_b13_replay_equals_live_and_every_checkpoint_names_its_lineage(
    v2: tuple[Any, ArchiveProvider], hermes_home: Path, tmp_path: Path
) -> None:
    mm, provider = v2
    transcript = [{"role": "user", "content": "plan the offsite"},
                  {"role": "assistant", "content": "Lisbon in May?"}]  # fmt: skip
    mm.sync_all("plan the offsite", "Lisbon in May?", session_id="s1", messages=transcript)
    mm.on_memory_write("add", "memory", "Offsite: Lisbon, May", metadata={"write_origin": "tool"})
    mm.on_pre_compress(copy.deepcopy(transcript), evidence_messages=evidence_of(transcript),
                       require_checkpoint=True)  # fmt: skip
    mm.on_session_switch("s2", parent_session_id="s1", reset=False, reason="compression")
    grown = transcript + [{"role": "user", "content": "book flights"},
                          {"role": "assistant", "content": "Flights booked."}]  # fmt: skip
    mm.on_pre_compress(copy.deepcopy(grown), evidence_messages=evidence_of(grown),
                       require_checkpoint=True)  # fmt: skip
    mm.on_memory_write("replace", "memory", "Offsite: Lisbon, June",
                       metadata={"write_origin": "tool", "old_text": "May"})  # fmt: skip
    with write_lock_held(hermes_home):
        mm.on_pre_compress([{"role": "user", "content": "fails"}])  # best effort: recorded
    assert mm.prefetch_all("offsite Lisbon")
    assert mm.flush_pending(5)
    assert wait_for(lambda: len(events(hermes_home, "checkpoint_failed")) == 1)
    flush(provider)

    live, replayed = live_and_replayed(hermes_home, tmp_path)
    assert live == replayed
    assert verify(hermes_home).ok

    checkpoints = checkpoint_events(hermes_home)
    assert [(c.session, c.body["parent_session"]) for c in checkpoints] == [
        ("s1", "s0"),
        ("s2", "s1"),
    ]
    with open_view(hermes_home) as store:
        for checkpoint in checkpoints:
            body = checkpoint.body
            assert checkpoint.key["session"] == checkpoint.session
            assert body["evidence_digest"] == checkpoint.key["evidence"]
            assert body["evidence_digest"] == store.hasher.digest(canonical_bytes(body["evidence"]))
            assert "host_api_version" in body
            assert body["host_api_version"] == HOST_CHECKPOINT_API_VERSION
            assert body["provider_api_version"] == 2
