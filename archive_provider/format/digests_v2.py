"""Format version 2: domains, salted payload commitments, identity, envelope, chain.

docs/FORMAT.md sections 11 and 13. Digests are raw 32 bytes here (the database stores them
as BLOBs); inside canonical bytes (envelope, identity input, bodies) they are 64 lowercase
hex characters. Payload commitments are salted with a random salt per stored payload, so an
erased body (body and salt deleted) can be confirmed by nobody, key holder included; the
keyed *lookup* only lets the writer find the salt of a body it still stores.
"""

from __future__ import annotations

import secrets

from blake3 import blake3

from .canonical import encode_text
from .digests import Envelope

FORMAT_VERSION = 2
DOMAIN_IDENTITY = b"hermes-archive/v2/identity\x00"
DOMAIN_PAYLOAD = b"hermes-archive/v2/payload\x00"
DOMAIN_LOOKUP = b"hermes-archive/v2/lookup\x00"
DOMAIN_CHAIN = b"hermes-archive/v2/chain\x00"
DOMAIN_GENESIS = b"hermes-archive/v2/genesis\x00"
DIGEST_BYTES = 32
SALT_BYTES = 32
LOOKUP_BYTES = 16


def new_salt() -> bytes:
    """A fresh random salt: one per stored payload (FORMAT.md 12.1)."""
    return secrets.token_bytes(SALT_BYTES)


def payload_digest(salt: bytes, body: bytes) -> bytes:
    """The salted commitment to a payload's canonical bytes."""
    return blake3(DOMAIN_PAYLOAD + salt + body).digest()


def lookup(store_key: bytes, body: bytes) -> bytes:
    """The keyed lookup by which the writer finds a stored part's salt (16 bytes)."""
    return blake3(DOMAIN_LOOKUP + body, key=store_key).digest()[:LOOKUP_BYTES]


def identity(event_type: str, session: str, key: str, parts: str) -> bytes:
    """What makes an event *that* event: type, session, identity key and part list (texts)."""
    document = (
        '{"key":'
        + key
        + ',"parts":'
        + parts
        + ',"session":'
        + encode_text(session)
        + ',"type":'
        + encode_text(event_type)
        + "}"
    )
    return blake3(DOMAIN_IDENTITY + document.encode("utf-8")).digest()


def genesis(store_id: str) -> bytes:
    return blake3(DOMAIN_GENESIS + store_id.encode("ascii")).digest()


def chain_hash(previous: bytes, envelope: Envelope) -> bytes:
    """The v2 chain value of ``envelope`` (its ``version`` must be 2)."""
    return chain_of(previous, envelope.canonical())


def chain_of(previous: bytes, canonical: bytes) -> bytes:
    """The v2 chain value of an envelope from its canonical bytes (an append has them for
    the Merkle leaf already)."""
    return blake3(DOMAIN_CHAIN + previous + canonical).digest()


def parts_blob(parts_text: str) -> bytes:
    """The ``parts`` column (32·k bytes) of a canonical list of hex digests."""
    return bytes.fromhex(parts_text[2:-2].replace('","', "")) if parts_text != "[]" else b""


def parts_from_blob(blob: bytes) -> str:
    """The canonical list text of a ``parts`` column (lowercase hex)."""
    return "[" + ",".join(f'"{blob[i : i + 32].hex()}"' for i in range(0, len(blob), 32)) + "]"


def envelope_of_row(
    seq: int,
    time: str,
    type_: str,
    session: str,
    key: str,
    identity: bytes,
    payload: bytes,
    parts: bytes,
    author: bytes | None,
) -> Envelope:
    """The envelope of a v2 ``events`` row, whose digests are stored as bytes (FORMAT.md 17)."""
    return Envelope(
        int(seq),
        str(time),
        str(type_),
        str(session),
        str(key),
        bytes(identity).hex(),
        bytes(payload).hex(),
        parts_from_blob(bytes(parts)),
        None if author is None else bytes(author).hex(),
        FORMAT_VERSION,
    )


def origin(store_id: str) -> str:
    """The checkpoint origin and signing key name of a store (FORMAT.md 15.1)."""
    return f"hermes-archive.invalid/{store_id}"
