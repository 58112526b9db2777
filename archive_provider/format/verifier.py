"""Standalone verifier for hermes-archive logs and export bundles (docs/FORMAT.md 7 and 20).

It imports only the Python standard library, ``blake3`` and (for format v2) ``cryptography``
and its two pure sibling modules ``merkle.py`` and ``signed_note.py``, so that an auditor
can read it, copy the three files (with ``tlog_proof.py`` for proof files) into one folder
and run it alone::

    python verifier.py path/to/archive/events.db [--key VKEY] [--jobs N] [--json]
    python verifier.py bundle path/to/export.zip [--key VKEY] [--json]
    python verifier.py proof path/to/seq.proof --key VKEY [--witness WKEY] [--json]
    python verifier.py path/to/archive/events.db [--key path/to/payload.key]  # format 1

It is also the verifier the package itself uses, so there is one implementation of the
checks. It recomputes every identity, payload digest, part digest and chain value from
the rows, checks that sequence numbers run 1, 2, 3, ... without gaps and that the recorded
head matches the last event, and names the first bad sequence number.

An export bundle (docs/AUDIT.md section 4, FORMAT.md 21.3) is a zip holding ``manifest.json``,
``envelopes.bin`` (every envelope from the genesis to the head, as binary records) and
``payloads.bin`` (the bodies with their salts of the selected events only), sealed by its
zip comment: the manifest's BLAKE3 and a BLAKE3 over every byte of the file before the seal
digest itself, so a change to any single bit anywhere is caught and named. Bundles of
versions 1 and 2 (``envelopes.jsonl``, ``payloads/<digest>``, and in version 1
``payload.key``; FORMAT.md 21.2) are still read.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import collections
import json
import os
import pathlib
import re
import signal
import socket
import sqlite3
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection, wait
from typing import IO, Any, BinaryIO

try:
    from blake3 import blake3
except ImportError:
    if __name__ != "__main__":
        raise
    sys.exit("verifier.py needs the blake3 package: python3 -m pip install blake3")

#: why format-v2 archives cannot be checked by this copy (None: they can)
V2_UNAVAILABLE: str | None = None
try:  # format v2: the two pure modules beside this file (docs/FORMAT.md 20)
    from . import merkle, signed_note
except ImportError:  # run as a script: verifier.py, merkle.py and signed_note.py side by side
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        import merkle  # type: ignore[no-redef]
        import signed_note  # type: ignore[no-redef]
    except ImportError as missing:  # verifier.py alone with blake3 still checks v1 archives
        V2_UNAVAILABLE = (
            f"a format-v2 archive needs merkle.py and signed_note.py beside verifier.py and "
            f"the cryptography package ({missing})"
        )
#: why proof files (FORMAT.md 21.1) cannot be checked by this copy (None: they can)
PROOF_UNAVAILABLE: str | None = V2_UNAVAILABLE
if PROOF_UNAVAILABLE is None:
    try:
        from . import tlog_proof
    except ImportError:
        try:
            import tlog_proof  # type: ignore[no-redef]
        except ImportError as missing:
            PROOF_UNAVAILABLE = f"a proof file needs tlog_proof.py beside verifier.py ({missing})"

DOMAIN_IDENTITY = b"hermes-archive/v1/identity\x00"
DOMAIN_PAYLOAD = b"hermes-archive/v1/payload\x00"
DOMAIN_CHAIN = b"hermes-archive/v1/chain\x00"
DOMAIN_GENESIS = b"hermes-archive/v1/genesis\x00"
SUPPORTED_FORMAT = 1
_HEX64 = re.compile(r"[0-9a-f]{64}")
_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}
_NEEDS_ESCAPE = re.compile('["\\\\\x00-\x1f\ud800-\udfff]')


def _text(value: str) -> str:
    """Canonical JSON string literal (FORMAT.md 2.3)."""
    return (
        '"'
        + _NEEDS_ESCAPE.sub(lambda m: _ESCAPES.get(m.group()) or f"\\u{ord(m.group()):04x}", value)
        + '"'
    )


def envelope_bytes(
    seq: int, time: str, type_: str, session: str, key: str, identity: str, payload: str, parts: str
) -> bytes:
    """Canonical bytes of an envelope (keys in code-point order)."""
    return (
        '{"identity":"'
        + identity
        + '","key":'
        + key
        + ',"parts":'
        + parts
        + ',"payload":"'
        + payload
        + '","seq":'
        + str(seq)
        + ',"session":'
        + _text(session)
        + ',"time":'
        + _text(time)
        + ',"type":'
        + _text(type_)
        + "}"
    ).encode("utf-8")


def identity_of(type_: str, key: str) -> str:
    return blake3(
        DOMAIN_IDENTITY + ('{"key":' + key + ',"type":' + _text(type_) + "}").encode("utf-8")
    ).hexdigest()


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
    #: envelopes checked for identity and chain only (a partial export carries no payload for them)
    envelopes_only: int = 0
    #: what a bundle claims (store, head, proof start, selection), for the auditor to compare
    details: dict[str, Any] = field(default_factory=dict)

    def fail(self, seq: int | None, problem: str) -> Report:
        self.ok, self.first_bad_seq, self.problem = False, seq, problem
        return self

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


Row = tuple[
    int, str, str, str, str, str, str, str, str
]  # seq time type session key identity payload parts chain


def _check_payloads(
    report: Report,
    seq: int,
    payload: str,
    parts: str,
    key: bytes,
    payload_of: Callable[[str], bytes | Iterable[bytes] | None],
    seen: _Seen,
) -> Report | None:
    """Check one event's payload and parts; return the failed report, or None when all hold.

    ``payloads_checked`` counts distinct digests (payloads and parts alike), each once
    however many events name it: the payloads the log stores, as an export bundle holds them.
    """
    failed = _check_payload(report, seq, "payload", payload, key, payload_of, seen)
    if failed is not None:
        return failed
    try:
        part_digests = json.loads(parts)
    except ValueError:
        return report.fail(seq, "parts list is not valid JSON")
    for digest in part_digests:
        if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
            return report.fail(seq, f"part {digest!r} is not a digest")
        failed = _check_payload(report, seq, "part", digest, key, payload_of, seen)
        if failed is not None:
            return failed
    return None


def _check_payload(
    report: Report,
    seq: int,
    what: str,
    digest: str,
    key: bytes,
    payload_of: Callable[[str], bytes | Iterable[bytes] | None],
    seen: _Seen,
) -> Report | None:
    mark = bytes.fromhex(digest) if _HEX64.fullmatch(digest) else digest.encode()
    if mark in seen:
        return None
    body = payload_of(digest)
    if body is None:
        return report.fail(seq, f"{what} {digest} is missing")
    hasher = blake3(DOMAIN_PAYLOAD, key=key)
    for piece in (body,) if isinstance(body, bytes) else body:  # a bundle's: streamed
        hasher.update(piece)
    if hasher.hexdigest() != digest:
        return report.fail(seq, f"{what} {digest} does not match its bytes (changed or swapped)")
    seen.add(mark)
    report.payloads_checked += 1
    return None


def verify_rows(
    rows: Iterable[Row],
    *,
    store_id: str,
    key: bytes,
    payload_of: Callable[[str], bytes | Iterable[bytes] | None],
    head: tuple[int, str] | None,
    start: tuple[int, str] | None = None,
    progress: Callable[[int], None] | None = None,
    payload_needed: Callable[[Row], bool] | None = None,
) -> Report:
    """Check a run of envelopes in sequence order.

    ``start`` is the (seq, chain) just before the first row (default: the genesis), so a
    partial export can be checked from any point of the chain. ``head`` is the recorded
    (seq, chain) the run must end at (``None`` when the source records no head).
    ``payload_of`` gives a body whole or as the pieces of a stream (a bundle member, which
    may claim any size, is never read whole). ``payload_needed`` says which rows must come
    with their payload and parts (default: all); the others are checked for identity and
    chain only, as a partial export carries just their envelopes.
    """
    report = Report(head_seq=head[0] if head else None)
    prev_seq, prev_chain = start if start else (0, genesis(store_id))
    seen = _Seen()  # payload and part digests checked, in memory that does not grow
    try:
        for row in rows:
            seq, time, type_, session, key_text, identity, payload, parts, chain = row
            if seq != prev_seq + 1:
                what = "missing" if seq > prev_seq + 1 else "repeated or out of order"
                return report.fail(
                    prev_seq + 1,
                    f"sequence gap: expected {prev_seq + 1}, found {seq} (events {what})",
                )
            if identity_of(type_, key_text) != identity:
                return report.fail(seq, "identity digest does not match the event's type and key")
            if payload_needed is None or payload_needed(row):
                failed = _check_payloads(report, seq, payload, parts, key, payload_of, seen)
                if failed is not None:
                    return failed
            else:
                report.envelopes_only += 1
            expected = blake3(
                DOMAIN_CHAIN
                + bytes.fromhex(prev_chain)
                + envelope_bytes(seq, time, type_, session, key_text, identity, payload, parts)
            ).hexdigest()
            if expected != chain:
                return report.fail(
                    seq,
                    "chain hash does not match "
                    "(an envelope field, or an earlier event, was changed)",
                )
            prev_seq, prev_chain = seq, chain
            report.events_checked += 1
            report.last_seq = seq
            if progress and seq % 10000 == 0:
                progress(seq)
    except (TypeError, ValueError) as exc:
        # a row of the wrong shape (a blob where text belongs, parts that are not a list of
        # digests): the row after the last good one is bad; report it, do not crash
        return report.fail(prev_seq + 1, f"malformed event row: {type(exc).__name__}: {exc}")
    if head is not None and (head[0], head[1]) != (prev_seq, prev_chain):
        if head[0] > prev_seq:
            return report.fail(
                prev_seq + 1,
                f"the head records {head[0]} events but the log ends at {prev_seq} (truncated)",
            )
        if head[0] < prev_seq:
            return report.fail(
                head[0] + 1,
                f"events after the recorded head {head[0]} (appended outside the writer)",
            )
        return report.fail(prev_seq, "the recorded head's chain does not match the last event")
    return report


_ROWS_SQL = (
    "SELECT seq, time, type, session, key, identity, payload, parts, chain FROM events ORDER BY seq"
)


ARCHIVE_TABLES = ("meta", "events", "payloads", "head")
#: the tables a v2 verification reads besides those
ARCHIVE_TABLES_V2 = (*ARCHIVE_TABLES, "tiles", "signed_checkpoints")


def schema_problem(
    conn: sqlite3.Connection, tables: tuple[str, ...] = ARCHIVE_TABLES
) -> str | None:
    """Why this database cannot be an archive to read, checked before any query of its data.

    A database under audit may come from a compromised system: a view named like one of
    our tables could run any query (a recursive one never ends), so each must be a table.
    """
    marks = ", ".join("?" * len(tables))
    kinds = dict(
        conn.execute(
            f"SELECT name, type FROM sqlite_master WHERE name IN ({marks})", tables
        ).fetchall()
    )
    for name in tables:
        if kinds.get(name) != "table":
            found = f"a {kinds[name]}" if name in kinds else "nothing"
            return f"{name} is {found}, not a table: this is not a hermes-archive database"
    return None


def database_format(conn: sqlite3.Connection) -> tuple[int, ReportV2 | None]:
    """The archive's format (1 or 2), or the failed report that refuses it: the schema is
    checked before any query of its data (FORMAT.md 20.1), then ``meta.format_version``."""
    problem = schema_problem(conn)
    if problem:
        return 0, ReportV2().fail(None, problem, "unreadable")
    row = conn.execute("SELECT value FROM meta WHERE name = 'format_version'").fetchone()
    version = None if row is None else row[0]
    if version in ("1", 1):
        return 1, None
    if version == "2":
        return 2, None
    found = "missing" if version is None else f"{printable(version)!r}"
    return 0, ReportV2().fail(
        None,
        f"meta.format_version is {found}: this verifier reads formats 1 and 2",
        "format_version",
    )


def verify_database(
    conn: sqlite3.Connection,
    key: bytes,
    progress: Callable[[int], None] | None = None,
    vkey: str | None = None,
    jobs: int = 1,
) -> Report:
    """Verify a whole archive database through an open connection, in its own format.

    The head, the envelopes and the payloads are read in one read transaction, so a writer
    in another process appending meanwhile can never make the head look stale. A v1 archive
    needs its payload ``key``; a v2 archive needs no key and gives a :class:`ReportV2`
    (``vkey``, the pinned verifier key, checks its signed checkpoints; ``jobs``, the
    processes it may use; a v1 archive is checked in one).
    """
    version, refused = database_format(conn)
    if refused is not None:
        return refused
    if version == 2:
        return verify_database_v2(conn, vkey, jobs)
    payload_cursor = conn.cursor()

    def payload_of(digest: str) -> bytes | None:
        row = payload_cursor.execute(
            "SELECT body FROM payloads WHERE digest = ?", (digest,)
        ).fetchone()
        return bytes(row[0]) if row else None

    conn.execute("BEGIN")  # one read snapshot for the whole pass (head included)
    try:
        problem = schema_problem(conn)
        if problem:
            return Report().fail(None, problem)
        meta = dict(conn.execute("SELECT name, value FROM meta").fetchall())
        if int(meta.get("format_version", 0)) != SUPPORTED_FORMAT:
            return Report().fail(None, f"unsupported format version {meta.get('format_version')!r}")
        head_row = conn.execute("SELECT seq, chain FROM head WHERE id = 1").fetchone()
        return verify_rows(
            conn.execute(_ROWS_SQL),
            store_id=meta["store_id"],
            key=key,
            payload_of=payload_of,
            head=(head_row[0], head_row[1]) if head_row else (0, genesis(meta["store_id"])),
            progress=progress,
        )
    finally:
        conn.execute("COMMIT")


# -- format version 2 (docs/FORMAT.md sections 11 to 20) -----------------------------------

V2_IDENTITY = b"hermes-archive/v2/identity\x00"
V2_PAYLOAD = b"hermes-archive/v2/payload\x00"
V2_CHAIN = b"hermes-archive/v2/chain\x00"
V2_GENESIS = b"hermes-archive/v2/genesis\x00"
_STORE_ID = re.compile(r"[0-9a-f]{32}")
_HEX64_ANY_CASE = re.compile(r"[0-9a-fA-F]{64}")


@dataclass
class ReportV2(Report):
    """The v2 report (FORMAT.md 20.3): the v1 fields plus the tree, signatures and a code."""

    format_version: int = 2
    store_id: str | None = None
    payloads_erased: int = 0
    erasures: list[dict[str, int]] = field(default_factory=list)
    tree_size: int = 0
    root: str | None = None
    checkpoint: dict[str, Any] | None = None
    authenticity: str = "not checked"
    code: str | None = None

    def fail(self, seq: int | None, problem: str, code: str = "unreadable") -> ReportV2:
        self.ok, self.first_bad_seq, self.problem, self.code = False, seq, problem, code
        return self


class _Failed(Exception):
    def __init__(self, seq: int | None, code: str, problem: str) -> None:
        super().__init__(problem)
        self.seq, self.code, self.problem = seq, code, problem


class _Twice(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _once(items: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose members are named once; else the first name met again."""
    value = dict(items)
    if len(value) != len(items):
        seen: set[str] = set()
        for name, _ in items:
            if name in seen:
                raise _Twice(name)
            seen.add(name)
    return value


