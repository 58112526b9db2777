"""export: write a sealed, self-contained bundle of selected events with the proof they belong.

The bundle carries every envelope from the genesis to the head, and the payloads and parts
of the selected events only. docs/AUDIT.md explains what it proves.
"""

from __future__ import annotations

import argparse
from typing import Any

from archive_provider.commands import (
    CommandContext,
    CommandError,
    UsageError,
    expanded,
    time_arg,
    time_range,
)

NAME = "export"
HELP = "export events (all, one session, a time range) to a sealed bundle an auditor can verify"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "out", metavar="OUT", help="the bundle file to write (a zip, e.g. audit.zip)"
    )
    parser.add_argument("--session", help="only this session's events get their payloads")
    parser.add_argument("--since", type=time_arg, help="only events at or after this ISO 8601 time")
    parser.add_argument(
        "--until", type=time_arg, help="only events at or before this ISO 8601 time"
    )
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")


def _human(data: dict[str, Any]) -> str:
    start = (
        "the genesis" if data["proof_start"]["seq"] == 0 else f"seq {data['proof_start']['seq']}"
    )
    lines = [
        f"Wrote {data['path']} ({data['bytes']:,} bytes): {data['selected_events']} selected "
        f"events with {data['payloads']} payloads; {data['envelopes']} envelopes chained from "
        f"{start} to the head.",
        f"Head: seq {data['head']['seq']} chain {data['head']['chain']}",
        f"Seal: blake3 {data['seal']}",
        "Verified with the standalone verifier; check it anywhere with "
        f"`hermes-archive verify-bundle {data['path']}` or "
        f"`python verifier.py bundle {data['path']}`.",
    ]
    if data["selected_events"] == 0:
        lines.insert(
            1, "No event matches the selection: the bundle proves there is none up to the head."
        )
    return "\n".join(lines)


def run(ctx: CommandContext) -> int:
    from archive_provider import __version__
    from archive_provider.audit.export import ExportError, Selection, export_bundle

    args = ctx.args
    out = expanded(args.out)
    if out.is_symlink() or (out.exists() and not out.is_file()):
        # the bundle replaces OUT by rename: a link, device or pipe would be destroyed, not
        # written through, so only a regular file may be overwritten (and only with --force)
        raise UsageError(f"{out} is not a regular file; give a new file name for the bundle")
    if out.exists() and not args.force:
        raise UsageError(f"{out} exists; choose another path or pass --force")
    selection = Selection(args.session, *time_range(args))
    with ctx.store() as store:
        total = store.head().seq
        with ctx.progress("export", total) as progress:
            try:
                result = export_bundle(
                    store,
                    out,
                    selection,
                    progress=progress,
                    created_by=f"hermes-archive {__version__}",
                )
            except ExportError as exc:  # its message says what to do
                raise CommandError(str(exc)) from None
    data = {
        "ok": True,
        "path": str(result.path),
        "bytes": result.bytes,
        "store_id": result.store_id,
        "head": {"seq": result.head_seq, "chain": result.head_chain},
        "proof_start": {"seq": result.start_seq, "chain": result.start_chain},
        "selection": selection.as_dict(),
        "envelopes": result.envelopes,
        "selected_events": result.selected_events,
        "payloads": result.payloads,
        "seal": result.seal,
    }
    ctx.emit(data, _human)
    return 0
