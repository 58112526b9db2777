"""Format v2 digests, envelope, chain, tiles and checkpoint (FORMAT.md 11, 13-15) vs vectors.

tests/vectors/chain_v2.json is frozen. Each value is recomputed twice: by an independent
oracle written here from the text of FORMAT.md (blake3, hashlib and json only) and by the
package (format/digests_v2.py, the v2 Envelope), so a change to either is caught.
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from blake3 import blake3
from hypothesis import given
from hypothesis import strategies as st

from archive_provider.format import digests_v2, merkle
from archive_provider.format.canonical import canonical_bytes, canonical_text
from archive_provider.format.digests import Envelope
from archive_provider.format.signed_note import Verifier, open_checkpoint

HERE = Path(__file__).parent / "vectors"
VECTORS = json.loads((HERE / "chain_v2.json").read_text(encoding="utf-8"))
EVENTS: list[dict[str, Any]] = VECTORS["events"]
STORE_KEY = bytes.fromhex(VECTORS["store_key_hex"])


def _json(value: Any) -> bytes:
    """The oracle's canonical bytes for the plain values of these vectors (no floats)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def test_domains_are_the_documented_v2_prefixes() -> None:
    expected = {
        name: f"hermes-archive/v2/{name}\x00".encode()
        for name in ("identity", "payload", "lookup", "chain", "genesis")
    }
    assert {n: bytes.fromhex(v) for n, v in VECTORS["domains_hex"].items()} == expected
    assert expected["lookup"] == digests_v2.DOMAIN_LOOKUP
    assert expected["payload"] == digests_v2.DOMAIN_PAYLOAD


def test_genesis() -> None:
    oracle = blake3(b"hermes-archive/v2/genesis\x00" + VECTORS["store_id"].encode()).hexdigest()
    assert VECTORS["genesis"] == oracle == digests_v2.genesis(VECTORS["store_id"]).hex()


@pytest.mark.parametrize("event", EVENTS, ids=[f"{e['seq']}-{e['type']}" for e in EVENTS])
def test_event_digests(event: dict[str, Any]) -> None:
    payloads = [*event["parts"], *([event["author"]] if event["author"] else [])]
    for entry in payloads:
        data = bytes.fromhex(entry["canonical_hex"])
        assert data == _json(entry["value"]) == canonical_bytes(entry["value"])
        salt = bytes.fromhex(entry["salt"])
        oracle = blake3(b"hermes-archive/v2/payload\x00" + salt + data).hexdigest()
        assert entry["digest"] == oracle == digests_v2.payload_digest(salt, data).hex()
        lookup = blake3(b"hermes-archive/v2/lookup\x00" + data, key=STORE_KEY).digest()[:16]
        assert entry["lookup"] == lookup.hex() == digests_v2.lookup(STORE_KEY, data).hex()
    body = bytes.fromhex(event["body_canonical_hex"])
    assert body == _json(event["body"])
    salt = bytes.fromhex(event["body_salt"])
    assert event["payload"] == blake3(b"hermes-archive/v2/payload\x00" + salt + body).hexdigest()
    digests = [p["digest"] for p in event["parts"]]
    identity_input = _json(
        {"key": event["key"], "parts": digests, "session": event["session"], "type": event["type"]}
    )
    assert identity_input.decode() == event["identity_input"]
    assert (
        event["identity"] == blake3(b"hermes-archive/v2/identity\x00" + identity_input).hexdigest()
    )
    key = canonical_text(event["key"])
    assert key == event["key_canonical"]
    parts_text = canonical_text(digests)
    assert (
        digests_v2.identity(event["type"], event["session"], key, parts_text).hex()
        == event["identity"]
    )
    assert digests_v2.parts_blob(parts_text).hex() == event["parts_blob_hex"]
    assert digests_v2.parts_from_blob(bytes.fromhex(event["parts_blob_hex"])) == parts_text


def test_envelopes_chain_and_tree() -> None:
    previous = bytes.fromhex(VECTORS["genesis"])
    compact = merkle.CompactRange()
    for event in EVENTS:
        author = event["author"]["digest"] if event["author"] else None
        oracle = _json(
            {
                "author": author,
                "identity": event["identity"],
                "key": event["key"],
                "parts": [p["digest"] for p in event["parts"]],
                "payload": event["payload"],
                "seq": event["seq"],
                "session": event["session"],
                "time": event["time"],
                "type": event["type"],
            }
        )
        envelope = Envelope(
            event["seq"],
            event["time"],
            event["type"],
            event["session"],
            event["key_canonical"],
            event["identity"],
            event["payload"],
            event["parts_canonical"],
            author,
            2,
        )
        assert oracle.decode() == event["envelope_text"]
        assert envelope.canonical() == oracle
        assert event["previous_chain"] == previous.hex()
        previous = blake3(b"hermes-archive/v2/chain\x00" + previous + oracle).digest()
        assert (
            event["chain"]
            == previous.hex()
            == digests_v2.chain_hash(bytes.fromhex(event["previous_chain"]), envelope).hex()
        )
        leaf = hashlib.sha256(b"\x00" + oracle).digest()
        assert event["leaf_hash"] == leaf.hex()
        compact.append(leaf)
    head = VECTORS["head"]
    assert head == {"seq": len(EVENTS), "chain": previous.hex(), "root": compact.root().hex()}
    leaves = b"".join(bytes.fromhex(e["leaf_hash"]) for e in EVENTS)
    assert VECTORS["tiles"] == [{"level": 0, "index": 0, "hashes_hex": leaves.hex()}]


def test_checkpoint_is_signed_by_the_test_log_key() -> None:
    verifier = Verifier.from_vkey(VECTORS["log_vkey"])
    checkpoint, _, _ = open_checkpoint(VECTORS["checkpoint"], verifier)
    assert checkpoint.origin == f"hermes-archive.invalid/{VECTORS['store_id']}"
    assert checkpoint.size == VECTORS["head"]["seq"]
    assert base64.b64encode(checkpoint.root).decode() in VECTORS["checkpoint"]
    assert checkpoint.root.hex() == VECTORS["head"]["root"]


def test_an_uppercase_digest_is_another_text() -> None:
    """Digests inside canonical bytes are lowercase hex: uppercase gives another identity."""
    event = EVENTS[1]
    upper = canonical_text([p["digest"].upper() for p in event["parts"]])
    other = digests_v2.identity(event["type"], event["session"], event["key_canonical"], upper)
    assert other.hex() != event["identity"]


def test_the_generator_still_makes_the_frozen_file() -> None:
    sys.path.insert(0, str(HERE))
    try:
        import make_vectors_v2
    finally:
        sys.path.remove(str(HERE))
    assert json.loads(json.dumps(make_vectors_v2.make_chain_v2())) == VECTORS


@given(st.lists(st.binary(min_size=32, max_size=32), max_size=20))
def test_parts_blob_round_trip(digests: list[bytes]) -> None:
    text = canonical_text([d.hex() for d in digests])
    assert digests_v2.parts_blob(text) == b"".join(digests)
    assert digests_v2.parts_from_blob(b"".join(digests)) == text
