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
import sqlite3
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
from tests.conftest import traced

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
    with traced(store.conn) as statements:
        receipt = mm.on_pre_compress(copy.deepcopy(RAW), evidence_messages=evidence_of(RAW),
                                     require_checkpoint=True)  # fmt: skip
        at_return = list(statements)

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
    # the audit event, taken in from the spill (the locked log could not take it) with the
    # spill_taken record of that segment, and nothing else
    added = [e.type for e in events(hermes_home) if e.seq > before["head"]]
    assert sorted(added) == ["checkpoint_failed", "spill_taken"]
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
            if checkpoint.envelope.version == 2:  # identity = type, session and parts (13.2)
                assert checkpoint.key == {} and checkpoint.part_digests == body["evidence"]
            else:
                assert checkpoint.key["session"] == checkpoint.session
                assert body["evidence_digest"] == checkpoint.key["evidence"]
            assert body["evidence_digest"] == store.hasher.digest(canonical_bytes(body["evidence"]))
            assert "host_api_version" in body
            assert body["host_api_version"] == HOST_CHECKPOINT_API_VERSION
            assert body["provider_api_version"] == 2


# == Issue 17: what main's host tells providers since (docs/HOST.md §1-§6) =================


@pytest.fixture
def main_host(
    hermes_home: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Any, ArchiveProvider]]:
    """Main's manager surface (authors, scrub, filtered kwargs) over our provider."""
    mm = h.MainMemoryManager()
    provider = ArchiveProvider()
    mm.add_provider(provider)
    mm.initialize_all("s1", platform="discord", agent_context="primary")
    flush(provider)
    yield mm, provider
    if not mm._shutting_down:
        mm.shutdown_all()


def settle(mm: Any, provider: ArchiveProvider) -> None:
    assert mm.flush_pending(10)
    flush(provider)


def author_of(home: Path, turn: Any) -> Any:
    """The turn's author payload: a part named in the body (v1), the envelope's author (v2)."""
    digest = turn.body.get("author") or turn.envelope.author
    if digest is None:
        return None
    with open_view(home) as store:
        body = store.payload(digest)
    return None if body is None else json.loads(body)


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    from archive_provider.cli import main

    code = main(list(args))
    return code, capsys.readouterr().out


class LegacySync(RecordingStubProvider):
    """A provider written before authors: no ``turn_author`` and no ``**kwargs``."""

    def sync_turn(self, user_content, assistant_content, *, session_id="", messages=None):  # type: ignore[override]
        self._rec("sync_turn", user=user_content, session_id=session_id)


ALICE = {"id": "bot:ops/alice", "name": "Alice \U0001f916", "is_bot": True, "platform": "discord"}


# -- B14 authors ------------------------------------------------------------------------------


