"""The v2 verifier keeps bounded state (issue 18) and still gives every verdict it gave.

A full pass keeps only the newest digests in memory (older ones in a temporary database
behind a Bloom filter) and compares tiles as they fill. With windows shrunk to a few
entries, every rule vector and a real archive with repeated parts must give the report the
unbounded pass gave; tampered tiles far behind the window are still found.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from archive_provider.format import verifier
from archive_provider.storage.store import EventStore
from bench.corpus import build
from tests.test_verifier_v2 import CASES, VECTORS, _database, _verdict


@pytest.fixture
def tiny_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verifier._Seen, "RECENT", 2)
    monkeypatch.setattr(verifier._TreeCheck, "CHUNK", 1)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_each_rule_gives_its_verdict_with_tiny_windows(
    tmp_path: Path, case: dict[str, Any], tiny_windows: None
) -> None:
    conn = sqlite3.connect(_database(tmp_path, case), isolation_level=None)
    vkey = VECTORS["log_vkey"] if case["vkey"] else None
    report = verifier.verify_database(conn, b"", vkey=vkey)
    assert _verdict(report) == case["expected"], report.problem


@pytest.fixture(scope="module")
def corpus_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~2,700 events; every session's checkpoint names ten parts its turns named before."""
    folder = tmp_path_factory.mktemp("bounded") / "archive"
    store = EventStore.open(folder)
    try:
        build(store, 2500, batch=500, near_misses=0)
    finally:
        store.close()
    return folder / "events.db"


def _report(db: Path) -> dict[str, Any]:
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        return verifier.verify_database(conn, b"").as_dict()
    finally:
        conn.close()


def _distinct_named(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        named: set[bytes] = set()
        for payload, parts, author in conn.execute("SELECT payload, parts, author FROM events"):
            named.add(payload)
            named.update(parts[i : i + 32] for i in range(0, len(parts), 32))
            if author is not None:
                named.add(author)
        return len(named)
    finally:
        conn.close()


def test_spilled_digests_are_counted_once_as_before(
    corpus_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = _report(corpus_db)
    monkeypatch.setattr(verifier._Seen, "RECENT", 8)
    monkeypatch.setattr(verifier._TreeCheck, "CHUNK", 300)
    windowed = _report(corpus_db)
    assert windowed["ok"], windowed["problem"]
    assert windowed == whole
    assert windowed["payloads_checked"] == _distinct_named(corpus_db)
    assert windowed["tree_size"] > 2 * 300  # several comparisons of full tiles happened


def _tampered(source: Path, to: Path, *sql: str) -> Path:
    to.write_bytes(source.read_bytes())
    conn = sqlite3.connect(to, isolation_level=None)
    conn.execute("DROP TRIGGER tiles_grow_only")
    for statement in sql:
        conn.execute(statement)
    conn.close()
    return to


@pytest.mark.parametrize(
    ("sql", "first_bad"),
    [
        ("UPDATE tiles SET hashes = zeroblob(8192) WHERE level = 0 AND idx = 1", 257),
        ("INSERT INTO tiles VALUES (0, 40, zeroblob(32))", None),
        ("INSERT INTO tiles VALUES (1, 1, zeroblob(32))", None),
    ],
    ids=["full tile far behind the window", "row past the edge", "row of no tile above"],
)
def test_a_bad_tile_behind_the_window_is_found(
    corpus_db: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    sql: str,
    first_bad: int | None,
) -> None:
    monkeypatch.setattr(verifier._TreeCheck, "CHUNK", 300)
    report = _report(_tampered(corpus_db, tmp_path / "events.db", sql))
    assert (report["ok"], report["code"], report["first_bad_seq"]) == (False, "tiles", first_bad)


def test_the_seen_filter_stops_growing_at_its_cap_and_stays_exact(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past MOST_BITS the filter only fills: its size is capped, and every answer is exact."""
    monkeypatch.setattr(verifier._Seen, "RECENT", 64)
    monkeypatch.setattr(verifier._Seen, "MOST_BITS", 1 << 16)
    seen = verifier._Seen(expected=10)
    added = [bytes([i % 256, i // 256]) * 16 for i in range(40_000)]  # 40k distinct digests
    for digest in added:
        seen.add(digest)
    assert seen.bits == 1 << 16 and len(seen.bloom) == (1 << 16) // 8  # 8 KiB, not ~50 KiB
    assert seen.entries > (1 << 16) // 10  # well past what the cap sizes for
    assert all(digest in seen for digest in added)
    absent = [bytes([i % 256, i // 256, 1]) + bytes(29) for i in range(5_000)]
    assert not any(digest in seen for digest in absent)
