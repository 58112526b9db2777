"""retention: the retention policy, recorded as an event (never a file in the profile), and
applying it (expired payloads erased with reason "retention", in bounded batches)."""

from __future__ import annotations

import argparse

from archive_provider.commands import CommandContext, UsageError, positive_int
from archive_provider.commands.forget import add_safety

#: six months, the least the EU AI Act keeps logs of high-risk systems (docs/OPERATIONS.md)
AI_ACT_FLOOR_DAYS = 183
NAME = "retention"
HELP = "show, set (--days N | --keep) or apply [--dry-run] the retention policy"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("show", "set", "apply"))
    parser.add_argument("--days", type=positive_int, help="set: keep events this many days")
    parser.add_argument("--keep", action="store_true", help="set: keep forever (the default)")
    parser.add_argument("--reason", help="set: why (recorded)")
    add_safety(parser)


def run(ctx: CommandContext) -> int:
    from archive_provider.audit.erasure import (
        apply_retention,
        check_retention_days,
        retention_policy,
        set_retention,
    )
    from archive_provider.commands.forget import (
        confirm,
        open_writer,
        render,
        spill_lines,
        take_in_spill_first,
        who,
    )

    args = ctx.args
    spill = take_in_spill_first(ctx) if args.action == "apply" else None
    if args.action == "show":
        with ctx.store() as store:
            policy = retention_policy(store)
        days = policy.get("days") if policy else None
        ctx.emit(
            {"ok": True, "policy": policy},
            f"retention: keep {days} days" if days else "retention: keep forever",
        )
        return 0
    store = open_writer(ctx)
    try:
        if args.action == "set":
            if not args.reason or (args.days is None) == (not args.keep):
                raise UsageError("retention set needs --days N or --keep, and --reason")
            check_retention_days(args.days)
            current = retention_policy(store)
            old = current.get("days") if current else None
            shorter = args.days is not None and (old is None or args.days < old)
            if args.dry_run:
                ctx.emit({"ok": True, "days": args.days, "shorter": shorter}, "dry run")
                return 0
            if shorter:
                confirm(ctx, f"Shorten retention to {args.days} days (this erases older data)?")
            seq = set_retention(store, args.days, args.reason, who(), confirmed=shorter)
            note = (
                f"note: {args.days} days is below the six months (183 days) the EU AI Act "
                "(Art. 19, 26(6)) requires for the logs of high-risk AI systems"
                if args.days is not None and args.days < AI_ACT_FLOOR_DAYS
                else None
            )
            ctx.emit(
                {"ok": True, "seq": seq, "days": args.days, "note": note},
                f"retention set (seq {seq})" + (f"\n{note}" if note else ""),
            )
            return 0
        if not args.dry_run:
            preview = apply_retention(store, dry_run=True)
            if any(r.payloads for r in preview):
                confirm(ctx, "Erase what the retention policy says has expired?")
        done = apply_retention(store, dry_run=args.dry_run, who=who())
    finally:
        store.close()
    ctx.emit(
        {"ok": True, "erasures": [r.as_dict() for r in done], **(spill or {})},
        "\n".join(
            [
                "\n\n".join(render(r) for r in done) or "nothing has expired",
                *spill_lines(spill or {}),
            ]
        ),
    )
    return 0
