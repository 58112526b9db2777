"""prove: disclose archived events to someone else, with the proof that they are in the log.

Writes a C2SP tlog-proof file (docs/FORMAT.md 21.1): per event its envelope, the bodies
with their salts, an inclusion proof and the signed checkpoint with its cosignatures. The
recipient checks it offline with the archive's verifier key (`hermes-archive key`):
`python verifier.py proof FILE --key VKEY`. A format-2 archive only.
"""

from __future__ import annotations

import argparse
import os

from archive_provider.commands import CommandContext, CommandError, UsageError, expanded

NAME = "prove"
HELP = "write a proof file disclosing events (format v2) that anyone can check with the key"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("seqs", metavar="SEQ", type=int, nargs="+", help="the events to prove")
    parser.add_argument("--out", required=True, help="the proof file to write")
    parser.add_argument(
        "--only",
        metavar="DIGEST",
        nargs="+",
        default=(),
        help="disclose only these bodies (hex digests); the others stay digests",
    )
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")


def run(ctx: CommandContext) -> int:
    from archive_provider.audit.prove import ProveError, prove

    out = expanded(ctx.args.out)
    if out.is_symlink() or (out.exists() and not out.is_file()):
        raise UsageError(f"{out} is not a regular file; give a new file name for the proof")
    if out.exists() and not ctx.args.force:
        raise UsageError(f"{out} exists; choose another path or pass --force")
    if not ctx.exists():
        raise CommandError(f"no archive at {ctx.archive}")
    with ctx.store() as store:
        try:
            data = prove(store, ctx.args.seqs, ctx.args.only)
        except ProveError as exc:
            raise CommandError(str(exc)) from None
        vkey = store.note_vkey()
    tmp = out.with_name(f".{out.name}.{os.getpid()}.partial")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # disclosed text: private
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    seqs = sorted(set(ctx.args.seqs))
    ctx.emit(
        {"ok": True, "path": str(out), "bytes": len(data), "seqs": seqs, "vkey": vkey},
        lambda _: (
            f"Wrote {out} ({len(data):,} bytes): seq {', '.join(map(str, seqs))} with the signed "
            f"checkpoint. Check it with `python verifier.py proof {out} --key {vkey}`."
        ),
    )
    return 0
