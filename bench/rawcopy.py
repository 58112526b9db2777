"""The raw baseline: the same rows the project wrote, inserted with plain ``executemany``.

After the project has written a run into database A, :func:`extract` reads back every row
it produced and groups them by the event they belong to (``seq`` columns; payloads and
other content-addressed rows by the first event that names them; the archive's signed
checkpoints and cosignatures by the tree size they sign, and its tiles by the transactions
whose leaves change them). :func:`RawCopy.insert`
then writes exactly those rows into an empty database B with the same schema, the same
pragmas and the same transaction boundaries, digests precomputed: no hashing, no
encoding, no reads. That is the floor SQLite itself sets for the work.
"""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from archive_provider.storage.store_pieces import split_parts

# tables written by SQLite itself or read-only views
_SKIP = {"meta", "sqlite_sequence"}


@dataclass
class TableRows:
    name: str
    columns: list[str]
    insert: str
    by_seq: dict[int, list[tuple[Any, ...]]] = field(default_factory=lambda: defaultdict(list))
    state: bool = False  # rows upserted once per transaction (head, projection_state, sessions)
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    tiles: bool = False  # tiles: the rows a transaction's leaves change (their final bytes)


def _tables(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    found = conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'table' ORDER BY rowid"
    ).fetchall()
    virtual = [name for name, sql in found if sql and sql.upper().startswith("CREATE VIRTUAL")]
    shadow = {
        f"{v}_{suffix}"
        for v in virtual
        for suffix in ("data", "idx", "content", "docsize", "config")
    }
    out = []
    for name, sql in found:
        if name in _SKIP or name in shadow or name.startswith("sqlite_"):
            continue
        if sql and "fts5vocab" in sql.lower():
            continue
        out.append((name, sql or ""))
    return out


def _first_use(conn: sqlite3.Connection) -> dict[Any, int]:
    """Digest -> seq of the first event that names it (as payload, part or author)."""
    first: dict[Any, int] = {}
    for seq, payload, parts, author in conn.execute(
        "SELECT seq, payload, parts, author FROM events ORDER BY seq"
    ):
        first.setdefault(payload, seq)
        for digest in split_parts(parts):
            first.setdefault(digest, seq)
        if author is not None:
            first.setdefault(author, seq)
    return first


