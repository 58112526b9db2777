"""Contract-mirror harness for Hermes' pre-compress checkpoint API v2.

Why: ``hermes-agent==0.19.0`` (the newest PyPI wheel) predates checkpoint API v2, yet our
provider advertises v2 and must behave correctly on hosts that have it (GitHub builds from
0.21.1). This module reproduces upstream main's *call logic* so Tier B tests can drive the
provider exactly as main's host would. It is a specification kept in the tests, not
vendored code. It mirrors:

* NousResearch/hermes-agent#94639: the opt-in fail-closed contract (version attribute,
  ``require_checkpoint`` mode, the evidence filter, ``compression.checkpoint_required``,
  ``CompressionCheckpointUnavailable`` / ``BLOCKED_MISSING_PREREQUISITE``);
* #99486: forwarding ``require_checkpoint`` to v2 providers, with signature inspection so a
  bare ``def on_pre_compress(self, messages)`` v2 provider still works;
* #115394: the startup warning and the capability-refusal remediation text.

Every public name is feature-detected: when the installed host already exposes the native
symbol (``agent.memory_provider.PRE_COMPRESS_CHECKPOINT_API_VERSION`` and friends), the
native object is exported instead of the mirror, so the same tests run natively on a v2
host. :data:`NATIVE` records which symbols came from the host.

Deliberate differences from main (documented, harmless for provider tests):

* Redaction: on main every hand-off is scrubbed by ``_redact_for_provider``. The v2
  checkpoint mirror deep-copies and runs 0.19.0's ``agent.redact.redact_sensitive_text
  (force=True)`` over every string; :class:`MainMemoryManager` (the later surface) scrubs
  every hand-off as main does, "masked once, masked everywhere" included
  (:func:`scrub_for_provider`).
* :func:`compress_context_v2` runs the gate *before* delegating to 0.19.0's real
  ``compress_context`` (main runs it after taking the per-session compression lock). The
  provider sees the same calls; only a lock-contended attempt differs (main sits out
  without checkpointing, the mirror checkpoints and then sits out, which idempotent
  checkpoints absorb).
"""

from __future__ import annotations

import copy
import inspect
import logging
import re
from collections.abc import Callable
from typing import Any

import agent.conversation_compression as _host_cc
import agent.memory_manager as _host_mm
import agent.memory_provider as _host_mp
from agent.memory_manager import MemoryManager

try:  # newest main moved the gate into its own module
    import agent.conversation_compression_checkpoint as _host_ccc  # type: ignore[import-not-found]
except ImportError:  # 0.19.0 and older main revisions
    _host_ccc = None

# Same logger names as upstream, so ``caplog.at_level(..., logger=...)`` filters work the same
# against the mirror and against a native host.
_mm_logger = logging.getLogger("agent.memory_manager")
_cc_logger = logging.getLogger("agent.conversation_compression")

NATIVE: dict[str, bool] = {}


def _native(public: str, name: str, *modules: Any) -> Any:
    """Return the host's symbol ``name`` from the first module that has it, else None."""
    for module in modules:
        if module is not None and hasattr(module, name):
            NATIVE[public] = True
            return getattr(module, name)
    NATIVE[public] = False
    return None


#: True when the installed host implements checkpoint API v2 natively (GitHub build >= 0.21.1).
HOST_HAS_CHECKPOINT_V2: bool = hasattr(_host_mp, "PRE_COMPRESS_CHECKPOINT_API_VERSION")

_native_version = _native(
    "PRE_COMPRESS_CHECKPOINT_API_VERSION", "PRE_COMPRESS_CHECKPOINT_API_VERSION", _host_mp
)
#: The checkpoint API version this harness speaks (main: ``agent.memory_provider``).
PRE_COMPRESS_CHECKPOINT_API_VERSION: int = int(_native_version or 2)
#: Providers without the attribute are on the implicit best-effort v1 contract.
LEGACY_PRE_COMPRESS_API_VERSION = 1

