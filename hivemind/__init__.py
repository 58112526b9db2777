"""hivemind: peer awareness between Hermes agents over Matrix, archived in the same event log.

Hermes discovers this package as the memory provider ``hivemind`` (entry point group
``hermes_agent.memory_providers``, or a plugin folder written by ``hermes-archive install
hivemind``). ``register(ctx)`` calls ``ctx.register_memory_provider()`` with a new
:class:`HivemindProvider` each time (one provider per profile); nothing opens, connects or
starts before ``initialize()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .provider import HivemindProvider

__all__ = ["HivemindProvider", "register"]


def register(ctx: Any) -> None:
    """Plugin entry: a new provider per registration (profile isolation) and its hooks."""
    from archive_provider import register_provider

    from .provider import HivemindProvider

    register_provider(ctx, HivemindProvider())


def __getattr__(name: str) -> Any:
    """``HivemindProvider`` on first use: the archive loads ``hivemind.peers`` (the peers
    projection, an entry point) in commands such as ``status``, which must not import the
    host that the provider is built on."""
    if name == "HivemindProvider":
        from .provider import HivemindProvider

        return HivemindProvider
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
