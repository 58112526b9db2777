"""The event model: what a new event carries and what the store says about it (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from .canonical import canonical_bytes, decode
from .digests import Envelope, payload_digest

EVENT_TYPES = frozenset(
    {
        "session_started",
        "session_switched",
        "session_ended",
        "turn",
        "memory_write",
        "checkpoint",
        "checkpoint_failed",
        "recall_served",
        "delegation",
        "tool_call",
        "write_failed",
        "shutdown_drain",
        "spill_taken",
        "spill_accepted",
        "peer_seen",
        "peer_message_received",
        "peer_message_sent",
        "peer_send_failed",
        "peers_introduced",
        "spark_suggested",
        "spark_dismissed",
        "peer_summary_updated",
        "peer_message_undecryptable",
        "peer_invite_ignored",
        "peer_messages_read",
        "peer_sync_position",
        "peer_input_rejected",
        "peer_link_state",
        "witness_accepted",
        "witness_added",
        "witness_removed",
        "witness_refused",
        "peer_witness_refused",
        "turns_rewound",
        "store_created",
        "migrated_from",
        "erasure",
        "retention_policy",
        "legal_hold",
        "legal_hold_released",
    }
)

Outcome = Literal["appended", "already_archived"]


@dataclass(frozen=True)
class Part:
    """A payload stored apart from any one event (a message), content-addressed."""

    digest: str
    body: bytes
    salt: bytes | None = None  # v2: a salt drawn for a body not stored yet (FORMAT.md 12.3)
    lookup: bytes | None = None  # v2: the keyed lookup of the body


class Hasher:
    """Keyed payload digests for one store; builders use it to name parts and payloads."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def part(self, value: Any) -> Part:
        body = canonical_bytes(value)
        return Part(payload_digest(self._key, body), body)

    def digest(self, body: bytes) -> str:
        return payload_digest(self._key, body)


@dataclass(frozen=True)
class NewEvent:
    """An event before it is appended.

    ``key`` is what makes it *that* event (its identity is a digest of type and key);
    ``body`` is its payload; ``parts`` are payloads it refers to by digest (messages),
    stored once however many events name them.

    ``author`` is who wrote a turn, as the host stated it (``{"id", "name", "is_bot",
    "source", ...}``, docs/HOST.md §1), never part of the identity: the envelope's separate,
    erasable author payload (FORMAT.md 13.1).
    """

    type: str
    session: str
    key: Mapping[str, Any]
    body: Any
    parts: tuple[Part, ...] = field(default=())
    author: Part | None = None  # v2: the turn's author payload (FORMAT.md 13.1)

    def __post_init__(self) -> None:
        if self.type not in EVENT_TYPES:
            raise ValueError(f"unknown event type {self.type!r}")


@dataclass(frozen=True)
class AppendResult:
    outcome: Outcome
    seq: int
    identity: str
    type: str


@dataclass(frozen=True)
class StoredEvent:
    """An event as read back from the log: its envelope and its decoded payload."""

    envelope: Envelope
    chain: str
    body_bytes: bytes

    @property
    def seq(self) -> int:
        return self.envelope.seq

    @property
    def type(self) -> str:
        return self.envelope.type

    @property
    def session(self) -> str:
        return self.envelope.session

    @property
    def time(self) -> str:
        return self.envelope.time

    @property
    def body(self) -> Any:
        return decode(self.body_bytes)

    @property
    def key(self) -> Any:
        return decode(self.envelope.key)

    @property
    def part_digests(self) -> list[str]:
        return list(decode(self.envelope.parts))

    @property
    def messages(self) -> list[str]:
        """A turn's message digests: its body's ``messages`` (format 1, migrated events),
        else its parts in order (a v2 turn names its messages by position, FORMAT.md 13.4)."""
        return turn_messages(self.body, self.part_digests)

    @property
    def author_digest(self) -> str | None:
        """A turn's author payload: the envelope's (v2, 13.1), or the part its body names (v1)."""
        if self.envelope.author is not None:
            return self.envelope.author
        body = self.body
        named = body.get("author") if isinstance(body, Mapping) else None
        return named if isinstance(named, str) else None


def turn_messages(body: Any, parts: list[str]) -> list[str]:
    """The message digests of a turn with this body and these parts (FORMAT.md 13.4): the
    body's ``messages`` where it has them, else the parts, which are the messages in order."""
    listed = body.get("messages") if isinstance(body, Mapping) else None
    if isinstance(listed, list):
        return [d for d in listed if isinstance(d, str)]
    return list(parts)


@dataclass(frozen=True)
class LoadedEvent(StoredEvent):
    """A stored event with the bodies of its parts, as the replay streams them.

    Its body is decoded once, however many projections read it.
    """

    parts: Mapping[str, bytes] = field(default_factory=dict)

    @cached_property
    def body(self) -> Any:
        return decode(self.body_bytes)
