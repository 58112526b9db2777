"""The checkpoint API v2 harness pins the same facts as upstream's contract tests.

Mirrors ``tests/agent/test_pre_compress_checkpoint_contract.py`` on hermes-agent main
(PRs #94639, #99486, #115394), as summarized in hermes-contract.md section 1.5. On a
native v2 host the harness re-exports the host's objects, so these tests then check the
host itself; on 0.19.0 they check that the mirror behaves like main.
"""

from __future__ import annotations

import copy
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from agent.memory_manager import MemoryManager
from agent.memory_provider import MemoryProvider

from . import v2_host as h

EVIDENCE = [{"role": "user", "content": "evidence"}]


class _BaseStub(MemoryProvider):
    """A v1 provider with the historical bare signature."""

    def __init__(self, name: str = "stub") -> None:
        self._name = name
        self.pre_compress_calls: list[Any] = []

    @property
    def name(self) -> str:
        return self._name

    def is_available(self) -> bool:
        return True

    def initialize(self, session_id: str, **kwargs: Any) -> None:
        return None

    def get_tool_schemas(self) -> list[dict[str, Any]]:
        return []

    def on_pre_compress(self, messages):  # type: ignore[override]
        self.pre_compress_calls.append(messages)
        return f"{self._name} context"


class _V2Keyword(_BaseStub):
    pre_compress_checkpoint_api_version = h.PRE_COMPRESS_CHECKPOINT_API_VERSION

    def __init__(self, name: str = "stub") -> None:
        super().__init__(name)
        self.require_checkpoint_calls: list[bool] = []

    def on_pre_compress(self, messages, *, require_checkpoint=False):  # type: ignore[override]
        self.require_checkpoint_calls.append(require_checkpoint)
        return super().on_pre_compress(messages)


class _V2Kwargs(_BaseStub):
    pre_compress_checkpoint_api_version = h.PRE_COMPRESS_CHECKPOINT_API_VERSION

    def __init__(self, name: str = "kw") -> None:
        super().__init__(name)
        self.kwargs_seen: list[dict[str, Any]] = []

    def on_pre_compress(self, messages, **kwargs):  # type: ignore[override]
        self.kwargs_seen.append(dict(kwargs))
        return super().on_pre_compress(messages)


class _V2Bare(_BaseStub):
    """v2 by attribute, but the original docs example's bare signature."""

    pre_compress_checkpoint_api_version = h.PRE_COMPRESS_CHECKPOINT_API_VERSION


class _V2Failing(_V2Keyword):
    def on_pre_compress(self, messages, *, require_checkpoint=False):  # type: ignore[override]
        self.require_checkpoint_calls.append(require_checkpoint)
        if require_checkpoint:
            raise RuntimeError("durable store unreachable")
        return ""


class _V1Failing(_BaseStub):
    def on_pre_compress(self, messages):  # type: ignore[override]
        raise RuntimeError("legacy best-effort failure")


def _manager(*providers: MemoryProvider) -> MemoryManager:
    manager = h.V2MemoryManager()
    for provider in providers:
        manager.add_provider(provider)
    return manager


