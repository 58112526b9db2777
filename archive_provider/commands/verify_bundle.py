"""verify-bundle: check an export bundle with the standalone verifier, then against this archive.

The bundle alone proves it is intact and internally consistent. Compared with the live
archive of the same store, it also proves neither side was rewritten or rolled back: the
chain value at the bundle's head seq never changes in an append-only log.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from archive_provider.commands import CommandContext, CommandError, UsageError, expanded

NAME = "verify-bundle"
HELP = "verify an export bundle (seal, members, chain, selection) and compare it with this archive"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", metavar="OUT", help="the bundle file written by `export`")
    parser.add_argument(
        "--key",
        metavar="VKEY",
        help="the archive's verifier key (or a file holding it), to check the bundle's signed "
        "checkpoint (bundle versions 2 and 3); without it only its integrity is checked",
    )
    parser.add_argument(
        "--no-archive",
        action="store_true",
        help="do not compare with the archive of --home even when it is the same store",
    )


_PROGRESS_MANIFEST_LIMIT = 64 << 20


def _claimed_head(path: Path) -> int:
    """The head seq the manifest claims, for the progress bar only (0 when unreadable).

    Read before anything is verified, so only a manifest of modest declared size is read
    (zipfile stops at the declared size): a bundle is untrusted input.
    """
    import zipfile

    from archive_provider.format.verifier import MANIFEST

    try:
        with zipfile.ZipFile(path) as archive:
            if archive.getinfo(MANIFEST).file_size > _PROGRESS_MANIFEST_LIMIT:
                return 0
            return int(json.loads(archive.read(MANIFEST))["head"]["seq"])
    except Exception:
        return 0


def compare(ctx: CommandContext, details: dict[str, Any]) -> dict[str, Any]:
    """Compare the bundle's head (and stated start) with the live archive of the same store."""
    if ctx.args.no_archive or not ctx.exists():
        return {"compared": False, "matches": None, "detail": "no archive to compare with"}
    with ctx.store() as store:
        if store.store_id != details["store_id"]:
            return {
                "compared": False,
                "matches": None,
                "detail": f"the archive at {ctx.archive} is another store ({store.store_id})",
            }
        head = store.head()
        claims = [("head", details["head"]["seq"], details["head"]["chain"])]
        if not details["proof_start"]["genesis"]:
            claims.append(
                ("proof start", details["proof_start"]["seq"], details["proof_start"]["chain"])
            )
        for label, seq, chain in claims:
            if seq > head.seq:
                return {
                    "compared": True,
                    "matches": False,
                    "detail": (
                        f"the bundle's {label} is seq {seq} but this archive ends at "
                        f"seq {head.seq}: "
                        "the archive was rolled back, or the bundle comes from another copy"
                    ),
                }
            row = store.conn.execute("SELECT chain FROM events WHERE seq = ?", (seq,)).fetchone()
            stored = row[0].hex() if row and isinstance(row[0], bytes) else row and row[0]
            if seq and (row is None or stored != chain):
                return {
                    "compared": True,
                    "matches": False,
                    "detail": (
                        f"the bundle's {label} chain at seq {seq} differs from this archive's: "
                        "one of them was rewritten"
                    ),
                }
    return {
        "compared": True,
        "matches": True,
        "detail": f"this archive holds the same chain value at seq {details['head']['seq']} "
        f"(it is now at seq {head.seq})",
    }


def run(ctx: CommandContext) -> int:
    from archive_provider.format.verifier import describe, verify_bundle, vkey_argument

    path = expanded(ctx.args.bundle)
    if not path.exists():
        raise CommandError(f"no bundle at {path}")
    if not path.is_file():
        raise UsageError(f"{path} is not a file")
    with ctx.progress("verify-bundle", _claimed_head(path)) as progress:
        report = verify_bundle(path, progress=progress, vkey=vkey_argument(ctx.args.key))
    archive: dict[str, Any] = (
        compare(ctx, report.details)
        if report.ok
        else {"compared": False, "matches": None, "detail": "not compared: the bundle failed"}
    )
    ok = report.ok and archive["matches"] is not False
    data = {"ok": ok, "bundle": report.as_dict(), "archive": archive}

    def human(_: Any) -> str:
        lines = [describe(report, "bundle")]
        if report.ok:
            verdict = {
                True: "matches the archive",
                False: "DOES NOT MATCH the archive",
                None: "archive",
            }
            lines.append(f"{verdict[archive['matches']]}: {archive['detail']}")
        return "\n".join(lines)

    ctx.emit(data, human)
    return 0 if ok else 1
