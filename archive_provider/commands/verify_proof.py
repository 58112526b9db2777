"""verify-proof: check a proof file (`prove`) with the log's verifier key, as the standalone
verifier does, so an auditor with the package installed needs no second tool."""

from __future__ import annotations

import argparse

from archive_provider.commands import CommandContext, CommandError, UsageError, expanded

NAME = "verify-proof"
HELP = "check a proof file written by `prove` (signatures, inclusion, disclosed bodies)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("proof", metavar="FILE", help="the proof file written by `prove`")
    parser.add_argument(
        "--key",
        metavar="VKEY",
        required=True,
        help="the archive's verifier key (or a file holding it), pinned outside the archive",
    )
    parser.add_argument(
        "--witness",
        action="append",
        default=[],
        metavar="WKEY",
        help="a witness's verifier key whose cosignature is checked (repeatable)",
    )


def run(ctx: CommandContext) -> int:
    from archive_provider.format.verifier import describe, verify_proof, vkey_argument

    path = expanded(ctx.args.proof)
    if not path.exists():
        raise CommandError(f"no proof file at {path}")
    if not path.is_file():
        raise UsageError(f"{path} is not a file")
    report = verify_proof(path, vkey_argument(ctx.args.key), ctx.args.witness)
    ctx.emit({"ok": report.ok, "proof": report.as_dict()}, lambda _: describe(report, "proof"))
    return 0 if report.ok else 1
