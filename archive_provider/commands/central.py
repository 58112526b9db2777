"""central init: create the central store's schema, roles and grants (idempotent).

Run once per database as a superuser (or a role that may create roles):
``hermes-archive central init --db postgresql://postgres@dbhost/archive``. Login roles for
hosts and auditors are then granted one of hermes_archive_shipper, hermes_archive_reader or
hermes_archive_eraser (docs/OPERATIONS.md "Fleet").
"""

from __future__ import annotations

import argparse

from archive_provider.commands import CommandContext, UsageError

NAME = "central"
HELP = "set up a central PostgreSQL store: `central init --db URL` (schema, roles, grants)"
USES_DB = True


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["init", "sql"], help="init: apply; sql: print the SQL")


def run(ctx: CommandContext) -> int:
    from archive_provider.storage import central

    if ctx.args.action == "sql":
        ctx.out.write(central.schema_sql())
        return 0
    if not ctx.db:
        raise UsageError("central init needs --db URL (a role that may create roles)")
    central.init(ctx.db)
    ctx.emit(
        {"ok": True, "central": central.redacted(ctx.db)},
        lambda d: (
            f"central store ready at {d['central']} (schema hermes_archive, roles "
            "hermes_archive_owner, _shipper, _reader, _eraser)"
        ),
    )
    return 0
