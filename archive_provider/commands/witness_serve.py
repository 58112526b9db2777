"""``witness serve`` and ``witness keygen``: run a C2SP tlog-witness for other machines' logs.

Not a command of its own: ``witness`` dispatches here, so the archive's own witness
commands (show, accept) and the remote witness share one name.
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from typing import Any

from archive_provider.commands import CommandContext, CommandError, UsageError, expanded
from archive_provider.format.signed_note import NoteError


def _state(ctx: CommandContext) -> Path:
    if not ctx.args.state:
        raise UsageError(
            f"witness {ctx.args.action} needs --state DIR (the witness's own folder, outside "
            "any archive)"
        )
    return expanded(ctx.args.state)


def run_remote(ctx: CommandContext) -> int:
    from archive_provider.witnesses.server import (
        WitnessHTTPServer,
        WitnessStateError,
        keygen,
        parse_listen,
        serve,
    )

    state = _state(ctx)
    if ctx.args.action == "keygen":
        name = ctx.args.name or f"{socket.gethostname()}/witness"
        try:
            signer = keygen(state, name)
        except (WitnessStateError, NoteError) as exc:
            raise CommandError(str(exc)) from None
        data = {"ok": True, "vkey": signer.vkey, "key": str(state / "witness.key")}
        ctx.emit(data, lambda d: f"witness key written to {d['key']}\nverifier key: {d['vkey']}")
        return 0
    if not ctx.args.log_key:
        raise UsageError("witness serve needs at least one --log-key VKEY (the log's verifier key)")
    try:
        listen = parse_listen(ctx.args.listen)
    except ValueError as exc:
        raise UsageError(str(exc)) from None

    def ready(server: WitnessHTTPServer) -> None:
        data: dict[str, Any] = {
            "ok": True,
            "url": server.url,
            "vkey": server.witness.vkey,
            "state": str(server.witness.state_dir),
            "logs": sorted(server.witness.keys),
        }
        ctx.emit(
            data,
            lambda d: (
                f"witness {d['vkey']} listening on {d['url']} (state {d['state']}); "
                f"logs: {', '.join(d['logs'])}"
            ),
        )
        ctx.out.flush()

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=ctx.err)
    try:
        serve(state, ctx.args.log_key, listen, ready=ready)
    except (WitnessStateError, NoteError) as exc:
        raise CommandError(str(exc)) from None
    return 0