try:
    from agent.context_compressor import COMPRESSED_SUMMARY_METADATA_KEY
except ImportError:  # pragma: no cover - present since well before 0.19.0
    COMPRESSED_SUMMARY_METADATA_KEY = "_compressed_summary"

try:
    from agent.context_engine import sanitize_memory_context
except ImportError:  # pragma: no cover - present in 0.19.0

    def sanitize_memory_context(memory_context: str) -> str:
        return memory_context.strip()


# ---------------------------------------------------------------------------
# Evidence filter (#94639)
# ---------------------------------------------------------------------------


def _mirror_direct_messages(messages: Any) -> list[dict[str, Any]]:
    """Direct user/assistant evidence, as main's ``_direct_messages_for_pre_compress_memory``.

    Drops non-dicts, every role but user/assistant, and compaction summaries (rows carrying
    ``_compressed_summary``). An assistant row with ``tool_calls`` survives only if it has
    prose, and the kept copy loses ``tool_calls``. The input is never mutated.
    """
    direct: list[dict[str, Any]] = []
    for message in messages or []:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role not in {"user", "assistant"} or message.get(COMPRESSED_SUMMARY_METADATA_KEY):
            continue
        if role == "assistant" and message.get("tool_calls"):
            content = message.get("content")
            has_prose = bool(content.strip() if isinstance(content, str) else content)
            if not has_prose:
                continue
            message = {k: v for k, v in message.items() if k != "tool_calls"}
        direct.append(message)
    return direct


direct_messages_for_pre_compress_memory: Callable[[Any], list[dict[str, Any]]] = (
    _native(
        "direct_messages_for_pre_compress_memory",
        "_direct_messages_for_pre_compress_memory",
        _host_ccc,
        _host_cc,
    )
    or _mirror_direct_messages
)


# ---------------------------------------------------------------------------
# Manager side (#94639, #99486)
# ---------------------------------------------------------------------------