def touched_tiles(first: int, last: int, width: int = 256) -> set[tuple[int, int]]:
    """(level, index) of every tile that appending leaves ``first..last`` (seqs) changes."""
    touched: set[tuple[int, int]] = set()
    span, level = 1, 0
    while last // span > (first - 1) // span:  # level-``level`` nodes completed by the range
        lo, hi = (first - 1) // span, last // span - 1
        touched.update((level, index) for index in range(lo // width, hi // width + 1))
        span, level = span * width, level + 1
    return touched


def extract(path: Path) -> list[TableRows]:
    """Every row the project wrote in the database at ``path``, grouped by event."""
    conn = sqlite3.connect(path)
    try:
        first = _first_use(conn)
        tables: list[TableRows] = []
        for name, sql in _tables(conn):
            is_fts = sql.upper().startswith("CREATE VIRTUAL")
            columns = [r[1] for r in conn.execute(f"PRAGMA table_info({name})")]
            marks = ", ".join("?" * len(columns))
            verb = "INSERT" if is_fts else "INSERT OR REPLACE"
            insert = f"{verb} INTO {name} ({', '.join(columns)}) VALUES ({marks})"
            table = TableRows(name, columns, insert)
            rows = conn.execute(f"SELECT {', '.join(columns)} FROM {name}").fetchall()
            if "seq" in columns and name not in ("head",):
                at = columns.index("seq")
                for row in rows:
                    table.by_seq[int(row[at])].append(row)
            elif "size" in columns:  # signed checkpoints, cosignatures: at the size signed
                at = columns.index("size")
                for row in rows:
                    table.by_seq[int(row[at])].append(row)
            elif name == "tiles":
                table.tiles = True
                table.rows = rows
            elif "digest" in columns:
                at = columns.index("digest")
                for row in rows:
                    table.by_seq[first.get(row[at], 0)].append(row)
            else:
                table.state = True
                table.rows = rows
            tables.append(table)
        return tables
    finally:
        conn.close()


def event_batches(path: Path, sizes: Sequence[int]) -> list[tuple[int, int]]:
    """Seq ranges (first, last) of consecutive transactions holding ``sizes`` events each."""
    conn = sqlite3.connect(path)
    try:
        seqs = [row[0] for row in conn.execute("SELECT seq FROM events ORDER BY seq")]
    finally:
        conn.close()
    ranges = []
    at = 0
    for size in sizes:
        if at >= len(seqs):
            break
        chunk = seqs[at : at + max(size, 1)]
        ranges.append((chunk[0], chunk[-1]))
        at += len(chunk)
    if at < len(seqs):
        ranges.append((seqs[at], seqs[-1]))
    return ranges


class RawCopy:
    """Insert the extracted rows into an empty database of the same schema."""

    def __init__(self, tables: list[TableRows]) -> None:
        self.tables = tables

    def prepare(
        self, ranges: Sequence[tuple[int, int]]
    ) -> list[list[tuple[str, list[tuple[Any, ...]]]]]:
        """Per transaction, the (statement, rows) pairs to execute, built ahead of timing."""
        plan = []
        for first, last in ranges:
            steps: list[tuple[str, list[tuple[Any, ...]]]] = []
            for table in self.tables:
                if table.tiles:
                    touched = touched_tiles(first, last)
                    rows = [r for r in table.rows if (r[0], r[1]) in touched]
                    if rows:
                        steps.append((table.insert, rows))
                    continue
                if table.state:
                    rows = table.rows
                    if "first_seq" in table.columns:  # sessions: only those this batch touched
                        lo, hi = table.columns.index("first_seq"), table.columns.index("last_seq")
                        rows = [r for r in rows if (r[lo] or 0) <= last and (r[hi] or 0) >= first]
                    if rows:
                        steps.append((table.insert, rows))
                    continue
                rows = [row for seq in range(first, last + 1) for row in table.by_seq.get(seq, ())]
                if first == ranges[0][0]:
                    rows = table.by_seq.get(0, []) + rows
                if rows:
                    steps.append((table.insert, rows))
            plan.append(steps)
        return plan

    @staticmethod
    def insert(
        conn: sqlite3.Connection,
        plan: list[list[tuple[str, list[tuple[Any, ...]]]]],
        *,
        durable: bool = False,
    ) -> None:
        """Execute ``plan``: one ``BEGIN IMMEDIATE ... COMMIT`` per transaction."""
        conn.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
        for steps in plan:
            conn.execute("BEGIN IMMEDIATE")
            for statement, rows in steps:
                conn.executemany(statement, rows)
            conn.execute("COMMIT")


def empty_like(source: Path, target: Path) -> sqlite3.Connection:
    """An empty database with the schema (tables, indexes, triggers) of ``source``, in WAL."""
    src = sqlite3.connect(source)
    try:
        ddl = src.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid"
        ).fetchall()
        meta = src.execute("SELECT name, value FROM meta").fetchall()
    finally:
        src.close()
    conn = sqlite3.connect(target, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    virtual = [name for _, name, sql in ddl if sql.upper().startswith("CREATE VIRTUAL")]
    shadow = {f"{v}_{s}" for v in virtual for s in ("data", "idx", "content", "docsize", "config")}
    conn.execute("BEGIN")
    for _kind, name, sql in ddl:
        if name in shadow or name.startswith("sqlite_"):
            continue
        conn.execute(sql)
    conn.executemany("INSERT INTO meta VALUES (?, ?)", meta)
    conn.execute("COMMIT")
    return conn
