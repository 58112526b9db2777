"""migrate: make a format-v2 archive from a v1 one; the v1 file is kept (docs/FORMAT.md 19).

Run it with Hermes stopped. The v1 archive is verified first (one that does not verify is
not migrated), renamed ``events.v1.db`` / ``payload.v1.key``, and a new v2 archive with a
new store id and signing key records the v1 head it came from in its first event. A pending
spill is then taken into the new archive (nothing writes a v1 log any more).
"""

from __future__ import annotations

import argparse

from archive_provider.commands import CommandContext, CommandError

NAME = "migrate"
HELP = "make a format-v2 archive (Merkle tree, signed checkpoints) from a v1 one; keeps the v1 file"


def configure(parser: argparse.ArgumentParser) -> None:
    """No options."""


def run(ctx: CommandContext) -> int:
    from archive_provider.host.spill_kinds import take_in_spill
    from archive_provider.projections.registry import default_projections
    from archive_provider.storage.migrate import migrate
    from archive_provider.storage.witness import Witness

    if not ctx.exists():
        raise CommandError(f"no archive at {ctx.archive}")
    with ctx.progress("migrate", 0) as progress:
        done = migrate(
            ctx.archive,
            projections=default_projections,
            progress=progress,
            witness=Witness.for_home(ctx.home),
        )
    take_in_spill(ctx.home)
    data = {
        "ok": True,
        "v1_store_id": done.v1_store_id,
        "v1_head": {"seq": done.v1_head_seq, "chain": done.v1_head_chain},
        "v1_file": "events.v1.db",
        "store_id": done.store_id,
        "events": done.events,
        "vkey": done.vkey,
    }
    ctx.emit(
        data,
        f"migrated: v1 store {done.v1_store_id} (head seq {done.v1_head_seq}) is now v2 store "
        f"{done.store_id} with {done.events} events; the v1 file is kept as events.v1.db.\n"
        f"verifier key (pin it outside the archive): {done.vkey}",
    )
    return 0
