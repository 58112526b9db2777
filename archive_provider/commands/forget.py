"""forget: erase data from the archive with a recorded, verifiable erasure event.

Destructive: asks for confirmation on a terminal and needs ``--yes`` otherwise; ``--dry-run``
shows what would go and what a legal hold keeps. docs/OPERATIONS.md gives the order of a
data-subject request (erase at the host first, then here, then the backups).
"""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import TYPE_CHECKING, Any

from archive_provider.commands import (
    EXIT_PROBLEM,
    CommandContext,
    CommandError,
    UsageError,
    time_arg,
)

if TYPE_CHECKING:
    from archive_provider.audit.erasure import Receipt, Scope
    from archive_provider.storage.store import EventStore

NAME = "forget"
HELP = (
    "erase a session, event, time range, author or memory entry (every version) from the "
    "archive, with a receipt; --dry-run first"
)


def configure(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--session", help="every event of this session")
    which.add_argument("--event", metavar="SEQ|DIGEST", help="one event: seq or digest prefix")
    which.add_argument(
        "--since", type=time_arg, help="events at or after this time (with --until), as log"
    )
    which.add_argument("--author", help="every turn of this author id (as the host gave it)")
    which.add_argument(
        "--memory", metavar="TEXT", help="the memory entry holding TEXT, every version"
    )
    parser.add_argument(
        "--until", type=time_arg, help="events at or before this time (with --since), as log"
    )
    parser.add_argument("--reason", required=True, help="why (recorded in the erasure event)")
    parser.add_argument(
        "--shared",
        action="store_true",
        help="also erase texts that events outside the scope name (listed as dangling)",
    )
    parser.add_argument("--legal-basis", default="", help="free text, e.g. 'GDPR Art. 17(1)(a)'")
    add_safety(parser)


def add_safety(parser: argparse.ArgumentParser) -> None:
    """--yes and --dry-run, the same on every destructive command."""
    parser.add_argument("--yes", action="store_true", help="do not ask (required off a terminal)")
    parser.add_argument("--dry-run", action="store_true", help="show what would go; change nothing")


def scope_of(args: argparse.Namespace) -> Scope:
    from archive_provider.audit.erasure import Scope

    found = _scope(args)
    return Scope(found.kind, {**found.value, "shared": True}) if args.shared else found


def _scope(args: argparse.Namespace) -> Scope:
    from archive_provider.audit.erasure import Scope

    if args.session is not None:
        return Scope("session", {"session": args.session})
    if args.event is not None:
        ref = str(args.event).lower()
        if ref.isdigit() and len(ref) < 8:
            return Scope("event", {"seq": int(ref)})
        if len(ref) < 8 or any(c not in "0123456789abcdef" for c in ref):
            raise UsageError(f"--event {args.event!r}: give a seq or at least 8 hex digits")
        return Scope("event", {"digest": ref})
    if args.since is not None:
        if args.until is None:
            raise UsageError("--since needs --until")
        if args.since > args.until:
            raise UsageError("--since is after --until")
        return Scope("time", {"since": args.since, "until": args.until})
    if args.author is not None:
        return Scope("author", {"author": args.author})
    return Scope("memory", {"text": args.memory})


def confirm(ctx: CommandContext, question: str) -> None:
    """Ask on a terminal; off a terminal only ``--yes`` lets a destructive command run."""
    if getattr(ctx.args, "yes", False):
        return
    if not sys.stdin.isatty():
        raise CommandError(f"{question}: not confirmed (pass --yes to run without a terminal)")
    ctx.err.write(f"{question} Type 'yes' to go on: ")
    ctx.err.flush()
    if sys.stdin.readline().strip() != "yes":
        raise CommandError("not confirmed: nothing was changed")


def who() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def open_writer(ctx: CommandContext) -> EventStore:
    return ctx.open_writable()


def render(receipt: Receipt) -> str:
    from archive_provider.audit.erasure import scope_text

    if receipt.dry_run:
        lines = [f"would erase {receipt.payloads} payloads touching {receipt.events} events"]
        if receipt.kept_shared:
            lines.append(f"kept: {receipt.kept_shared} payloads events outside the scope name")
        lines += [
            f"held: {h['events']} events by legal hold {h['hold']} ({h['reason']})"
            for h in receipt.held
        ]
        return "\n".join(lines)
    if receipt.seq is None:
        return "nothing left to erase (already erased); the files were scrubbed again"
    lines = [
        f"erased {receipt.payloads} payloads touching {receipt.events} events",
        f"erasure event: seq {receipt.seq} at {receipt.time}, chain {receipt.chain}",
        f"scope: {scope_text(receipt.scope)}",
        f"reason: {receipt.reason}  by: {receipt.who}",
        f"legal basis: {receipt.legal_basis or '(none given)'}",
    ]
    if receipt.kept_shared:
        lines.append(f"kept: {receipt.kept_shared} payloads events outside the scope name")
    if receipt.checkpoint:
        lines += ["signed checkpoint including it:", receipt.checkpoint.rstrip("\n")]
    return "\n".join(lines)


def take_in_spill_first(ctx: CommandContext) -> dict[str, Any]:
    """Take the pending spill into the log before erasing, so the erasure reaches it.

    Taken in, the spill's events are erased with the log's (nothing accepted is dropped on
    the way, and no segment keeps the text: each is removed once committed); a dry run
    only counts the segments. Runs before the command opens its own connection, so neither
    waits on the other. A damaged segment kept aside is never read or deleted: it is listed
    for the operator to inspect, since it may hold what is being erased.
    """
    from archive_provider.host.spill_kinds import take_in_spill
    from archive_provider.storage.spill import damaged_paths, segment_paths

    open_writer(ctx).close()  # a v1 or refused archive is refused before anything is written
    if ctx.args.dry_run:
        taken, pending = 0, len(segment_paths(ctx.archive))
    else:
        taken, pending = take_in_spill(ctx.home), 0
    damaged = [p.name for p in damaged_paths(ctx.archive)]
    return {"spill_taken_in": taken, "spill_pending": pending, "spill_damaged": damaged}


def spill_lines(spill: dict[str, Any]) -> list[str]:
    lines = []
    if spill.get("spill_taken_in"):
        lines.append(f"took in {spill['spill_taken_in']} pending spill segment(s) first")
    if spill.get("spill_pending"):
        lines.append(
            f"{spill['spill_pending']} pending spill segment(s) are taken in before the "
            "erasure (not counted above)"
        )
    if spill.get("spill_damaged"):
        lines.append(
            "damaged spill segments kept aside in spill/damaged may hold this data and are "
            f"not erased: {', '.join(spill['spill_damaged'])} (docs/RECOVER.md, 'Damaged spill')"
        )
    return lines


def run(ctx: CommandContext) -> int:
    from archive_provider.audit import host_copies
    from archive_provider.audit.erasure import erased_texts, forget, scope_text

    scope = scope_of(ctx.args)
    spill = take_in_spill_first(ctx)
    store = open_writer(ctx)
    try:
        held_by_host = host_copies.scan(ctx.home, erased_texts(store, scope))
        if not ctx.args.dry_run:
            preview = forget(store, scope, reason=ctx.args.reason, dry_run=True)
            if preview.held:
                hold = preview.held[0]
                raise CommandError(
                    f"legal hold {hold['hold']} ({hold['reason']}) covers {hold['events']} of "
                    "these events: nothing was erased (hermes-archive hold list)"
                )
            if preview.payloads:
                confirm(
                    ctx,
                    f"Erase {preview.payloads} payloads touching {preview.events} events "
                    f"({scope_text(scope.record())}) for good?",
                )
        receipt = forget(
            store,
            scope,
            reason=ctx.args.reason,
            legal_basis=ctx.args.legal_basis,
            who=who(),
            dry_run=ctx.args.dry_run,
            pending_spill=bool(spill["spill_pending"]),
        )
    finally:
        store.close()
    host = {"host_copies": held_by_host.as_dict()}
    if receipt.dry_run and receipt.held:  # as the real run would: refused, naming the hold
        hold = receipt.held[0]
        error = (
            f"legal hold {hold['hold']} ({hold['reason']}) covers {hold['events']} of these "
            "events: the erasure would be refused (hermes-archive hold list)"
        )
        data = {"ok": False, "error": error, **receipt.as_dict(), **spill, **host}
        ctx.emit(data, "\n".join([render(receipt), *spill_lines(spill), *held_by_host.lines()]))
        if not ctx.json:
            ctx.err.write(f"error: {error}\n")
        return EXIT_PROBLEM
    data = {"ok": True, **receipt.as_dict(), **spill, **host}
    ctx.emit(data, "\n".join([render(receipt), *spill_lines(spill), *held_by_host.lines()]))
    return 0
