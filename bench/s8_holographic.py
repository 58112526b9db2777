"""Row 8: the peer a Hermes user would pick instead, hermes' bundled ``holographic`` store.

``plugins/memory/holographic/store.py`` keeps facts in SQLite with an FTS5 index (plus HRR
vectors when numpy is installed; it is not here, so that part is skipped, which only makes
the peer faster). It is filled to the same size as the project's log with the same texts
(one fact per archived turn: the user and assistant text joined), in one bulk transaction
with ``synchronous=OFF`` through its own schema and triggers (setup only, as for the
project's log). Then it is used as a user's store would be: ``add_fact`` for new facts
(its default durability: autocommit, synchronous FULL) and ``search_facts`` for the same
queries the project answers (at most ``MAX_QUERIES`` of each kind: its common-word search
is slow).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .common import Row, percentile
from .workload import Text

Report = Callable[[str], None]
MAX_QUERIES = 60


def _store(path: Path) -> Any:
    from plugins.memory.holographic.store import MemoryStore

    return MemoryStore(db_path=str(path))


def turn_texts(db: Path) -> Iterator[str]:
    """Each archived turn's texts joined, in log order, from the project's recall index."""
    conn = sqlite3.connect(f"{db.absolute().as_uri()}?mode=ro", uri=True)
    try:
        seq, parts = None, []
        for row_seq, text in conn.execute(
            "SELECT seq, text FROM recall_fts WHERE kind = 'turn' ORDER BY rowid"
        ):
            if row_seq != seq and parts:
                yield " ".join(parts)
                parts = []
            seq = row_seq
            parts.append(text)
        if parts:
            yield " ".join(parts)
    finally:
        conn.close()


def build(path: Path, texts: Iterator[str]) -> int:
    """Bulk-fill the holographic schema (setup only): facts, and FTS rows via its triggers.

    Entity extraction is skipped here: its alias pattern backtracks quadratically (about
    0.7 ms per 500-byte fact), and the corpus has no multi-word capitalised names it would
    find anyway. ``add_fact`` below still runs it, as a user's store would.
    """
    _store(path).close()  # its own schema, WAL and triggers
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("BEGIN")
    count = 0
    batch: list[tuple[str]] = []
    for text in texts:
        count += 1
        batch.append((text,))
        if len(batch) >= 5000:
            conn.executemany("INSERT OR IGNORE INTO facts (content) VALUES (?)", batch)
            batch = []
    conn.executemany("INSERT OR IGNORE INTO facts (content) VALUES (?)", batch)
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return count


def add_rate(path: Path, text: Text, adds: int) -> float:
    """Facts per second through ``add_fact`` (texts generated ahead of timing)."""
    facts = [" ".join(text.exchange(500)) for _ in range(adds)]
    store = _store(path)
    try:
        start = time.perf_counter()
        for fact in facts:
            store.add_fact(fact)
        return adds / (time.perf_counter() - start)
    finally:
        store.close()


def search_latencies(path: Path, queries: Sequence[str]) -> tuple[list[float], int]:
    store = _store(path)
    try:
        for query in queries[:20]:
            store.search_facts(query, limit=8)
        out, answered = [], 0
        for query in queries:
            start = time.perf_counter()
            found = store.search_facts(query, limit=8)
            out.append((time.perf_counter() - start) * 1000)
            answered += bool(found)
        return out, answered
    finally:
        store.close()


def rows_for(
    label: str,
    holo: Path,
    our_rate: float,
    holo_rate: float,
    ours: dict[str, list[float]],
    queries: dict[str, Sequence[str]],
    say: Report,
) -> list[Row]:
    rows = [
        Row(
            "8",
            f"add throughput, {label}: provider turns vs holographic add_fact",
            our_rate,
            "turns/s",
            holo_rate,
            "holographic facts/s",
        )
    ]
    say(f"  holographic @ {label}: add_fact {holo_rate:,.0f}/s (provider {our_rate:,.0f} turns/s)")
    for kind, qs in queries.items():
        qs = qs[:MAX_QUERIES]
        theirs, answered = search_latencies(holo, qs)
        say(
            f"  holographic search {kind} @ {label}: p50 {percentile(theirs, 50):.2f} ms "
            f"p95 {percentile(theirs, 95):.2f} ms; answered {answered}/{len(qs)}"
        )
        mine = ours[kind][: len(qs)]  # the same queries, in the same order
        rows.append(
            Row(
                "8",
                f"search p95, {kind} queries, {label}: archive_search vs holographic",
                percentile(mine, 95),
                "ms",
                percentile(theirs, 95),
                "holographic search_facts",
                extra={
                    "holographic_p50": percentile(theirs, 50),
                    "archive_p50": percentile(mine, 50),
                    "holographic_answered": answered,
                },
            )
        )
    return rows
