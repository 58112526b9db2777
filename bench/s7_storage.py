"""Row 7: bytes on disk per archived turn, and what re-sent transcripts add (should be nothing).

Per turn: the database file (WAL checkpointed into it) divided by the turns it holds,
beside the raw UTF-8 bytes of those turns' message texts; ``dbstat`` splits the file by
table (envelopes, payloads, indexes, FTS5). Re-sends: a provider session is driven the way
0.19.0 drives it (every ``sync_turn`` carries the whole transcript), then the host sends
everything again: the same transcripts through ``sync_turn`` and the same checkpoint
twice. Every byte those duplicates add is growth the content
addressing should have prevented.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from archive_provider.storage.store import archive_dir

from .common import Row, Workdir
from .s3_provider import open_provider
from .workload import Text, sessions

Report = Callable[[str], None]


def table_bytes(db: Path) -> dict[str, int]:
    """Bytes per table/index (FTS5 shadow tables folded into their table), via dbstat."""
    conn = sqlite3.connect(db)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        sizes: dict[str, int] = {}
        for name, size in conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name"):
            for prefix in ("recall_fts",):
                if name.startswith(prefix):
                    name = prefix
            sizes[name] = sizes.get(name, 0) + int(size)
        return dict(sorted(((k, v) for k, v in sizes.items() if v), key=lambda item: -item[1]))
    finally:
        conn.close()


def file_bytes(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages, size, free = (
            conn.execute(f"PRAGMA {p}").fetchone()[0]
            for p in ("page_count", "page_size", "freelist_count")
        )
        return int((pages - free) * size)
    finally:
        conn.close()


def text_bytes(db: Path) -> tuple[int, int]:
    """(turns, UTF-8 bytes of their message texts) from the recall index (turn rows)."""
    conn = sqlite3.connect(db)
    try:
        turns = conn.execute("SELECT count(*) FROM events WHERE type = 'turn'").fetchone()[0]
        total = conn.execute(
            "SELECT sum(length(CAST(text AS BLOB))) FROM recall_fts WHERE kind = 'turn'"
        ).fetchone()[0]
        return int(turns), int(total or 0)
    finally:
        conn.close()


#: which dbstat names make up each part of an archive (issue 18's split of bytes per turn)
_LOG = {"events", "payloads", "head", "meta", "erased"}
_TREE = {"tiles", "tile_inner", "signed_checkpoints", "cosignatures"}


def components(db: Path) -> dict[str, int]:
    """Bytes of the log, the tree, the salts (v2 salt and lookup columns and the lookup
    index, estimated from their counts), the log's indexes (envelopes; payload digests once
    payloads are a rowid table), the full-text index and the other projections."""
    tables = table_bytes(db)
    conn = sqlite3.connect(db)
    try:
        columns = [r[1] for r in conn.execute("PRAGMA table_info(payloads)")]
        salted = 0
        if "salt" in columns:
            salted = conn.execute(
                "SELECT coalesce(sum(length(salt)), 0) + coalesce(sum(length(lookup)), 0)"
                " FROM payloads"
            ).fetchone()[0]
    finally:
        conn.close()
    out = dict.fromkeys(("log", "tree", "salts", "indexes", "full-text", "projections"), 0)
    for name, size in tables.items():
        if name == "payloads_lookup":
            out["salts"] += size
        elif name in _LOG:
            out["log"] += size
        elif name in _TREE:
            out["tree"] += size
        elif name.startswith("recall_fts"):
            out["full-text"] += size
        elif name.startswith(("events_", "sqlite_autoindex_events", "sqlite_autoindex_payloads")):
            out["indexes"] += size
        else:
            out["projections"] += size
    out["salts"] += int(salted)
    out["log"] -= int(salted)
    return out


def per_turn(db: Path, label: str, say: Report) -> list[Row]:
    turns, raw = text_bytes(db)
    used = file_bytes(db)
    tables = table_bytes(db)
    say(f"  storage @ {label}: {used / turns:,.0f} B/turn vs {raw / turns:,.0f} B of text/turn")
    return [
        Row(
            "7",
            f"bytes on disk per archived turn, {label}",
            used / turns,
            "B",
            raw / turns,
            "raw message text",
            extra={
                "turns": turns,
                "file_bytes": used,
                "per_turn_by_table": {
                    k: round(v / turns, 1) for k, v in tables.items() if v / turns >= 0.05
                },
                "per_turn_by_component": {
                    k: round(v / turns, 1) for k, v in components(db).items()
                },
            },
        )
    ]


def _counts(db: Path) -> dict[str, int]:
    conn = sqlite3.connect(db)
    try:
        return {
            table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ("events", "payloads", "recall_fts")
        }
    finally:
        conn.close()


def resend(work: Workdir, text: Text, turns: int, say: Report) -> list[Row]:
    home = work.fresh("resend")
    provider = open_provider(home, "resend-0")
    writer = provider.core.writer
    assert writer is not None
    db = archive_dir(home) / "events.db"
    done: list[tuple[str, list[dict[str, Any]]]] = []
    empty_bytes, empty_tables = file_bytes(db), table_bytes(db)  # schema pages, one session_started
    try:
        last: dict[str, list[dict[str, Any]]] = {}
        for session, user, assistant in sessions("resend", text, 500, turns):
            provider.sync_turn(
                user, assistant, session_id=session.name, messages=list(session.messages)
            )
            last[session.name] = list(session.messages)
        writer.flush(120)
        done = list(last.items())
        provider.on_pre_compress(done[-1][1], require_checkpoint=True)
        before_bytes, before = file_bytes(db), _counts(db)
        for name, messages in done:  # the host sends everything again
            provider.sync_turn(
                messages[-2]["content"], messages[-1]["content"], session_id=name, messages=messages
            )
        provider.on_pre_compress(done[-1][1], require_checkpoint=True)
        provider.on_pre_compress(done[-1][1], require_checkpoint=True)
        writer.flush(120)
        after_bytes, after = file_bytes(db), _counts(db)
    finally:
        provider.shutdown()
    growth = after_bytes - before_bytes
    rows_added = {k: after[k] - before[k] for k in after}
    say(f"  re-sent transcripts: +{growth} B, rows added {rows_added}")
    turns_in, raw = text_bytes(db)
    grown = {
        k: round((v - empty_tables.get(k, 0)) / turns_in, 1)
        for k, v in table_bytes(db).items()
        if v > empty_tables.get(k, 0)
    }
    return [
        Row(
            "7",
            "bytes on disk per turn, provider-driven (whole transcript every turn)",
            (before_bytes - empty_bytes) / turns_in,
            "B",
            raw / turns_in,
            "raw message text",
            note="file growth over the empty store, per turn",
            extra={"turns": turns_in, "per_turn_by_table": grown},
        ),
        Row(
            "7",
            f"growth from re-sending {len(done)} transcripts + 2 identical checkpoints",
            float(growth),
            "B",
            None,
            absolute_kind="max",
            absolute_value=0.0,
            target_text="zero",
            extra={
                "rows_added": rows_added,
                "bytes_before": before_bytes,
                "bytes_after": after_bytes,
            },
        ),
    ]