def accepts_require_checkpoint(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` can take ``require_checkpoint=`` (main's ``_accepts_require_checkpoint``).

    True for a keyword-only or positional-or-keyword ``require_checkpoint`` parameter or a
    ``**kwargs`` catch-all; an uninspectable signature counts as "does not accept" (#99486).
    """
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return True
    kind = getattr(params.get("require_checkpoint"), "kind", None)
    return kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def checkpoint_api_version_of(provider: Any) -> int | None:
    """A provider's advertised checkpoint API version; None when it cannot be parsed."""
    try:
        return int(
            getattr(
                provider, "pre_compress_checkpoint_api_version", LEGACY_PRE_COMPRESS_API_VERSION
            )
        )
    except (TypeError, ValueError):
        return None


def _redact_value(value: Any, redact: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redact_value(v, redact) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_redact_value(v, redact) for v in value)
    return copy.deepcopy(value)


def redact_for_provider(messages: Any) -> Any:
    """A scrubbed deep copy of ``messages`` (main hands providers redacted copies, #115104)."""
    if messages is None:
        return None
    try:
        from agent.redact import redact_sensitive_text
    except ImportError:  # pragma: no cover - present in 0.19.0
        return copy.deepcopy(messages)

    def _scrub(text: str) -> str:
        return redact_sensitive_text(text, force=True)

    return _redact_value(messages, _scrub)


class _MirrorV2MemoryManager(MemoryManager):
    """The real 0.19.0 ``MemoryManager`` plus main's checkpoint API v2 surface (#94639, #99486).

    Only ``on_pre_compress`` and ``supports_pre_compress_checkpoint`` differ from the host
    class; everything else (registration, sync worker, shutdown drain) is the real code.
    """

    def supports_pre_compress_checkpoint(
        self, api_version: int = PRE_COMPRESS_CHECKPOINT_API_VERSION
    ) -> bool:
        """True when any registered provider's parsed version is at least ``api_version``."""
        versions = (checkpoint_api_version_of(p) for p in self._providers)
        return any(v is not None and v >= api_version for v in versions)

    def on_pre_compress(  # type: ignore[override]
        self,
        messages: list[dict[str, Any]],
        *,
        evidence_messages: list[dict[str, Any]] | None = None,
        require_checkpoint: bool = False,
        checkpoint_api_version: int = PRE_COMPRESS_CHECKPOINT_API_VERSION,
    ) -> str:
        """Fan out before compression; main's who-gets-what and success/failure rules.

        Checkpoint (v2+) providers get ``evidence_messages`` when given, others the raw list;
        ``require_checkpoint`` reaches only checkpoint providers whose signature accepts it.
        With ``require_checkpoint`` a checkpoint provider's exception is re-raised unchanged,
        and if no checkpoint provider succeeded a ``RuntimeError`` is raised.
        """
        raw = redact_for_provider(messages)
        evidence = redact_for_provider(evidence_messages)
        parts: list[str] = []
        checkpoint_succeeded = False
        for provider in self._providers:
            version = checkpoint_api_version_of(provider)
            if version is None:
                version = LEGACY_PRE_COMPRESS_API_VERSION
            is_checkpoint_provider = version >= checkpoint_api_version
            use_evidence = is_checkpoint_provider and evidence is not None
            provider_messages = evidence if use_evidence else raw
            kwargs: dict[str, Any] = {}
            if is_checkpoint_provider and accepts_require_checkpoint(provider.on_pre_compress):
                kwargs["require_checkpoint"] = require_checkpoint
            try:
                result = provider.on_pre_compress(provider_messages, **kwargs)
                if result and result.strip():
                    parts.append(result)
                checkpoint_succeeded = checkpoint_succeeded or is_checkpoint_provider
            except Exception as exc:
                _mm_logger.debug(
                    "Memory provider '%s' on_pre_compress failed: %s", provider.name, exc
                )
                if require_checkpoint and is_checkpoint_provider:
                    raise
        if require_checkpoint and not checkpoint_succeeded:
            raise RuntimeError(
                "No active memory provider completed pre-compress checkpoint API "
                f"v{checkpoint_api_version}"
            )
        return "\n\n".join(parts)


def _host_manager_is_v2(cls: type) -> bool:
    if not hasattr(cls, "supports_pre_compress_checkpoint"):
        return False
    try:
        return "evidence_messages" in inspect.signature(cls.on_pre_compress).parameters
    except (TypeError, ValueError):
        return False


NATIVE["V2MemoryManager"] = _host_manager_is_v2(MemoryManager)
#: A ``MemoryManager`` with checkpoint API v2: the host class when native, else the mirror.
V2MemoryManager: type[MemoryManager] = (
    MemoryManager if NATIVE["V2MemoryManager"] else _MirrorV2MemoryManager
)


def upgrade_memory_manager(manager: Any) -> Any:
    """Give an existing host ``MemoryManager`` (e.g. an AIAgent's) the v2 API in place.

    The mirror subclass adds no state, so swapping ``__class__`` is safe; a manager that
    already speaks v2 (or is not a ``MemoryManager``) is returned unchanged.
    """
    if (
        manager is not None
        and type(manager) is MemoryManager
        and V2MemoryManager is not MemoryManager
    ):
        manager.__class__ = V2MemoryManager
    return manager


# ---------------------------------------------------------------------------
# Compression gate (#94639, #115394)
# ---------------------------------------------------------------------------


class _MirrorCompressionCheckpointUnavailable(RuntimeError):
    """Raised when required durable pre-compress checkpointing is unavailable."""


CompressionCheckpointUnavailable: type[RuntimeError] = (
    _native(
        "CompressionCheckpointUnavailable",
        "CompressionCheckpointUnavailable",
        _host_ccc,
        _host_cc,
    )
    or _MirrorCompressionCheckpointUnavailable
)

CHECKPOINT_REQUIRED_REMEDIATION: str = _native(
    "CHECKPOINT_REQUIRED_REMEDIATION",
    "_CHECKPOINT_REQUIRED_REMEDIATION",
    _host_ccc,
    _host_cc,
) or (
    "set compression.checkpoint_required: false, or switch to a memory "
    "provider that implements checkpoint API v2"
)

BLOCKED_PREFIX = "BLOCKED_MISSING_PREREQUISITE: required pre-compress checkpoint unavailable: "


def _mirror_checkpoint_blocked(reason: str) -> RuntimeError:
    return CompressionCheckpointUnavailable(f"{BLOCKED_PREFIX}{reason}")


def _mirror_checkpoint_incapable(reason: str) -> RuntimeError:
    """Capability refusal: carries the config-level way out (#115394)."""
    return checkpoint_blocked(f"{reason}. Recover by {CHECKPOINT_REQUIRED_REMEDIATION}")


#: ``checkpoint_blocked(reason)``: the plain refusal (transient failure; retry is right).
checkpoint_blocked: Callable[[str], RuntimeError] = (
    _native("checkpoint_blocked", "_checkpoint_blocked", _host_ccc, _host_cc)
    or _mirror_checkpoint_blocked
)
#: ``checkpoint_incapable(reason)``: refusal that can never pass with this provider set.
checkpoint_incapable: Callable[[str], RuntimeError] = (
    _native("checkpoint_incapable", "_checkpoint_incapable", _host_ccc, _host_cc)
    or _mirror_checkpoint_incapable
)


def active_memory_provider_label(agent: Any) -> str:
    """Comma-joined provider names, or the explicit ``"no active provider"`` sentinel."""
    memory_manager = getattr(agent, "_memory_manager", None)
    if memory_manager is None:
        return "no active provider"
    names: list[str] = []
    try:
        providers = list(getattr(memory_manager, "providers", None) or [])
    except TypeError:
        providers = []
    for provider in providers:
        name = getattr(provider, "name", None)
        if isinstance(name, str) and name.strip():
            names.append(name.strip())
    return ", ".join(names) if names else "no active provider"


def _mirror_warn_checkpoint_required(agent: Any) -> None:
    """Startup WARNING when the armed gate can never pass; never refuses init (#115394).

    Silent when the gate is off or a provider is capable; a raising capability probe is
    logged at DEBUG only, so a broken provider cannot crash agent construction.
    """
    if getattr(agent, "compression_checkpoint_required", False) is not True:
        return
    memory_manager = getattr(agent, "_memory_manager", None)
    if memory_manager is not None:
        supports = getattr(memory_manager, "supports_pre_compress_checkpoint", None)
        if callable(supports):
            try:
                if bool(supports(PRE_COMPRESS_CHECKPOINT_API_VERSION)):
                    return
            except Exception as exc:
                _cc_logger.debug(
                    "checkpoint-required capability probe failed; init continues: %s",
                    exc,
                    exc_info=True,
                )
                return
    _cc_logger.warning(
        "compression.checkpoint_required is enabled but the active memory provider (%s) "
        "does not implement checkpoint API v%s. Compress will fail closed. Recover by %s.",
        active_memory_provider_label(agent),
        PRE_COMPRESS_CHECKPOINT_API_VERSION,
        CHECKPOINT_REQUIRED_REMEDIATION,
    )


warn_checkpoint_required_without_capable_provider: Callable[[Any], None] = (
    _native(
        "warn_checkpoint_required_without_capable_provider",
        "_warn_checkpoint_required_without_capable_provider",
        _host_ccc,
        _host_cc,
    )
    or _mirror_warn_checkpoint_required
)


def is_persistence_isolated_fork(agent: Any) -> bool:
    """Background-review / ``/btw`` forks discard their transcript: nothing to checkpoint."""
    return (
        getattr(agent, "_persist_disabled", False) is True
        and getattr(agent, "_session_db", None) is None
    )


def _pre_compress_raw(agent: Any, messages: list, checkpoint_required: bool) -> str | None:
    """Run main's gate and the manager fan-out; return the unsanitized provider text."""
    if is_persistence_isolated_fork(agent):
        return None
    memory_manager = getattr(agent, "_memory_manager", None)
    evidence_messages = direct_messages_for_pre_compress_memory(messages)
    version = PRE_COMPRESS_CHECKPOINT_API_VERSION
    if checkpoint_required:
        supports = getattr(memory_manager, "supports_pre_compress_checkpoint", None)
        if memory_manager is None or not callable(supports):
            raise checkpoint_incapable(f"no active provider implements checkpoint API v{version}")
        try:
            compatible = bool(supports(version))
        except Exception as exc:
            raise checkpoint_blocked("provider capability probe failed") from exc
        if not compatible:
            raise checkpoint_incapable(
                f"active provider does not implement checkpoint API v{version}"
            )
        try:
            result = memory_manager.on_pre_compress(
                messages,
                evidence_messages=evidence_messages,
                require_checkpoint=True,
                checkpoint_api_version=version,
            )
        except Exception as exc:
            _cc_logger.warning("Required pre-compress checkpoint failed (%s)", type(exc).__name__)
            raise checkpoint_blocked(f"provider checkpoint API v{version} failed") from exc
        return result if isinstance(result, str) else None
    if memory_manager:
        try:
            result = memory_manager.on_pre_compress(messages, evidence_messages=evidence_messages)
        except Exception:
            _cc_logger.warning("Best-effort pre-compress memory hook failed", exc_info=True)
            return None
        return result if isinstance(result, str) else None
    return None


def _mirror_pre_compress_memory_context(
    agent: Any, messages: list, checkpoint_required: bool
) -> str:
    """Provider text for the summary prompt; raises when a required checkpoint cannot be taken
    (main's ``_pre_compress_memory_context``, #94639 with #115394's capability refusals).

    Order as on main: a persistence-isolated fork returns ``""`` (even when armed); the
    evidence is computed first; when armed, no manager / no capability method or a False
    probe is ``checkpoint_incapable``, a raising probe is ``checkpoint_blocked``, and any
    failure of ``on_pre_compress(..., require_checkpoint=True)`` is logged at WARNING and
    re-raised as ``checkpoint_blocked`` chained from the original. Unarmed, the call is best
    effort. A string result is passed through ``sanitize_memory_context``.
    """
    raw = _pre_compress_raw(agent, messages, checkpoint_required)
    return sanitize_memory_context(raw) if raw else ""


pre_compress_memory_context: Callable[[Any, list, bool], str] = (
    _native("pre_compress_memory_context", "_pre_compress_memory_context", _host_ccc, _host_cc)
    or _mirror_pre_compress_memory_context
)


class _PrecomputedPreCompress:
    """Stands in for the agent's manager during a delegated compress: the checkpoint already
    ran in the gate, so the host's own ``on_pre_compress`` call just gets its result."""

    def __init__(self, inner: Any, text: str) -> None:
        self._inner = inner
        self._text = text
        self.pre_compress_calls = 0

    def on_pre_compress(self, messages: Any, **_kwargs: Any) -> str:
        self.pre_compress_calls += 1
        return self._text

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def compress_context_v2(
    agent: Any,
    messages: list,
    system_message: str = "",
    *,
    approx_tokens: int | None = None,
    task_id: str = "default",
    focus_topic: str | None = None,
    force: bool = False,
    checkpoint_required: bool | None = None,
) -> tuple[list, str]:
    """``compress_context`` as on a v2 host: the checkpoint gate runs before the compressor.

    ``checkpoint_required`` defaults to ``agent.compression_checkpoint_required is True``. On
    refusal ``CompressionCheckpointUnavailable`` propagates, ``agent.context_compressor``
    is never called and ``messages`` is untouched; the attempt can simply be retried. On a
    0.19.0 host the agent's manager is upgraded in place (:func:`upgrade_memory_manager`),
    the gate runs, and the real ``agent.conversation_compression.compress_context`` does the
    rest with the checkpoint's text as ``memory_context``. On a native v2 host this is the
    host's own ``compress_context``.
    """
    if checkpoint_required is not None:
        agent.compression_checkpoint_required = bool(checkpoint_required)
    armed = getattr(agent, "compression_checkpoint_required", False) is True
    if NATIVE["pre_compress_memory_context"]:
        return _host_cc.compress_context(
            agent,
            messages,
            system_message,
            approx_tokens=approx_tokens,
            task_id=task_id,
            focus_topic=focus_topic,
            force=force,
        )
    manager = upgrade_memory_manager(getattr(agent, "_memory_manager", None))
    raw = _pre_compress_raw(agent, messages, armed)
    if manager is None:
        return _host_cc.compress_context(
            agent,
            messages,
            system_message,
            approx_tokens=approx_tokens,
            task_id=task_id,
            focus_topic=focus_topic,
            force=force,
        )
    proxy = _PrecomputedPreCompress(manager, raw or "")
    agent._memory_manager = proxy
    try:
        return _host_cc.compress_context(
            agent,
            messages,
            system_message,
            approx_tokens=approx_tokens,
            task_id=task_id,
            focus_topic=focus_topic,
            force=force,
        )
    finally:
        if agent._memory_manager is proxy:
            agent._memory_manager = manager


# ---------------------------------------------------------------------------
# Main's later provider surface (issue 17; docs/HOST.md §1-§4)
# ---------------------------------------------------------------------------


def _signature_params(fn: Callable[..., Any]) -> dict[str, inspect.Parameter] | None:
    """A callable's parameters, or None when it cannot be inspected (main: assume it accepts)."""
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


def _has_var_kwargs(params: dict[str, inspect.Parameter]) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def provider_sync_accepts(provider: Any, keyword: str) -> bool:
    """Main's ``_provider_sync_accepts`` (memory_manager [stored id 66030987327] ~47.5k)."""
    params = _signature_params(provider.sync_turn)
    return params is None or _has_var_kwargs(params) or keyword in params


#: main ``agent/redact.py`` [stored id 68292260048]: the fail-closed sentinel
REDACTION_UNAVAILABLE = "[redaction-unavailable]"


def redact_for_egress(text: str) -> str:
    """Main's egress scrub: the host redactor forced on, a bearer sweep, fail closed.

    ``redact_sensitive_text(force=True)`` is 0.19.0's; the sweep folds any bearer residue
    into ``Bearer [redacted]``; if the redactor raises, the whole text is the sentinel.
    """
    from agent import redact

    try:
        scrubbed = redact.redact_sensitive_text(text, force=True)
        return re.sub(
            r"\bBearer\s+(?:\[[^\]]+\]|[A-Za-z0-9._~+/-]{20,}=*)", "Bearer [redacted]", scrubbed
        )
    except Exception:
        return REDACTION_UNAVAILABLE


_TOKEN = re.compile(r"[A-Za-z0-9_\-./+]{16,}")


def scrub_for_provider(*values: Any) -> Any:
    """Main's ``_redact_for_provider`` (memory_manager.py@002b06468d29, the #115104 shape):
    copies of ``values`` with every string scrubbed by :func:`redact_for_egress`, walking
    dicts, lists and tuples; ``""`` and ``data:`` URLs pass through. A token the scrub
    masked anywhere in the hand-off is then replaced by ``[redacted]`` everywhere in it.
    Unchanged values come back as they are (identity). One value in, one out; several, a tuple.
    """
    learned: set[str] = set()

    def walk(value: Any, fix: Callable[[str], str]) -> Any:
        if isinstance(value, str):
            return value if not value or value.startswith("data:") else fix(value)
        if isinstance(value, dict):
            out = {k: walk(v, fix) for k, v in value.items()}
            return value if all(out[k] is value[k] for k in value) else out
        if isinstance(value, (list, tuple)):
            items = [walk(v, fix) for v in value]
            if all(new is old for new, old in zip(items, value, strict=True)):
                return value
            return tuple(items) if isinstance(value, tuple) else items
        return value

    def scrub(text: str) -> str:
        out = redact_for_egress(text)
        if out != text:
            learned.update(set(_TOKEN.findall(text)) - set(_TOKEN.findall(out)))
        return out

    scrubbed = [walk(v, scrub) for v in values]
    if learned:
        everywhere = re.compile(
            "|".join(re.escape(t) for t in sorted(learned, key=len, reverse=True))
        )
        scrubbed = [
            walk(v, lambda t: everywhere.sub("[redacted]", t) if everywhere.search(t) else t)
            for v in scrubbed
        ]
    return scrubbed[0] if len(scrubbed) == 1 else tuple(scrubbed)


class MainMemoryManager(V2MemoryManager):  # type: ignore[misc, valid-type]
    """The v2 manager plus what main hands providers since: authors, the hand-off scrub,
    signature-filtered ``on_turn_start`` kwargs, inspection-only init and the recall line.

    Each method mirrors agent/memory_manager.py@002b06468d29 (quoted in docs/HOST.md): every
    fan-out goes through :func:`scrub_for_provider` (turns and their transcript, the turn-start
    message, session-end rows, prefetch queries, tool arguments, memory mirrors, delegations).
    """

    def sync_all(  # type: ignore[override]
        self,
        user_content: str,
        assistant_content: str,
        *,
        session_id: str = "",
        messages: list[dict[str, Any]] | None = None,
        turn_author: dict[str, Any] | None = None,
    ) -> None:
        providers = list(self._providers)
        clean = self._strip_skill_scaffolding(user_content) if providers else None
        if not clean:
            return
        clean, assistant, rows = scrub_for_provider(clean, assistant_content, messages)
        optional = {"messages": rows, "turn_author": turn_author}

        def run() -> None:
            for provider in providers:
                kwargs: dict[str, Any] = {"session_id": session_id}
                for keyword, value in optional.items():
                    if value is not None and provider_sync_accepts(provider, keyword):
                        kwargs[keyword] = value
                try:
                    provider.sync_turn(clean, assistant, **kwargs)
                except Exception as exc:
                    _mm_logger.warning(
                        "Memory provider '%s' sync_turn failed: %s", provider.name, exc
                    )

        self._submit_background(run)

    def on_turn_start(self, turn_number: int, message: str, **kwargs: Any) -> None:
        """Kwargs filtered to each provider's signature (a legacy one still gets its tick)."""
        message = scrub_for_provider(message)
        for provider in self._providers:
            params = _signature_params(provider.on_turn_start)
            accepted = (
                kwargs
                if params is None or _has_var_kwargs(params)
                else {k: v for k, v in kwargs.items() if k in params}
            )
            try:
                provider.on_turn_start(turn_number, message, **accepted)
            except Exception as exc:
                _mm_logger.debug(
                    "Memory provider '%s' on_turn_start failed: %s", provider.name, exc
                )

    def on_session_end(self, messages: list[dict[str, Any]]) -> None:
        super().on_session_end(list(scrub_for_provider(messages or [])))

    def prefetch_all(self, query: str, *, session_id: str = "") -> str:
        clean = self._strip_skill_scaffolding(query)
        if not clean:
            return ""
        return str(super().prefetch_all(scrub_for_provider(clean), session_id=session_id))

    def handle_tool_call(self, tool_name: str, args: dict[str, Any], **kwargs: Any) -> str:
        return str(super().handle_tool_call(tool_name, scrub_for_provider(args), **kwargs))

    def on_memory_write(
        self, action: str, target: str, content: str, metadata: dict[str, Any] | None = None
    ) -> None:
        content, metadata = scrub_for_provider(content, dict(metadata or {}))
        super().on_memory_write(action, target, content, metadata=metadata)

    def on_delegation(
        self, task: str, result: str, *, child_session_id: str = "", **kwargs: Any
    ) -> None:
        task, result = scrub_for_provider(task, result)
        super().on_delegation(task, result, child_session_id=child_session_id, **kwargs)

    def shutdown_all(self) -> None:
        """Main's shutdown: drain the worker (bounded), then ``shutdown()`` each provider in
        reverse order, with no arguments: no timeout and no drain result reach a provider;
        ``shutdown_drain_state`` stays on the manager."""
        self._drain_sync_executor()
        for provider in reversed(self._providers):
            try:
                provider.shutdown()
            except Exception as exc:
                _mm_logger.warning("Memory provider '%s' shutdown failed: %s", provider.name, exc)

    def initialize_all_for_inspection(self, session_id: str, **kwargs: Any) -> None:
        """``initialize_for_inspection`` where a provider has it, else ``initialize``."""
        if "hermes_home" not in kwargs:
            from hermes_constants import get_hermes_home

            kwargs["hermes_home"] = str(get_hermes_home())
        for provider in self._providers:
            init = getattr(provider, "initialize_for_inspection", None) or provider.initialize
            try:
                init(session_id=session_id, **kwargs)
            except Exception as exc:
                _mm_logger.warning("Memory provider '%s' initialize failed: %s", provider.name, exc)

    def describe_recall(self) -> str:
        """Main's recall indicator line from each provider's ``recall_status()``."""
        segments: list[str] = []
        for provider in self._providers:
            try:
                status = provider.recall_status() if hasattr(provider, "recall_status") else None
            except Exception as exc:
                _mm_logger.debug("recall_status failed (non-fatal): %s", exc)
                continue
            if status is None:
                continue
            detail = (
                "recalled 1 memory"
                if status.count == 1
                else f"recalled {status.count} memories"
                if status.count > 1
                else "recalled relevant memory"
            )
            segments.append(f"{status.glyph} {status.provider_label} \u2014 {detail}")
        return "  ".join(segments)


def install_v2_host(agent: Any, *, checkpoint_required: bool | None = None) -> Any:
    """Make a real 0.19.0 ``AIAgent`` look like a v2 host: v2 manager, optional armed gate,
    and main's startup warning. Returns the agent."""
    upgrade_memory_manager(getattr(agent, "_memory_manager", None))
    if checkpoint_required is not None:
        agent.compression_checkpoint_required = bool(checkpoint_required)
    warn_checkpoint_required_without_capable_provider(agent)
    return agent


__all__ = [
    "BLOCKED_PREFIX",
    "CHECKPOINT_REQUIRED_REMEDIATION",
    "COMPRESSED_SUMMARY_METADATA_KEY",
    "HOST_HAS_CHECKPOINT_V2",
    "LEGACY_PRE_COMPRESS_API_VERSION",
    "MainMemoryManager",
    "REDACTION_UNAVAILABLE",
    "NATIVE",
    "PRE_COMPRESS_CHECKPOINT_API_VERSION",
    "CompressionCheckpointUnavailable",
    "V2MemoryManager",
    "accepts_require_checkpoint",
    "active_memory_provider_label",
    "checkpoint_api_version_of",
    "checkpoint_blocked",
    "checkpoint_incapable",
    "compress_context_v2",
    "direct_messages_for_pre_compress_memory",
    "install_v2_host",
    "is_persistence_isolated_fork",
    "pre_compress_memory_context",
    "provider_sync_accepts",
    "redact_for_egress",
    "redact_for_provider",
    "scrub_for_provider",
    "upgrade_memory_manager",
    "warn_checkpoint_required_without_capable_provider",
]

# Keep a handle on the host modules for tests that want to assert provenance.
HOST_MODULES = {"memory_manager": _host_mm, "memory_provider": _host_mp, "compression": _host_cc}
