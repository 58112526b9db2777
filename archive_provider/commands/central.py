"""central: set up a central PostgreSQL store, and what only its administrator does.

``central init --db URL`` creates the schema, roles and grants (idempotent; a superuser, or
a role that may create roles). Login roles for hosts and auditors are then granted one of
hermes_archive_shipper, hermes_archive_reader, hermes_archive_eraser or hermes_archive_admin
(docs/OPERATIONS.md "Fleet"). As a member of hermes_archive_admin:

* ``central register --shipper ROLE`` registers the archive of ``--home`` (its store id,
  genesis and key) to the shipping login ROLE, the only one that may ship it: a shipper can
  no longer claim a store id first;
* ``central release-hold HOLD --store ID --reason WHY`` releases a legal hold centrally: a
  shipped ``legal_hold_released`` is the host's word, and the server keeps held data until
  this is recorded.
"""

from __future__ import annotations

import argparse
import socket

from archive_provider.commands import CommandContext, UsageError

NAME = "central"
HELP = (
    "a central PostgreSQL store: init (schema, roles, grants), sql; as its administrator: "
    "register --shipper ROLE, release-hold HOLD --store ID --reason WHY"
)
USES_DB = True


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        choices=["init", "sql", "register", "release-hold"],
        help="init: apply; sql: print the SQL; register: the archive of --home, to a "
        "shipping role; release-hold: a legal hold of --store",
    )
    parser.add_argument("hold", nargs="?", metavar="HOLD", help="release-hold: the hold's id")
    parser.add_argument("--shipper", help="register: the login role that ships this archive")
    parser.add_argument("--label", help="register: where it comes from (default HOST:PROFILE)")
    parser.add_argument("--reason", help="release-hold: why (recorded)")


def run(ctx: CommandContext) -> int:
    from archive_provider.fleet import central

    action = ctx.args.action
    if action == "sql":
        ctx.out.write(central.schema_sql())
        return 0
    if not ctx.db:
        raise UsageError(f"central {action} needs --db URL")
    if action == "register":
        return _register(ctx, ctx.db)
    if action == "release-hold":
        return _release_hold(ctx, ctx.db)
    central.init(ctx.db)
    ctx.emit(
        {"ok": True, "central": central.redacted(ctx.db)},
        lambda d: (
            f"central store ready at {d['central']} (schema hermes_archive, roles "
            "hermes_archive_owner, _shipper, _reader, _eraser, _admin)"
        ),
    )
    return 0


def _register(ctx: CommandContext, db: str) -> int:
    from archive_provider.fleet import central
    from archive_provider.fleet.ship import registration

    shipper = ctx.args.shipper
    if not shipper:
        raise UsageError("central register needs --shipper ROLE (the login that ships it)")
    with ctx.store() as store:
        found = registration(store)
    label = ctx.args.label or f"{socket.gethostname()}:{ctx.home.name}"
    central.register(db, found, shipper, label)
    ctx.emit(
        {"ok": True, "store_id": found.store_id, "shipper": shipper, "vkey": found.vkey},
        f"registered store {found.store_id} (key {found.vkey}) to {shipper}; compare the key "
        "with the one you pinned",
    )
    return 0


def _release_hold(ctx: CommandContext, db: str) -> int:
    from archive_provider.fleet import central

    if not ctx.args.hold or not ctx.central_store or not (ctx.args.reason or "").strip():
        raise UsageError("central release-hold needs HOLD, --store ID and --reason WHY")
    central.release_hold(db, ctx.central_store, ctx.args.hold, ctx.args.reason.strip())
    ctx.emit(
        {"ok": True, "store_id": ctx.central_store, "hold": ctx.args.hold},
        f"released legal hold {ctx.args.hold} of store {ctx.central_store} centrally",
    )
    return 0
