"""replay: rebuild every projection from the log in one transaction (the log is the only truth)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from archive_provider.commands import CommandContext, CommandError

NAME = "replay"
HELP = "rebuild every projection from the log (atomically: a crash leaves the old ones intact)"


def configure(parser: argparse.ArgumentParser) -> None:
    """No options."""


def _writer_running(folder: Path) -> bool:
    """Whether this process already has the archive's writer (one writer per file per process)."""
    from archive_provider.storage.writer import writers

    return Path(os.path.realpath(folder)) in getattr(writers, "_writers", {})


def run(ctx: CommandContext) -> int:
    from archive_provider.audit.replay import projection_digests, rebuild
    from archive_provider.projections.registry import default_projections
    from archive_provider.storage.store import EventStore

    if not ctx.exists():
        ctx.open_store()  # raises the "no archive" message
    if _writer_running(ctx.archive):
        raise CommandError(
            "this process is writing to the archive; replay it from a separate command"
        )
    # a write connection: BEGIN IMMEDIATE waits for, never races, an agent in another process
    store = EventStore.open(ctx.archive, create=False, projections=default_projections)
    try:
        head = store.head().seq
        with ctx.progress("replay", head) as progress:
            events = rebuild(store, progress=progress)
        digests = projection_digests(store.conn, store.projections)
    finally:
        store.close()
    data = {"ok": True, "head": head, "events_replayed": events, "projections": digests}
    ctx.emit(
        data,
        lambda d: (
            f"Rebuilt {len(d['projections'])} projections ({', '.join(d['projections'])}) from "
            f"{d['events_replayed']} events, up to seq {d['head']}."
        ),
    )
    return 0