def _warn_text(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


# -- surface -----------------------------------------------------------------


def test_harness_surface_matches_host_capability() -> None:
    assert h.PRE_COMPRESS_CHECKPOINT_API_VERSION == 2
    assert issubclass(h.V2MemoryManager, MemoryManager)
    assert issubclass(h.CompressionCheckpointUnavailable, RuntimeError)
    if h.HOST_HAS_CHECKPOINT_V2:
        assert h.NATIVE["PRE_COMPRESS_CHECKPOINT_API_VERSION"]
    else:
        # hermes-agent 0.19.0: nothing of API v2 exists, everything is mirrored.
        assert not any(h.NATIVE.values()), h.NATIVE
        assert h.V2MemoryManager is not MemoryManager
        with pytest.raises(TypeError, match="evidence_messages"):
            MemoryManager().on_pre_compress(EVIDENCE, evidence_messages=EVIDENCE)


# -- who gets what -------------------------------------------------------------


def test_v1_providers_receive_raw_messages_and_v2_receive_evidence() -> None:
    raw = [
        {"role": "user", "content": "evidence"},
        {"role": "tool", "content": "tool output", "tool_call_id": "t1"},
    ]
    legacy = _BaseStub("legacy")
    _manager(legacy).on_pre_compress(raw, evidence_messages=EVIDENCE)
    assert legacy.pre_compress_calls == [raw]

    durable = _V2Keyword("durable")
    _manager(durable).on_pre_compress(raw, evidence_messages=EVIDENCE)
    assert durable.pre_compress_calls == [EVIDENCE]


def test_v2_provider_gets_raw_messages_when_host_sends_no_evidence() -> None:
    raw = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    durable = _V2Keyword("durable")
    _manager(durable).on_pre_compress(raw)
    assert durable.pre_compress_calls == [raw]


# -- the evidence filter -------------------------------------------------------


def test_direct_messages_filter_keeps_only_direct_source_evidence() -> None:
    messages = [
        {"role": "system", "content": "system prompt"},
        {"role": "user", "content": "durable user decision"},
        {"role": "assistant", "content": "direct assistant answer"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "t1"}]},
        {"role": "tool", "content": "tool output", "tool_call_id": "t1"},
        {
            "role": "assistant",
            "content": "previous compaction summary",
            h.COMPRESSED_SUMMARY_METADATA_KEY: True,
        },
        "not-a-dict",
    ]
    direct = h.direct_messages_for_pre_compress_memory(messages)
    assert [m["content"] for m in direct] == ["durable user decision", "direct assistant answer"]


def test_direct_messages_filter_keeps_prose_of_tool_call_messages() -> None:
    messages = [
        {"role": "user", "content": "please scan the network"},
        {
            "role": "assistant",
            "content": "Scanning now — the last sweep found 26 hosts.",
            "tool_calls": [{"id": "t1", "function": {"name": "terminal"}}],
        },
        {"role": "assistant", "content": "   ", "tool_calls": [{"id": "t2"}]},
    ]
    before = copy.deepcopy(messages)

    direct = h.direct_messages_for_pre_compress_memory(messages)

    assert [m["content"] for m in direct] == [
        "please scan the network",
        "Scanning now — the last sweep found 26 hosts.",
    ]
    assert all("tool_calls" not in m for m in direct)
    assert messages == before  # the input is not mutated
    assert h.direct_messages_for_pre_compress_memory(direct) == direct  # idempotent


# -- capability ----------------------------------------------------------------


def test_manager_advertises_checkpoint_capability_only_with_capable_provider() -> None:
    assert _manager(_BaseStub("legacy")).supports_pre_compress_checkpoint(2) is False
    assert _manager(_V2Keyword("durable")).supports_pre_compress_checkpoint(2) is True
    assert _manager(_V2Keyword("durable")).supports_pre_compress_checkpoint(3) is False
    assert h.V2MemoryManager().supports_pre_compress_checkpoint() is False


@pytest.mark.parametrize("attr", ["two", None, object()])
def test_unparseable_version_attribute_counts_as_v1(attr: Any) -> None:
    provider = _V2Keyword("odd")
    provider.pre_compress_checkpoint_api_version = attr
    manager = _manager(provider)
    raw = [{"role": "tool", "content": "x"}]

    assert manager.supports_pre_compress_checkpoint(2) is False
    with pytest.raises(RuntimeError, match="No active memory provider completed"):
        manager.on_pre_compress(raw, evidence_messages=EVIDENCE, require_checkpoint=True)
    assert provider.pre_compress_calls == [raw]  # raw list: treated as v1
    assert provider.require_checkpoint_calls == [False]  # the flag was not forwarded
    assert h.checkpoint_api_version_of(provider) is None


def test_version_attribute_is_parsed_with_int() -> None:
    provider = _V2Keyword("stringly")
    provider.pre_compress_checkpoint_api_version = "2"
    assert _manager(provider).supports_pre_compress_checkpoint(2) is True


# -- require_checkpoint forwarding (#99486) --------------------------------------


