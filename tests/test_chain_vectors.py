"""Digest domains, envelope and chain (docs/FORMAT.md sections 3-5) against frozen vectors.

The package (digests.py) and the standalone verifier (its own envelope and identity
encoding) are each checked against tests/vectors/chain.json. The verifier's row checks are
exercised without a database (verify_rows is sans-I/O); one test writes the same events
with tests/v1_writer.py (format 1's only writer since 0.2.0, which makes migrate's inputs)
and compares the rows it wrote.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from blake3 import blake3

from archive_provider.format import verifier
from archive_provider.format.canonical import canonical_bytes
from archive_provider.format.digests import (
    DOMAIN_CHAIN,
    DOMAIN_GENESIS,
    DOMAIN_IDENTITY,
    DOMAIN_PAYLOAD,
    Envelope,
    chain_hash,
    genesis_chain,
    identity_digest,
    key_text,
    parts_text,
    payload_digest,
)
from archive_provider.format.events import Hasher
from tests.v1_writer import V1Event, write_v1_log

VECTORS = json.loads((Path(__file__).parent / "vectors" / "chain.json").read_text(encoding="utf-8"))
KEY = bytes.fromhex(VECTORS["payload_key_hex"])
STORE_ID = VECTORS["store_id"]
EVENTS: list[dict[str, Any]] = VECTORS["events"]


def _ids(events: list[dict[str, Any]]) -> list[str]:
    return [f"{event['seq']}-{event['type']}" for event in events]


def test_domains_are_the_documented_prefixes() -> None:
    """The exact prefixes, NUL included: changing one is a new format version."""
    expected = {
        "identity": b"hermes-archive/v1/identity\x00",
        "payload": b"hermes-archive/v1/payload\x00",
        "chain": b"hermes-archive/v1/chain\x00",
        "genesis": b"hermes-archive/v1/genesis\x00",
    }
    assert {
        name: bytes.fromhex(value) for name, value in VECTORS["domains_hex"].items()
    } == expected
    assert tuple(expected.values()) == (
        DOMAIN_IDENTITY,
        DOMAIN_PAYLOAD,
        DOMAIN_CHAIN,
        DOMAIN_GENESIS,
    )
    assert tuple(expected.values()) == (
        verifier.DOMAIN_IDENTITY,
        verifier.DOMAIN_PAYLOAD,
        verifier.DOMAIN_CHAIN,
        verifier.DOMAIN_GENESIS,
    )


def test_genesis() -> None:
    expected = blake3(b"hermes-archive/v1/genesis\x00" + STORE_ID.encode("ascii")).hexdigest()
    assert VECTORS["genesis"] == expected == genesis_chain(STORE_ID) == verifier.genesis(STORE_ID)
    assert EVENTS[0]["previous_chain"] == expected


def test_vectors_cover_parts_shared_parts_and_escaped_session() -> None:
    assert any(event["parts"] for event in EVENTS)
    digests = [part["digest"] for event in EVENTS for part in event["parts"]]
    assert len(digests) > len(set(digests))  # a part named by two events
    assert any('"' in event["session"] and "\t" in event["session"] for event in EVENTS)
    assert [event["seq"] for event in EVENTS] == list(range(1, len(EVENTS) + 1))


@pytest.mark.parametrize("event", EVENTS, ids=_ids(EVENTS))
def test_package_matches_vector(event: dict[str, Any]) -> None:
    body = bytes.fromhex(event["body_canonical_hex"])
    assert canonical_bytes(event["body"]) == body
    assert payload_digest(KEY, body) == event["payload"]
    assert key_text(event["key"]) == event["key_canonical"]
    assert identity_digest(event["type"], event["key"]) == event["identity"]
    for part in event["parts"]:
        made = Hasher(KEY).part(part["value"])
        assert (made.body.hex(), made.digest) == (part["canonical_hex"], part["digest"])
    assert parts_text([part["digest"] for part in event["parts"]]) == event["parts_canonical"]
    envelope = _envelope(event)
    assert envelope.canonical().hex() == event["envelope_hex"]
    assert canonical_bytes(envelope.as_value()) == envelope.canonical()
    assert chain_hash(event["previous_chain"], envelope) == event["chain"]


@pytest.mark.parametrize("event", EVENTS, ids=_ids(EVENTS))
def test_verifier_matches_vector(event: dict[str, Any]) -> None:
    """The verifier's independent encoding gives the same identity, envelope and chain."""
    envelope = verifier.envelope_bytes(*_row(event)[:8])
    assert envelope.hex() == event["envelope_hex"]
    assert verifier.identity_of(event["type"], event["key_canonical"]) == event["identity"]
    chain = blake3(verifier.DOMAIN_CHAIN + bytes.fromhex(event["previous_chain"]) + envelope)
    assert chain.hexdigest() == event["chain"]
    body = bytes.fromhex(event["body_canonical_hex"])
    assert blake3(verifier.DOMAIN_PAYLOAD + body, key=KEY).hexdigest() == event["payload"]


