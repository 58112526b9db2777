"""log: the events of the archive, filtered, oldest first (the newest are at the bottom)."""

from __future__ import annotations

import argparse
from typing import Any

from archive_provider.commands import (
    CommandContext,
    UsageError,
    count_or_all,
    time_arg,
    time_range,
)
from archive_provider.commands._render import envelope_record, event_table, record
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
    sql = f"SELECT e.seq FROM events e{where} ORDER BY e.seq DESC LIMIT ?"
    with ctx.store() as store:
        seqs = [seq for (seq,) in store.conn.execute(sql, [*params, limit]).fetchall()]
        events = [  # each read by the store's one reader; an erased body by its envelope
            record(store, event)
            if (event := store.event(seq)) is not None
            else envelope_record(store, seq)
            for seq in reversed(seqs)
        ]

    ctx.emit(events, event_table)
    return 0 if events else 1