def test_manager_require_checkpoint_raises_without_capable_provider() -> None:
    legacy = _BaseStub("legacy")
    with pytest.raises(RuntimeError, match="pre-compress checkpoint"):
        _manager(legacy).on_pre_compress(
            EVIDENCE, require_checkpoint=True, checkpoint_api_version=2
        )
    assert legacy.pre_compress_calls == [EVIDENCE]  # the v1 hook still ran, best effort
    with pytest.raises(RuntimeError, match="No active memory provider completed"):
        h.V2MemoryManager().on_pre_compress(EVIDENCE, require_checkpoint=True)


def test_manager_passes_required_signal_to_checkpoint_provider() -> None:
    durable = _V2Keyword("durable")
    _manager(durable).on_pre_compress(EVIDENCE, require_checkpoint=True)
    assert durable.require_checkpoint_calls == [True]


def test_v2_provider_with_kwargs_catchall_receives_exactly_the_signal() -> None:
    kw = _V2Kwargs("kw")
    _manager(kw).on_pre_compress(EVIDENCE, evidence_messages=EVIDENCE, require_checkpoint=True)
    assert kw.kwargs_seen == [{"require_checkpoint": True}]


def test_v2_provider_with_bare_signature_still_works_and_counts_as_checkpoint() -> None:
    bare = _V2Bare("bare-v2")
    combined = _manager(bare).on_pre_compress(EVIDENCE, require_checkpoint=True)
    assert combined == "bare-v2 context"
    assert bare.pre_compress_calls == [EVIDENCE]
    assert h.accepts_require_checkpoint(bare.on_pre_compress) is False


def test_manager_does_not_pass_checkpoint_keyword_to_legacy_provider() -> None:
    legacy = _BaseStub("legacy")
    combined = _manager(legacy).on_pre_compress(EVIDENCE)
    assert combined == "legacy context"
    assert legacy.pre_compress_calls == [EVIDENCE]


def test_checkpoint_provider_receives_false_in_best_effort_mode() -> None:
    durable = _V2Failing("durable")
    assert _manager(durable).on_pre_compress(EVIDENCE) == ""
    assert durable.require_checkpoint_calls == [False]


def test_uninspectable_signature_never_gets_the_flag() -> None:
    assert h.accepts_require_checkpoint(len) is False  # builtin: no inspectable signature


# -- success and failure rules ---------------------------------------------------


def test_manager_require_checkpoint_propagates_checkpoint_provider_failure() -> None:
    with pytest.raises(RuntimeError, match="durable store unreachable"):
        _manager(_V2Failing("durable")).on_pre_compress(
            EVIDENCE, require_checkpoint=True, checkpoint_api_version=2
        )


def test_propagated_failure_is_the_provider_exception_unchanged() -> None:
    class StoreDown(OSError):
        pass

    boom = StoreDown("disk full")

    class Raising(_V2Keyword):
        def on_pre_compress(self, messages, *, require_checkpoint=False):  # type: ignore[override]
            raise boom

    with pytest.raises(StoreDown) as excinfo:
        _manager(Raising("durable")).on_pre_compress(EVIDENCE, require_checkpoint=True)
    assert excinfo.value is boom


def test_manager_require_checkpoint_succeeds_and_returns_provider_context() -> None:
    durable = _V2Keyword("durable")
    combined = _manager(durable).on_pre_compress(
        EVIDENCE, require_checkpoint=True, checkpoint_api_version=2
    )
    assert "durable context" in combined
    assert durable.pre_compress_calls


def test_empty_return_from_checkpoint_provider_is_still_a_successful_checkpoint() -> None:
    class Quiet(_V2Keyword):
        def on_pre_compress(self, messages, *, require_checkpoint=False):  # type: ignore[override]
            self.require_checkpoint_calls.append(require_checkpoint)
            return ""

    quiet = Quiet("quiet")
    assert _manager(quiet).on_pre_compress(EVIDENCE, require_checkpoint=True) == ""
    assert quiet.require_checkpoint_calls == [True]


def test_manager_best_effort_mode_keeps_historical_swallow_semantics() -> None:
    assert _manager(_V1Failing("legacy")).on_pre_compress(EVIDENCE) == ""


def test_v1_failure_is_swallowed_even_in_required_mode_but_a_v2_success_carries() -> None:
    # The builtin name is always accepted next to one external provider.
    builtin_v1 = _V1Failing("builtin")
    durable = _V2Keyword("durable")
    combined = _manager(builtin_v1, durable).on_pre_compress(EVIDENCE, require_checkpoint=True)
    assert combined == "durable context"


