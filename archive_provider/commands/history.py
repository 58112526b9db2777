"""history: every change to a built-in memory entry (MEMORY.md / USER.md), through its edits."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from archive_provider.audit.summary import preview
from archive_provider.commands import CommandContext, CommandError, UsageError
from archive_provider.commands._render import short_time

BUILT_IN_TARGETS = ("memory", "user")  # MEMORY.md and USER.md of Hermes' built-in memory
NAME = "history"
HELP = "every change to the memory entries matching ENTRY: time, action, origin, previous content"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "entry", metavar="ENTRY", help="text any version of the entry contained (case-insensitive)"
    )
    parser.add_argument("--target", help="only this memory target (memory or user)")


def collect(ctx: CommandContext) -> dict[str, Any]:
    from archive_provider.projections.builtin import history

    with ctx.store() as store:
        conn = store.conn
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'memory_history'").fetchone():
            raise CommandError(
                "the archive has no memory projection yet; run `hermes-archive replay` to build it"
            )
        target = ctx.args.target
        if target is not None:
            known = sorted(
                {*BUILT_IN_TARGETS}
                | {row[0] for row in conn.execute("SELECT DISTINCT target FROM memory_history")}
            )
            if target not in known:
                raise UsageError(
                    f"--target {target!r} is not a memory target; known: {', '.join(known)}"
                )
        changes = [c for c in history(conn, ctx.args.entry) if target in (None, c.target)]
        current = {
            (target, entry): content
            for target, entry, content in conn.execute(
                "SELECT target, entry, content FROM memory_entries"
            )
        }
    entries: dict[tuple[str, int | None, int], dict[str, Any]] = {}
    for change in changes:
        # writes that changed no entry (unresolved, ignored) stand alone, keyed by their seq
        group = (change.target, change.entry, change.seq if change.entry is None else 0)
        entry = entries.setdefault(
            group,
            {
                "target": change.target,
                "entry": change.entry,
                "current": current.get((change.target, change.entry)),
                "changes": [],
            },
        )
        entry["changes"].append(asdict(change))
    return {"query": ctx.args.entry, "entries": list(entries.values())}


def _human(data: dict[str, Any]) -> str:
    from archive_provider.format.verifier import printable

    if not data["entries"]:
        return f"No memory entry ever contained {data['query']!r}."
    blocks = []
    for entry in data["entries"]:
        now = (
            preview(entry["current"], 70) if entry["current"] is not None else "(not in memory now)"
        )
        lines = [
            f"{entry['target']} entry {'-' if entry['entry'] is None else entry['entry']}: "
            f"now {now}"
        ]
        for c in entry["changes"]:
            change = {
                "add": f"added {preview(c['after'], 60)}",
                "replace": f"replaced {preview(c['before'], 50)} with {preview(c['after'], 50)}",
                "remove": f"removed {preview(c['before'], 60)}",
            }.get(c["action"], f"{c['action']} {preview(c['after'] or c['before'] or '', 60)}")
            if c["before"] is None and c["action"] in ("replace", "remove"):
                change = (
                    f"{c['action']} (entry not found: {c['resolution']}) "
                    f"{preview(c['after'] or '', 50)}"
                )
            origin = ", ".join(
                f"{k}={v}" for k, v in sorted(c["metadata"].items()) if isinstance(v, (str, int))
            )
            lines.append(
                f"  seq {c['seq']:>5}  {short_time(c['time'])}  session {printable(c['session'])}  {change}"
                + (
                    f"  [{c['resolution']}]"
                    if c["resolution"] not in ("appended", "substring")
                    else ""
                )
                + (f"\n             origin: {origin}" if origin else "")
            )
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def run(ctx: CommandContext) -> int:
    data = collect(ctx)
    ctx.emit(data, _human)
    return 0 if data["entries"] else 1
