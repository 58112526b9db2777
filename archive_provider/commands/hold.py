"""hold: legal holds (add, list, release), each a recorded event; forget and retention refuse
or skip what a hold in force covers."""

from __future__ import annotations

import argparse

from archive_provider.audit.summary import fields
from archive_provider.commands import CommandContext, UsageError, time_arg

NAME = "hold"
HELP = "legal holds: add (--session | --since/--until | --author), list, release ID"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("add", "list", "release"))
    parser.add_argument("hold_id", nargs="?", metavar="ID", help="release: the hold's id")
    parser.add_argument("--session")
    parser.add_argument("--since", type=time_arg)
    parser.add_argument("--until", type=time_arg)
    parser.add_argument("--author")
    parser.add_argument("--reason", help="why (required for add and release)")


def run(ctx: CommandContext) -> int:
    from archive_provider.audit.erasure import add_hold, holds, release_hold
    from archive_provider.commands.forget import open_writer, who

    args = ctx.args
    if args.action == "list":
        with ctx.store() as store:
            found = holds(store)
        ctx.emit(
            {"ok": True, "holds": found},
            "\n".join(
                f"{h['hold']} (seq {h['seq']}): {fields(h['selector'])}: {h['reason']}"
                for h in found
            )
            or "no legal holds in force",
        )
        return 0
    if not args.reason:
        raise UsageError(f"hold {args.action} needs --reason")
    store = open_writer(ctx)
    try:
        if args.action == "release":
            if not args.hold_id:
                raise UsageError("hold release needs the hold's ID (hermes-archive hold list)")
            seq = release_hold(store, args.hold_id, args.reason, who())
            ctx.emit({"ok": True, "hold": args.hold_id, "seq": seq}, f"released {args.hold_id}")
            return 0
        if args.session:
            selector: dict[str, str] = {"session": args.session}
        elif args.since and args.until:
            selector = {"since": args.since, "until": args.until}
        elif args.author:
            selector = {"author": args.author}
        else:
            raise UsageError("hold add needs --session, --since with --until, or --author")
        hold = add_hold(store, selector, args.reason, who())
    finally:
        store.close()
    ctx.emit({"ok": True, "hold": hold, "selector": selector}, f"legal hold {hold} added")
    return 0