def test_parts_are_joined_with_a_blank_line_in_registration_order() -> None:
    combined = _manager(_BaseStub("builtin"), _V2Keyword("durable")).on_pre_compress(EVIDENCE)
    assert combined == "builtin context\n\ndurable context"


def test_providers_receive_redacted_copies() -> None:
    secret = "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4"
    raw = [{"role": "user", "content": f"my key is {secret}"}]
    before = copy.deepcopy(raw)

    class Mutating(_V2Keyword):
        def on_pre_compress(self, messages, *, require_checkpoint=False):  # type: ignore[override]
            self.pre_compress_calls.append(copy.deepcopy(messages))
            messages.clear()
            return "ok"

    provider = Mutating("durable")
    _manager(provider).on_pre_compress(raw, evidence_messages=raw, require_checkpoint=True)

    assert raw == before  # the caller's list is never the provider's list
    received = provider.pre_compress_calls[0][0]["content"]
    assert received.startswith("my key is ")
    assert secret not in received


# -- refusal errors (#94639, #115394) ----------------------------------------------


def test_checkpoint_blocked_error_is_prefixed_and_typed() -> None:
    error = h.checkpoint_blocked("no active provider")
    assert isinstance(error, h.CompressionCheckpointUnavailable)
    assert str(error).startswith("BLOCKED_MISSING_PREREQUISITE:")
    assert str(error) == (
        "BLOCKED_MISSING_PREREQUISITE: required pre-compress checkpoint unavailable: "
        "no active provider"
    )


def test_checkpoint_incapable_error_carries_the_remediation() -> None:
    error = h.checkpoint_incapable("active provider does not implement checkpoint API v2")
    assert isinstance(error, h.CompressionCheckpointUnavailable)
    assert str(error) == (
        "BLOCKED_MISSING_PREREQUISITE: required pre-compress checkpoint unavailable: "
        "active provider does not implement checkpoint API v2. Recover by set "
        "compression.checkpoint_required: false, or switch to a memory provider that "
        "implements checkpoint API v2"
    )


# -- startup warning (#115394) -------------------------------------------------------


def _armed(manager: Any) -> SimpleNamespace:
    return SimpleNamespace(compression_checkpoint_required=True, _memory_manager=manager)


@pytest.mark.parametrize(
    ("make_manager", "label"),
    [
        (lambda: _manager(_BaseStub("holographic")), "holographic"),
        (lambda: None, "no active provider"),
    ],
    ids=["v1-provider", "no-manager"],
)
def test_startup_warns_when_checkpoint_required_cannot_pass(
    caplog: pytest.LogCaptureFixture, make_manager: Any, label: str
) -> None:
    with caplog.at_level(logging.WARNING, logger="agent.conversation_compression"):
        h.warn_checkpoint_required_without_capable_provider(_armed(make_manager()))
    text = _warn_text(caplog)
    assert "compression.checkpoint_required" in text
    assert label in text
    assert "false" in text.lower()


def test_startup_is_silent_when_gate_off_or_provider_capable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    off = SimpleNamespace(
        compression_checkpoint_required=False, _memory_manager=_manager(_BaseStub("legacy"))
    )
    with caplog.at_level(logging.WARNING, logger="agent.conversation_compression"):
        h.warn_checkpoint_required_without_capable_provider(_armed(_manager(_V2Keyword("a"))))
        h.warn_checkpoint_required_without_capable_provider(off)
    assert "compression.checkpoint_required" not in _warn_text(caplog)


def test_startup_probe_failure_is_debug_only(caplog: pytest.LogCaptureFixture) -> None:
    def probe(_version: int) -> bool:
        raise RuntimeError("probe exploded")

    manager = SimpleNamespace(supports_pre_compress_checkpoint=probe, providers=[])
    with caplog.at_level(logging.DEBUG, logger="agent.conversation_compression"):
        h.warn_checkpoint_required_without_capable_provider(_armed(manager))
    assert _warn_text(caplog) == ""
    assert any("probe failed" in r.getMessage() for r in caplog.records)


# -- the compress-time gate ------------------------------------------------------------


