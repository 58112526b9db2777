"""checkpoint: print a signed checkpoint of the archive as its note, with every
cosignature (docs/FORMAT.md 15.5), for a witness, a monitor or any C2SP tool to read."""

from __future__ import annotations

import argparse

from archive_provider.commands import CommandContext, CommandError, positive_int

NAME = "checkpoint"
HELP = "print the signed checkpoint note at SIZE (default: the newest) with its cosignatures"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "size",
        nargs="?",
        type=positive_int,
        metavar="SIZE",
        help="the tree size of a signed checkpoint (default: the newest)",
    )


def run(ctx: CommandContext) -> int:
    if not ctx.exists():
        raise CommandError(f"no archive at {ctx.archive}")
    with ctx.store() as store:
        note = store.checkpoint_note(ctx.args.size)
    if note is None:
        raise CommandError(
            "no checkpoint is signed yet"
            if ctx.args.size is None
            else f"no checkpoint is signed at size {ctx.args.size}"
        )
    text = note.decode("utf-8")
    ctx.emit({"ok": True, "note": text}, text.rstrip("\n"))
    return 0
