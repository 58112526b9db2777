"""erasures: every erasure's receipt (scope, counts, seq, chain, the signed checkpoint)."""

from __future__ import annotations

import argparse

from archive_provider.commands import CommandContext

NAME = "erasures"
HELP = "list the erasures made in this archive, with their receipts (never erased content)"


def configure(parser: argparse.ArgumentParser) -> None:
    """Only --json (global)."""


def run(ctx: CommandContext) -> int:
    from archive_provider.audit.erasure import receipts
    from archive_provider.commands.forget import render

    with ctx.store() as store:
        listed = receipts(store)
    ctx.emit(
        {"ok": True, "erasures": [r.as_dict() for r in listed]},
        "\n\n".join(render(r) for r in listed) or "no erasures",
    )
    return 0