def test_capability_refusal_names_the_config_key_to_change() -> None:
    agent = SimpleNamespace(_memory_manager=_manager(_BaseStub("legacy")))
    with pytest.raises(h.CompressionCheckpointUnavailable) as excinfo:
        h.pre_compress_memory_context(agent, EVIDENCE, True)
    msg = str(excinfo.value)
    assert msg.startswith("BLOCKED_MISSING_PREREQUISITE")
    assert "compression.checkpoint_required" in msg
    assert "false" in msg.lower()


@pytest.mark.parametrize(
    "manager", [None, SimpleNamespace(on_pre_compress=lambda *a, **k: "")], ids=["none", "no-probe"]
)
def test_gate_without_capability_method_is_an_incapable_refusal(manager: Any) -> None:
    with pytest.raises(h.CompressionCheckpointUnavailable, match="Recover by") as excinfo:
        h.pre_compress_memory_context(SimpleNamespace(_memory_manager=manager), EVIDENCE, True)
    assert "no active provider implements checkpoint API v2" in str(excinfo.value)


def test_gate_probe_failure_is_a_plain_block_chained_from_the_probe_error() -> None:
    def probe(_version: int) -> bool:
        raise ValueError("probe exploded")

    manager = SimpleNamespace(supports_pre_compress_checkpoint=probe)
    with pytest.raises(h.CompressionCheckpointUnavailable) as excinfo:
        h.pre_compress_memory_context(SimpleNamespace(_memory_manager=manager), EVIDENCE, True)
    assert str(excinfo.value).endswith("provider capability probe failed")
    assert isinstance(excinfo.value.__cause__, ValueError)


def test_gate_turns_a_provider_failure_into_a_chained_block(
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent = SimpleNamespace(_memory_manager=_manager(_V2Failing("durable")))
    with (
        caplog.at_level(logging.WARNING, logger="agent.conversation_compression"),
        pytest.raises(h.CompressionCheckpointUnavailable) as excinfo,
    ):
        h.pre_compress_memory_context(agent, EVIDENCE, True)
    assert str(excinfo.value) == (
        "BLOCKED_MISSING_PREREQUISITE: required pre-compress checkpoint unavailable: "
        "provider checkpoint API v2 failed"
    )
    assert "durable store unreachable" in str(excinfo.value.__cause__)
    assert "Required pre-compress checkpoint failed" in _warn_text(caplog)


def test_armed_gate_hands_evidence_and_flag_and_returns_the_receipt() -> None:
    durable = _V2Keyword("durable")
    raw = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "decision"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "t"}]},
        {"role": "tool", "content": "out", "tool_call_id": "t"},
        {"role": "assistant", "content": "answer"},
    ]
    result = h.pre_compress_memory_context(
        SimpleNamespace(_memory_manager=_manager(durable)), raw, True
    )
    assert result == "durable context"
    assert durable.pre_compress_calls == [
        [{"role": "user", "content": "decision"}, {"role": "assistant", "content": "answer"}]
    ]
    assert durable.require_checkpoint_calls == [True]


def test_unarmed_gate_is_best_effort() -> None:
    agent = SimpleNamespace(_memory_manager=_manager(_V2Failing("durable")))
    assert h.pre_compress_memory_context(agent, EVIDENCE, False) == ""
    assert (
        h.pre_compress_memory_context(SimpleNamespace(_memory_manager=None), EVIDENCE, False) == ""
    )


def test_persistence_isolated_fork_skips_the_checkpoint_gate_but_durable_agents_do_not() -> None:
    fork = SimpleNamespace(_persist_disabled=True, _session_db=None, _memory_manager=None)
    assert h.pre_compress_memory_context(fork, EVIDENCE, True) == ""

    durable = SimpleNamespace(_persist_disabled=False, _session_db=None, _memory_manager=None)
    with pytest.raises(h.CompressionCheckpointUnavailable):
        h.pre_compress_memory_context(durable, EVIDENCE, True)


# -- compress_context_v2 against a real AIAgent ------------------------------------------