def test_identity_is_over_type_and_key_only() -> None:
    """Identity = BLAKE3(domain || canonical({"key":..., "type":...})), unkeyed."""
    event = EVENTS[1]
    data = (
        b'{"key":' + event["key_canonical"].encode() + b',"type":"' + event["type"].encode() + b'"}'
    )
    assert blake3(DOMAIN_IDENTITY + data).hexdigest() == event["identity"]


def test_payload_digest_is_keyed() -> None:
    """Without the store's key the digest of a known text cannot be confirmed (erasure)."""
    body = bytes.fromhex(EVENTS[2]["body_canonical_hex"])
    assert blake3(DOMAIN_PAYLOAD + body).hexdigest() != EVENTS[2]["payload"]
    assert payload_digest(bytes(32), body) != EVENTS[2]["payload"]


# -- verify_rows over the vectors (pure) ---------------------------------------------------


def _envelope(event: dict[str, Any]) -> Envelope:
    return Envelope(
        event["seq"],
        event["time"],
        event["type"],
        event["session"],
        event["key_canonical"],
        event["identity"],
        event["payload"],
        event["parts_canonical"],
    )


def _row(event: dict[str, Any]) -> tuple[Any, ...]:
    return (
        event["seq"],
        event["time"],
        event["type"],
        event["session"],
        event["key_canonical"],
        event["identity"],
        event["payload"],
        event["parts_canonical"],
        event["chain"],
    )


def _payloads() -> dict[str, bytes]:
    bodies = {event["payload"]: bytes.fromhex(event["body_canonical_hex"]) for event in EVENTS}
    for event in EVENTS:
        bodies.update(
            {part["digest"]: bytes.fromhex(part["canonical_hex"]) for part in event["parts"]}
        )
    return bodies


def _verify(rows: list[tuple[Any, ...]], payloads: dict[str, bytes] | None = None, **kw: Any):
    payloads = _payloads() if payloads is None else payloads
    head = kw.pop("head", (VECTORS["head"]["seq"], VECTORS["head"]["chain"]))
    return verifier.verify_rows(
        rows, store_id=STORE_ID, key=KEY, payload_of=payloads.get, head=head, **kw
    )


def test_verify_rows_accepts_the_vector_log() -> None:
    report = _verify([_row(event) for event in EVENTS])
    assert report.ok, report.problem
    assert report.events_checked == len(EVENTS)
    assert report.payloads_checked == len(_payloads())  # each shared part checked once


def test_verify_rows_from_a_midpoint() -> None:
    """A partial export can be checked from any point of the chain (``start``)."""
    start = (EVENTS[1]["seq"], EVENTS[1]["chain"])
    report = _verify([_row(event) for event in EVENTS[2:]], start=start)
    assert report.ok, report.problem


def _tampered(seq: int, column: int, value: Any) -> list[tuple[Any, ...]]:
    rows = [list(_row(event)) for event in EVENTS]
    rows[seq - 1][column] = value
    return [tuple(row) for row in rows]


@pytest.mark.parametrize(
    ("column", "value", "problem"),
    [
        (1, "2026-01-02T03:04:06.100001Z", "chain hash"),
        (2, "session_ended", "identity"),
        (3, "sess-β", "chain hash"),
        (4, '{"session":"sess-β"}', "identity"),
        (7, EVENTS[1]["parts_canonical"], "chain hash"),  # real parts, not this event's
        (8, "0" * 64, "chain hash"),
    ],
)
def test_verify_rows_names_a_changed_field(column: int, value: Any, problem: str) -> None:
    report = _verify(_tampered(3, column, value))
    assert not report.ok
    assert report.first_bad_seq == 3
    assert problem in (report.problem or "")


