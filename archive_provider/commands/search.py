"""search: the recall index, as the agent's archive_search tool sees it (ranked, filterable)."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from archive_provider.audit.summary import preview
from archive_provider.commands import CommandContext, CommandError, positive_int, time_arg
from archive_provider.commands._render import short_time

NAME = "search"
HELP = "full-text search over archived messages, checkpoint evidence and memory entries"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "query", nargs="+", metavar="QUERY", help="words to look for (never query syntax)"
    )
    parser.add_argument(
        "--limit", type=positive_int, default=10, help="at most N results (default 10)"
    )
    parser.add_argument("--session", help="only this session id")
    parser.add_argument(
        "--since", type=time_arg, help="only texts archived at or after this ISO 8601 time"
    )
    parser.add_argument(
        "--until", type=time_arg, help="only texts archived at or before this ISO 8601 time"
    )
    parser.add_argument(
        "--author",
        metavar="ID|NAME",
        help="only turns whose author (as the host stated it) has this id or display name",
    )


def run(ctx: CommandContext) -> int:
    from archive_provider.format.verifier import printable
    from archive_provider.projections.recall import search

    text = " ".join(ctx.args.query)
    with ctx.store() as store:
        # recall_docs: the index's current layout (an archive last opened by an older version
        # has an index this one cannot read until an open with projections rebuilds it)
        if not store.conn.execute(
            "SELECT 1 FROM sqlite_master WHERE name = 'recall_docs'"
        ).fetchone():
            raise CommandError(
                "the archive has no recall index of this version yet; run "
                "`hermes-archive replay` to build it"
            )
        head = store.head().seq  # first: a commit between the two reads moves both
        indexed = store.conn.execute(
            "SELECT last_seq FROM projection_state WHERE name = 'recall'"
        ).fetchone()
        if indexed is None or int(indexed[0]) < head:  # a rebuild on open, batch by batch
            raise CommandError(
                f"the recall index is behind the log (seq {indexed[0] if indexed else 0} of "
                f"{head}): it is being rebuilt by an open of the archive, or was left behind; "
                "try again once the provider has started, or run `hermes-archive replay`"
            )
        hits = search(
            store.conn,
            text,
            limit=ctx.args.limit or 10,
            session=ctx.args.session,
            since=ctx.args.since,
            until=ctx.args.until,
            author=ctx.args.author,
        )
    data: dict[str, Any] = {"query": text, "results": [asdict(hit) for hit in hits]}

    def human(data: dict[str, Any]) -> str:
        if not data["results"]:
            return f"Nothing in the archive matches {text!r}."
        return "\n".join(
            f"{h['seq']:>6}  {short_time(h['time'] or ''):<19}  {h['kind']:<10}  "
            f"{h['role'] or '-':<9}  {printable(h['session']) or '-'}  {preview(h['text'], 80)}"
            for h in data["results"]
        )

    ctx.emit(data, human)
    return 0 if hits else 1
