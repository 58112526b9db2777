"""key: the verifier key of the archive, for witnesses and auditors to pin.

Prints ``<name>+<key ID>+<base64>`` (signed-note verifier key form, docs/FORMAT.md 15.2),
read from the signing key; never the private key.
"""

from __future__ import annotations

import argparse

from archive_provider.commands import CommandContext, CommandError

NAME = "key"
HELP = "print the archive's verifier key for witnesses and auditors to pin"


def configure(parser: argparse.ArgumentParser) -> None:
    """No options."""


def run(ctx: CommandContext) -> int:
    if not ctx.exists():
        raise CommandError(f"no archive at {ctx.archive}")
    with ctx.store() as store:
        vkey = store.vkey
    ctx.emit({"ok": True, "vkey": vkey, "origin": vkey.split("+")[0]}, vkey)
    return 0
