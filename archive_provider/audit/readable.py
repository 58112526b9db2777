"""A readable copy of an archive for the tools auditors already use (sqlite-utils, Datasette).

The copy is a separate SQLite file built with sqlite-utils: flat tables with full-text
search and foreign keys, one row per event, message, memory write, checkpoint, session and
recall, each with its ``seq`` and digests so a finding leads back to ``hermes-archive show
SEQ``. Beside it goes a Datasette ``metadata.json``: titles, descriptions, column notes,
and the archive's head and verification result at the time of the copy (also in the
copy's ``archive`` table).

The rows are read through the audit views (store.AUDIT_VIEWS), made as temporary views
on a read-only connection: the archive's own views are never run (an archive under audit
is untrusted), and an archive older than the views is read the same. Everything streams
in batches: memory stays flat whatever the archive's size. Only the events up to the
verified head are copied, so the copy and its verification agree.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlite_utils

from ..domain.clock import now_text
from ..format.verifier import Report, verify_database
from ..storage.store import AUDIT_VIEWS, EventStore
from ..storage.store_pieces import write_private

BATCH = 1000


@dataclass(frozen=True)
class Table:
    """One table of the copy: where its rows come from and what Datasette says about it."""

    name: str
    view: str  # the audit view it is read from
    pk: str | tuple[str, ...]
    title: str
    description: str
    columns: dict[str, tuple[type, str]]  # name -> (type, note)
    fts: tuple[str, ...] = ()
    foreign_keys: tuple[tuple[str, str, str], ...] = ()
    sort: str = "seq"


_SEQ = (int, "sequence number of the event: `hermes-archive show SEQ` shows it in full")
_TIME = (str, "when the event was written (UTC, ISO 8601)")
_SESSION = (str, "the Hermes session id")
_PAYLOAD = (str, "keyed BLAKE3 digest of the event's payload")
_CHAIN = (str, "chain value after this event: commits to every event up to it")
_TO_EVENT = ("seq", "events", "seq")

TABLES = (
    Table(
        "events",
        "audit_events",
        "seq",
        "Events",
        "Every event of the log in order, with its payload as JSON text.",
        {
            "seq": _SEQ,
            "time": _TIME,
            "type": (str, "event type (docs/FORMAT.md)"),
            "session": _SESSION,
            "payload": (str, "the payload, canonical JSON"),
            "parts": (str, "digests of the parts (messages, memory contents) the event names"),
            "identity": (str, "BLAKE3 of the event's type and identity key"),
            "payload_digest": _PAYLOAD,
            "chain": _CHAIN,
        },
        foreign_keys=(("session", "sessions", "session"),),
    ),
    Table(
        "messages",
        "audit_turns",
        ("seq", "position"),
        "Conversation",
        "Every message of every archived turn, tool messages included, in order.",
        {
            "seq": _SEQ,
            "position": (int, "the message's place in its turn (1, 2, ...)"),
            "time": _TIME,
            "session": _SESSION,
            "turn": (int, "the turn's number in its session"),
            "role": (str, "user, assistant, tool or system"),
            "name": (str, "the message's name field, when the host set one"),
            "author": (str, "who wrote the turn, as the host stated it (name, else id)"),
            "author_id": (str, "the turn author's id as the host stated it"),
            "author_is_bot": (int, "1 when the host said the turn's author is a bot"),
            "text": (str, "the message's content (a tool call's arguments when it has none)"),
            "tool_call_id": (str, "the tool call a tool message answers"),
            "message_digest": (str, "keyed BLAKE3 digest of the stored message"),
            "payload_digest": _PAYLOAD,
            "chain": _CHAIN,
        },
        fts=("text",),
        foreign_keys=(_TO_EVENT, ("session", "sessions", "session")),
    ),
    Table(
        "memory_writes",
        "audit_memory",
        "seq",
        "Memory writes",
        "Every write to Hermes' built-in memory (MEMORY.md, USER.md), as the host sent it.",
        {
            "seq": _SEQ,
            "time": _TIME,
            "session": _SESSION,
            "action": (str, "add, replace or remove"),
            "target": (str, "memory (MEMORY.md) or user (USER.md)"),
            "content": (str, "the new text (empty for a remove)"),
            "old_text": (str, "the text the host searched for, for replace and remove"),
            "origin": (str, "who wrote it, as the host said (write_origin)"),
            "metadata": (str, "everything the host sent with it, JSON"),
            "content_digest": (str, "keyed BLAKE3 digest of the stored content"),
            "payload_digest": _PAYLOAD,
            "chain": _CHAIN,
        },
        fts=("content", "old_text"),
        foreign_keys=(_TO_EVENT, ("session", "sessions", "session")),
    ),
    Table(
        "checkpoints",
        "audit_checkpoints",
        "seq",
        "Checkpoints",
        "Pre-compression checkpoints: the evidence archived before the host summarized.",
        {
            "seq": _SEQ,
            "time": _TIME,
            "session": _SESSION,
            "ok": (int, "1 a checkpoint, 0 a failed one"),
            "parent_session": (str, "the session compressed, as the host named it"),
            "messages": (int, "messages of evidence (failed: messages offered)"),
            "require_checkpoint": (int, "1 when the host would not compress without it"),
            "host_api_version": (int, "the host's checkpoint API version"),
            "error": (str, "why a checkpoint failed"),
            "evidence_digest": (str, "keyed BLAKE3 digest of the ordered evidence"),
            "payload_digest": _PAYLOAD,
            "chain": _CHAIN,
        },
        foreign_keys=(_TO_EVENT, ("session", "sessions", "session")),
    ),
    Table(
        "recalls",
        "audit_recalls",
        "seq",
        "Recalls served",
        "What the archive returned to the agent as recall, and for which turn.",
        {
            "seq": _SEQ,
            "time": _TIME,
            "session": _SESSION,
            "turn": (int, "the turn it was served for"),
            "query": (str, "what the recall searched for"),
            "result": (str, "the block returned (the host may still have trimmed it)"),
            "sources": (str, "sequence numbers of the events quoted, JSON"),
            "query_digest": (str, "keyed BLAKE3 digest of the stored query"),
            "result_digest": (str, "keyed BLAKE3 digest of the stored result"),
            "payload_digest": _PAYLOAD,
            "chain": _CHAIN,
        },
        fts=("query", "result"),
        foreign_keys=(_TO_EVENT, ("session", "sessions", "session")),
    ),
    Table(
        "sessions",
        "audit_sessions",
        "session",
        "Sessions",
        "Each session: its events, counts, and the session it was switched from.",
        {
            "session": _SESSION,
            "first_seq": (int, "its first event"),
            "last_seq": (int, "its last event"),
            "first_time": (str, "time of its first event"),
            "last_time": (str, "time of its last event"),
            "events": (int, "events in it"),
            "turns": (int, "turns archived"),
            "memory_writes": (int, "memory writes"),
            "checkpoints": (int, "checkpoints"),
            "recalls": (int, "recalls served"),
            "switched_from": (str, "the session it was switched from (compression keeps the id)"),
            "switch_reason": (str, "why the host switched"),
            "platform": (str, "the platform the session ran on"),
        },
        sort="first_seq",
    ),
)


@dataclass(frozen=True)
class CopyResult:
    path: Path
    metadata_path: Path
    report: Report
    head_seq: int
    head_chain: str
    rows: dict[str, int]


def metadata_path(out: Path) -> Path:
    """Where the Datasette metadata goes: beside the copy, named after it."""
    return out.with_name(out.stem + ".metadata.json")


def _views() -> dict[str, str]:
    """The audit view statements, by view name."""
    statements = [part.strip() for part in AUDIT_VIEWS.split(";\n") if part.strip()]
    return {statement.split()[5]: statement for statement in statements}


def _temporary(statement: str) -> str:
    return statement.replace("CREATE VIEW IF NOT EXISTS", "CREATE TEMP VIEW", 1)


def _rows(conn: sqlite3.Connection, table: Table, until: int) -> Iterator[dict[str, Any]]:
    names = list(table.columns)
    cursor = conn.execute(
        f"SELECT {', '.join(names)} FROM temp.{table.view} WHERE seq <= ?", (until,)
    )
    while batch := cursor.fetchmany(BATCH):
        for row in batch:
            yield dict(zip(names, row, strict=True))


def write_copy(
    store: EventStore,
    out: Path,
    *,
    created_by: str,
    progress: Callable[[int], None] | None = None,
) -> CopyResult:
    """Verify the archive, then write the readable copy of it up to the verified head.

    The copy is written under a temporary name and renamed into place; the metadata file
    likewise. A failed verification is recorded in both (the copy is still written: a
    damaged archive is what an auditor most needs to read).
    """
    report = verify_database(store.conn, store.key, progress)
    head = store.head()
    until = report.last_seq if report.ok else head.seq
    chain_row = store.conn.execute("SELECT chain FROM events WHERE seq = ?", (until,)).fetchone()
    stored = chain_row[0] if chain_row else None
    chain = stored.hex() if isinstance(stored, bytes) else str(stored) if stored else head.chain
    meta = dict(store.conn.execute("SELECT name, value FROM meta").fetchall())
    tmp = out.with_name(f".{out.name}.{os.getpid()}.partial")
    tmp.unlink(missing_ok=True)
    summary = {
        "store_id": store.store_id,
        "format_version": int(meta.get("format_version", 0)),
        "archive_created": meta.get("created"),
        "head_seq": until,
        "head_chain": chain,
        "verified": int(report.ok),
        "verification": verdict(report),
        "copied_at": now_text(),
        "copied_by": created_by,
    }
    rows: dict[str, int] = {}
    try:
        # 0600 before a byte is written: the copy holds every message text, as a bundle does
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        db = sqlite_utils.Database(tmp)
        try:
            db.execute("PRAGMA journal_mode = OFF")  # a new file, renamed only when complete
            db.execute("PRAGMA synchronous = OFF")
            rows = _fill(db, store.conn, until)
            db.table("archive").insert(summary)
            db.conn.commit()
        finally:
            db.close()
        with tmp.open("rb+") as handle:
            os.fsync(handle.fileno())
        document = _metadata(out, summary, rows)
        meta_tmp = tmp.with_name(tmp.name + ".json")
        meta_tmp.unlink(missing_ok=True)
        write_private(meta_tmp, json.dumps(document, indent=2, ensure_ascii=False) + "\n")
        os.replace(meta_tmp, metadata_path(out))
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        tmp.with_name(tmp.name + ".json").unlink(missing_ok=True)
        raise
    return CopyResult(out, metadata_path(out), report, until, chain, rows)


def _fill(db: sqlite_utils.Database, source: sqlite3.Connection, until: int) -> dict[str, int]:
    """Create every table (sessions first: the others refer to it), then stream the rows.

    The per-event tables are read from the archive through temporary audit views (the
    archive's own views never run); the sessions are then summed up from the copied events
    with the same view's statement, so they count exactly what was copied.
    """
    views = _views()
    for statement in views.values():
        source.execute(_temporary(statement))
    sessions = next(t for t in TABLES if t.name == "sessions")
    for table in (sessions, *(t for t in TABLES if t is not sessions)):
        db.table(table.name).create(
            {name: kind for name, (kind, _) in table.columns.items()},
            pk=table.pk,
            foreign_keys=table.foreign_keys,
        )
    rows: dict[str, int] = {}
    source.execute("BEGIN")  # one snapshot of the archive for every table
    try:
        for table in TABLES:
            if table is sessions:
                continue
            db.table(table.name).insert_all(_rows(source, table, until), batch_size=BATCH)
    finally:
        source.execute("COMMIT")
    for table in TABLES:  # before the sessions are summed: they look events up by session
        if table is not sessions:
            db.table(table.name).create_index(["session", "seq"])
    db.execute("CREATE TEMP VIEW audit_events AS SELECT * FROM main.events")
    db.execute(_temporary(views["audit_sessions"]))
    names = ", ".join(sessions.columns)
    db.execute(f"INSERT INTO sessions ({names}) SELECT {names} FROM temp.audit_sessions")
    for table in TABLES:
        rows[table.name] = db.table(table.name).count
        if table.fts:
            db.table(table.name).enable_fts(table.fts, tokenize="porter")
    return rows


def verdict(report: Report) -> str:
    if report.ok:
        return (
            f"ok: {report.events_checked} events and {report.payloads_checked} payloads "
            f"verified to head seq {report.last_seq}"
        )
    return f"FAILED at seq {report.first_bad_seq}: {report.problem}"


def _metadata(out: Path, summary: dict[str, Any], rows: dict[str, int]) -> dict[str, Any]:
    """Datasette's metadata.json: titles, descriptions and column notes for every table."""
    about = (
        f"A readable copy of hermes-archive store {summary['store_id']} up to seq "
        f"{summary['head_seq']} (chain {summary['head_chain']}), made {summary['copied_at']}. "
        f"Verification of the archive at the time of the copy: {summary['verification']}. "
        "The archive itself is the record: this copy is derived from it, and "
        "`hermes-archive show SEQ` shows any row's event there."
    )
    tables: dict[str, Any] = {
        table.name: {
            "title": table.title,
            "description": f"{table.description} ({rows.get(table.name, 0):,} rows)",
            "sort": table.sort,
            "columns": {name: note for name, (_, note) in table.columns.items()},
        }
        for table in TABLES
    }
    tables["archive"] = {
        "title": "About this copy",
        "description": "The archive's store, head and verification result when it was copied.",
        "columns": {
            "head_seq": "the last event copied (the verified head)",
            "head_chain": "its chain value: compare with a head recorded elsewhere",
            "verified": "1 when the archive verified at the time of the copy",
            "verification": "what the verification found",
        },
    }
    return {
        "title": f"hermes-archive {summary['store_id']}",
        "description": about,
        "databases": {out.stem: {"description": about, "tables": tables}},
    }
