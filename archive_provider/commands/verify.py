"""verify: recompute every digest and chain value; name the first bad sequence number.

With ``--projections`` it also rebuilds every projection from the log in a scratch copy
and compares their digests with the live ones (docs/DESIGN.md, invariant 1).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from archive_provider.commands import CommandContext, positive_int

if TYPE_CHECKING:
    from archive_provider.format.verifier import Report

NAME = "verify"
HELP = "check every identity, payload digest and chain value (--projections: projections too)"


def verifier_key(text: str) -> str:
    """argparse type for --key and --witness-key: a verifier key (``name+hex ID+base64``)."""
    from archive_provider.format.signed_note import NoteError, Verifier

    try:
        Verifier.from_vkey(text)
    except NoteError as exc:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a verifier key ({exc}); `hermes-archive key` prints the archive's"
        ) from None
    return text


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--projections",
        action="store_true",
        help="also rebuild every projection in a scratch database and compare digests",
    )
    parser.add_argument(
        "--key",
        type=verifier_key,
        metavar="VKEY",
        help="the archive's verifier key, pinned outside it (`hermes-archive key` "
        "printed it), to check every signed checkpoint",
    )
    parser.add_argument(
        "--witness-key",
        action="append",
        type=verifier_key,
        metavar="VKEY",
        help="with --db: a witness's cosigner key; its cosignatures on the central "
        "checkpoints are checked (repeatable; keys the log's witness_added events name are "
        "checked anyway)",
    )
    parser.add_argument(
        "--witnesses",
        action="store_true",
        help="ask the local and every remote witness what they cosigned and check "
        "it against this archive (lag, last error, a refused rewrite)",
    )
    parser.add_argument(
        "--jobs",
        type=positive_int,
        metavar="N",
        help="processes to use (default: the cores this process may run on; at most 16): one "
        "checks the events while the others merge the payloads, each a range of digests, and "
        "the report is the one a single process gives",
    )
    parser.add_argument(
        "--lineage",
        metavar="V1_FILE",
        help="a migrated archive: check it against the kept v1 file (events.v1.db; its key "
        "payload.v1.key beside it)",
    )


def _projections(ctx: CommandContext, total: int) -> dict[str, Any]:
    from archive_provider.audit.replay import verify_projections

    with ctx.progress("projections", total) as progress:
        result = verify_projections(ctx.archive, progress=progress)
    return {
        "ok": bool(result.ok),
        "live": dict(result.live),
        "rebuilt": dict(result.rebuilt),
        "mismatched": sorted(result.mismatched),
    }


def _lineage(ctx: CommandContext, v1_file: Path) -> dict[str, Any]:
    from archive_provider.storage.migrate import V1_KEY_NAME, lineage
    from archive_provider.storage.store import read_key

    key = read_key(v1_file.with_name(V1_KEY_NAME))
    with ctx.store() as store:
        return lineage(store, v1_file, key).as_dict()


def _human(data: dict[str, Any]) -> str:
    report = data["log"]
    if report["ok"]:
        lines = [
            f"ok: {report['events_checked']} events and {report['payloads_checked']} payloads "
            "verified; "
            f"head at seq {report['last_seq']}"
        ]
        lines += [  # each erasure event and how many tombstones it covers
            f"erasure at seq {e['seq']}: {e['payloads']} payloads erased"
            for e in report.get("erasures") or []
        ]
        if report.get("authenticity") == "verified":  # v2; unchecked, a note says so
            source = {"--key": "the verifier key given with --key"}.get(
                data.get("pinned_key") or "", "the verifier key the local witness pinned"
            )
            lines.append(f"signed checkpoints: verified with {source}")
    else:
        where = (
            f"seq {report['first_bad_seq']}"
            if report["first_bad_seq"] is not None
            else "the archive"
        )
        lines = [f"FAILED at {where}: {report['problem']}"]
    lines += [f"note: {warning}" for warning in report.get("warnings") or []]
    if "lineage" in data:
        found = data["lineage"]
        lines.append(
            f"lineage: ok, the {found['events']} v1 events are the migrated ones"
            if found["ok"]
            else f"lineage FAILED: {found['problem']}"
        )
    lines.extend(data.get("witness_lines", ()))
    projections = data.get("projections")
    if projections is not None:
        if projections["ok"]:
            lines.append(
                f"projections: ok, {len(projections['live'])} rebuilt from the log and identical"
            )
        else:
            for name in projections["mismatched"]:
                live, rebuilt = projections["live"].get(name), projections["rebuilt"].get(name)
                lines.append(
                    f"projection {name} DIFFERS from a replay: live {live}, rebuilt {rebuilt}"
                )
            lines.append("run `hermes-archive replay` to rebuild the projections from the log")
    return "\n".join(lines)


def _pinned_key(ctx: CommandContext, store_id: str) -> tuple[str | None, str | None]:
    """(the verifier key to check with, where it came from): ``--key``, else the key the
    local witness pinned (FORMAT.md 20.2 step 6), else none."""
    from archive_provider.storage.witness import Witness, WitnessMismatch

    if ctx.args.key is not None:
        return ctx.args.key, "--key"
    try:
        record = Witness.for_home(ctx.home).read_for(store_id)
    except WitnessMismatch:
        return None, None  # the open-time proof reports an unreadable witness
    if record is None or record.log_vkey is None:
        return None, None
    return record.log_vkey, "the local witness"


def run(ctx: CommandContext) -> int:
    from archive_provider.format.verifier import usable_cores, verify_database

    jobs = usable_cores() if ctx.args.jobs is None else ctx.args.jobs
    with ctx.store() as store:
        total = store.head().seq
        vkey, pinned_by = _pinned_key(ctx, store.store_id)
        with ctx.progress("verify", total) as progress:
            report: Report = verify_database(
                store.conn, store.key, progress=progress, vkey=vkey, jobs=jobs
            )
    data: dict[str, Any] = {"ok": report.ok, "log": report.as_dict(), "pinned_key": pinned_by}
    if ctx.args.lineage and report.ok:
        data["lineage"] = _lineage(ctx, Path(ctx.args.lineage))
        data["ok"] = data["lineage"]["ok"]
    if ctx.args.witnesses:
        from archive_provider.commands.status import witness_lines, witness_status

        with ctx.store() as store:
            found = witness_status(ctx, store, timeout=10.0)
        data["witnesses"] = found
        data["witness_lines"] = witness_lines(found)
        refused = not found.get("local_witness", {"ok": True})["ok"] or any(
            row.get("consistent") is False for row in found.get("remote_witnesses", ())
        )
        data["ok"] = data["ok"] and not refused
    if ctx.args.projections and report.ok:
        data["projections"] = _projections(ctx, total)
        data["ok"] = data["projections"]["ok"]
    ctx.emit(data, _human)
    return 0 if data["ok"] else 1
