"""as-of: what the archive knew at an event or a moment: memory, session lineage, recall served."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from archive_provider.audit.summary import preview
from archive_provider.commands import CommandContext, CommandError, UsageError, time_arg
from archive_provider.domain.authors import author_label

NAME = "as-of"
HELP = (
    "memory entries, session lineage, turn authors and recall served as they stood at a seq"
    " or a time"
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "at",
        metavar="TIME|SEQ",
        help="a sequence number, or an ISO 8601 time (the last event at or before it)",
    )
    parser.add_argument("--session", help="the session whose lineage and recalls to show")


def _point(text: str) -> dict[str, Any]:
    if text.isdigit():
        return {"seq": int(text)}
    try:
        return {"time": time_arg(text)}
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"TIME|SEQ: {exc}") from None


def _human(data: dict[str, Any]) -> str:
    when = f"seq {data['seq']}" + (
        f" ({data['time']})" if data["time"] else " (before the first event)"
    )
    lines = [f"As of {when}:"]
    if not data["memory"]:
        lines.append("  memory: empty")
    for target, entries in sorted(data["memory"].items()):
        lines.append(f"  {target} ({len(entries)} entries):")
        lines.extend(f"    - {preview(entry, 90)}" for entry in entries)
    if data["session"] is not None:
        chain = " <- ".join(
            [
                data["session"],
                *(f"{link['parent']} ({link['relation']})" for link in data["lineage"]),
            ]
        )
        lines.append(f"  lineage: {chain}")
    lines.append(f"  session switches: {len(data['links'])}")
    authors = data["authors"]
    lines.append(f"  turn authors: {len(authors)}" + (":" if authors else ""))
    for author in authors:
        lines.append(
            f"    {author_label(author)}: {author['turns']} turns, last at seq {author['last_seq']}"
        )
    recalls = data["recalls"]
    lines.append(f"  recall served: {len(recalls)}" + (":" if recalls else ""))
    for recall in recalls[-5:]:
        lines.append(
            f"    seq {recall['seq']} session {recall['session']} turn {recall['turn']}: "
            f"query {preview(recall['query'], 40)}, sources {json.dumps(recall['sources'])}"
        )
    return "\n".join(lines)


def run(ctx: CommandContext) -> int:
    from archive_provider.audit.as_of import as_of

    point = _point(ctx.args.at)
    with ctx.store() as store:
        try:
            answer = as_of(store, session=ctx.args.session, **point)
        except ValueError as exc:  # a seq outside the log: not found, a data problem
            raise CommandError(str(exc)) from None
    data = asdict(answer)
    ctx.emit(data, _human)
    return 0