class _Compressor:
    """Replaces ``agent.context_compressor.compress``; records what the host handed it."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(
        self, messages, current_tokens=None, focus_topic=None, force=False, memory_context=""
    ):
        self.calls.append({"messages": copy.deepcopy(messages), "memory_context": memory_context})
        return [messages[0], {"role": "assistant", "content": "SUMMARY"}, messages[-1]]


def _transcript() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "we decided to ship on friday"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "todo", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "content": "{}", "tool_call_id": "c1"},
        {"role": "assistant", "content": "noted: friday"},
        {"role": "user", "content": "and the budget is 10k"},
        {"role": "assistant", "content": "budget 10k noted"},
    ]


def test_compress_context_v2_refusal_leaves_everything_untouched_and_is_retryable(
    offline_agent: Any,
) -> None:
    agent = offline_agent()
    provider = _V2Failing("durable")
    agent._memory_manager = _manager(provider)
    compressor = _Compressor()
    agent.context_compressor.compress = compressor
    messages = _transcript()
    before = copy.deepcopy(messages)

    with pytest.raises(h.CompressionCheckpointUnavailable, match="^BLOCKED_MISSING_PREREQUISITE"):
        h.compress_context_v2(
            agent, messages, "sys", approx_tokens=100_000, force=True, checkpoint_required=True
        )
    assert compressor.calls == []
    assert messages == before
    assert provider.require_checkpoint_calls == [True]

    # Retry once the store is back: the same attempt now goes through.
    agent._memory_manager = _manager(_V2Keyword("durable"))
    compressed, _prompt = h.compress_context_v2(
        agent, messages, "sys", approx_tokens=100_000, force=True
    )
    assert len(compressor.calls) == 1
    assert compressor.calls[0]["memory_context"] == "durable context"
    assert compressed[1]["content"] == "SUMMARY"


def test_compress_context_v2_with_v1_provider_refuses_when_armed_and_runs_when_not(
    offline_agent: Any,
) -> None:
    agent = offline_agent()
    legacy = _BaseStub("legacy")
    agent._memory_manager = _manager(legacy)
    compressor = _Compressor()
    agent.context_compressor.compress = compressor

    with pytest.raises(h.CompressionCheckpointUnavailable, match="Recover by"):
        h.compress_context_v2(agent, _transcript(), "sys", force=True, checkpoint_required=True)
    assert compressor.calls == [] and legacy.pre_compress_calls == []

    h.compress_context_v2(agent, _transcript(), "sys", force=True, checkpoint_required=False)
    assert compressor.calls[0]["memory_context"] == "legacy context"
    assert legacy.pre_compress_calls == [_transcript()]  # v1: the raw transcript


def test_compress_context_v2_upgrades_a_plugin_loaded_manager(
    offline_agent: Any, install_memory_plugin: Any
) -> None:
    install_memory_plugin("stubarchive", settings={"checkpoint_version": 2})
    agent = offline_agent()
    provider = next(p for p in agent._memory_manager.providers if p.name == "stubarchive")
    compressor = _Compressor()
    agent.context_compressor.compress = compressor

    h.compress_context_v2(
        agent, _transcript(), "sys", approx_tokens=50_000, force=True, checkpoint_required=True
    )

    assert isinstance(agent._memory_manager, h.V2MemoryManager)
    (call,) = provider.of("on_pre_compress")
    assert call.args["require_checkpoint"] is True
    assert call.args["messages"] == h.direct_messages_for_pre_compress_memory(_transcript())
    assert compressor.calls[0]["memory_context"] == provider.pre_compress_text
    # The host's own post-compaction notification still reaches the provider.
    (switch,) = provider.of("on_session_switch")
    assert switch.args["kwargs"]["reason"] == "compression"
    assert switch.args["kwargs"]["reset"] is False


def test_install_v2_host_warns_for_an_incapable_provider(
    offline_agent: Any, install_memory_plugin: Any, caplog: pytest.LogCaptureFixture
) -> None:
    install_memory_plugin("stubarchive")  # no checkpoint_version: a v1 provider
    agent = offline_agent()
    with caplog.at_level(logging.WARNING, logger="agent.conversation_compression"):
        h.install_v2_host(agent, checkpoint_required=True)
    text = _warn_text(caplog)
    assert "compression.checkpoint_required" in text and "stubarchive" in text
    assert agent._memory_manager.supports_pre_compress_checkpoint(2) is False