#: :func:`strict_json`'s rule with one decoder for every line (a decoder per line costs as
#: much as the parse)
_ONCE = json.JSONDecoder(object_pairs_hook=_once)


def strict_json(data: bytes | str, what: str) -> Any:
    """JSON where a member named twice is refused (``duplicate_key``), never last-one-wins."""
    try:
        return json.loads(data, object_pairs_hook=_once)
    except _Twice as twice:
        raise _Failed(
            None, "duplicate_key", f'{what} has the member "{twice.name}" twice'
        ) from None


def read_key_file(path: str) -> bytes:
    """A v1 payload.key or v2 store.key: 64 hex digits in either case (code ``key_file``)."""
    try:
        text = _read_regular(path, 4096).decode("ascii").strip()
    except (OSError, ValueError) as exc:
        raise _Failed(
            None, "key_file", f"cannot read the archive: the key file {path}: {exc}"
        ) from None
    if not _HEX64_ANY_CASE.fullmatch(text):
        raise _Failed(None, "key_file", f"the key file {path} does not hold 64 hex digits")
    return bytes.fromhex(text)


def _v2_parts_text(parts: bytes) -> str:
    """The parts as a canonical JSON list of hex digests (FORMAT.md 13.1)."""
    if not parts:
        return "[]"
    hexed = parts.hex()
    return '["' + '","'.join([hexed[i : i + 64] for i in range(0, len(hexed), 64)]) + '"]'


def _envelope_v2(
    seq: int,
    time_text: str,
    type_text: str,
    session_text: str,
    key: str,
    identity_hex: str,
    payload_hex: str,
    parts_text: str,
    author_text: str,
) -> bytes:
    """The envelope from its members' canonical texts (digests in hex, the author ``null`` or
    a quoted hex digest), so a pass that also hashes the identity document, or read the
    digests as hex, encodes each text once."""
    return (
        '{"author":'
        + author_text
        + ',"identity":"'
        + identity_hex
        + '","key":'
        + key
        + ',"parts":'
        + parts_text
        + ',"payload":"'
        + payload_hex
        + '","seq":'
        + str(seq)
        + ',"session":'
        + session_text
        + ',"time":'
        + time_text
        + ',"type":'
        + type_text
        + "}"
    ).encode("utf-8")


def _identity_v2(key: str, parts_text: str, session_text: str, type_text: str) -> bytes:
    document = (
        '{"key":' + key + ',"parts":' + parts_text + ',"session":' + session_text
        + ',"type":' + type_text + "}"
    )  # fmt: skip
    return blake3(V2_IDENTITY + document.encode("utf-8")).digest()


def envelope_bytes_v2(
    seq: int,
    time: str,
    type_: str,
    session: str,
    key: str,
    identity: bytes,
    payload: bytes,
    parts: bytes,
    author: bytes | None,
) -> bytes:
    """The nine-member v2 envelope (FORMAT.md 13.1): v1's eight members in hex, and the author,
    which sorts first; also the Merkle leaf's input."""
    return _envelope_v2(
        seq,
        _text(time),
        _text(type_),
        _text(session),
        key,
        identity.hex(),
        payload.hex(),
        _v2_parts_text(parts),
        _author_text(author),
    )


def _author_text(author: bytes | None) -> str:
    return "null" if author is None else '"' + author.hex() + '"'


def identity_v2(type_: str, session: str, key: str, parts: bytes) -> bytes:
    return _identity_v2(key, _v2_parts_text(parts), _text(session), _text(type_))


_V2_ROWS = (
    "SELECT seq, CAST(time AS BLOB), CAST(type AS BLOB), CAST(session AS BLOB),"
    " CAST(key AS BLOB), identity, payload, parts, author, chain,"
    " typeof(time), typeof(type), typeof(session), typeof(key) FROM events"
    " WHERE seq > ? AND seq <= ? ORDER BY seq"
)


