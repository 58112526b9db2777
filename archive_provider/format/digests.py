"""Digest domains, the envelope and the chain rule (docs/FORMAT.md sections 3-5).

Every digest is BLAKE3 over a domain-separation prefix followed by canonical bytes, so a
digest of one kind can never be passed off as a digest of another kind. Payload digests
use BLAKE3's keyed mode with the store's random key: after an erasure the digest left
behind cannot confirm a guessed text, and the same text has another digest in another
profile's store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from blake3 import blake3

from .canonical import canonical_text, decode, encode_text

FORMAT_VERSION = 1
DOMAIN_IDENTITY = b"hermes-archive/v1/identity\x00"
DOMAIN_PAYLOAD = b"hermes-archive/v1/payload\x00"
DOMAIN_CHAIN = b"hermes-archive/v1/chain\x00"
DOMAIN_GENESIS = b"hermes-archive/v1/genesis\x00"
KEY_BYTES = 32


def payload_digest(key: bytes, body: bytes) -> str:
    """Keyed digest of a payload's canonical bytes, as lowercase hex."""
    return blake3(DOMAIN_PAYLOAD + body, key=key).hexdigest()


def identity_digest(event_type: str, identity_key: Any) -> str:
    """Digest of what makes an event *that* event: its type and its identity key."""
    return identity_of_key_text(event_type, canonical_text(identity_key))


def identity_of_key_text(event_type: str, key: str) -> str:
    """The identity from the key's canonical text (equal to canonical({"key", "type"}))."""
    document = '{"key":' + key + ',"type":' + encode_text(event_type) + "}"
    return blake3(DOMAIN_IDENTITY + document.encode("utf-8")).hexdigest()


def genesis_chain(store_id: str) -> str:
    """The chain value before the first event: binds the chain to one store."""
    return blake3(DOMAIN_GENESIS + store_id.encode("ascii")).hexdigest()


@dataclass(frozen=True)
class Envelope:
    """The chained record of one event; the chain commits to every field."""

    seq: int
    time: str
    type: str
    session: str
    key: str  # canonical text of the identity key
    identity: str
    payload: str
    parts: str  # canonical text of the list of part digests
    author: str | None = None  # v2: the author payload's digest (FORMAT.md 13.1)
    version: int = FORMAT_VERSION  # 2: the nine-member v2 envelope

    def canonical(self) -> bytes:
        """Canonical bytes of the envelope; equals canonical_bytes(self.as_value())."""
        # Built by concatenation (keys already sorted) because verify runs this per event.
        if self.version == 2:
            author = "null" if self.author is None else '"' + self.author + '"'
            start = '{"author":' + author + ',"identity":"'
        else:
            start = '{"identity":"'
        return (
            start
            + self.identity
            + '","key":'
            + self.key
            + ',"parts":'
            + self.parts
            + ',"payload":"'
            + self.payload
            + '","seq":'
            + str(self.seq)
            + ',"session":'
            + encode_text(self.session)
            + ',"time":'
            + encode_text(self.time)
            + ',"type":'
            + encode_text(self.type)
            + "}"
        ).encode("utf-8")

    def as_value(self) -> dict[str, Any]:
        value: dict[str, Any] = {"author": self.author} if self.version == 2 else {}
        return value | {
            "identity": self.identity,
            "key": decode(self.key),
            "parts": decode(self.parts),
            "payload": self.payload,
            "seq": self.seq,
            "session": self.session,
            "time": self.time,
            "type": self.type,
        }


def chain_hash(previous: str, envelope: Envelope) -> str:
    """Chain value of ``envelope``: BLAKE3 over the previous chain value and the envelope."""
    return blake3(DOMAIN_CHAIN + bytes.fromhex(previous) + envelope.canonical()).hexdigest()


def parts_text(part_digests: Sequence[str]) -> str:
    """Canonical text of the list of part digests (letters and digits need no escaping)."""
    if all(type(d) is str for d in part_digests) and "".join(part_digests).isalnum():
        return '["' + '","'.join(part_digests) + '"]'
    return canonical_text(list(part_digests))


def key_text(identity_key: Mapping[str, Any]) -> str:
    return canonical_text(identity_key)
