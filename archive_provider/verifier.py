"""Standalone verifier for hermes-archive logs (docs/FORMAT.md section 7).

This module imports only the Python standard library and ``blake3`` so that an auditor
can read it, copy it out and run it alone::

    python verifier.py path/to/archive/events.db [--key path/to/payload.key] [--json]

It is also the verifier the package itself uses, so there is one implementation of the
checks. It recomputes every identity, payload digest, part digest and chain value from
the rows, checks that sequence numbers run 1, 2, 3, ... without gaps and that the recorded
head matches the last event, and names the first bad sequence number.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

from blake3 import blake3

DOMAIN_IDENTITY = b"hermes-archive/v1/identity\x00"
DOMAIN_PAYLOAD = b"hermes-archive/v1/payload\x00"
DOMAIN_CHAIN = b"hermes-archive/v1/chain\x00"
DOMAIN_GENESIS = b"hermes-archive/v1/genesis\x00"
SUPPORTED_FORMAT = 1
_HEX64 = re.compile(r"[0-9a-f]{64}")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
_NEEDS_ESCAPE = re.compile('["\\\\\x00-\x1f\ud800-\udfff]')


def _text(value: str) -> str:
    """Canonical JSON string literal (FORMAT.md 2.3)."""
    return '"' + _NEEDS_ESCAPE.sub(lambda m: _ESCAPES.get(m.group()) or f"\\u{ord(m.group()):04x}", value) + '"'


def envelope_bytes(seq: int, time: str, type_: str, session: str, key: str, identity: str, payload: str, parts: str) -> bytes:
    """Canonical bytes of an envelope (keys in code-point order)."""
    return (
        '{"identity":"' + identity + '","key":' + key + ',"parts":' + parts + ',"payload":"'
        + payload + '","seq":' + str(seq) + ',"session":' + _text(session) + ',"time":'
        + _text(time) + ',"type":' + _text(type_) + "}"
    ).encode("utf-8")


def identity_of(type_: str, key: str) -> str:
    return blake3(DOMAIN_IDENTITY + ('{"key":' + key + ',"type":' + _text(type_) + "}").encode("utf-8")).hexdigest()


def genesis(store_id: str) -> str:
    return blake3(DOMAIN_GENESIS + store_id.encode("ascii")).hexdigest()


@dataclass
class Report:
    """What a verification found. ``ok`` is true only when every check held."""

    ok: bool = True
    events_checked: int = 0
    payloads_checked: int = 0
    last_seq: int = 0
    head_seq: int | None = None
    first_bad_seq: int | None = None
    problem: str | None = None
    warnings: list[str] = field(default_factory=list)

    def fail(self, seq: int | None, problem: str) -> Report:
        self.ok, self.first_bad_seq, self.problem = False, seq, problem
        return self

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


Row = tuple[int, str, str, str, str, str, str, str, str]  # seq time type session key identity payload parts chain


def verify_rows(
    rows: Iterable[Row],
    *,
    store_id: str,
    key: bytes,
    payload_of: Callable[[str], bytes | None],
    head: tuple[int, str] | None,
    start: tuple[int, str] | None = None,
    progress: Callable[[int], None] | None = None,
) -> Report:
    """Check a run of envelopes in sequence order.

    ``start`` is the (seq, chain) just before the first row (default: the genesis), so a
    partial export can be checked from any point of the chain. ``head`` is the recorded
    (seq, chain) the run must end at (``None`` when the source records no head).
    """
    report = Report(head_seq=head[0] if head else None)
    prev_seq, prev_chain = start if start else (0, genesis(store_id))
    seen_parts: set[str] = set()
    for seq, time, type_, session, key_text, identity, payload, parts, chain in rows:
        if seq != prev_seq + 1:
            what = "missing" if seq > prev_seq + 1 else "repeated or out of order"
            return report.fail(prev_seq + 1, f"sequence gap: expected {prev_seq + 1}, found {seq} (events {what})")
        if identity_of(type_, key_text) != identity:
            return report.fail(seq, "identity digest does not match the event's type and key")
        body = payload_of(payload)
        if body is None:
            return report.fail(seq, f"payload {payload} is missing")
        if blake3(DOMAIN_PAYLOAD + body, key=key).hexdigest() != payload:
            return report.fail(seq, f"payload {payload} does not match its bytes (changed or swapped)")
        report.payloads_checked += 1
        try:
            part_digests = json.loads(parts)
        except ValueError:
            return report.fail(seq, "parts list is not valid JSON")
        for digest in part_digests:
            if digest in seen_parts:
                continue
            if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
                return report.fail(seq, f"part {digest!r} is not a digest")
            part = payload_of(digest)
            if part is None:
                return report.fail(seq, f"part {digest} is missing")
            if blake3(DOMAIN_PAYLOAD + part, key=key).hexdigest() != digest:
                return report.fail(seq, f"part {digest} does not match its bytes (changed or swapped)")
            seen_parts.add(digest)
            report.payloads_checked += 1
        expected = blake3(
            DOMAIN_CHAIN + bytes.fromhex(prev_chain)
            + envelope_bytes(seq, time, type_, session, key_text, identity, payload, parts)
        ).hexdigest()
        if expected != chain:
            return report.fail(seq, "chain hash does not match (an envelope field, or an earlier event, was changed)")
        prev_seq, prev_chain = seq, chain
        report.events_checked += 1
        report.last_seq = seq
        if progress and seq % 10000 == 0:
            progress(seq)
    if head is not None and (head[0], head[1]) != (prev_seq, prev_chain):
        if head[0] > prev_seq:
            return report.fail(prev_seq + 1, f"the head records {head[0]} events but the log ends at {prev_seq} (truncated)")
        if head[0] < prev_seq:
            return report.fail(head[0] + 1, f"events after the recorded head {head[0]} (appended outside the writer)")
        return report.fail(prev_seq, "the recorded head's chain does not match the last event")
    return report


_ROWS_SQL = "SELECT seq, time, type, session, key, identity, payload, parts, chain FROM events ORDER BY seq"


def verify_database(conn: sqlite3.Connection, key: bytes, progress: Callable[[int], None] | None = None) -> Report:
    """Verify a whole archive database through an open connection."""
    meta = dict(conn.execute("SELECT name, value FROM meta").fetchall())
    if int(meta.get("format_version", 0)) != SUPPORTED_FORMAT:
        return Report().fail(None, f"unsupported format version {meta.get('format_version')!r}")
    head_row = conn.execute("SELECT seq, chain FROM head WHERE id = 1").fetchone()
    payload_cursor = conn.cursor()

    def payload_of(digest: str) -> bytes | None:
        row = payload_cursor.execute("SELECT body FROM payloads WHERE digest = ?", (digest,)).fetchone()
        return bytes(row[0]) if row else None

    conn.execute("BEGIN")  # one read snapshot for the whole pass
    try:
        return verify_rows(
            conn.execute(_ROWS_SQL), store_id=meta["store_id"], key=key, payload_of=payload_of,
            head=(head_row[0], head_row[1]) if head_row else (0, genesis(meta["store_id"])), progress=progress,
        )
    finally:
        conn.execute("COMMIT")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Verify a hermes-archive events.db without the package.")
    parser.add_argument("database")
    parser.add_argument("--key", help="payload.key (default: beside the database)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    key_path = args.key or os.path.join(os.path.dirname(os.path.abspath(args.database)), "payload.key")
    try:
        with open(key_path) as handle:
            key = bytes.fromhex(handle.read().strip())
        conn = sqlite3.connect(f"file:{args.database}?mode=ro", uri=True, isolation_level=None)
        report = verify_database(conn, key)
    except (OSError, ValueError, sqlite3.Error, KeyError) as exc:
        report = Report().fail(None, f"cannot read the archive: {exc}")
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    elif report.ok:
        print(f"ok: {report.events_checked} events, {report.payloads_checked} payloads verified; head at {report.last_seq}")
    else:
        print(f"FAILED at seq {report.first_bad_seq}: {report.problem}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
