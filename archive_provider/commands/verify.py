"""verify: recompute every digest and chain value; name the first bad sequence number."""

from __future__ import annotations

import argparse

from archive_provider.commands import CommandContext
from archive_provider.store import StoreError
from archive_provider.verifier import Report, verify_database

NAME = "verify"
HELP = "check every identity, payload digest and chain hash of the log"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--projections", action="store_true",
                        help="also rebuild every projection in a scratch database and compare digests")


def _human(report: Report) -> str:
    if report.ok:
        return f"ok: {report.events_checked} events and {report.payloads_checked} payloads verified; head at seq {report.last_seq}"
    where = f"seq {report.first_bad_seq}" if report.first_bad_seq is not None else "the archive"
    return f"FAILED at {where}: {report.problem}"


def run(ctx: CommandContext) -> int:
    try:
        store = ctx.open_store()
    except StoreError as exc:
        report = Report().fail(None, str(exc))
        ctx.emit(report.as_dict(), _human)
        return 1
    try:
        total = store.head().seq
        with ctx.progress("verify", total) as progress:
            report = verify_database(store.conn, store.key, progress=progress)
    finally:
        store.close()
    ctx.emit(report.as_dict(), _human)
    return 0 if report.ok else 1
