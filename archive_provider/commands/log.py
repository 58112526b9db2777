"""log: the events of the archive, filtered, oldest first (the newest are at the bottom)."""

from __future__ import annotations

import argparse
from typing import Any

from archive_provider.audit.summary import Archive, envelope_summary
from archive_provider.commands import (
    CommandContext,
    UsageError,
    count_or_all,
    time_arg,
    time_range,
)
from archive_provider.commands._render import event_table, record
from archive_provider.format.events import EVENT_TYPES

NAME = "log"
HELP = "list events (filter by type, session, time); the newest last"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--type",
        dest="types",
        action="append",
        metavar="TYPE",
        help="only this event type (repeatable), e.g. turn, memory_write, checkpoint",
    )
    parser.add_argument("--session", help="only this session id")
    parser.add_argument(
        "--since", type=time_arg, help="events at or after this ISO 8601 time (UTC if naive)"
    )
    parser.add_argument("--until", type=time_arg, help="events at or before this ISO 8601 time")
    parser.add_argument(
        "--limit",
        type=count_or_all,
        default=50,
        help="show the last N matching events (default 50; 0 shows all)",
    )


def query(ctx: CommandContext) -> tuple[str, list[Any]]:
    """The SQL and arguments for the filters (envelope times are text that sorts as time)."""
    args = ctx.args
    unknown = sorted(set(args.types or ()) - EVENT_TYPES)
    if unknown:
        raise UsageError(
            f"unknown event type {unknown[0]!r}; known: {', '.join(sorted(EVENT_TYPES))}"
        )
    since, until = time_range(args)
    clauses, params = [], []
    if args.types:
        clauses.append(f"e.type IN ({', '.join('?' * len(args.types))})")
        params.extend(args.types)
    for clause, value in (
        ("e.session = ?", args.session),
        ("e.time >= ?", since),
        ("e.time <= ?", until),
    ):
        if value is not None:
            clauses.append(clause)
            params.append(value)
    where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
    return where, params


def run(ctx: CommandContext) -> int:
    where, params = query(ctx)
    limit = ctx.args.limit or -1  # SQLite: a negative LIMIT means no limit
    sql = (
        "SELECT e.seq, e.time, e.type, e.session, e.identity, e.payload"
        f" FROM events e{where} ORDER BY e.seq DESC LIMIT ?"
    )
    with ctx.store() as store:
        rows = store.conn.execute(sql, [*params, limit]).fetchall()
        events = []
        for row in reversed(rows):
            event = store.event(row[0])  # the store's one reader, in either format
            events.append(record(store, event) if event is not None else _envelope(store, row))

    ctx.emit(events, event_table)
    return 0 if events else 1


def _envelope(store: Archive, row: tuple[Any, ...]) -> dict[str, Any]:
    """An event the reader does not return, its body erased (or missing): the envelope is
    still in the log, so it is listed, with what became of its body."""
    seq, time, kind, session, identity, payload = row
    identity, payload = (v.hex() if isinstance(v, bytes) else str(v) for v in (identity, payload))
    return {
        "seq": seq,
        "time": time,
        "type": kind,
        "session": session,
        "identity": identity,
        "payload_digest": payload,
        "summary": envelope_summary(store, kind, payload),
    }
