"""prove: disclose archived events to someone else, with the proof that they are in the log.

Writes one C2SP tlog-proof file per event (docs/FORMAT.md 21.1): its envelope, the bodies
with their salts, an inclusion proof and the signed checkpoint with its cosignatures; one
SEQ to the file OUT, several to the new folder OUT as ``<seq>.proof`` (a tlog-proof holds
one proof: stock tools read no concatenation). The recipient checks a file offline with the
archive's verifier key (`hermes-archive key`): `hermes-archive verify-proof FILE --key VKEY`
or `python verifier.py proof FILE --key VKEY`. A format-2 archive only.
"""

from __future__ import annotations

import argparse

from archive_provider.commands import CommandContext, CommandError, UsageError, expanded

NAME = "prove"
HELP = "write a proof file disclosing events that anyone can check with the key"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("seqs", metavar="SEQ", type=int, nargs="+", help="the events to prove")
    parser.add_argument(
        "--out",
        required=True,
        help="the proof file to write (one SEQ), or the folder to make for <seq>.proof files "
        "(several)",
    )
    parser.add_argument(
        "--only",
        metavar="DIGEST",
        nargs="+",
        default=(),
        help="disclose only these bodies (hex digests); the others stay digests",
    )
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")


def run(ctx: CommandContext) -> int:
    from archive_provider.audit.prove import ProveError, prove, uncosigned
    from archive_provider.storage.safe_files import write_private_file

    out = expanded(ctx.args.out)
    seqs = sorted(set(ctx.args.seqs))
    folder = len(seqs) > 1
    if out.is_symlink() or (out.exists() and out.is_dir() != folder):
        raise UsageError(
            f"{out} is not a folder; give a new folder for the {len(seqs)} proof files"
            if folder
            else f"{out} is not a regular file; give a new file name for the proof"
        )
    if out.exists() and not ctx.args.force:
        raise UsageError(f"{out} exists; choose another path or pass --force")
    if not ctx.exists():
        raise CommandError(f"no archive at {ctx.archive}")
    with ctx.store() as store:
        try:
            proofs = prove(store, seqs, ctx.args.only)
        except ProveError as exc:
            raise CommandError(str(exc)) from None
        vkey, why = store.note_vkey(), uncosigned(store, max(seqs))
    if folder:
        out.mkdir(mode=0o700, exist_ok=True)
    paths = [out / f"{seq}.proof" if folder else out for seq in proofs]
    for path, data in zip(paths, proofs.values(), strict=True):
        write_private_file(path, data)
    size = sum(len(data) for data in proofs.values())
    ctx.emit(
        {
            "ok": True,
            "paths": [str(p) for p in paths],
            "bytes": size,
            "seqs": seqs,
            "vkey": vkey,
            "cosigned": why is None,
            "uncosigned_because": why,
        },
        lambda _: (
            f"Wrote {len(paths)} proof file{'s' * folder} ({size:,} bytes) for seq "
            f"{', '.join(map(str, seqs))} with the signed checkpoint: {', '.join(map(str, paths))}. "
            f"Check each with `hermes-archive verify-proof FILE --key {vkey}`."
            + (f"\nnote: {why}" if why else "")
        ),
    )
    return 0
