"""hermes-archive: an event-sourced, hash-chained archiving memory provider for Hermes Agent.

Hermes discovers this package as the memory provider ``archive`` (entry point group
``hermes_agent.memory_providers``, or a plugin folder written by ``hermes-archive install``);
``register(ctx)`` calls ``ctx.register_memory_provider()`` with a new provider each time.
"""

from .host.provider import ArchiveProvider, register

__all__ = ["ArchiveProvider", "register"]
__version__ = "0.1.0"