def test_verify_rows_names_a_swapped_payload() -> None:
    payloads = _payloads()
    first, second = EVENTS[0]["payload"], EVENTS[2]["payload"]
    payloads[first], payloads[second] = payloads[second], payloads[first]
    report = _verify([_row(event) for event in EVENTS], payloads)
    assert (report.ok, report.first_bad_seq) == (False, 1)
    assert "does not match its bytes" in (report.problem or "")


def test_verify_rows_names_a_missing_part() -> None:
    payloads = _payloads()
    del payloads[EVENTS[1]["parts"][1]["digest"]]
    report = _verify([_row(event) for event in EVENTS], payloads)
    assert (report.ok, report.first_bad_seq) == (False, 2)
    assert "missing" in (report.problem or "")


def test_verify_rows_wrong_store_id_fails_at_the_first_event() -> None:
    rows = [_row(event) for event in EVENTS]
    report = verifier.verify_rows(
        rows, store_id="f" * 32, key=KEY, payload_of=_payloads().get, head=None
    )
    assert (report.ok, report.first_bad_seq) == (False, 1)


def test_verify_rows_wrong_key_fails_at_the_first_event() -> None:
    rows = [_row(event) for event in EVENTS]
    report = verifier.verify_rows(
        rows, store_id=STORE_ID, key=bytes(32), payload_of=_payloads().get, head=None
    )
    assert (report.ok, report.first_bad_seq) == (False, 1)


def test_verify_rows_checks_the_head() -> None:
    rows = [_row(event) for event in EVENTS]
    truncated = _verify(rows[:3])
    assert (truncated.ok, truncated.first_bad_seq) == (False, 4)
    beyond = _verify(rows, head=(3, EVENTS[2]["chain"]))
    assert (beyond.ok, beyond.first_bad_seq) == (False, 4)
    wrong_chain = _verify(rows, head=(5, "0" * 64))
    assert (wrong_chain.ok, wrong_chain.first_bad_seq) == (False, 5)


@pytest.mark.parametrize(
    ("column", "value"),
    [(2, b"turn"), (3, 7), (4, None), (7, "5"), (7, '[["nested"]]'), (7, '{"a": 1}')],
)
def test_verify_rows_reports_malformed_rows_instead_of_crashing(column: int, value: Any) -> None:
    """A row of the wrong shape (blob type, non-list parts) is a failure at its seq."""
    report = _verify(_tampered(2, column, value))
    assert (report.ok, report.first_bad_seq) == (False, 2)


# -- the test writer of format 1 writes exactly these rows ------------------------------------


def test_the_format_1_test_writer_writes_the_vector_rows(tmp_path: Path) -> None:
    """tests/v1_writer.py builds the large format-1 archives migrate is tested on: with the
    vectors' key and store id it writes exactly the frozen chain, head and payloads."""
    events = [
        V1Event(
            event["time"],
            event["type"],
            event["session"],
            event["key"],
            event["body"],
            tuple(bytes.fromhex(part["canonical_hex"]) for part in event["parts"]),
        )
        for event in EVENTS
    ]
    folder = tmp_path / "archive"
    assert write_v1_log(folder, STORE_ID, KEY, events) == len(EVENTS)
    conn = sqlite3.connect(folder / "events.db")
    try:
        rows = conn.execute(
            "SELECT seq, time, type, session, key, identity, payload, parts, chain FROM events"
            " ORDER BY seq"
        ).fetchall()
        assert rows == [_row(event) for event in EVENTS]
        assert conn.execute("SELECT seq, chain FROM head").fetchone() == (
            VECTORS["head"]["seq"],
            VECTORS["head"]["chain"],
        )
        stored = {d: bytes(b) for d, b in conn.execute("SELECT digest, body FROM payloads")}
        assert stored == _payloads()
        assert verifier.verify_database(conn, KEY).ok
    finally:
        conn.close()
