"""status: what the archive holds and whether its projections are current."""

from __future__ import annotations

import argparse
from typing import Any

from archive_provider.commands import CommandContext

NAME = "status"
HELP = "summarize the archive: events, sessions, checkpoints, last event, size, projection health"


def configure(parser: argparse.ArgumentParser) -> None:
    """No options."""


def collect(ctx: CommandContext) -> dict[str, Any]:
    if not ctx.exists():
        return {"archive": str(ctx.archive), "exists": False}
    store = ctx.open_store()
    try:
        conn = store.conn
        head = store.head()
        counts = dict(conn.execute("SELECT type, count(*) FROM events GROUP BY type").fetchall())
        last = conn.execute("SELECT seq, time, type, session FROM events ORDER BY seq DESC LIMIT 1").fetchone()
        projections = dict(conn.execute("SELECT name, last_seq FROM projection_state").fetchall())
        size = sum(p.stat().st_size for p in ctx.archive.iterdir() if p.name.startswith("events.db"))
        return {
            "archive": str(ctx.archive),
            "exists": True,
            "events": head.seq,
            "events_by_type": counts,
            "sessions": conn.execute("SELECT count(DISTINCT session) FROM events").fetchone()[0],
            "checkpoints": counts.get("checkpoint", 0),
            "last_event": dict(zip(("seq", "time", "type", "session"), last)) if last else None,
            "bytes": size,
            "projections": {
                name: {"last_seq": seq, "current": seq == head.seq} for name, seq in sorted(projections.items())
            },
        }
    finally:
        store.close()


def _human(data: dict[str, Any]) -> str:
    if not data["exists"]:
        return f"No archive yet at {data['archive']} (it is created when the provider first runs)."
    last = data["last_event"]
    lines = [
        f"Archive: {data['archive']}",
        f"Events: {data['events']} ({', '.join(f'{k} {v}' for k, v in sorted(data['events_by_type'].items()))})",
        f"Sessions: {data['sessions']}   Checkpoints: {data['checkpoints']}   Size: {data['bytes']:,} bytes",
    ]
    if last:
        lines.append(f"Last event: seq {last['seq']} {last['type']} at {last['time']} (session {last['session']})")
    stale = [name for name, p in data["projections"].items() if not p["current"]]
    lines.append("Projections: " + ("all current" if not stale else "behind: " + ", ".join(stale)))
    return "\n".join(lines)


def run(ctx: CommandContext) -> int:
    ctx.emit(collect(ctx), _human)
    return 0
