"""hermes-archive: an event-sourced, hash-chained archiving memory provider for Hermes Agent.

Hermes discovers this package as the memory provider ``archive`` (entry point group
``hermes_agent.memory_providers``, or a plugin folder written by ``hermes-archive install``);
``register(ctx)`` calls ``ctx.register_memory_provider()`` with a new provider each time.

The names below are the package's public API: what ``hivemind`` (and any other package
built on the archive) may import, always as ``from archive_provider import NAME``. They
are loaded on first use, so ``import archive_provider`` costs nothing (every CLI call and
every host start imports it); the provider, and hermes-agent with it, load only when
``ArchiveProvider`` or ``register`` is first touched. docs/DESIGN.md says which layer
each comes from.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

#: public name -> the module that defines it
_EXPORTS = {
    # errors: one root, subclasses by what the caller can do
    "ArchiveError": "archive_provider.errors",
    "ArchiveBusy": "archive_provider.errors",
    "ArchiveDamaged": "archive_provider.errors",
    "ArchiveNotWritable": "archive_provider.errors",
    "ArchiveUnavailable": "archive_provider.errors",
    "InvalidRequest": "archive_provider.errors",
    "UsageError": "archive_provider.errors",
    # format: encoding, digests, the event model, verification
    "INT_MAX": "archive_provider.format.canonical",
    "canonical_bytes": "archive_provider.format.canonical",
    "canonical_text": "archive_provider.format.canonical",
    "decode": "archive_provider.format.canonical",
    "identity_digest": "archive_provider.format.digests",
    "AppendResult": "archive_provider.format.events",
    "Hasher": "archive_provider.format.events",
    "NewEvent": "archive_provider.format.events",
    "Part": "archive_provider.format.events",
    "StoredEvent": "archive_provider.format.events",
    "verify_database": "archive_provider.format.verifier",
    # domain
    "with_redactions": "archive_provider.domain.builders",
    "format_time": "archive_provider.domain.clock",
    "now_text": "archive_provider.domain.clock",
    "parse_time": "archive_provider.domain.clock",
    "utc_now": "archive_provider.domain.clock",
    "one_line": "archive_provider.domain.fence",
    "archivable_text": "archive_provider.domain.evidence",
    "bindable_text": "archive_provider.domain.evidence",
    "redact_value": "archive_provider.domain.redaction",
    # storage
    "DB_NAME": "archive_provider.storage.store",
    "EventStore": "archive_provider.storage.store",
    "archive_dir": "archive_provider.storage.store",
    "connect": "archive_provider.storage.store",
    "part_body": "archive_provider.storage.store",
    "InsideProfile": "archive_provider.storage.outside",
    "WITNESS_PEERS_ENV": "archive_provider.storage.outside",
    "ignored_in_profile": "archive_provider.storage.outside",
    "outside_value": "archive_provider.storage.outside",
    # witnesses: the peers that cosign each other, and the log's remote witness set
    "PeerAnswer": "archive_provider.witnesses.peer",
    "PeerWitness": "archive_provider.witnesses.peer",
    "accept_cosignature": "archive_provider.witnesses.peer",
    "checkpoint_request": "archive_provider.witnesses.peer",
    "cosigned_size": "archive_provider.witnesses.peer",
    "refusal_checks": "archive_provider.witnesses.peer",
    "witness_added": "archive_provider.witnesses.remote",
    "witness_refused": "archive_provider.witnesses.remote",
    "witness_set": "archive_provider.witnesses.remote",
    # projections
    "TableProjection": "archive_provider.projections.base",
    "recall_echo_cut": "archive_provider.projections.recall",
    # host: the provider, its glue, and the CLI door hermes wires as `hermes <provider>`
    "archive_command": "archive_provider.cli",
    "register_cli": "archive_provider.cli",
    "ArchiveProvider": "archive_provider.host.provider",
    "register": "archive_provider.host.provider",
    "register_provider": "archive_provider.host.provider",
    "get_secret": "archive_provider.host.hermes",
    "HostLLMReply": "archive_provider.host.hermes",
    "call_host_llm": "archive_provider.host.hermes",
    "spawn_thread": "archive_provider.host.hermes",
    "load_tool_schema": "archive_provider.host.schemas",
    "Settings": "archive_provider.host.settings",
    "config_path": "archive_provider.host.settings",
    "save_settings": "archive_provider.host.settings",
    # demo
    "DemoRefused": "archive_provider.demo.demo",
    "demo_home": "archive_provider.demo.demo",
}

__all__ = [
    "AppendResult",
    "ArchiveBusy",
    "ArchiveDamaged",
    "ArchiveError",
    "ArchiveNotWritable",
    "ArchiveProvider",
    "ArchiveUnavailable",
    "DB_NAME",
    "DemoRefused",
    "EventStore",
    "Hasher",
    "HostLLMReply",
    "INT_MAX",
    "InsideProfile",
    "InvalidRequest",
    "NewEvent",
    "Part",
    "PeerAnswer",
    "PeerWitness",
    "Settings",
    "StoredEvent",
    "TableProjection",
    "UsageError",
    "WITNESS_PEERS_ENV",
    "accept_cosignature",
    "archivable_text",
    "archive_command",
    "archive_dir",
    "bindable_text",
    "call_host_llm",
    "canonical_bytes",
    "canonical_text",
    "checkpoint_request",
    "config_path",
    "connect",
    "cosigned_size",
    "decode",
    "demo_home",
    "format_time",
    "get_secret",
    "identity_digest",
    "ignored_in_profile",
    "load_tool_schema",
    "now_text",
    "one_line",
    "outside_value",
    "parse_time",
    "part_body",
    "recall_echo_cut",
    "redact_value",
    "refusal_checks",
    "register",
    "register_cli",
    "register_provider",
    "save_settings",
    "spawn_thread",
    "utc_now",
    "verify_database",
    "with_redactions",
    "witness_added",
    "witness_refused",
    "witness_set",
]


def __getattr__(name: str) -> Any:
    """Load a public name from its module the first time it is asked for (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'archive_provider' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


if TYPE_CHECKING:  # the same names, for type checkers and the import contracts
    from .cli import archive_command, register_cli
    from .demo.demo import DemoRefused, demo_home
    from .domain.builders import with_redactions
    from .domain.clock import format_time, now_text, parse_time, utc_now
    from .domain.evidence import archivable_text, bindable_text
    from .domain.fence import one_line
    from .domain.redaction import redact_value
    from .errors import (
        ArchiveBusy,
        ArchiveDamaged,
        ArchiveError,
        ArchiveNotWritable,
        ArchiveUnavailable,
        InvalidRequest,
        UsageError,
    )
    from .format.canonical import INT_MAX, canonical_bytes, canonical_text, decode
    from .format.digests import identity_digest
    from .format.events import AppendResult, Hasher, NewEvent, Part, StoredEvent
    from .format.verifier import verify_database
    from .host.hermes import HostLLMReply, call_host_llm, get_secret, spawn_thread
    from .host.provider import ArchiveProvider, register, register_provider
    from .host.schemas import load_tool_schema
    from .host.settings import Settings, config_path, save_settings
    from .projections.base import TableProjection
    from .projections.recall import recall_echo_cut
    from .storage.outside import (
        WITNESS_PEERS_ENV,
        InsideProfile,
        ignored_in_profile,
        outside_value,
    )
    from .storage.store import DB_NAME, EventStore, archive_dir, connect, part_body
    from .witnesses.peer import (
        PeerAnswer,
        PeerWitness,
        accept_cosignature,
        checkpoint_request,
        cosigned_size,
        refusal_checks,
    )
    from .witnesses.remote import witness_added, witness_refused, witness_set