def test_b14_turn_author_is_archived_as_sent_erasably_and_shown(
    main_host: tuple[Any, ArchiveProvider], hermes_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mm, provider = main_host
    recorder = Recorder().wrap(provider, "sync_turn")
    convo = [{"role": "user", "content": "deploy the heron service"},
             {"role": "assistant", "content": "Deploying heron now."}]  # fmt: skip
    mm.sync_all("deploy the heron service", "Deploying heron now.", session_id="s1",
                messages=convo, turn_author=dict(ALICE))  # fmt: skip
    settle(mm, provider)
    (call,) = recorder.of("sync_turn")
    assert call.kwargs["turn_author"] == ALICE  # main delivers it: our signature names it

    (turn,) = events(hermes_home, "turn")
    assert author_of(hermes_home, turn) == {**ALICE, "source": "sync_turn"}
    if turn.envelope.version == 2:  # its own erasable payload, outside the body (13.1)
        assert turn.envelope.author is not None and "author" not in turn.body
    else:
        assert turn.body["author"] in turn.part_digests  # a part: erasure removes it
    with open_view(hermes_home) as store:
        envelope = store.conn.execute(
            "SELECT time, type, session, key, identity, payload, parts, chain FROM events"
            " WHERE seq = ?", (turn.seq,)).fetchone()  # fmt: skip
    assert "Alice" not in repr(envelope) and "bot:ops" not in repr(envelope)

    code, out = run_cli(capsys, "log", "--type", "turn")
    assert code == 0 and "by Alice \U0001f916 <bot:ops/alice> [bot]" in out
    code, out = run_cli(capsys, "show", str(turn.seq))
    assert "author    Alice \U0001f916 <bot:ops/alice> [bot]" in out
    code, out = run_cli(capsys, "search", "heron", "--author", "bot:ops/alice")
    assert code == 0 and "Deploying heron now." in out
    code, out = run_cli(capsys, "search", "heron", "--author", "someone-else")
    assert code == 1
    code, out = run_cli(capsys, "as-of", str(turn.seq), "--session", "s1")
    assert "Alice \U0001f916 <bot:ops/alice> [bot]: 1 turns" in out
    code, out = run_cli(capsys, "as-of", str(turn.seq - 1), "--session", "s1")
    assert "turn authors: 0" in out  # not yet, one event earlier
    with open_view(hermes_home) as store:
        rows = store.conn.execute(
            "SELECT author, author_id, author_is_bot FROM audit_turns").fetchall()  # fmt: skip
    assert rows == [("Alice \U0001f916", "bot:ops/alice", 1)] * 2

    # A provider whose sync_turn cannot take it never receives it (main's signature check).
    legacy_mm = h.MainMemoryManager()
    legacy = LegacySync("legacy")
    legacy_mm.add_provider(legacy)
    legacy_mm.sync_all("hi", "hello", session_id="s9", messages=convo, turn_author=dict(ALICE))
    assert legacy_mm.flush_pending(10)
    # it got its call: passing turn_author= to this signature would have raised TypeError
    assert [c.args for c in legacy.calls if c.hook == "sync_turn"] == [
        {"user": "hi", "session_id": "s9"}]  # fmt: skip
    legacy_mm.shutdown_all()


def test_b14_author_trio_on_turn_start_when_sync_turn_names_nobody(
    main_host: tuple[Any, ArchiveProvider], hermes_home: Path
) -> None:
    mm, provider = main_host
    mm.on_turn_start(1, "what is on today", author_id="U042", author_name="  Bob\x07 ",
                     author_is_bot="no", model="m", platform="discord")  # fmt: skip
    mm.sync_all("what is on today", "Standup at ten.", session_id="s1", messages=[
        {"role": "user", "content": "what is on today"},
        {"role": "assistant", "content": "Standup at ten."}])  # fmt: skip
    # sync_turn's own author wins over the trio (it is bound to the completed turn)
    mm.on_turn_start(2, "and tomorrow", author_id="U042", author_name="Bob", author_is_bot=False)
    mm.sync_all("and tomorrow", "Nothing.", session_id="s1", turn_author={"id": "U077", "name": "Cy"},
                messages=[{"role": "user", "content": "what is on today"},
                          {"role": "assistant", "content": "Standup at ten."},
                          {"role": "user", "content": "and tomorrow"},
                          {"role": "assistant", "content": "Nothing."}])  # fmt: skip
    settle(mm, provider)
    first, second = events(hermes_home, "turn")
    assert author_of(hermes_home, first) == {
        "id": "U042", "name": "Bob", "is_bot": False, "source": "on_turn_start"}  # fmt: skip
    assert author_of(hermes_home, second) == {
        "id": "U077", "name": "Cy", "is_bot": False, "source": "sync_turn"}  # fmt: skip


def test_b14_no_author_is_none_never_inferred_from_text(
    main_host: tuple[Any, ArchiveProvider], hermes_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mm, provider = main_host
    text = "Message from \U0001f916 ops (@ops): rotate the keys"
    mm.on_turn_start(1, text)
    mm.sync_all(text, "Rotating.", session_id="s1", messages=[
        {"role": "user", "content": text}, {"role": "assistant", "content": "Rotating."}])  # fmt: skip
    mm.sync_all("x", "y", session_id="s1", turn_author={"id": " ", "name": "\x00"})
    settle(mm, provider)
    for turn in events(hermes_home, "turn"):
        assert "author" not in turn.body
    code, out = run_cli(capsys, "log", "--type", "turn")
    assert "by —" in out


# -- B15 session boundaries and rewinds -------------------------------------------------------


def _turns(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(1, n + 1):
        out += [{"role": "user", "content": f"question {i} about herons"},
                {"role": "assistant", "content": f"answer {i} about herons"}]  # fmt: skip
    return out


def test_b15_rewind_marks_turns_and_keeps_memory_writes(
    main_host: tuple[Any, ArchiveProvider], hermes_home: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    mm, provider = main_host
    for n in (1, 2, 3):
        convo = _turns(n)
        mm.sync_all(convo[-2]["content"], convo[-1]["content"], session_id="s1", messages=convo)
        if n == 3:
            mm.on_memory_write("add", "memory", "Herons nest in March",
                               metadata={"write_origin": "tool", "session_id": "s1"})  # fmt: skip
    assert mm.flush_pending(10)
    # /undo 2 (cli.py:7510-7520 shape): same id, no parent, rewound=True
    mm.on_session_switch("s1", parent_session_id="", reset=False, rewound=True)
    kept = _turns(1) + [{"role": "user", "content": "new question about egrets"},
                        {"role": "assistant", "content": "egrets are white"}]  # fmt: skip
    mm.sync_all("new question about egrets", "egrets are white", session_id="s1", messages=kept)
    settle(mm, provider)

    (switch,) = events(hermes_home, "session_switched")
    assert switch.body["rewound"] is True
    (rewound,) = events(hermes_home, "turns_rewound")
    turns = events(hermes_home, "turn")
    assert rewound.body["switch_seq"] == switch.seq
    assert (rewound.body["from_message"], rewound.body["to_message"]) == (2, 6)
    assert rewound.body["turn_seqs"] == [turns[1].seq, turns[2].seq]
    assert rewound.body["detected_by"] == "sync_turn"
    assert turns[-1].body["start"] == 2 and len(turns) == 4  # the new turn, nothing re-archived
    assert messages_of(hermes_home, turns[-1]) == kept[2:]

    with open_view(hermes_home) as store:
        current = store.conn.execute(
            "SELECT count(*) FROM transcript WHERE session = 's1'").fetchone()[0]  # fmt: skip
        marked = store.conn.execute("SELECT count(*) FROM transcript_rewound").fetchone()[0]
        memory = store.conn.execute("SELECT content FROM memory_entries").fetchall()
    assert (current, marked) == (4, 4)
    assert memory == [("Herons nest in March",)]  # the host does not revert MEMORY.md

    hits = json.loads(provider.handle_tool_call("archive_search", {"query": "question herons"}))
    texts = {r["text"] for r in hits["results"]}
    assert "question 1 about herons" in texts
    assert not texts & {"question 2 about herons", "question 3 about herons"}
    code, out = run_cli(capsys, "log", "--type", "turn")
    assert out.count(f"[rewound at seq {rewound.seq}]") == 2  # still in the log, marked
    live, replayed = live_and_replayed(hermes_home, tmp_path)
    assert live == replayed
    assert verify(hermes_home).ok


def test_b15_rewind_then_session_end_is_detected_there(
    main_host: tuple[Any, ArchiveProvider], hermes_home: Path
) -> None:
    mm, provider = main_host
    mm.sync_all("q", "a", session_id="s1", messages=_turns(2))
    assert mm.flush_pending(10)
    mm.on_session_switch("s1", rewound=True)
    mm.on_session_end(_turns(1))
    settle(mm, provider)
    (rewound,) = events(hermes_home, "turns_rewound")
    assert rewound.body["detected_by"] == "session_end"
    assert (rewound.body["from_message"], rewound.body["to_message"]) == (2, 4)


def test_b15_switch_fields_archived_verbatim(
    main_host: tuple[Any, ArchiveProvider], hermes_home: Path
) -> None:
    mm, provider = main_host
    owner = {"id": "U1", "name": "Dee", "roles": ["admin"]}
    mm.on_session_switch("s2", parent_session_id="s1", reset=False, reason="compression",
                         owner=owner, rewound=False, extra_flag=3)  # fmt: skip
    settle(mm, provider)
    (switch,) = events(hermes_home, "session_switched")
    assert switch.body["reason"] == "compression"
    assert switch.body["owner"] == owner and switch.body["extra_flag"] == 3
    assert switch.body["rewound"] is False  # main forwards rewound only when set
    assert (switch.body["from"], switch.body["parent_session_id"]) == ("s1", "s1")


# -- B16 lifecycle and status -----------------------------------------------------------------


def test_b16_inspection_touches_no_disk(hermes_home: Path) -> None:
    mm = h.MainMemoryManager()
    provider = ArchiveProvider()
    mm.add_provider(provider)
    before = sorted(p.name for p in hermes_home.rglob("*"))
    threads = {t.name for t in threading.enumerate()}
    mm.initialize_all_for_inspection("inspect-1", platform="cli")
    assert provider.core.writer is None
    assert provider.system_prompt_block().startswith("## Archive")
    assert [s["name"] for s in mm.get_all_tool_schemas()] == ["archive_search"]
    assert sorted(p.name for p in hermes_home.rglob("*")) == before
    assert not any(
        t.name.startswith("archive") for t in threading.enumerate() if t.name not in threads
    )
    assert provider.unavailable_reason() == "" and provider.is_available()


def test_b16_recall_status_counts_the_last_prefetch_only(
    main_host: tuple[Any, ArchiveProvider], hermes_home: Path
) -> None:
    mm, provider = main_host
    mm.sync_all("q", "a", session_id="s1", messages=_turns(3))
    settle(mm, provider)
    assert mm.prefetch_all("herons question")
    status = provider.recall_status()
    assert status is not None and status.provider_label == "archive" and status.count >= 3
    assert f"archive \u2014 recalled {status.count} memories" in mm.describe_recall()
    assert mm.prefetch_all("zebra xylophone") == ""
    assert provider.recall_status() is None and mm.describe_recall() == ""


def test_b16_withheld_recall_status_names_the_reason_and_stays_available(
    main_host: tuple[Any, ArchiveProvider], hermes_home: Path
) -> None:
    mm, provider = main_host
    mm.sync_all("q", "a", session_id="s1", messages=_turns(2))
    settle(mm, provider)
    conn = sqlite3.connect(db_path(hermes_home))
    conn.execute("UPDATE recall_docs SET text = 'question 1 about herons: obey me' WHERE rowid = 1")
    conn.execute("INSERT INTO recall_fts (recall_fts) VALUES ('rebuild')")  # index agrees
    conn.commit()
    conn.close()
    mm.prefetch_all("herons obey question")
    status = provider.recall_status()
    assert status is not None and "withheld: not proven against the log" in status.provider_label
    assert provider.unavailable_reason() == "" and provider.is_available()


def test_b16_required_shipping_without_a_target_keeps_the_archive_out_and_blocks_compression(
    hermes_home: Path, offline_agent: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 19: ``ship_required`` with no ``ship_to`` fails closed at configuration: the
    real agent never adds the unavailable provider, so the armed gate blocks compression."""
    monkeypatch.setenv("ARCHIVE_SHIP_REQUIRED", "true")
    install_archive(hermes_home)
    agent = h.install_v2_host(offline_agent(), checkpoint_required=True)
    assert hostkit.external_provider(agent) is None
    compressed_calls: list[Any] = []
    agent.context_compressor.compress = lambda *args, **kwargs: compressed_calls.append(args)
    messages = copy.deepcopy(RAW[2:])
    with pytest.raises(h.CompressionCheckpointUnavailable, match="^BLOCKED_MISSING_PREREQUISITE"):
        h.compress_context_v2(agent, messages, "sys", approx_tokens=100_000, force=True,
                              checkpoint_required=True)  # fmt: skip
    assert compressed_calls == [] and messages == RAW[2:]
    assert not db_path(hermes_home).exists()  # nothing archived: a setting to fix, not an outage
    monkeypatch.delenv("ARCHIVE_SHIP_REQUIRED")
    assert isinstance(hostkit.external_provider(offline_agent()), ArchiveProvider)


def test_b16_flush_pending_drains_the_archive_queue(
    main_host: tuple[Any, ArchiveProvider], hermes_home: Path
) -> None:
    mm, provider = main_host
    for i in range(50):
        provider.on_memory_write("add", "memory", f"fact {i}")
    assert provider.flush_pending(10) is True
    assert len(events(hermes_home, "memory_write")) == 50
    mm.shutdown_all()
    assert mm.shutdown_drain_state["status"] == "drained"
    assert provider.flush_pending(1) is True  # closed: nothing pending


def test_b16_main_shutdown_hands_providers_nothing_so_our_own_drain_is_archived(
    hermes_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Main drains its worker, then calls ``shutdown()`` bare (memory_manager.py@002b06468d29):
    no timeout, no drain result. What our writer could not commit is spilled, and the
    ``shutdown_drain`` record of it is archived by the next open."""
    monkeypatch.setenv("ARCHIVE_DRAIN_TIMEOUT_S", "0.3")
    monkeypatch.setenv("ARCHIVE_BUSY_TIMEOUT_S", "0.1")
    mm = h.MainMemoryManager()
    provider = ArchiveProvider()
    mm.add_provider(provider)
    calls = Recorder().wrap(provider, "shutdown")
    mm.initialize_all("s1", platform="cli", agent_context="primary")
    flush(provider)
    with write_lock_held(hermes_home):
        mm.sync_all("question 1 about herons", "answer 1 about herons", session_id="s1",
                    messages=_turns(1))  # fmt: skip
        mm.on_delegation("count the herons", "three", child_session_id="c1")
        mm.shutdown_all()
    (call,) = calls.of("shutdown")
    assert (call.args, call.kwargs) == ((), {})
    assert mm.shutdown_drain_state["status"] == "drained"  # the host's figures stay with it

    again = ArchiveProvider()
    again.initialize("s2", hermes_home=str(hermes_home), platform="cli")
    flush(again)
    again.shutdown()
    (drain,) = events(hermes_home, "shutdown_drain")
    body = drain.body
    # the locked log could not take them: the writer spilled them then, none at shutdown
    assert (body["pending"], body["spilled"], body["unwritten"]) == (0, 0, 0)
    assert body["finished"] is False and "locked" in (body["error"] or "")
    assert [e.type for e in events(hermes_home, "turn", "delegation")] == ["turn", "delegation"]


# -- B17 redaction before providers ------------------------------------------------------------

HOST_SECRET = "sk-proj-Ab12Cd34Ef56Gh78Ij90Kl12Mn34"


def test_b17_host_masks_recorded_per_event_and_ours_left_alone(
    main_host: tuple[Any, ArchiveProvider], hermes_home: Path
) -> None:
    mm, provider = main_host
    convo = [{"role": "user", "content": f"use {HOST_SECRET} for the deploy"},
             {"role": "assistant", "content": "Done."}]  # fmt: skip
    mm.sync_all(convo[0]["content"], "Done.", session_id="s1", messages=convo)
    settle(mm, provider)
    (turn,) = events(hermes_home, "turn")
    (user_row, _) = messages_of(hermes_home, turn)
    assert HOST_SECRET not in user_row["content"] and "..." in user_row["content"]
    assert turn.body["host_masks"] == [
        {"path": "/messages/0/content", "kind": "head_tail", "at": 4}]  # fmt: skip
    assert "redactions" not in turn.body  # our redaction was a no-op on the host's mask


def test_b17_redaction_unavailable_is_archived_as_sent(
    main_host: tuple[Any, ArchiveProvider], hermes_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agent.redact

    mm, provider = main_host

    def broken(*_a: Any, **_k: Any) -> str:
        raise RuntimeError("redactor down")

    monkeypatch.setattr(agent.redact, "redact_sensitive_text", broken)
    convo = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    mm.sync_all("hello", "hi", session_id="s1", messages=convo)
    settle(mm, provider)
    (turn,) = events(hermes_home, "turn")
    # main fails closed on every string of the hand-off, the roles included (@002b06468d29)
    sentinel = {"role": h.REDACTION_UNAVAILABLE, "content": h.REDACTION_UNAVAILABLE}
    assert messages_of(hermes_home, turn) == [sentinel, sentinel]
    assert {(m["path"], m["kind"]) for m in turn.body["host_masks"]} == {
        (f"/messages/{i}/{field}", "redaction_unavailable")
        for i in (0, 1)
        for field in ("role", "content")
    }


def test_b17_session_records_host_redaction_capability(
    hermes_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agent.memory_manager
    import agent.redact

    def started(context: str) -> Any:
        provider = ArchiveProvider()
        provider.initialize(context, platform="cli", agent_context="primary")
        flush(provider)
        provider.shutdown()
        return [e for e in events(hermes_home, "session_started") if e.session == context][0]

    plain = started("s-plain").body["host_redaction"]
    if not hostkit.ON_0_19:  # 0.22 scrubs every hand-off itself
        assert plain["redacts_providers"] is True
        assert "_redact_for_provider" in plain["symbols"] and plain["host"] == hostkit.HOST
        return
    assert plain["redacts_providers"] is False and plain["symbols"] == []  # 0.19.0
    monkeypatch.setattr(agent.redact, "redact_for_egress", h.redact_for_egress, raising=False)
    egress = started("s-egress").body["host_redaction"]
    assert egress["redacts_providers"] == "unknown" and egress["symbols"] == ["redact_for_egress"]
    monkeypatch.setattr(
        agent.memory_manager, "_redact_for_provider", h.redact_for_egress, raising=False
    )
    scrubbing = started("s-scrub").body["host_redaction"]
    assert scrubbing["redacts_providers"] is True
    assert "_redact_for_provider" in scrubbing["symbols"]


#: an opaque token main masks where it sees it assigned, and then everywhere in the hand-off
SPLIT_TOKEN = "Zx9Qw8Er7Ty6Ui5Op4As3Df2"


def test_b17_host_masks_on_every_other_hand_off_and_ours_left_alone(
    main_host: tuple[Any, ArchiveProvider], hermes_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Memory mirrors, delegations, recall queries, session end and tool arguments carry the
    host's masks as main hands them over (memory_manager.py@002b06468d29); each event lists
    them under ``host_masks`` and our redaction leaves them alone (no ``redactions``)."""
    mm, provider = main_host
    call = {"id": "c1", "type": "function", "function": {
        "name": "deploy", "arguments": json.dumps({"api_key": HOST_SECRET})}}  # fmt: skip
    convo = [*_turns(1), {"role": "assistant", "content": None, "tool_calls": [call]},
             {"role": "tool", "tool_call_id": "c1", "content": "deployed"},
             {"role": "assistant", "content": "Deployed."}]  # fmt: skip
    mm.sync_all("question 1 about herons", "Deployed.", session_id="s1", messages=convo)
    settle(mm, provider)
    # a memory mirror: the assigned token is masked, then the bare repeat as [redacted]
    mm.notify_memory_tool_write(
        '{"success": true}',
        {"action": "replace", "target": "memory", "content": f"the token is {SPLIT_TOKEN}",
         "old_text": f"MY_TOKEN={SPLIT_TOKEN}"},
        build_metadata=lambda: {"write_origin": "tool"},
    )  # fmt: skip
    mm.on_delegation(f"deploy with {HOST_SECRET}", "deployed", child_session_id="c1")
    assert mm.prefetch_all(f"herons {HOST_SECRET}")
    mm.on_session_end([*convo, {"role": "user", "content": f"last: {HOST_SECRET}"}])
    settle(mm, provider)

    first, last = events(hermes_home, "turn")
    assert {"path": "/messages/2/tool_calls/0/function/arguments", "kind": "stars",
            "at": 13} in first.body["host_masks"]  # fmt: skip
    assert last.body["host_masks"] == [
        {"path": "/messages/0/content", "kind": "head_tail", "at": 6}]  # fmt: skip
    (write,) = events(hermes_home, "memory_write")
    assert write.body["metadata"]["old_text"] == "MY_TOKEN=***"
    assert write.body["host_masks"] == [
        {"path": "/content", "kind": "learned_redacted", "at": 13},
        {"path": "/metadata/old_text", "kind": "stars", "at": 9},
    ]
    (delegation,) = events(hermes_home, "delegation")
    assert delegation.body["host_masks"] == [{"path": "/task", "kind": "head_tail", "at": 12}]
    (recall,) = events(hermes_home, "recall_served")
    assert recall.body["host_masks"] == [{"path": "/query", "kind": "head_tail", "at": 7}]
    for event in (first, last, write, delegation, recall):
        assert "redactions" not in event.body  # a no-op on every host mask
    assert not any(
        HOST_SECRET in json.dumps(v) or SPLIT_TOKEN in json.dumps(v)
        for v in all_payload_values(hermes_home)
    )
    # a tool call's arguments reach the provider scrubbed; the call itself is archived as
    # the transcript's tool_calls row above, not as an event of its own
    answer = json.loads(mm.handle_tool_call("archive_search", {"query": f"herons {HOST_SECRET}"}))
    assert answer["query"] == "herons sk-pro...Mn34"
    code, out = run_cli(capsys, "log", "--type", "memory_write", "--type", "delegation")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 2
    assert lines[0].endswith("[host masked: learned_redacted x1, stars x1]")
    assert lines[1].endswith("[host masked: head_tail x1]")
    code, out = run_cli(capsys, "show", str(recall.seq))
    assert "[host masked: head_tail x1]" in out


# -- B18 checkpoint evidence variants ---------------------------------------------------------


def test_b18_compressed_summary_rows_counted_not_archived(
    v2: tuple[Any, ArchiveProvider], hermes_home: Path
) -> None:
    _mm, provider = v2
    assert "archived" in provider.on_pre_compress(copy.deepcopy(RAW))  # a v1-shaped hand-off
    (checkpoint,) = checkpoint_events(hermes_home)
    assert checkpoint.body["summaries_skipped"] == 1
    assert checkpoint.body["received_roles"] == {"system": 1, "user": 3, "assistant": 3, "tool": 2}
    assert messages_of(hermes_home, checkpoint) == EVIDENCE  # the summary is not evidence


def test_b18_checkpoint_only_context_archives_checkpoints_only(hermes_home: Path) -> None:
    mm = h.MainMemoryManager()
    provider = ArchiveProvider()
    mm.add_provider(provider)
    mm.initialize_all("sub-1", platform="cli", agent_context="checkpoint_only")
    try:
        mm.sync_all("q", "a", session_id="sub-1", messages=_turns(1))
        mm.on_memory_write("add", "memory", "not mine to write")
        assert mm.flush_pending(10)
        assert provider.get_tool_schemas() == []
        assert "error" in json.loads(provider.handle_tool_call("archive_search", {"query": "q"}))
        receipt = mm.on_pre_compress(copy.deepcopy(RAW), evidence_messages=evidence_of(RAW),
                                     require_checkpoint=True)  # fmt: skip
        assert "archived" in receipt
        assert provider.prefetch("herons") == ""
        flush(provider)
        assert [e.type for e in events(hermes_home)] == ["checkpoint"]
        # still fails closed for evidence not yet archived (an identical retry of RAW's is
        # answered from a read: it is durable already and needs no write lock)
        grown = copy.deepcopy(RAW) + [{"role": "user", "content": "more"}]
        with write_lock_held(hermes_home), pytest.raises(CheckpointError):
            mm.on_pre_compress(grown, evidence_messages=evidence_of(grown), require_checkpoint=True)
    finally:
        mm.shutdown_all()


def test_b18_v3_host_treats_our_v2_provider_as_v1(
    v2: tuple[Any, ArchiveProvider], hermes_home: Path
) -> None:
    mm, provider = v2
    recorder = Recorder().wrap(provider, "on_pre_compress")
    with pytest.raises(RuntimeError, match="checkpoint API v3"):
        mm.on_pre_compress(copy.deepcopy(RAW), evidence_messages=evidence_of(RAW),
                           require_checkpoint=True, checkpoint_api_version=3)  # fmt: skip
    (call,) = recorder.of("on_pre_compress")
    assert call.kwargs == {} and len(call.args[0]) == len(RAW)  # raw list, no flag
    assert type(provider).pre_compress_checkpoint_api_version == 2  # we keep advertising 2


# -- B19 entry point and threads ---------------------------------------------------------------


def test_b19_entry_point_discovered_by_importlib_metadata_and_registers(
    hermes_home: Path,
) -> None:
    from importlib.metadata import entry_points

    found = {ep.name: ep for ep in entry_points(group="hermes_agent.memory_providers")}
    assert {"archive", "hivemind"} <= found.keys()
    module = found["archive"].load()
    folder = Path(module.__file__).parent  # main's find_provider_dir: the package folder
    assert (folder / "plugin.yaml").is_file() and (folder / "cli.py").is_file()

    registered: list[Any] = []
    module.register(SimpleNamespace(register_memory_provider=registered.append))
    (provider,) = registered
    assert isinstance(provider, ArchiveProvider) and provider.name == found["archive"].name


def test_b19_every_provider_thread_goes_through_the_host_helper(
    hermes_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import re

    from archive_provider.host import hermes as glue

    made: list[str] = []

    def host_spawn(target: Any, *, name: str, daemon: bool = True) -> threading.Thread:
        made.append(name)
        return threading.Thread(target=contextvars.copy_context().run, args=(target,),
                                name=name, daemon=daemon)  # fmt: skip

    monkeypatch.setattr(glue, "_host_spawn", host_spawn)
    provider = ArchiveProvider()
    provider.initialize("s-threads", platform="cli", agent_context="primary")
    flush(provider)
    provider.shutdown()
    assert any(name.startswith("archive-writer") for name in made)

    # Statically: no other thread is started anywhere in the packages.
    bare = re.compile(r"threading\.Thread\(")
    allowed = {"archive_provider/storage/threads.py",  # context_thread, the 0.19.0 fallback
               "archive_provider/demo/fake_llm.py",  # the demo's loopback LLM server
               # `witness serve` is its own process, never inside a host
               "archive_provider/witnesses/server.py",
               # a `verify --jobs` helper's watch on its parent: only in the helper's own
               # interpreter (verifier._helper_main), never inside a host
               "archive_provider/format/verifier.py"}  # fmt: skip
    root = Path(__file__).resolve().parents[2]
    offenders = [
        str(path.relative_to(root))
        for package in ("archive_provider", "hivemind")
        for path in (root / package).rglob("*.py")
        if bare.search(path.read_text(encoding="utf-8"))
        and str(path.relative_to(root)) not in allowed
    ]
    assert offenders == []
