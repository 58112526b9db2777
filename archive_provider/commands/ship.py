"""ship: copy this archive to a central PostgreSQL store (once, or --follow until stopped).

Only what the local archive verifies is sent, in order, from where the central store stands;
re-running adds nothing. The target is a libpq URL (``sslmode`` and all), a key=value string
or a service name; its password is never printed.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading
from typing import Any

from archive_provider.commands import CommandContext, CommandError, positive_int

NAME = "ship"
HELP = "ship this archive to a central PostgreSQL store (--follow keeps shipping)"
USES_DB = True


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--to",
        required=True,
        metavar="URL",
        help="central store: postgresql://user@host/db?sslmode=require, key=value, or a "
        "service name (passwords from PGPASSFILE or the URL; never printed)",
    )
    parser.add_argument(
        "--follow", action="store_true", help="keep shipping new events until interrupted"
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=2.0,
        help="with --follow: seconds between passes when idle (default 2)",
    )
    parser.add_argument(
        "--batch", type=positive_int, default=1000, help="events per transaction (default 1000)"
    )


def _line(data: dict[str, Any]) -> str:
    text = (
        f"shipped {data['shipped']} events to {data['target']}; central head seq "
        f"{data['central_seq']} of {data['local_seq']} (lag {data['lag_events']} events)"
    )
    if data.get("last_error"):
        text += f"\nlast error: {data['last_error']}"
    return text


def _is_the_providers(ctx: CommandContext, target: str) -> bool:
    """Whether ``target`` is where the provider ships (its ``ship_to``), or the provider ships
    nowhere: only then is this run's state the archive's shipping state (``status``)."""
    from archive_provider.fleet.central import redacted
    from archive_provider.host.settings import settings_and_problems

    configured = settings_and_problems(ctx.home)[0].ship_to
    return not configured or redacted(configured) == redacted(target)


def run(ctx: CommandContext) -> int:
    from archive_provider.fleet.central import CentralError
    from archive_provider.fleet.ship import ShipError, Shipper

    if not ctx.exists():
        raise CommandError(f"no archive at {ctx.archive} to ship")
    shipper = Shipper(
        ctx.archive,
        ctx.args.to,
        batch=max(1, ctx.args.batch),
        record_state=_is_the_providers(ctx, ctx.args.to),
    )
    try:
        if not ctx.args.follow:
            try:
                shipped = shipper.ship_once()
            except (ShipError, CentralError) as exc:
                return ctx.fail(str(exc))
            except Exception:
                return ctx.fail(f"shipping failed: {shipper.state.last_error}")
            ctx.emit({"shipped": shipped, **shipper.state.as_dict()}, _line)
            return 0
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())

        def on_pass(added: int, error: BaseException | None) -> None:
            if added or error:
                ctx.emit({"shipped": added, **shipper.state.as_dict()}, _line)
                ctx.out.flush()

        with contextlib.suppress(KeyboardInterrupt):
            shipper.follow(stop, interval=ctx.args.interval, on_pass=on_pass)
        return 0
    finally:
        shipper.close()
