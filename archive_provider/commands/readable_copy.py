"""readable-copy: a human-readable SQLite copy for sqlite-utils and Datasette (AUDIT.md 6)."""

from __future__ import annotations

import argparse
from typing import Any

from archive_provider.commands import CommandContext, CommandError, UsageError, expanded

NAME = "readable-copy"
HELP = (
    "write OUT.db, a readable copy for sqlite-utils and Datasette (flat tables, full-text "
    "search, OUT.metadata.json beside it), with the head and verification result"
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", metavar="OUT.db", help="the copy to write (a new file)")
    parser.add_argument("--force", action="store_true", help="replace OUT.db if it exists")


def _human(data: dict[str, Any]) -> str:
    counts = ", ".join(f"{n:,} {name}" for name, n in data["rows"].items())
    return "\n".join(
        [
            f"Wrote {data['path']} ({counts}) and {data['metadata']}.",
            f"Head: seq {data['head']['seq']} chain {data['head']['chain']}",
            f"Verification: {data['verification']}",
            f"Open it: datasette {data['path']} --metadata {data['metadata']}",
        ]
    )


def run(ctx: CommandContext) -> int:
    from archive_provider import __version__
    from archive_provider.audit.readable import metadata_path, verdict, write_copy

    out = expanded(ctx.args.out)
    if out.is_symlink() or (out.exists() and not out.is_file()):
        raise UsageError(f"{out} is not a regular file; give a new file name for the copy")
    if out.exists() and not ctx.args.force:
        raise UsageError(f"{out} exists; choose another path or pass --force")
    if not out.parent.is_dir():
        raise CommandError(f"No such folder: {out.parent} (for {out})")
    with ctx.store() as store, ctx.progress("verify", store.head().seq) as progress:
        result = write_copy(
            store, out, created_by=f"hermes-archive {__version__}", progress=progress
        )
    data = {
        "ok": result.report.ok,
        "path": str(result.path),
        "metadata": str(metadata_path(result.path)),
        "head": {"seq": result.head_seq, "chain": result.head_chain},
        "verification": result.report.as_dict(),
        "rows": result.rows,
    }
    ctx.emit(data, lambda d: _human({**d, "verification": verdict(result.report)}))
    return 0 if result.report.ok else 1