class _Seen:
    """The digests a pass has met, exactly, in memory that does not grow with the archive.

    A set of every digest costs about 100 bytes each (a gigabyte at 10M events), so only the
    newest RECENT stay in a set; older ones move to a private temporary database on disk and
    are asked for only when a Bloom filter of them says "maybe" (a repeat from long ago, or
    about 1 in 60 new digests). The filter holds 10 bits per digest ``expected`` (rebuilt
    larger if more come) up to MOST_BITS (8 MiB, about 6.7M digests); past that it only
    fills, so more new digests are looked up on disk: time grows, memory does not.
    """

    RECENT = 1 << 14
    MOST_BITS = 1 << 26
    _BITS_PER_ENTRY = 10

    def __init__(self, expected: int = 0) -> None:
        self.expected = expected
        self.recent: set[bytes] = set()
        self.older: sqlite3.Connection | None = None
        self.bloom = bytearray()
        self.bits = self.entries = 0

    def __contains__(self, digest: bytes) -> bool:
        if digest in self.recent:
            return True
        if self.older is None:
            return False
        bloom, bits = self.bloom, self.bits
        value = int.from_bytes(digest, "little")  # digests are uniform: 3 slices, 3 hashes
        for at in (value % bits, (value >> 64) % bits, (value >> 128) % bits):
            if not bloom[at >> 3] >> (at & 7) & 1:
                return False
        found = self.older.execute("SELECT 1 FROM seen WHERE d = ?", (digest,)).fetchone()
        return found is not None

    def add(self, digest: bytes) -> None:
        self.recent.add(digest)
        if len(self.recent) >= self.RECENT:
            self._spill()

    def clear(self) -> None:
        self.recent.clear()
        if self.older is not None:
            self.older.close()
        self.older, self.bloom, self.bits, self.entries = None, bytearray(), 0, 0

    def _mark(self, digests: Iterable[bytes]) -> None:
        bloom, bits = self.bloom, self.bits
        for digest in digests:
            value = int.from_bytes(digest, "little")
            for at in (value % bits, (value >> 64) % bits, (value >> 128) % bits):
                bloom[at >> 3] |= 1 << (at & 7)

    def _spill(self) -> None:
        if self.older is None:
            self.older = sqlite3.connect("")  # "": a private temporary database on disk
            self.older.execute("CREATE TABLE seen (d BLOB PRIMARY KEY) WITHOUT ROWID")
        batch = sorted(self.recent)
        self.older.executemany("INSERT OR IGNORE INTO seen VALUES (?)", ((d,) for d in batch))
        self.recent.clear()
        self.entries += len(batch)
        if self.entries * self._BITS_PER_ENTRY > self.bits and self.bits < self.MOST_BITS:
            wanted = max(self.entries * 2, self.expected) * self._BITS_PER_ENTRY
            self.bits = min(max(wanted // 8 * 8, 1 << 16), self.MOST_BITS)
            self.bloom = bytearray(self.bits // 8)
            self._mark(digest for (digest,) in self.older.execute("SELECT d FROM seen"))
        else:
            self._mark(batch)


class _TreeCheck:
    """The tree of the leaves as they come (FORMAT.md 20.2 steps 4 and 5), each completed tile
    compared with its stored row as soon as it is full, so only the tree's right edge is kept."""

    CHUNK = 1 << 13  # leaves between comparisons

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.tree = merkle.TileAppender()
        self.pending: list[bytes] = []
        self.bad: list[tuple[int, int]] = []  # (level, index) of tiles unlike their stored row

    def append(self, leaf: bytes) -> None:
        self.pending.append(leaf)
        if len(self.pending) >= self.CHUNK:
            self._compare(final=False)

    def stored(self, level: int, index: int) -> Any:
        row = self.conn.execute(  # a row that is not a BLOB is no tile (never decoded)
            "SELECT CASE typeof(hashes) WHEN 'blob' THEN hashes END FROM tiles "
            "WHERE level = ? AND idx = ?",
            (level, index),
        ).fetchone()
        return None if row is None else row[0]

    def _compare(self, final: bool) -> None:
        self.tree.append(self.pending)
        self.pending.clear()
        built = self.tree.changed()
        if final:  # every partial tile of the right edge, touched lately or not
            widths = merkle.tile_widths(self.tree.size)
            built.update({(lv, widths[lv][0]): data for lv, data in self.tree.edge().items()})
        for (level, index), hashes in built.items():
            if (final or len(hashes) == merkle.FULL_TILE_BYTES) and self.stored(
                level, index
            ) != hashes:
                self.bad.append((level, index))
        if not final:
            self.tree = merkle.TileAppender(self.tree.size, self.tree.edge(), self.tree.compact())

    def finish(self) -> tuple[int, bytes, tuple[int, int] | None]:
        """(tree size, root, the first tile unlike the events in (level, index) order)."""
        self._compare(final=True)
        size = self.tree.size
        for level, index in self.conn.execute("SELECT level, idx FROM tiles"):
            entries = size >> (merkle.TILE_HEIGHT * level) if isinstance(level, int) else 0
            if not (isinstance(index, int) and 0 <= index < -(-entries // merkle.TILE_WIDTH)):
                self.bad.append((level, index))  # a row for no tile of this tree
        return size, self.tree.root(), min(self.bad, default=None)


class _V2Pass:
    """One full verification of a v2 database (FORMAT.md 20.2), state kept between steps."""

    def __init__(self, conn: sqlite3.Connection, report: ReportV2) -> None:
        self.conn, self.report = conn, report
        self.cursor = conn.cursor()
        head = conn.execute("SELECT max(seq) FROM events").fetchone()[0]
        #: digests whose body was checked (or found erased); most events name about three
        self.checked = _Seen(expected=3 * head if isinstance(head, int) else 0)
        self.covered: dict[bytes, int] = {}  # erased digest -> erasure seq
        self.erasure_counts: dict[int, int] = {}

    def payload(self, seq: int, digest: bytes, what: str) -> bytes | None:
        """Check one payload once per pass; the body, or None for a covered tombstone."""
        row = self.cursor.execute(
            "SELECT salt, body, typeof(body) FROM payloads WHERE digest = ?", (digest,)
        ).fetchone()
        if row is None:
            raise _Failed(seq, "missing_payload", f"seq {seq}: {what} {digest.hex()} is missing")
        salt, body, kind = row
        if kind == "null":
            erased_at = self.covered.get(digest)
            if erased_at is None or erased_at <= seq:
                raise _Failed(
                    seq,
                    "erased_without_erasure",
                    f"seq {seq}: {what} {digest.hex()} was erased with no later erasure event "
                    "listing it",
                )
            if digest not in self.checked:
                self.checked.add(digest)
                self.report.payloads_erased += 1
                self.erasure_counts[erased_at] = self.erasure_counts.get(erased_at, 0) + 1
            return None
        if digest in self.checked:
            return bytes(body) if kind == "blob" else None
        if kind != "blob":
            raise _Failed(
                seq, "payload_type", f"seq {seq}: {what} {digest.hex()} is stored as {kind}"
            )
        if not isinstance(salt, bytes) or len(salt) != 32:
            raise _Failed(
                seq, "payload_mismatch", f"seq {seq}: {what} {digest.hex()} has no valid salt"
            )
        if blake3(V2_PAYLOAD + salt + body).digest() != digest:
            raise _Failed(
                seq,
                "payload_mismatch",
                f"seq {seq}: {what} {digest.hex()} does not match its bytes (changed or swapped)",
            )
        self.checked.add(digest)
        self.report.payloads_checked += 1
        return bytes(body)

    def erasures(self) -> None:
        """Read every erasure event first: which digests it covers, and from which seq."""
        rows = self.conn.execute(
            "SELECT seq, payload FROM events WHERE type = 'erasure' ORDER BY seq"
        ).fetchall()
        for seq, payload in rows:
            body = (
                self.payload(seq, bytes(payload), "payload") if isinstance(payload, bytes) else None
            )
            if body is None:
                raise _Failed(seq, "malformed_row", f"seq {seq}: the erasure's body is unreadable")
            try:
                value = strict_json(body, f"the body of erasure seq {seq}")
            except _Failed as failure:
                raise _Failed(seq, failure.code, f"seq {seq}: {failure.problem}") from None
            except ValueError:
                raise _Failed(seq, "malformed_row", f"seq {seq}: the erasure is not JSON") from None
            digests = value.get("digests") if isinstance(value, dict) else None
            if not isinstance(digests, list) or not all(
                isinstance(d, str) and _HEX64.fullmatch(d) for d in digests
            ):
                raise _Failed(seq, "malformed_row", f"seq {seq}: the erasure lists no digests")
            for digest in digests:
                self.covered.setdefault(bytes.fromhex(digest), seq)
            self.erasure_counts.setdefault(seq, 0)
        self.checked.clear()  # counted again, in order, by the pass over the events
        self.report.payloads_checked = 0

    def events(
        self,
        genesis_value: bytes,
        leaf: Callable[[bytes], object],
        after: int = 0,
        until: int = 2**63 - 1,
        payloads: bool = True,
    ) -> tuple[int, bytes]:
        """Check the events ``after < seq <= until``; ``genesis_value`` is the chain before.

        With ``payloads`` false the payloads the events name are left to :meth:`named`."""
        prev_seq, prev_chain = after, genesis_value
        report, payload, leaf_hash = self.report, self.payload, merkle.leaf_hash
        texts: dict[bytes, str] = {}  # canonical texts of the few type names and sessions met
        for row in self.conn.execute(_V2_ROWS, (after, until)):
            seq = row[0]
            if type(seq) is not int:
                raise _Failed(
                    prev_seq + 1, "malformed_row", f"seq {prev_seq + 1}: seq is not an integer"
                )
            if row[10:14] != _ALL_TEXT:
                name, kind = next(
                    (n, k) for n, k in zip(_TEXT_COLUMNS, row[10:14], strict=True) if k != "text"
                )
                raise _Failed(seq, "malformed_row", f"seq {seq}: column {name} is {kind}")
            raw_time, raw_type, raw_session, raw_key = row[1:5]
            try:
                time, key = raw_time.decode("utf-8"), raw_key.decode("utf-8")
                type_text = texts.get(raw_type) or _remember(texts, raw_type)
                session_text = texts.get(raw_session) or _remember(texts, raw_session)
            except UnicodeDecodeError:
                columns = zip(_TEXT_COLUMNS, row[1:5], strict=True)
                name = next(n for n, raw in columns if not _utf8(raw))
                raise _Failed(
                    seq, "invalid_utf8", f"seq {seq}: column {name} is not valid UTF-8"
                ) from None
            identity, payload_digest, parts, author, chain = row[5:10]
            if not (
                type(identity) is bytes
                and type(payload_digest) is bytes
                and type(chain) is bytes
                and len(identity) == len(payload_digest) == len(chain) == 32
                and type(parts) is bytes
                and len(parts) % 32 == 0
                and (author is None or type(author) is bytes and len(author) == 32)
            ):
                raise _Failed(
                    seq, "malformed_row", f"seq {seq}: a digest column has the wrong form"
                )
            if seq != prev_seq + 1:
                what = "missing" if seq > prev_seq + 1 else "repeated or out of order"
                raise _Failed(
                    prev_seq + 1,
                    "sequence_gap",
                    f"sequence gap: expected {prev_seq + 1}, found {seq} (events {what})",
                )
            parts_text = _v2_parts_text(parts)
            if _identity_v2(key, parts_text, session_text, type_text) != identity:
                raise _Failed(
                    seq,
                    "identity",
                    f"seq {seq}: the identity does not match type, session, key and parts",
                )
            if payloads:
                payload(seq, payload_digest, "payload")
                for i in range(0, len(parts), 32):
                    payload(seq, parts[i : i + 32], "part")
                if author is not None:
                    payload(seq, author, "author")
            data = _envelope_v2(
                seq,
                _text(time),
                type_text,
                session_text,
                key,
                identity.hex(),
                payload_digest.hex(),
                parts_text,
                _author_text(author),
            )
            if blake3(V2_CHAIN + prev_chain + data).digest() != chain:
                raise _Failed(
                    seq,
                    "chain",
                    f"seq {seq}: the chain hash does not match (an envelope field, or an "
                    "earlier event, was changed)",
                )
            leaf(leaf_hash(data))
            prev_seq, prev_chain = seq, chain
            report.events_checked += 1
            report.last_seq = seq
        return prev_seq, prev_chain

    def named(self, until: int, low: bytes | None = None, high: bytes | None = None) -> bool:
        """Check every payload the events ``seq <= until`` name, each distinct digest once,
        without a lookup per digest (issue 18): the digests the events name, sorted and
        grouped by SQLite (in bounded memory, spilling to temporary files), are merged with
        the payloads table read in its stored (digest) order. False at the first thing that
        does not hold: the ordered pass then names it, as FORMAT.md 20.2 orders failures.

        ``low <= digest < high`` (None: unbounded) takes one range of digests, so that
        ``verify --jobs`` can merge ranges in several processes; every digest falls in one.
        Rows no event names are skipped unread, as the ordered pass never reads them."""
        bounds = {"until": until, "low": low, "high": high}
        where = " AND ".join(
            test
            for test, bound in (("digest >= :low", low), ("digest < :high", high))
            if bound is not None
        )
        named = self.conn.execute(_NAMED.format(where=where or "1"), bounds)
        want, last = next(named, (None, 0))
        covered, counts, checked, erased, previous = self.covered, self.erasure_counts, 0, 0, None
        for digest, salt, body, kind in self.conn.execute(
            "SELECT digest, salt, body, typeof(body) FROM payloads"
            + (f" WHERE {where}" if where else "")
            + " ORDER BY digest",
            bounds,
        ):
            if digest != want:
                if want is None:
                    break  # every named digest was met; the rest is named by no event
                if type(digest) is bytes and (digest == previous or digest > want):
                    return False  # two rows for one digest, or ``want`` is missing
                continue  # a row no event names (or no digest): unread, as in 20.2
            if kind == "blob":
                if not (
                    type(salt) is bytes
                    and len(salt) == 32
                    and blake3(V2_PAYLOAD + salt + body).digest() == digest
                ):
                    return False  # payload_mismatch
                checked += 1
            elif kind == "null":
                erased_at = covered.get(digest)
                if erased_at is None or erased_at <= last:
                    return False  # erased_without_erasure
                erased += 1
                counts[erased_at] = counts.get(erased_at, 0) + 1
            else:
                return False  # payload_type
            previous = digest
            want, last = next(named, (None, 0))
        if want is not None:
            return False  # missing_payload: named beyond the last row
        self.report.payloads_checked += checked
        self.report.payloads_erased += erased
        return True


_TEXT_COLUMNS = ("time", "type", "session", "key")
_ALL_TEXT = ("text",) * 4
#: every digest the events ``0 < seq <= :until`` name (payload, each part, author) with the
#: last seq naming it, one row per distinct digest in digest order; ``{where}``: its range
_NAMED = """
WITH RECURSIVE part(seq, i, n) AS (
    SELECT seq, 0, length(parts) / 32 FROM events
    WHERE seq > 0 AND seq <= :until AND length(parts) >= 32
    UNION ALL SELECT seq, i + 1, n FROM part WHERE i + 1 < n
), named(digest, seq) AS (
    SELECT payload, seq FROM events WHERE seq > 0 AND seq <= :until
    UNION ALL
    SELECT author, seq FROM events WHERE author IS NOT NULL AND seq > 0 AND seq <= :until
    UNION ALL
    SELECT substr(e.parts, part.i * 32 + 1, 32), part.seq FROM part JOIN events e ON e.seq = part.seq
)
SELECT digest, max(seq) FROM named WHERE {where} GROUP BY digest ORDER BY digest
"""


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _remember(texts: dict[bytes, str], raw: bytes) -> str:
    """The canonical text of ``raw``, kept while few distinct values have been met."""
    text = _text(raw.decode("utf-8"))
    if len(texts) >= 4096:
        texts.clear()
    texts[raw] = text
    return text


def verify_range_v2(
    conn: sqlite3.Connection, after: int, chain: bytes, until: int = 2**63 - 1
) -> tuple[ReportV2, list[bytes], bytes]:
    """Check the events ``after < seq <= until`` from the chain value ``chain`` of ``after``.

    The open-time proof and the background walk (FORMAT.md 20.4) use it on a part of the log:
    identities, payloads (every erasure is read first, as in 20.2), the chain links. Returns
    the report, the leaf hashes of the envelopes checked (the caller compares them with the
    tree) and the chain value of the last event checked.
    """
    report = ReportV2()
    owns = not conn.in_transaction
    if owns:
        conn.execute("BEGIN")
    leaves: list[bytes] = []
    last_chain = chain
    try:
        report.store_id = _v2_meta(conn, report)["store_id"]
        check = _V2Pass(conn, report)
        check.erasures()
        _, last_chain = check.events(chain, leaves.append, after, until)
    except _Failed as failure:
        report.fail(failure.seq, failure.problem, failure.code)
    except (sqlite3.Error, ValueError, TypeError) as exc:
        report.fail(None, f"cannot read the archive: {printable(exc)}", "unreadable")
    finally:
        if owns:
            conn.execute("COMMIT")
    return report, leaves, last_chain


def _v2_meta(conn: sqlite3.Connection, report: ReportV2) -> dict[str, Any]:
    meta = dict(conn.execute("SELECT name, value FROM meta").fetchall())
    store_id = meta.get("store_id")
    if store_id is None:
        raise _Failed(None, "store_id_missing", "meta has no store_id")
    if not isinstance(store_id, str) or not _STORE_ID.fullmatch(store_id):
        raise _Failed(
            None, "store_id_malformed", "meta.store_id is not 32 lowercase hex characters"
        )
    report.store_id = store_id
    origin = meta.get("origin")  # the note is rebuilt from the origin (FORMAT.md 15.5)
    if origin != f"hermes-archive.invalid/{store_id}":
        found = "missing" if origin is None else f"{printable(origin)!r}"
        raise _Failed(
            None, "origin", f"meta.origin is {found}, not hermes-archive.invalid/{store_id}"
        )
    return meta


def verify_database_v2(
    conn: sqlite3.Connection, vkey: str | None = None, jobs: int = 1
) -> ReportV2:
    """Full verification of a v2 archive (FORMAT.md 20.2) in one read transaction.

    ``vkey`` is the pinned verifier key: with it every signed checkpoint's signature is
    checked (``authenticity`` verified or failed); without it, ``not checked``. With
    ``jobs`` above 1 the payload merge runs in ``jobs - 1`` other processes, each on a
    range of digests, while this one checks the events (:class:`_Helpers`); the report is
    the one a single process gives.
    """
    report = ReportV2()
    if V2_UNAVAILABLE:
        return report.fail(None, f"cannot read the archive: {V2_UNAVAILABLE}", "unreadable")
    problem = schema_problem(conn, ARCHIVE_TABLES_V2)  # a view named like a table never runs
    if problem:
        return report.fail(None, problem, "unreadable")
    owns = not conn.in_transaction  # a writer checks inside its own write transaction
    helpers = None
    try:
        helpers = _Helpers.start(conn, jobs) if owns and jobs > 1 else None
        if helpers is None or not helpers.share(conn):
            if helpers is not None:
                helpers.close()
                helpers = None
            if owns:
                conn.execute("BEGIN")
        _verify_v2(conn, report, vkey, helpers)
    except _Failed as failure:
        report.fail(failure.seq, failure.problem, failure.code)
    except (sqlite3.Error, ValueError, TypeError) as exc:
        report.fail(None, f"cannot read the archive: {printable(exc)}", "unreadable")
    finally:
        if helpers is not None:
            helpers.close()
        if owns and conn.in_transaction:
            conn.execute("COMMIT")
    return report


def _verify_v2(
    conn: sqlite3.Connection, report: ReportV2, vkey: str | None, helpers: _Helpers | None = None
) -> None:
    meta = _v2_meta(conn, report)
    store_id = meta["store_id"]
    head = conn.execute("SELECT seq, chain, root FROM head WHERE id = 1").fetchone()
    genesis_value = blake3(V2_GENESIS + store_id.encode("ascii")).digest()
    report.head_seq = None if head is None else head[0]
    if head is None:
        head = (0, genesis_value, merkle.EMPTY_ROOT)
    try:  # the pass that holds on an intact archive: payloads merged, not looked up
        check = _V2Pass(conn, report)
        check.erasures()
        tree = _TreeCheck(conn)
        last_seq, last_chain = check.events(genesis_value, tree.append, payloads=False)
        if not (check.named(last_seq) if helpers is None else helpers.merged(check, last_seq)):
            raise _Failed(None, "unreadable", "a payload does not hold")
    except _Failed:  # something does not hold: the ordered pass names the first failure
        if helpers is not None:
            helpers.close()  # their merge is not needed: the ordered pass checks every payload
        report.events_checked = report.payloads_checked = report.payloads_erased = 0
        report.last_seq = 0
        check = _V2Pass(conn, report)
        check.erasures()
        tree = _TreeCheck(conn)
        last_seq, last_chain = check.events(genesis_value, tree.append)
        check.checked.clear()
    report.erasures = [{"seq": e, "payloads": n} for e, n in sorted(check.erasure_counts.items())]
    if head[0] > last_seq:
        raise _Failed(
            last_seq + 1,
            "truncated",
            f"the head records {head[0]} events but the log ends at {last_seq} (truncated)",
        )
    if head[0] < last_seq:
        raise _Failed(
            head[0] + 1,
            "after_head",
            f"events after the recorded head {head[0]} (appended outside the writer)",
        )
    if head[1] != last_chain:
        raise _Failed(
            last_seq or None, "head_chain", "the head's chain does not match the last event"
        )
    size, root, bad_tile = tree.finish()
    report.tree_size, report.root = size, root.hex()
    if head[2] != root:
        raise _Failed(
            last_seq or None, "head_root", "the head's Merkle root is not the root of the events"
        )
    if bad_tile is not None:
        level, index = bad_tile
        first = index * merkle.TILE_WIDTH ** (level + 1) + 1
        raise _Failed(
            first if first <= last_seq else None,
            "tiles",
            f"tile {merkle.tile_path(level, index)} is not the tile of the events",
        )
    _check_checkpoints(conn, report, tree.stored, store_id, vkey)  # every row is as built


_HEAD_ROW = "SELECT seq, chain, root FROM head WHERE id = 1"


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system has one)."""
    counted = getattr(os, "process_cpu_count", None)  # Python 3.13
    if counted is not None:
        return int(counted() or 1)
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:
        return os.cpu_count() or 1


def _read_only(database: str) -> sqlite3.Connection:
    """A read-only connection to ``database`` that runs none of its schema's SQL functions."""
    uri = pathlib.Path(os.path.abspath(database)).as_uri() + "?mode=ro"  # quotes # ? %
    conn = sqlite3.connect(uri, uri=True, isolation_level=None)
    conn.execute("PRAGMA trusted_schema = OFF")  # the file may come from anywhere
    return conn


#: the most processes ``verify --jobs`` uses (each helper takes some 30 MiB)
MAX_JOBS = 16
#: the events pass costs about half the payload merge (PERFORMANCE.md, 100k and 1M events)
_EVENTS_PER_MERGE = 0.5

_Range = tuple[bytes | None, bytes | None]


def _digest_ranges(jobs: int) -> tuple[_Range | None, list[_Range]]:
    """The digests the parent merges after its events pass (None: none) and each helper's, cut
    by first byte so that ``jobs`` processes finish together; together every value."""
    own = max(0.0, (1 + _EVENTS_PER_MERGE) / jobs - _EVENTS_PER_MERGE)  # the parent's share
    starts = [own + (1 - own) * i / (jobs - 1) for i in range(jobs - 1)]
    cuts = [bytes([min(255, round(256 * start))]) for start in starts[1 if own == 0 else 0 :]]
    bounds: list[_Range] = list(zip([None, *cuts], [*cuts, None], strict=True))
    return (bounds[0] if own else None), bounds[1 if own else 0 :]


class _Helpers:
    """The processes of ``verify --jobs``: each merges one range of digests (:meth:`_V2Pass.named`)
    while the parent checks the events, on the parent's read snapshot.

    The snapshot is shared by agreement: each helper starts its read transaction and sends its
    head row; the parent starts its own and compares. A row in ``payloads`` an event names
    changes only in an erasure (FORMAT.md 12.4: the triggers refuse anything else), which
    appends an event and so moves the head, and events are only appended: equal heads are
    the same events and the same payloads. Otherwise all start again (a writer committed
    between), up to ``TRIES`` times, then the parent merges alone.

    A helper is a fresh interpreter running this module (:func:`_helper_main`), never a fork
    of a process holding SQLite connections and threads, and never a re-run of the caller's
    main module; it ignores Ctrl-C (the parent, which gets it too, stops it) and exits as
    soon as its link to the parent closes, the parent killed outright included.
    """

    TRIES = 8

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []
        self.links: list[Connection] = []
        self.own: _Range | None = None  # the digests the parent merges itself
        self.ranges: list[_Range] = []  # each helper's
        self.answered: set[int] = set()  # helpers whose result was received

    @classmethod
    def start(cls, conn: sqlite3.Connection, jobs: int) -> _Helpers | None:
        """``jobs - 1`` helpers on ``conn``'s database file; None for a database in memory
        (or where no interpreter can be started: one process verifies alone)."""
        try:
            listed = conn.execute("PRAGMA database_list").fetchall()
        except sqlite3.Error:  # the verification names it
            return None
        path = next((row[2] for row in listed if row[1] == "main"), "")
        if not path or not sys.executable:
            return None
        module = __name__ if __name__ != "__main__" else pathlib.Path(__file__).stem
        root = pathlib.Path(__file__).resolve().parents[module.count(".")]
        helpers = cls()
        helpers.own, helpers.ranges = _digest_ranges(min(jobs, MAX_JOBS))
        try:
            for low, high in helpers.ranges:
                mine, theirs = socket.socketpair()
                helpers.links.append(Connection(mine.detach()))
                with theirs:
                    helpers.processes.append(
                        subprocess.Popen(
                            [sys.executable, *_isolation(), "-c", _HELPER, str(root), module, path]
                            + [str(theirs.fileno()), _bound(low), _bound(high)],
                            stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL,
                            pass_fds=(theirs.fileno(),),
                        )
                    )
        except (OSError, ValueError):  # no process to be had
            helpers.close()
            return None
        except BaseException:
            helpers.close()
            raise
        return helpers

    def share(self, conn: sqlite3.Connection) -> bool:
        """Begin ``conn``'s read transaction on the snapshot every helper reads (True), or
        on none of theirs (False: the helpers are to be closed)."""
        try:
            for _ in range(self.TRIES):
                heads = [link.recv() for link in self.links]
                conn.execute("BEGIN")
                mine = _head_of(conn)
                if all(head == mine for head in heads):
                    for link in self.links:
                        link.send("go")
                    return True
                conn.execute("COMMIT")
                for link in self.links:
                    link.send("again")
        except (EOFError, OSError):  # a helper did not start
            if conn.in_transaction:
                conn.execute("COMMIT")
        return False

    def merged(self, check: _V2Pass, until: int) -> bool:
        """What :meth:`_V2Pass.named` gives for ``until``: the parent's range, the helpers'."""
        if self.own is not None and not check.named(until, *self.own):
            return False
        for index, (link, (low, high)) in enumerate(zip(self.links, self.ranges, strict=True)):
            try:
                ok, last, checked, erased, counts = link.recv()
                self.answered.add(index)
            except (EOFError, OSError):  # the helper died: its range is merged here
                if not check.named(until, low, high):
                    return False
                continue
            if not (ok and last == until):
                return False
            check.report.payloads_checked += checked
            check.report.payloads_erased += erased
            for seq, count in counts.items():
                check.erasure_counts[seq] = check.erasure_counts.get(seq, 0) + count
        return True

    def close(self) -> None:
        """Stop every helper still running and wait for it: none is left behind. Those that
        answered are ending on their own (each sends its range's result last)."""
        for link in self.links:
            link.close()  # a helper still merging sees its link close and exits
        for index, process in enumerate(self.processes):
            if index not in self.answered and process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes, self.links, self.ranges = [], [], []


#: a helper's interpreter: this module from the folder it was loaded from, then its main
_HELPER = (
    "import sys; sys.path.insert(0, sys.argv[1]); import importlib; "
    "importlib.import_module(sys.argv[2])._helper_main(sys.argv[3:])"
)


def _isolation() -> list[str]:
    """The isolation flags this interpreter runs with, which a helper keeps."""
    if sys.flags.isolated:
        return ["-I"]
    return ["-E"] * bool(sys.flags.ignore_environment) + ["-s"] * bool(sys.flags.no_user_site)


def _bound(value: bytes | None) -> str:
    return "-" if value is None else value.hex()


def _head_of(conn: sqlite3.Connection) -> object:
    try:
        return conn.execute(_HEAD_ROW).fetchone()
    except sqlite3.Error as exc:  # the verification names it; the snapshots agree on it
        return str(exc)


def _helper_main(argv: list[str]) -> None:
    """A helper of ``verify --jobs`` (:class:`_Helpers`): ``DATABASE FD LOW HIGH``. Agree on
    the parent's snapshot, then send ``(ok, until, payloads checked, erased, erasure
    counts)`` of the digests ``LOW <= digest < HIGH`` (hex, or ``-``: open)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    path, fd, low, high = argv
    link = Connection(int(fd))
    try:
        conn = _read_only(path)
    except sqlite3.Error:
        return  # the parent, which reads the same file, names what is wrong with it
    try:
        while True:
            conn.execute("BEGIN")
            link.send(_head_of(conn))
            if link.recv() == "go":
                break
            conn.execute("COMMIT")
        # the parent sends nothing more: the link readable means it closed it, or died
        done = threading.Event()
        threading.Thread(target=_exit_with, args=(link, done), daemon=True).start()
        report = ReportV2()
        check = _V2Pass(conn, report)
        try:
            check.erasures()
            until = conn.execute("SELECT max(seq) FROM events").fetchone()[0]
            ok = isinstance(until, int) and check.named(
                until, *(None if b == "-" else bytes.fromhex(b) for b in (low, high))
            )
        except (_Failed, sqlite3.Error, ValueError, TypeError):
            ok = False
        counts = {seq: count for seq, count in check.erasure_counts.items() if count}
        done.set()  # from here this helper ends on its own
        link.send(
            (ok, until if ok else None, report.payloads_checked, report.payloads_erased, counts)
        )
    except (EOFError, OSError, sqlite3.Error):
        pass  # the parent merges alone, or is gone: it reports, not a helper
    finally:
        conn.close()


def _exit_with(link: Connection, done: threading.Event) -> None:
    wait([link])
    if not done.is_set():
        os._exit(1)


def _check_checkpoints(
    conn: sqlite3.Connection,
    report: ReportV2,
    read_tile: Callable[[int, int], bytes | None],
    store_id: str,
    vkey: str | None,
) -> None:
    """Signed checkpoints (FORMAT.md 20.2 step 6): roots and signatures, with a pinned key."""
    rows = conn.execute(
        "SELECT size, root, signature FROM signed_checkpoints ORDER BY size"
    ).fetchall()
    if rows:
        report.checkpoint = {"size": rows[-1][0], "signature": "not checked", "cosigned_by": []}
    if vkey is None:
        if rows:
            report.warnings.append(
                "signed checkpoints were not checked: give the archive's verifier key "
                "(`hermes-archive key` prints it; pin it where the archive's writer cannot "
                "change it)"
            )
        return
    try:
        log_key = signed_note.Verifier.from_vkey(vkey)
    except signed_note.NoteError as exc:
        raise _Failed(
            None, "checkpoint_signature", f"the verifier key is not usable: {exc}"
        ) from None
    origin = f"hermes-archive.invalid/{store_id}"
    if log_key.name != origin:
        report.authenticity = "failed"
        raise _Failed(
            None, "checkpoint_signature", f"the verifier key is for {log_key.name}, not {origin}"
        )
    if not rows and report.tree_size:
        report.authenticity = "failed"
        raise _Failed(
            None,
            "checkpoint_signature",
            f"no signed checkpoint: none of the {report.tree_size} events is signed by the "
            "pinned key",
        )
    reader = merkle.TileReader(read_tile, report.tree_size)
    for size, root, signature in rows:
        if size > report.tree_size:
            report.authenticity = "failed"
            raise _Failed(
                None, "checkpoint_root", f"a checkpoint is signed at size {size}, beyond the log"
            )
        if bytes(root) != merkle.root(size, reader):
            report.authenticity = "failed"
            raise _Failed(
                size or None,
                "checkpoint_root",
                f"the checkpoint at size {size} does not name the root of the first {size} events",
            )
        text = signed_note.format_checkpoint(signed_note.Checkpoint(origin, size, bytes(root)))
        if not log_key.verify(
            text, signed_note.Signature(origin, log_key.key_id, bytes(signature))
        ):
            report.authenticity = "failed"
            raise _Failed(
                None,
                "checkpoint_signature",
                f"the checkpoint at size {size} is not signed by that key",
            )
    if rows:
        report.authenticity = "verified"
        assert report.checkpoint is not None
        report.checkpoint["signature"] = "verified"
        signed = rows[-1][0]
        if signed < report.tree_size:  # what the signature covers, and what it does not
            report.warnings.append(
                f"events 1 to {signed} are signed (the newest checkpoint, size {signed}); "
                f"events {signed + 1} to {report.tree_size} are after it: their chain and tree "
                "hold, but no signature covers them yet"
            )


# -- export bundles (docs/AUDIT.md section 4) --------------------------------------------

BUNDLE_NAME = "hermes-archive-bundle"
BUNDLE_VERSION = 1
MANIFEST = "manifest.json"
KEY_MEMBER = "payload.key"
ENVELOPES = "envelopes.jsonl"
PAYLOAD_PREFIX = "payloads/"
ENVELOPE_FIELDS = ("seq", "time", "type", "session", "key", "identity", "payload", "parts", "chain")
SEAL_PREFIX = b"hermes-archive bundle v1; manifest blake3 "
SEAL_MIDDLE = b"; seal blake3 "
SEAL_LENGTH = len(SEAL_PREFIX) + 64 + len(SEAL_MIDDLE) + 64
_SEAL = re.compile(
    re.escape(SEAL_PREFIX) + rb"([0-9a-f]{64})" + re.escape(SEAL_MIDDLE) + rb"([0-9a-f]{64})\Z"
)
_END_OF_ZIP = b"PK\x05\x06"  # the end-of-central-directory record; the seal is its comment
_END_RECORD = 22
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z")
#: manifest.json holds one small entry per member: it may be this large for each member (a
#: payload name is 73 characters, its size and digest about 90 more) plus a fixed allowance
_MANIFEST_PER_MEMBER = 512
_MANIFEST_BASE = 1 << 16
_MAX_KEY_MEMBER = 256  # 64 hex digits and a newline; anything far larger is not a key
_MAX_PAYLOAD = 1_000_000_000  # SQLite's largest value: no archive holds a larger payload
_MAX_ENVELOPE_LINE = 1 << 30


class BundleError(Exception):
    """The bundle is damaged or inconsistent; the message names what, ``seq`` where known,
    ``code`` which rule (FORMAT.md 21.4; a manifest's by default)."""

    def __init__(self, message: str, seq: int | None = None, code: str = "bundle_manifest") -> None:
        super().__init__(message)
        self.seq, self.code = seq, code
        self.store_id: str | None = None  # the manifest's, once it was read


def seal_comment(manifest_digest: str, seal: str = "0" * 64) -> bytes:
    """The zip comment that seals a bundle (the exporter writes zeros, then the seal)."""
    return SEAL_PREFIX + manifest_digest.encode("ascii") + SEAL_MIDDLE + seal.encode("ascii")


def selected(selection: Mapping[str, Any], session: str, time: str) -> bool:
    """Whether an event is in an export's selection: same session, ``since <= time <= until``.

    Times are envelope time text (fixed-width UTC), so comparing text compares instants.
    """
    return (
        (selection.get("session") is None or session == selection["session"])
        and (selection.get("since") is None or time >= selection["since"])
        and (selection.get("until") is None or time <= selection["until"])
    )


def envelope_line(row: Row) -> bytes:
    """A line of ``envelopes.jsonl``: ASCII JSON, so any text (lone surrogates too) round-trips."""
    return (
        json.dumps(
            dict(zip(ENVELOPE_FIELDS, row, strict=True)), sort_keys=True, separators=(",", ":")
        )
        + "\n"
    ).encode("ascii")


def seal_digest(handle: BinaryIO, size: int) -> str:
    """BLAKE3 over every byte of the bundle except the last 64 (the seal digest itself)."""
    hasher = blake3()
    handle.seek(0)
    remaining = size - 64
    while remaining > 0:
        chunk = handle.read(min(1 << 20, remaining))
        if not chunk:
            break
        hasher.update(chunk)
        remaining -= len(chunk)
    return hasher.hexdigest()


def _read_seal(handle: BinaryIO) -> tuple[str, str, int]:
    """(manifest digest, seal digest, file size) from the comment of the end-of-zip record."""
    size = handle.seek(0, os.SEEK_END)
    if size < SEAL_LENGTH + _END_RECORD:
        raise BundleError(
            "the file is too short to be a hermes-archive bundle", None, "bundle_seal"
        )
    handle.seek(size - SEAL_LENGTH - _END_RECORD)
    tail = handle.read()
    if tail[:4] != _END_OF_ZIP or int.from_bytes(tail[20:22], "little") != SEAL_LENGTH:
        raise BundleError(
            "the end-of-zip record before the seal is damaged (or this is not a bundle)",
            None,
            "bundle_seal",
        )
    match = _SEAL.match(tail[_END_RECORD:])
    if match is None:
        raise BundleError(
            "the seal (the zip comment at the end of the bundle) is damaged", None, "bundle_seal"
        )
    return match.group(1).decode(), match.group(2).decode(), size


def _member_digest(archive: zipfile.ZipFile, name: str, limit: int) -> tuple[int, str]:
    """(size, BLAKE3) of a member's content, reading at most ``limit`` + 1 bytes."""
    hasher, size = blake3(), 0
    try:
        with archive.open(name) as member:
            while size <= limit:
                chunk = member.read(min(1 << 20, limit + 1 - size))
                if not chunk:
                    break
                hasher.update(chunk)
                size += len(chunk)
    except Exception as exc:  # CRC, zlib, header and encryption-flag errors all land here
        raise BundleError(
            f"member {printable(name)} cannot be read: {exc}", None, "bundle_member"
        ) from None
    return size, hasher.hexdigest()


def _member_pieces(archive: zipfile.ZipFile, name: str, first: int = 1 << 20) -> Iterator[bytes]:
    """A member's content: ``first`` bytes (fewer only at its end), then pieces of at most
    1 MiB, so a body is hashed as a stream, in the memory the other checks keep, whatever
    size it claims."""
    try:
        with archive.open(name) as member:
            piece = member.read(first)
            while piece:
                yield piece
                piece = member.read(1 << 20)
    except Exception as exc:  # CRC, zlib, header and encryption-flag errors
        raise BundleError(
            f"member {printable(name)} cannot be read: {exc}", None, "bundle_member"
        ) from None


def _field(data: Mapping[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = data.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise BundleError(f"{where}: field {name!r} is missing or has the wrong type")
    return value


def _digest_field(data: Mapping[str, Any], name: str, where: str) -> str:
    value = _field(data, name, str, where)
    if not _HEX64.fullmatch(value):
        raise BundleError(f"{where}: field {name!r} is not a 64-digit lowercase hex digest")
    return str(value)


def _check_manifest(manifest: Any) -> dict[str, Any]:
    """Validate the manifest's shape (every field the checks rely on); return it."""
    where = MANIFEST
    if not isinstance(manifest, dict):
        raise BundleError(f"{where} is not a JSON object")
    if manifest.get("bundle") != BUNDLE_NAME or manifest.get("bundle_version") != BUNDLE_VERSION:
        raise BundleError(f"{where}: not a {BUNDLE_NAME} version {BUNDLE_VERSION}")
    if manifest.get("format_version") != SUPPORTED_FORMAT:
        raise BundleError(
            f"{where}: unsupported archive format version {manifest.get('format_version')!r}"
        )
    store_id = _field(manifest, "store_id", str, where)
    if not re.fullmatch(r"[0-9a-f]{32}", store_id):
        raise BundleError(f"{where}: store_id is not 32 hex digits")
    for section in ("head", "proof"):
        block = _field(manifest, section, dict, where)
        seq_name = "seq" if section == "head" else "start_seq"
        if _field(block, seq_name, int, f"{where} {section}") < 0:
            raise BundleError(f"{where}: {section} {seq_name} is negative")
        _digest_field(block, "chain" if section == "head" else "start_chain", f"{where} {section}")
    selection = _field(manifest, "selection", dict, where)
    if set(selection) != {"session", "since", "until"}:
        raise BundleError(f"{where}: selection must name exactly session, since and until")
    for name in ("session", "since", "until"):
        value = selection[name]
        if value is not None and not isinstance(value, str):
            raise BundleError(f"{where}: selection {name} must be text or null")
        if name != "session" and value is not None and not _TIME.fullmatch(value):
            raise BundleError(f"{where}: selection {name} is not envelope time text")
    for name in ("envelopes", "selected_events", "payloads"):
        if _field(manifest, name, int, where) < 0:
            raise BundleError(f"{where}: {name} is negative")
    members = _field(manifest, "members", dict, where)
    for name, entry in members.items():
        if not isinstance(entry, dict):
            raise BundleError(f"{where}: member entry {name!r} is not an object")
        _field(entry, "size", int, f"{where} member {name}")
        _digest_field(entry, "blake3", f"{where} member {name}")
        if name not in (KEY_MEMBER, ENVELOPES) and not (
            name.startswith(PAYLOAD_PREFIX) and _HEX64.fullmatch(name[len(PAYLOAD_PREFIX) :])
        ):
            raise BundleError(f"{where}: unexpected member name {name!r}")
    for name in (KEY_MEMBER, ENVELOPES):
        if name not in members:
            raise BundleError(f"{where}: member {name} is not listed")
    return manifest


def _envelope_rows(archive: zipfile.ZipFile, first_seq: int) -> Iterator[Row]:
    """Parse ``envelopes.jsonl`` strictly: exact fields, exact types, ASCII only."""
    expected = set(ENVELOPE_FIELDS)
    with archive.open(ENVELOPES) as member:
        for number, raw in enumerate(iter(lambda: member.readline(_MAX_ENVELOPE_LINE), b""), 1):
            seq_hint = first_seq + number
            try:
                value = json.loads(raw.decode("ascii"))
            except (UnicodeDecodeError, ValueError) as exc:
                raise BundleError(
                    f"{ENVELOPES} line {number} is not JSON: {exc}", seq_hint, "bundle_envelope"
                ) from None
            if not raw.endswith(b"\n") or not isinstance(value, dict) or set(value) != expected:
                raise BundleError(
                    f"{ENVELOPES} line {number} is not an envelope record",
                    seq_hint,
                    "bundle_envelope",
                )
            seq = value["seq"]
            if (
                not isinstance(seq, int)
                or isinstance(seq, bool)
                or any(not isinstance(value[name], str) for name in ENVELOPE_FIELDS[1:])
            ):
                raise BundleError(
                    f"{ENVELOPES} line {number}: a field has the wrong type",
                    seq_hint,
                    "bundle_envelope",
                )
            yield tuple(value[name] for name in ENVELOPE_FIELDS)


def _check_members(archive: zipfile.ZipFile, names: list[str], manifest: dict[str, Any]) -> None:
    """The zip holds exactly the members the manifest lists, each as listed (version 3: as the
    checks read them)."""
    members: dict[str, dict[str, Any]] = manifest["members"]
    present = set(names) - {MANIFEST}
    missing, unlisted = sorted(set(members) - present), sorted(present - set(members))
    if missing:
        raise BundleError(
            f"member {printable(missing[0])} is listed in the manifest but missing",
            None,
            "bundle_member",
        )
    if unlisted:
        raise BundleError(
            f"member {printable(unlisted[0])} is not listed in the manifest", None, "bundle_member"
        )
    if manifest.get("bundle_version") == BUNDLE_VERSION_V3:
        return
    for name in names:
        entry = members.get(name)
        if entry is not None and _member_digest(archive, name, entry["size"]) != (
            entry["size"],
            entry["blake3"],
        ):
            raise BundleError(
                f"member {printable(name)} was changed: its size or BLAKE3 differs from the "
                "manifest",
                None,
                "bundle_member",
            )


def _verify_open_bundle(
    handle: BinaryIO,
    report: Report,
    progress: Callable[[int], None] | None,
    vkey: str | None = None,
) -> Report:
    manifest_digest, seal, size = _read_seal(handle)
    try:
        archive = zipfile.ZipFile(handle)
    except Exception as exc:
        raise BundleError(f"the zip directory is damaged: {exc}", None, "bundle_seal") from None
    names = archive.namelist()
    seen: set[str] = set()
    for name in names:  # linear: one set lookup per member
        if name in seen:
            raise BundleError(
                f"member {printable(name)} appears more than once", None, "bundle_member"
            )
        seen.add(name)
    if MANIFEST not in seen:
        raise BundleError(f"{MANIFEST} is missing")
    manifest_limit = _MANIFEST_BASE + _MANIFEST_PER_MEMBER * len(names)
    if archive.getinfo(MANIFEST).file_size > manifest_limit:
        raise BundleError(
            f"{MANIFEST} says it inflates to {archive.getinfo(MANIFEST).file_size} bytes, more "
            f"than a manifest of {len(names)} members can hold"
        )
    manifest_size, digest = _member_digest(archive, MANIFEST, manifest_limit)
    if manifest_size > manifest_limit:
        raise BundleError(f"{MANIFEST} inflates past {manifest_limit} bytes")
    if digest != manifest_digest:
        raise BundleError(
            f"{MANIFEST} does not match the manifest digest in the seal (one of them was changed)"
        )
    with archive.open(MANIFEST) as member:
        try:
            manifest = _ONCE.decode(member.read(manifest_size).decode("utf-8"))
        except _Twice as twice:  # never "last one wins" (FORMAT.md 20.1)
            raise BundleError(
                f'{MANIFEST} has the member "{printable(twice.name)}" twice', None, "duplicate_key"
            ) from None
        except (UnicodeDecodeError, ValueError) as exc:
            raise BundleError(f"{MANIFEST} is not valid JSON: {exc}") from None
    v2 = isinstance(manifest, dict) and manifest.get("bundle_version") in (
        BUNDLE_VERSION_V2,
        BUNDLE_VERSION_V3,
    )
    manifest = _check_manifest_v2(manifest) if v2 else _check_manifest(manifest)
    try:
        _check_members(archive, names, manifest)
        if v2:
            contents = [name for name in names if name != MANIFEST]
            return _verify_bundle_v2(
                archive, manifest, contents, handle, (size, seal), vkey, progress
            )
    except BundleError as failure:  # the report names the store the manifest names
        failure.store_id = manifest["store_id"]
        raise
    members: dict[str, dict[str, Any]] = manifest["members"]
    store_id, head, proof = manifest["store_id"], manifest["head"], manifest["proof"]
    start = (proof["start_seq"], proof["start_chain"])
    report.details = {
        "store_id": store_id,
        "created": manifest.get("created"),
        "head": {"seq": head["seq"], "chain": head["chain"]},
        "proof_start": {"seq": start[0], "chain": start[1], "genesis": start[0] == 0},
        "selection": manifest["selection"],
        "envelopes": manifest["envelopes"],
        "selected_events": manifest["selected_events"],
        "payloads": manifest["payloads"],
    }
    if start[0] == 0 and start[1] != genesis(store_id):
        raise BundleError(
            f"{MANIFEST}: the proof starts at seq 0 but not at the genesis of store {store_id}"
        )
    if start[0] > head["seq"]:
        raise BundleError(f"{MANIFEST}: the proof starts after the head")
    if members[KEY_MEMBER]["size"] > _MAX_KEY_MEMBER:
        raise BundleError(
            f"{KEY_MEMBER} is {members[KEY_MEMBER]['size']} bytes; a key is 64 hex digits"
        )
    try:
        key = bytes.fromhex(archive.read(KEY_MEMBER).decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        raise BundleError(f"{KEY_MEMBER} is not hex text") from None
    if len(key) != 32:
        raise BundleError(f"{KEY_MEMBER} must hold 32 bytes, found {len(key)}")

    payload_names = {name for name in members if name.startswith(PAYLOAD_PREFIX)}
    referenced: set[str] = set()
    selection, chosen = manifest["selection"], [0]

    def payload_of(digest: str) -> Iterator[bytes] | None:
        name = PAYLOAD_PREFIX + digest
        if name not in payload_names:
            return None
        if members[name]["size"] > _MAX_PAYLOAD:  # checked against the content above
            raise BundleError(f"member {printable(name)} is larger than any archive can hold")
        referenced.add(name)
        return _member_pieces(archive, name)

    def payload_needed(row: Row) -> bool:
        if selected(selection, row[3], row[1]):
            chosen[0] += 1
            return True
        return False

    checked = verify_rows(
        _envelope_rows(archive, start[0]),
        store_id=store_id,
        key=key,
        payload_of=payload_of,
        head=(head["seq"], head["chain"]),
        start=start,
        progress=progress,
        payload_needed=payload_needed,
    )
    checked.details, checked.warnings = report.details, report.warnings
    report = checked
    if not report.ok:
        return report
    if report.events_checked != manifest["envelopes"]:
        return report.fail(
            None,
            f"{MANIFEST} claims {manifest['envelopes']} envelopes, "
            f"the bundle holds {report.events_checked}",
        )
    if chosen[0] != manifest["selected_events"]:
        return report.fail(
            None,
            f"{MANIFEST} claims {manifest['selected_events']} selected events, "
            f"the envelopes select {chosen[0]}",
        )
    unreferenced = sorted(payload_names - referenced)
    if unreferenced:
        return report.fail(
            None,
            f"member {printable(unreferenced[0])} is not a payload or part of any selected event",
        )
    if len(payload_names) != manifest["payloads"]:
        return report.fail(
            None,
            f"{MANIFEST} claims {manifest['payloads']} payloads, "
            f"the bundle holds {len(payload_names)}",
        )
    if seal_digest(handle, size) != seal:
        return report.fail(
            None,
            "the bundle's bytes do not match its seal: a zip header or directory entry "
            "(outside every member's content) or the seal itself was changed",
        )
    if start[0] > 0:
        report.warnings.append(
            f"the chain was checked from a stated start (seq {start[0]}, chain {start[1]}), "
            "not from the genesis: confirm that value against the archive "
            f"(hermes-archive show {start[0]})"
        )
    return report


# -- export bundles, version 2 (docs/FORMAT.md 21.2) -----------------------------------------

BUNDLE_VERSION_V2 = 2
ENVELOPE_FIELDS_V2 = (
    "seq",
    "time",
    "type",
    "session",
    "key",
    "identity",
    "payload",
    "parts",
    "author",
    "chain",
)
SALT_BYTES = 32
#: version 3 (FORMAT.md 21.3): the carried bodies and tombstones in one streamed member, so
#: neither the zip directory nor the manifest grows with the archive
BUNDLE_VERSION_V3 = 3
PAYLOADS = "payloads.bin"
CARRIED, TOMBSTONE = 1, 0  # the first byte of a payloads.bin record
#: added to a record's first byte when a later name (in 21.3's order) names its digest again
AGAIN = 0x80


class _BundleErrorV2(BundleError):
    """A v2 bundle check failed: the report so far and the failure's code travel with it."""

    def __init__(self, report: ReportV2, message: str, seq: int | None, code: str) -> None:
        super().__init__(message, seq, code)
        self.report = report


def _check_manifest_v2(manifest: Any) -> dict[str, Any]:
    """Validate a version-2 or -3 manifest's shape (FORMAT.md 21.2, 21.3); return it."""
    where = MANIFEST
    version = manifest.get("bundle_version")  # 2 or 3: the caller read it
    v3 = version == BUNDLE_VERSION_V3
    if manifest.get("bundle") != BUNDLE_NAME or manifest.get("format_version") != 2:
        raise BundleError(f"{where}: not a {BUNDLE_NAME} version {version} of a format-2 archive")
    if V2_UNAVAILABLE:
        raise BundleError(f"cannot check a version-{version} bundle: {V2_UNAVAILABLE}")
    store_id = _field(manifest, "store_id", str, where)
    if not _STORE_ID.fullmatch(store_id):
        raise BundleError(f"{where}: store_id is not 32 lowercase hex digits")
    head = _field(manifest, "head", dict, where)
    if _field(head, "seq", int, f"{where} head") < 0:
        raise BundleError(f"{where}: head seq is negative")
    for name in ("chain", "root"):
        _digest_field(head, name, f"{where} head")
    selection = _field(manifest, "selection", dict, where)
    if set(selection) != {"session", "since", "until"} or any(
        v is not None and not isinstance(v, str) for v in selection.values()
    ):
        raise BundleError(f"{where}: selection must name exactly session, since and until")
    for name in ("envelopes", "selected_events", "payloads"):
        if _field(manifest, name, int, where) < 0:
            raise BundleError(f"{where}: {name} is negative")
    _field(manifest, "checkpoint", str, where)
    consistency = _field(manifest, "consistency", list, where)
    if not all(isinstance(line, str) for line in consistency):
        raise BundleError(f"{where}: consistency is a list of base64 lines")
    if v3:  # tombstones travel in payloads.bin; the manifest counts them
        if _field(manifest, "erased", int, where) < 0:
            raise BundleError(f"{where}: erased is negative")
    else:
        for entry in _field(manifest, "erased", list, where):
            if not isinstance(entry, dict) or set(entry) != {"digest", "seq"}:
                raise BundleError(f"{where}: an erased entry is not a digest and its erasure seq")
            _digest_field(entry, "digest", f"{where} erased")
            _field(entry, "seq", int, f"{where} erased")
    members = _field(manifest, "members", dict, where)
    for name, entry in members.items():
        if not isinstance(entry, dict):
            raise BundleError(f"{where}: member entry {name!r} is not an object")
        _field(entry, "size", int, f"{where} member {name}")
        _digest_field(entry, "blake3", f"{where} member {name}")
        if not (
            name in (ENVELOPES_V3, PAYLOADS)
            if v3
            else name == ENVELOPES
            or name.startswith(PAYLOAD_PREFIX)
            and _HEX64.fullmatch(name[len(PAYLOAD_PREFIX) :])
        ):
            raise BundleError(f"{where}: unexpected member name {printable(name)}")
    for name in (ENVELOPES_V3, PAYLOADS) if v3 else (ENVELOPES,):
        if name not in members:
            raise BundleError(f"{where}: member {name} is not listed")
    return dict(manifest)


def _envelope_record_v2(raw: bytes, number: int) -> dict[str, Any]:
    """One ``envelopes.jsonl`` line parsed strictly: exact fields and types, duplicates refused."""
    try:
        value = _ONCE.decode(raw.decode("ascii"))
    except _Twice as twice:
        raise BundleError(
            f'{ENVELOPES} line {number} has the member "{printable(twice.name)}" twice',
            number,
            "duplicate_key",
        ) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise BundleError(
            f"{ENVELOPES} line {number} is not JSON: {exc}", number, "bundle_envelope"
        ) from None
    if (
        not raw.endswith(b"\n")
        or not isinstance(value, dict)
        or set(value) != set(ENVELOPE_FIELDS_V2)
        or type(value["seq"]) is not int
        or not all(isinstance(value[n], str) for n in ("time", "type", "session", "key"))
        or not all(
            isinstance(value[n], str) and _HEX64.fullmatch(value[n])
            for n in ("identity", "payload", "chain")
        )
        or not isinstance(value["parts"], list)
        or not all(isinstance(d, str) and _HEX64.fullmatch(d) for d in value["parts"])
        or not (
            value["author"] is None
            or isinstance(value["author"], str)
            and _HEX64.fullmatch(value["author"])
        )
    ):
        raise BundleError(
            f"{ENVELOPES} line {number} is not a v2 envelope record", number, "bundle_envelope"
        )
    return value


#: an envelope as the bundle check uses it: seq, time, type, session, their canonical texts,
#: key, identity and payload (hex), the parts' canonical text, the author's (``null`` or a
#: quoted digest), the chain and the digests it names in 21.3's order (raw, 32 bytes each)
EnvelopeV2 = tuple[int, str, str, str, str, str, str, str, str, str, str, str, bytes, bytes]


def _envelope_v2_of(value: dict[str, Any]) -> EnvelopeV2:
    """:data:`EnvelopeV2` of a line :func:`_envelope_record_v2` parsed."""
    author = value["author"]
    return (
        value["seq"],
        value["time"],
        value["type"],
        value["session"],
        _text(value["time"]),
        _text(value["type"]),
        _text(value["session"]),
        value["key"],
        value["identity"],
        value["payload"],
        "[" + ",".join('"' + d + '"' for d in value["parts"]) + "]",
        "null" if author is None else '"' + author + '"',
        bytes.fromhex(value["chain"]),
        bytes.fromhex(value["payload"] + "".join(value["parts"]) + (author or "")),
    )


def _envelope_rows_v2(archive: zipfile.ZipFile) -> Iterator[EnvelopeV2]:
    """A version-2 bundle's ``envelopes.jsonl``, every line parsed strictly."""
    with archive.open(ENVELOPES) as member:
        for number, raw in enumerate(iter(lambda: member.readline(_MAX_ENVELOPE_LINE), b""), 1):
            yield _envelope_v2_of(_envelope_record_v2(raw, number))


#: bundle 3's envelope member (FORMAT.md 21.3): one binary record per envelope
ENVELOPES_V3 = "envelopes.bin"
#: a record's fixed head: seq, chain, identity, payload, whether there is an author, the
#: author (32 zero bytes when none), the number of parts and the UTF-8 lengths of time, type,
#: session and key; then the parts (32 bytes each) and those four texts
ENVELOPE_HEAD_V3 = struct.Struct(">Q32s32s32sB32sIIIII")
_NO_AUTHOR = bytes(32)


def _envelope_records_v3(member: _ReadOnce) -> Iterator[EnvelopeV2]:
    """A version-3 bundle's ``envelopes.bin`` read once, record by record; the texts of the
    few type names and sessions are kept while few."""
    unpack, fixed = ENVELOPE_HEAD_V3.unpack_from, ENVELOPE_HEAD_V3.size
    texts: dict[bytes, tuple[str, str]] = {}
    data, at, number = b"", 0, 0

    def refused(why: str) -> BundleError:
        return BundleError(
            f"{ENVELOPES_V3} record {number} is not a v2 envelope record: {why}",
            number,
            "bundle_envelope",
        )

    def text(raw: bytes) -> tuple[str, str]:
        if len(texts) >= 4096:
            texts.clear()
        value = raw.decode("utf-8")
        found = texts[raw] = (value, _text(value))
        return found

    while True:
        number += 1
        if len(data) - at < fixed:
            data, at = data[at:], 0
            while len(data) < fixed and (more := member.read(1 << 16)):
                data += more
            if not data:
                return
            if len(data) < fixed:
                raise refused("cut short")
        seq, chain, identity, payload, authored, author, count, times, types, sessions, keys = (
            unpack(data, at)
        )
        parts_at = at + fixed
        time_at = parts_at + 32 * count
        type_at = time_at + times
        session_at = type_at + types
        key_at = session_at + sessions
        end = key_at + keys
        if authored > 1 or not authored and author != _NO_AUTHOR:
            raise refused("its author flag is neither 0 nor 1 with an author")
        if end - at > _MAX_ENVELOPE_LINE:
            raise refused("larger than any envelope")
        while len(data) < end:
            more = member.read(max(1 << 16, end - len(data)))
            if not more:
                raise refused("cut short")
            data += more
        parts = data[parts_at:time_at]
        try:
            time = data[time_at:type_at].decode("utf-8")
            raw = data[type_at:session_at]
            type_, type_text = texts.get(raw) or text(raw)
            raw = data[session_at:key_at]
            session, session_text = texts.get(raw) or text(raw)
            key = data[key_at:end].decode("utf-8")
        except UnicodeDecodeError:
            raise refused("a text is not UTF-8") from None
        at = end
        yield (
            seq,
            time,
            type_,
            session,
            _text(time),
            type_text,
            session_text,
            key,
            identity.hex(),
            payload.hex(),
            _v2_parts_text(parts),
            '"' + author.hex() + '"' if authored else "null",
            chain,
            payload + parts + author if authored else payload + parts,
        )


class _ReadOnce:
    """A version-3 member read once: its size and BLAKE3 are taken as the checks read it
    (the bundle was inflated twice: once for the manifest's digests, once for the checks).
    Reading past the size the manifest lists is a changed member; :meth:`finish` reads what
    the checks left and compares."""

    def __init__(self, archive: zipfile.ZipFile, name: str, entry: Mapping[str, Any]) -> None:
        self.name, self.listed = name, (entry["size"], entry["blake3"])
        self.hasher, self.size = blake3(), 0
        self.broken: BundleError | None = None
        try:
            self.stream: IO[bytes] = archive.open(name)
        except Exception as exc:  # a damaged local header
            raise self._unreadable(exc) from None

    def _unreadable(self, exc: Exception) -> BundleError:
        self.broken = BundleError(
            f"member {printable(self.name)} cannot be read: {exc}", None, "bundle_member"
        )
        return self.broken

    def _changed(self) -> BundleError:
        self.broken = BundleError(
            f"member {printable(self.name)} was changed: its size or BLAKE3 differs from the "
            "manifest",
            None,
            "bundle_member",
        )
        return self.broken

    def read(self, size: int) -> bytes:
        if self.broken is not None:
            raise self.broken
        try:
            chunk = self.stream.read(size)
        except Exception as exc:  # CRC, zlib, header and encryption-flag errors
            raise self._unreadable(exc) from None
        self.hasher.update(chunk)
        self.size += len(chunk)
        if self.size > self.listed[0]:
            raise self._changed()
        return chunk

    def finish(self) -> None:
        """Raise if the member, read to its end, is not the one the manifest lists."""
        while self.read(1 << 20):
            pass
        if (self.size, self.hasher.hexdigest()) != self.listed:
            raise self._changed()


class _CarriedV2:
    """A version-2 bundle's bodies: a ``payloads/<digest>`` member each, tombstones listed in
    the manifest (both held whole: the directory and the manifest grow with the bundle)."""

    def __init__(
        self,
        archive: zipfile.ZipFile,
        members: dict[str, Any],
        erased: list[dict[str, Any]],
        report: ReportV2,
        fail: Callable[..., _BundleErrorV2],
    ) -> None:
        self.archive, self.members, self.report, self.fail = archive, members, report, fail
        self.erased = {bytes.fromhex(e["digest"]): e["seq"] for e in erased}
        self.referenced: set[str] = set()

    def check(self, digest: bytes, seq: int) -> None:
        """One digest a selected event names: its body carried and matching, or erased later."""
        name = PAYLOAD_PREFIX + digest.hex()
        if name not in self.members:
            at = self.erased.get(digest)
            if at is None or at <= seq:
                raise self.fail(
                    f"seq {seq}: payload {digest.hex()} is missing from the bundle",
                    seq,
                    "missing_payload",
                )
            self.report.payloads_erased += name not in self.referenced
            self.referenced.add(name)
            return
        if name in self.referenced:
            return
        if self.members[name]["size"] > _MAX_PAYLOAD + SALT_BYTES:
            raise self.fail(f"member {printable(name)} is larger than any archive can hold", seq)
        pieces = _member_pieces(self.archive, name, SALT_BYTES)  # salt, then the body
        _check_body(digest, next(pieces, b""), pieces, seq, self.fail)
        self.referenced.add(name)
        self.report.payloads_checked += 1

    def held(self) -> int:
        return sum(1 for n in self.members if n.startswith(PAYLOAD_PREFIX))

    def erasures(self) -> dict[int, int]:
        """Tombstones met, by the seq of the erasure that made them."""
        return collections.Counter(
            at for d, at in self.erased.items() if PAYLOAD_PREFIX + d.hex() in self.referenced
        )

    def unreferenced(self) -> str | None:
        names = sorted(
            n for n in self.members if n.startswith(PAYLOAD_PREFIX) and n not in self.referenced
        )
        return f"member {printable(names[0])}" if names else None


def _check_body(
    digest: bytes,
    salt: bytes,
    body: bytes | Iterable[bytes],
    seq: int,
    fail: Callable[..., _BundleErrorV2],
) -> None:
    """The body (whole, or the pieces of a stream) with its salt gives ``digest``."""
    hasher = blake3(V2_PAYLOAD + salt)
    for piece in (body,) if isinstance(body, bytes) else body:
        hasher.update(piece)
    if len(salt) != SALT_BYTES or hasher.digest() != digest:
        raise fail(
            f"seq {seq}: payload {digest.hex()} does not match its salt and body",
            seq,
            "payload_mismatch",
        )


class _Once:
    """That each digest of a version-3 bundle has exactly one record and that each record's
    "named again" flag (:data:`AGAIN`) tells the truth: checked exactly, once the envelopes
    end, in memory that does not grow with the bundle.

    The reader keeps only the flagged digests at hand, so a flag left off a digest that is
    named again, with its body carried a second time where it is, would pass the reading
    itself. So every record read (digest, flag, seq), and every later name of a flagged
    digest, is written to one of 2**BITS temporary files chosen by Python's keyed hash of
    the digest (salted per process: a bundle cannot aim its digests at one file); at the end
    each file is read back into one dict, and a file holding more than MOST digests is
    spread again by the hash's next bits. Appending costs a fraction of asking a set of every
    digest at each name (a Bloom filter, a temporary B-tree), which the flag spares."""

    BITS = 6
    MOST = 1 << 14  # digests read back into one dict
    RECORD, FLAGGED, NAMED = 0, 1, 2
    _ENTRY = struct.Struct(">32sBQ")  # digest, what (above), seq
    _WAITING = 1 << 12  # entries buffered (168 KiB) before they go to the files

    def __init__(self) -> None:
        self.mask = (1 << self.BITS) - 1
        self.pending = [bytearray() for _ in range(self.mask + 1)]
        self.files: list[IO[bytes] | None] = [None] * (self.mask + 1)
        self.waiting = 0

    def add(self, digest: bytes, what: int, seq: int) -> None:
        self.pending[hash(digest) & self.mask] += self._ENTRY.pack(digest, what, seq)
        self.waiting += 1
        if self.waiting >= self._WAITING:
            self._flush()

    def _flush(self) -> None:
        for i, data in enumerate(self.pending):
            if data:
                file = self.files[i]
                if file is None:
                    file = self.files[i] = tempfile.TemporaryFile()  # noqa: SIM115 (close())
                file.write(data)
                data.clear()
        self.waiting = 0

    def _entries(self, file: IO[bytes]) -> Iterator[tuple[bytes, int, int]]:
        file.seek(0)
        while chunk := file.read(self._ENTRY.size << 12):
            yield from self._ENTRY.iter_unpack(chunk)
        file.seek(0, os.SEEK_END)

    def record_of(self, digest: bytes) -> int | None:
        """The seq of the event whose name read ``digest``'s record, if one was read (to
        explain a failure; a whole file is read)."""
        self._flush()
        file = self.files[hash(digest) & self.mask]
        for named, what, seq in self._entries(file) if file is not None else ():
            if named == digest and what != self.NAMED:
                return seq
        return None

    def problem(self) -> tuple[int, str] | None:
        """(seq, message) of the first digest, by seq, with a second record or whose flag is
        untrue; None when every record is once and every flag true."""
        self._flush()
        found = [self._problem(file, 1) for file in self.files if file is not None]
        return min((p for p in found if p is not None), default=None)

    def _problem(self, file: IO[bytes], level: int) -> tuple[int, str] | None:
        state: dict[bytes, int] = {}  # seq << 2 | named again (2) | flagged (1)
        worst: tuple[int, str] | None = None
        spread = level * self.BITS + self.BITS <= 64  # the hash has bits left
        for digest, what, seq in self._entries(file):
            known = state.get(digest)
            if what == self.NAMED:
                if known is not None:  # always: only a flagged digest read before is named
                    state[digest] = known | 2
                continue
            if known is None:
                if len(state) >= self.MOST and spread:
                    return self._spread(file, level)
                state[digest] = seq << 2 | what
                continue
            found = (
                seq,
                f"seq {seq}: payload {digest.hex()} has a second record in {PAYLOADS} (the "
                f"first, read at seq {known >> 2}, does not say it is named again)",
            )
            worst = found if worst is None else min(worst, found)
        for digest, known in state.items():
            if known & 3 == self.FLAGGED:
                found = (
                    known >> 2,
                    f"seq {known >> 2}: the record of payload {digest.hex()} in {PAYLOADS} says "
                    "it is named again, but no later name of a selected event names it",
                )
                worst = found if worst is None else min(worst, found)
        return worst

    def _spread(self, file: IO[bytes], level: int) -> tuple[int, str] | None:
        """A file of more than MOST digests, spread over more files by the hash's next bits
        (each digest's entries stay together, in their order)."""
        shift, size, mask = self.BITS * level, self._ENTRY.size, self.mask
        parts = [tempfile.TemporaryFile() for _ in range(mask + 1)]  # noqa: SIM115 (below)
        try:
            file.seek(0)
            while chunk := file.read(size << 12):
                spread = [bytearray() for _ in parts]
                for at in range(0, len(chunk), size):
                    spread[hash(chunk[at : at + 32]) >> shift & mask] += chunk[at : at + size]
                for part, data in zip(parts, spread, strict=True):
                    part.write(data)
            found = [self._problem(part, level + 1) for part in parts]
            return min((p for p in found if p is not None), default=None)
        finally:
            for part in parts:
                part.close()

    def close(self) -> None:
        for file in self.files:
            if file is not None:
                file.close()


class _CarriedV3:
    """A version-3 bundle's ``payloads.bin`` (FORMAT.md 21.3), read as one stream beside the
    envelopes: a named digest not kept at hand must be the next record. Memory: the
    digests whose records say they are named again (:class:`_Seen`, bounded), a read
    buffer, the tombstones (they grow with erasures only); every record also goes to
    :class:`_Once`, on disk, which checks at the end that no flag lied."""

    CHUNK = 1 << 16
    _HEAD = 1 + 32 + SALT_BYTES + 8  # a carried record before its body
    _KINDS = (CARRIED, TOMBSTONE, CARRIED | AGAIN, TOMBSTONE | AGAIN)

    def __init__(
        self,
        member: _ReadOnce,
        report: ReportV2,
        fail: Callable[..., _BundleErrorV2],
    ) -> None:
        self.member, self.report, self.fail = member, report, fail
        self.again = _Seen()  # the flagged digests: those later names may name again
        self.once = _Once()
        self.erased: dict[bytes, int] = {}
        self.records = 0
        self.buffer, self.at = b"", 0

    def _fill(self, size: int) -> bool:
        """Whether ``size`` more bytes are buffered (reading the member in large chunks)."""
        if self.at + size <= len(self.buffer):
            return True
        chunks, have = [self.buffer[self.at :]], len(self.buffer) - self.at
        while have < size:
            chunk = self.member.read(max(size - have, self.CHUNK))
            if not chunk:
                break
            chunks.append(chunk)
            have += len(chunk)
        self.buffer, self.at = b"".join(chunks), 0
        return have >= size

    def _take(self, size: int, seq: int) -> bytes:
        if not self._fill(size):
            raise self.fail(
                f"{PAYLOADS} ends inside record {self.records + 1}", seq, "missing_payload"
            )
        start = self.at
        self.at += size
        return self.buffer[start : self.at]

    def check(self, digest: bytes, seq: int) -> None:
        """One digest a selected event names: its body carried and matching, or erased later."""
        again = self.again
        if digest in again.recent or again.older is not None and digest in again:
            self.once.add(digest, _Once.NAMED, seq)
            at = self.erased.get(digest) if self.erased else None
            if at is None:
                return
        else:
            # the usual case, in one step: the next record, whole in the buffer, carries it
            buffer, start = self.buffer, self.at
            body = start + self._HEAD
            if (
                body <= len(buffer)
                and buffer[start] | AGAIN == CARRIED | AGAIN
                and buffer[start + 1 : start + 33] == digest
            ):
                end = body + int.from_bytes(buffer[body - 8 : body], "big")
                if end <= len(buffer):
                    self.at = end
                    self.records += 1
                    _check_body(
                        digest, buffer[start + 33 : body - 8], buffer[body:end], seq, self.fail
                    )
                    self._read(digest, buffer[start], seq)
                    self.report.payloads_checked += 1
                    return
            at = self._next(digest, seq)
            if at is None:
                return
        if at <= seq:  # a tombstone whose erasure is not after this event
            raise self.fail(
                f"seq {seq}: payload {digest.hex()} is missing from the bundle",
                seq,
                "missing_payload",
            )

    def _read(self, digest: bytes, kind: int, seq: int) -> None:
        """A record read at ``seq``: kept for :class:`_Once`, and at hand if flagged."""
        flagged = kind >> 7
        self.once.add(digest, flagged, seq)
        if flagged:
            self.again.add(digest)

    def _missing(self, digest: bytes, seq: int, more: str = "") -> _BundleErrorV2:
        """``digest`` has no record where it must: a flag that lied, or a payload missing."""
        first = self.once.record_of(digest)
        if first is not None:
            return self.fail(
                f"seq {seq}: payload {digest.hex()} is named again, but its record in "
                f"{PAYLOADS} (read at seq {first}) does not say so",
                seq,
            )
        return self.fail(
            f"seq {seq}: payload {digest.hex()} is missing from the bundle{more}",
            seq,
            "missing_payload",
        )

    def _next(self, digest: bytes, seq: int) -> int | None:
        """Read the next record, which must name ``digest``: None for a body that matched, the
        erasure seq of a tombstone."""
        if not self._fill(1):
            raise self._missing(digest, seq)
        head = self._take(33, seq)
        kind, named = head[0], head[1:]
        if kind not in self._KINDS:
            raise self.fail(f"{PAYLOADS} record {self.records + 1} is of no known kind", seq)
        self.records += 1
        if named != digest:
            raise self._missing(digest, seq, f" (the next record of {PAYLOADS} is {named.hex()})")
        if kind & ~AGAIN == TOMBSTONE:
            at = int.from_bytes(self._take(8, seq), "big")
            self.erased[digest] = at
            self._read(digest, kind, seq)
            self.report.payloads_erased += 1
            return at
        rest = self._take(SALT_BYTES + 8, seq)
        length = int.from_bytes(rest[SALT_BYTES:], "big")
        if length > _MAX_PAYLOAD:
            raise self.fail(
                f"{PAYLOADS} record {self.records} is larger than any archive can hold", seq
            )
        _check_body(digest, rest[:SALT_BYTES], self._pieces(length, seq), seq, self.fail)
        self._read(digest, kind, seq)
        self.report.payloads_checked += 1
        return None

    def _pieces(self, size: int, seq: int) -> Iterator[bytes]:
        """The next ``size`` bytes in pieces of at most :data:`CHUNK` (a record may claim a
        body of any size: it is hashed as it is read, never held whole)."""
        while size > 0:
            piece = self._take(min(size, self.CHUNK), seq)
            size -= len(piece)
            yield piece

    def held(self) -> int:
        return self.report.payloads_checked

    def erasures(self) -> dict[int, int]:
        """Tombstones met (each read once), by the seq of the erasure that made them."""
        return collections.Counter(self.erased.values())

    def unreferenced(self) -> str | None:
        if not self._fill(1):
            return None
        self._fill(33)
        named = self.buffer[self.at + 1 : self.at + 33]
        return f"record {self.records + 1} of {PAYLOADS} ({named.hex()})"


def _verify_bundle_v2(
    archive: zipfile.ZipFile,
    manifest: dict[str, Any],
    names: list[str],
    handle: BinaryIO,
    sealed: tuple[int, str],
    vkey: str | None,
    progress: Callable[[int], None] | None,
) -> ReportV2:
    """The envelopes chained from the genesis, streamed (a compact range, O(log n) memory,
    grows the root), each selected event's bodies against their salted digests, the seal,
    and the signed checkpoint with the consistency proof from the head to it.

    A version-3 bundle's two members are read once, their digests taken as they are checked
    (a version-2 bundle's members were compared with the manifest before): whatever fails,
    a member unlike the manifest is what is named, as when the digests came first."""
    report = ReportV2()
    store_id, head = manifest["store_id"], manifest["head"]
    report.store_id, report.head_seq = store_id, head["seq"]
    report.details = {
        "store_id": store_id,
        "created": manifest.get("created"),
        "head": dict(head),
        "proof_start": {"seq": 0, "chain": None, "genesis": True},
        "selection": manifest["selection"],
        "envelopes": manifest["envelopes"],
        "selected_events": manifest["selected_events"],
        "payloads": manifest["payloads"],
    }

    def fail(message: str, seq: int | None = None, code: str = "bundle_record") -> _BundleErrorV2:
        return _BundleErrorV2(report, message, seq, code)

    if manifest["bundle_version"] != BUNDLE_VERSION_V3:
        carried: _CarriedV2 | _CarriedV3 = _CarriedV2(
            archive, manifest["members"], manifest["erased"], report, fail
        )
        _check_bundle_v2(manifest, _envelope_rows_v2(archive), carried, report, fail, progress)
        _check_bundle_end(manifest, handle, sealed, vkey, report, fail)
        return report
    readers: dict[str, _ReadOnce] = {}
    stream: _CarriedV3 | None = None
    try:
        for name in names:
            readers[name] = _ReadOnce(archive, name, manifest["members"][name])
        stream = _CarriedV3(readers[PAYLOADS], report, fail)
        rows = _envelope_records_v3(readers[ENVELOPES_V3])
        _check_bundle_v2(manifest, rows, stream, report, fail, progress)
        for name in names:
            readers[name].finish()
    except Exception:  # a check failed, or a changed member held what no check expects
        for reader in readers.values():  # a member unlike the manifest first, in zip order
            reader.finish()
        raise
    finally:
        if stream is not None:
            stream.once.close()
    _check_bundle_end(manifest, handle, sealed, vkey, report, fail)
    return report


def _check_bundle_v2(
    manifest: dict[str, Any],
    rows: Iterator[EnvelopeV2],
    carried: _CarriedV2 | _CarriedV3,
    report: ReportV2,
    fail: Callable[..., _BundleErrorV2],
    progress: Callable[[int], None] | None,
) -> None:
    """Every envelope and every body the selection names; the head, tombstones and counts."""
    head, selection = manifest["head"], manifest["selection"]
    everything = all(value is None for value in selection.values())
    erasures_seen: set[int] = set()
    tree = merkle.CompactRange()
    append, leaf_hash, check = tree.append, merkle.leaf_hash, carried.check
    prev_seq, prev_chain = 0, blake3(V2_GENESIS + manifest["store_id"].encode("ascii")).digest()
    chosen = 0
    for row in rows:
        seq, time, type_, session, time_text, type_text, session_text, key = row[:8]
        identity, payload, parts, author, chain_listed, digests = row[8:]
        if seq != prev_seq + 1:
            raise fail(
                f"sequence gap: expected {prev_seq + 1}, found {seq}", prev_seq + 1, "sequence_gap"
            )
        if _identity_v2(key, parts, session_text, type_text).hex() != identity:
            raise fail(
                f"seq {seq}: the identity does not match type, session, key and parts",
                seq,
                "identity",
            )
        data = _envelope_v2(
            seq, time_text, type_text, session_text, key, identity, payload, parts, author
        )
        chain = blake3(V2_CHAIN + prev_chain + data).digest()
        if chain != chain_listed:
            raise fail(
                f"seq {seq}: the chain hash does not match (an envelope field, or an earlier event, was changed)",
                seq,
                "chain",
            )
        append(leaf_hash(data))
        if type_ == "erasure":
            erasures_seen.add(seq)
        if everything or selected(selection, session, time):
            chosen += 1
            for i in range(0, len(digests), 32):
                check(digests[i : i + 32], seq)
        else:
            report.envelopes_only += 1
        prev_seq, prev_chain = seq, chain
        report.events_checked, report.last_seq = report.events_checked + 1, seq
        if progress and seq % 1000 == 0:
            progress(seq)
    root = tree.root()
    report.tree_size, report.root = tree.size, root.hex()
    if head["seq"] > prev_seq:  # the head as in FORMAT.md 20.2 step 4
        raise fail(
            f"the envelopes end at seq {prev_seq}, not at the head {head['seq']} the manifest names",
            prev_seq + 1,
            "truncated",
        )
    if head["seq"] < prev_seq:
        raise fail(
            f"envelopes after the head {head['seq']} the manifest names",
            head["seq"] + 1,
            "after_head",
        )
    if prev_chain.hex() != head["chain"]:
        raise fail(
            "the head's chain in the manifest does not match the last envelope",
            prev_seq or None,
            "head_chain",
        )
    if root.hex() != head["root"]:
        raise fail(
            "the head's Merkle root is not the root of the envelopes", prev_seq or None, "head_root"
        )
    report.erasures = [{"seq": e, "payloads": n} for e, n in sorted(carried.erasures().items())]
    for digest, at in carried.erased.items():
        if at not in erasures_seen:
            raise fail(
                f"payload {digest.hex()} is listed as erased by seq {at}, which is no erasure",
                at,
                "erased_without_erasure",
            )
    unreferenced = carried.unreferenced()
    if unreferenced is not None:
        raise fail(f"{unreferenced} is not a payload or part of any selected event")
    counts = [
        ("envelopes", report.events_checked, manifest["envelopes"]),
        ("selected events", chosen, manifest["selected_events"]),
        ("payloads", carried.held(), manifest["payloads"]),
    ]
    if isinstance(carried, _CarriedV3):
        counts.append(("erased payloads", report.payloads_erased, manifest["erased"]))
    for name, found, claimed in counts:
        if found != claimed:
            raise fail(
                f"{MANIFEST} claims {claimed} {name}, the bundle holds {found}",
                None,
                "bundle_count",
            )
    if isinstance(carried, _CarriedV3):
        untrue = carried.once.problem()  # a record twice, or a "named again" flag that lied
        if untrue is not None:
            raise fail(untrue[1], untrue[0])


def _check_bundle_end(
    manifest: dict[str, Any],
    handle: BinaryIO,
    sealed: tuple[int, str],
    vkey: str | None,
    report: ReportV2,
    fail: Callable[..., _BundleErrorV2],
) -> None:
    """The seal over every byte, then the checkpoint."""
    if seal_digest(handle, sealed[0]) != sealed[1]:
        raise fail(
            "the bundle's bytes do not match its seal: a zip header or directory entry (outside every member's content) or the seal itself was changed",
            None,
            "bundle_seal",
        )
    assert report.root is not None
    _bundle_checkpoint(manifest, report, bytes.fromhex(report.root), vkey, fail)


def _bundle_checkpoint(
    manifest: dict[str, Any],
    report: ReportV2,
    root: bytes,
    vkey: str | None,
    fail: Callable[..., _BundleErrorV2],
) -> None:
    """The bundle's checkpoint: its origin, the head's consistency with it, its signature."""
    origin = f"hermes-archive.invalid/{manifest['store_id']}"
    try:
        if vkey is not None:
            checkpoint, _, cosigned = signed_note.open_checkpoint(
                manifest["checkpoint"], signed_note.Verifier.from_vkey(vkey)
            )
        else:
            note = signed_note.parse_note(manifest["checkpoint"])
            checkpoint, cosigned = signed_note.parse_checkpoint(note.text), []
    except signed_note.NoteError as exc:
        if vkey is not None:
            report.authenticity = "failed"
        raise fail(
            f"the bundle's checkpoint does not verify: {exc}", None, "checkpoint_signature"
        ) from None
    if checkpoint.origin != origin:
        raise fail(
            f"the checkpoint is for {printable(checkpoint.origin)}, not {origin}",
            None,
            "checkpoint_signature",
        )
    size = report.tree_size
    try:
        proof = [base64.b64decode(line, validate=True) for line in manifest["consistency"]]
        if checkpoint.size == size:
            if proof or checkpoint.root != root:
                raise merkle.ProofError("the checkpoint at the head's size names another root")
        elif checkpoint.size < size:
            raise merkle.ProofError(
                f"the checkpoint (size {checkpoint.size}) is older than the head"
            )
        else:
            merkle.verify_consistency(size, checkpoint.size, root, checkpoint.root, proof)
    except (merkle.ProofError, binascii.Error) as exc:
        raise fail(
            f"the head is not consistent with the signed checkpoint: {exc}", None, "consistency"
        ) from None
    report.checkpoint = {
        "size": checkpoint.size,
        "signature": "verified" if vkey is not None else "not checked",
        "cosigned_by": [s.name for s in cosigned],
    }
    if vkey is not None:
        report.authenticity = "verified"
    else:
        report.warnings.append(
            "integrity only: the checkpoint's signature was not checked; give the archive's "
            "verifier key (--key VKEY, from `hermes-archive key`) to check its authenticity"
        )


def verify_bundle(
    path: str | os.PathLike[str],
    progress: Callable[[int], None] | None = None,
    vkey: str | None = None,
) -> Report:
    """Verify an export bundle: seal, manifest, every member, the chain from its start to its head,
    every selected event's payload and parts, and that the selection is complete.

    A version-2 or 3 bundle (FORMAT.md 21.2, 21.3) also carries the signed checkpoint: with
    ``vkey`` its signature is checked (``authenticity`` verified), without it integrity only.
    """
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the open
            return ReportV2().fail(None, f"{printable(path)} is not a regular file")
        with open(path, "rb") as handle:
            return _verify_open_bundle(handle, Report(), progress, vkey)
    except BundleError as exc:
        if isinstance(exc, _BundleErrorV2):
            return exc.report.fail(exc.seq, str(exc), exc.code)
        return ReportV2(store_id=exc.store_id).fail(exc.seq, str(exc), exc.code)
    except Exception as exc:  # an unreadable file or a zip damaged in a way zipfile did not foresee
        return ReportV2().fail(None, f"cannot read the bundle: {printable(exc)}")


# -- command line ---------------------------------------------------------------------------


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: object) -> str:
    """``text`` safe for a terminal: control characters (ESC, CR, bidi overrides) escaped."""
    return _CONTROL.sub(
        lambda m: (
            f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}"
        ),
        str(text),
    )


def _read_regular(path: str, limit: int) -> bytes:
    """At most ``limit`` bytes of regular file ``path`` (a FIFO or device is refused, not read)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path} is not a regular file")
        data = os.read(fd, limit + 1)
        if len(data) > limit:
            raise ValueError(f"{path} is larger than {limit} bytes")
        return data
    finally:
        os.close(fd)


def vkey_argument(key: str | None) -> str | None:
    """A ``--key`` argument as a verifier key: the key itself, or a file holding it."""
    if key is not None and os.path.isfile(key):
        return _read_regular(key, 4096).decode("utf-8").strip()
    return key


def _verify_database_file(database: str, key: str | None, jobs: int = 1) -> Report:
    """Verify ``database``: v1 with its payload key (``key``: the file, default beside it),
    v2 with no key file (``key``: the pinned verifier key, or a file holding it) in ``jobs``
    processes."""
    try:
        if not stat.S_ISREG(os.stat(database).st_mode):  # a FIFO would hang SQLite's open
            raise ValueError(f"{database} is not a regular file")
        conn = _read_only(database)
        version, refused = database_format(conn)
        if refused is not None:
            return refused
        if version == 2:
            return verify_database_v2(conn, vkey_argument(key), jobs)
        key_path = key or os.path.join(os.path.dirname(os.path.abspath(database)), "payload.key")
        try:
            payload_key = read_key_file(key_path)
        except _Failed as failure:
            return Report().fail(None, failure.problem)
        return verify_database(conn, payload_key)
    except Exception as exc:  # an unreadable or hostile file is a failed check, never a crash
        return Report().fail(None, f"cannot read the archive: {type(exc).__name__}: {exc}")


MAX_PROOF_BYTES = 1 << 30


def verify_proof(
    path: str | os.PathLike[str], vkey: str | None, witnesses: Iterable[str] = ()
) -> ReportV2:
    """Check a ``hermes-archive prove`` file offline (FORMAT.md 21.1) with the log's verifier
    key and the witness keys the auditor trusts: signatures, inclusion, disclosed bodies."""
    report = ReportV2()
    if PROOF_UNAVAILABLE:
        return report.fail(None, f"cannot check the proof: {PROOF_UNAVAILABLE}")
    if not vkey:
        return report.fail(
            None, "a proof file is checked with the log's verifier key: give --key VKEY", "key"
        )
    try:
        data = _read_regular(os.fspath(path), MAX_PROOF_BYTES)
        proven = tlog_proof.verify_proof_file(
            data,
            signed_note.Verifier.from_vkey(vkey),
            [signed_note.cosigner_verifier(w) for w in witnesses],
        )
    except tlog_proof.ProofFileError as exc:
        if exc.code == "checkpoint_signature":
            report.authenticity = "failed"
        return report.fail(exc.seq, printable(exc), exc.code)
    except signed_note.NoteError as exc:  # a --key or --witness that is no verifier key
        return report.fail(None, f"a key given is not usable: {printable(exc)}", "key")
    except (OSError, ValueError) as exc:
        return report.fail(None, f"cannot read the proof: {printable(exc)}", "unreadable")
    checkpoint = proven[0].checkpoint
    report.store_id = checkpoint.origin.rpartition("/")[2]
    report.tree_size, report.root = checkpoint.size, checkpoint.root.hex()
    report.checkpoint = {
        "size": checkpoint.size,
        "signature": "verified",
        "cosigned_by": sorted(set(proven[0].cosigners)),
    }
    report.authenticity = "verified"
    if not witnesses:  # the cosignature lines are there, but whose they are was not checked
        report.warnings.append(
            "cosignatures were not checked: give --witness WKEY for each witness you trust"
        )
    report.events_checked = len(proven)
    report.payloads_checked = len({d for p in proven for d in p.disclosed})  # distinct, 20.3
    report.last_seq = max(p.seq for p in proven)
    report.details = {
        "events": [
            {
                "seq": p.seq,
                "type": p.envelope["type"],
                "session": p.envelope["session"],
                "time": p.envelope["time"],
                "disclosed": {d: body.decode("utf-8") for d, body in p.disclosed.items()},
            }
            for p in proven
        ]
    }
    return report


SQLITE_MAGIC = b"SQLite format 3\x00"
ZIP_MAGIC = b"PK\x03\x04"  # a bundle starts with its first member's local header


def kind_of(path: str) -> str | None:
    """``database``, ``bundle`` or ``proof`` by the file's first bytes; None when neither.

    A file that cannot be opened is taken for what its name suggests, so that the check
    itself reports why it cannot be read.
    """
    try:
        start = _read_regular_head(path)
    except (OSError, ValueError):
        return "bundle" if path.endswith(".zip") else "database"
    if start == SQLITE_MAGIC:
        return "database"
    if start.startswith(ZIP_MAGIC):
        return "bundle"
    if start == b"c2sp.org/tlog-proof@v1\n"[: len(start)] and len(start) == 16:
        return "proof"
    return None


def _read_regular_head(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path} is not a regular file")
        return os.read(fd, 16)
    finally:
        os.close(fd)


def describe(report: Report, kind: str) -> str:
    """One human line (plus warnings) for a report."""
    if not report.ok:
        where = f"seq {report.first_bad_seq}" if report.first_bad_seq is not None else f"the {kind}"
        return f"FAILED at {where}: {printable(report.problem)}"
    if kind == "proof" and isinstance(report, ReportV2):
        cosigned = (
            ", ".join((report.checkpoint or {}).get("cosigned_by") or [])
            or "none of the witnesses given"
        )
        text = (
            f"ok: {report.events_checked} events of store {report.store_id} proven in its tree "
            f"of size {report.tree_size} (root {report.root}), checkpoint signed by the log key "
            f"and cosigned by {cosigned}; {report.payloads_checked} disclosed bodies match"
        )
    elif kind == "bundle":
        d = report.details
        start = (
            "the genesis"
            if d["proof_start"]["genesis"]
            else f"stated seq {d['proof_start']['seq']}"
        )
        chosen = {k: v for k, v in d["selection"].items() if v is not None}
        text = (
            f"ok: bundle of store {d['store_id']}: {report.events_checked} envelopes chained "
            f"from {start} to head seq {d['head']['seq']} (chain {d['head']['chain']}); "
            f"{d['selected_events']} selected "
            f"events ({', '.join(f'{k}={v}' for k, v in chosen.items()) or 'everything'}), "
            f"{report.payloads_checked} payloads verified"
        )
        if isinstance(report, ReportV2):
            text += (
                f"; tree root {report.root}; checkpoint at size "
                f"{(report.checkpoint or {}).get('size')}; authenticity: {report.authenticity}"
            )
    else:
        text = (
            f"ok: {report.events_checked} events, {report.payloads_checked} payloads verified; "
            f"head at {report.last_seq}"
        )
        if isinstance(report, ReportV2):
            text += f"; tree root {report.root}; signed checkpoints: {report.authenticity}" + (
                f"; {report.payloads_erased} payloads erased" if report.payloads_erased else ""
            )
    return "\n".join(printable(line) for line in [text, *(f"note: {w}" for w in report.warnings)])


def main(argv: list[str] | None = None) -> int:
    """The command line; Ctrl-C says "interrupted" and exits 130, as hermes-archive does."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    mode = args_in.pop(0) if args_in and args_in[0] in ("bundle", "database", "proof") else None
    parser = argparse.ArgumentParser(
        prog="verifier.py",
        description="Verify a hermes-archive events.db, export bundle or proof file "
        "without the package.",
        usage="%(prog)s [bundle|database|proof] PATH [--key payload.key|VKEY] "
        "[--witness WKEY ...] [--jobs N] [--json]",
    )
    parser.add_argument(
        "path", help="events.db, an export bundle or a proof file (detected by its first bytes)"
    )
    parser.add_argument(
        "--key",
        help="the archive's verifier key (or a file holding it) to check its signatures; "
        "a format-1 database: its payload.key (default: beside it)",
    )
    parser.add_argument(
        "--witness",
        action="append",
        default=[],
        metavar="WKEY",
        help="a proof file: a witness verifier key whose cosignature is checked (repeatable)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=usable_cores(),
        metavar="N",
        help="a database: processes to use (default: the cores; format 1: one, N is ignored)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(args_in)
    kind = kind_of(args.path)
    if mode and kind in (None, mode):  # a damaged first byte is the named check's to report
        kind = mode
    if kind is None or (mode and mode != kind):
        report = Report().fail(
            None,
            f"{args.path} is a {kind}, not a {mode}"
            if kind
            else f"{args.path} is not an archive database or bundle (empty, or other first bytes)",
        )
        print(json.dumps(report.as_dict(), indent=2) if args.json else describe(report, "file"))
        return 1
    if kind == "database":
        report = _verify_database_file(args.path, args.key, max(1, args.jobs))
    elif kind == "proof":
        report = verify_proof(args.path, vkey_argument(args.key), args.witness)
    else:
        report = verify_bundle(args.path, vkey=vkey_argument(args.key))
    print(json.dumps(report.as_dict(), indent=2) if args.json else describe(report, kind))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
