"""`hermes hivemind ...`: the same commands as `hermes-archive`.

Hermes imports this file by path (never the package ``__init__``) for the active provider
when it finds the provider through the ``hermes_agent.memory_providers`` entry point.
"""

from archive_provider import archive_command, register_cli

hivemind_command = archive_command

__all__ = ["hivemind_command", "register_cli"]
