"""demo: the main job: a real Hermes agent archiving into a local profile, then verify."""

from __future__ import annotations

import argparse
import contextlib
import io
import shlex
import sys
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from archive_provider.commands import CommandContext, UsageError, expanded

DEFAULT_HOME = Path("demo-home")  # in the working folder

DEMOS = "hermes_archive.demos"
NAME = "demo"
HELP = (
    "run a real Hermes agent (scripted stand-in LLM on 127.0.0.1) with the archive, compress, "
    "recall, verify; in ./demo-home unless --home is given (never ~/.hermes or $HERMES_HOME)"
)


def configure(parser: argparse.ArgumentParser) -> None:
    """--home picks the (demo-only) folder; --peers runs the hivemind demo instead."""
    parser.add_argument(
        "--peers",
        action="store_true",
        help="hivemind: three agents on a local Synapse; two meet through a third",
    )


def _registered_demo(name: str) -> Callable[[CommandContext], int]:
    """A demo another package registers (``hivemind`` registers ``peers``): core never imports it."""
    from importlib.metadata import entry_points  # only this command pays for reading metadata

    found = [point for point in entry_points(group=DEMOS) if point.name == name]
    if not found:
        raise UsageError(f"the {name} demo needs hivemind: pip install 'hermes-archive[hivemind]'")
    runner: Callable[[CommandContext], int] = found[0].load()
    return runner


def next_commands(home: Path, timeline: list[dict[str, Any]]) -> list[str]:
    """Three commands that show what the archive now holds (shell-quoted for ``home``)."""
    where = f"hermes-archive --home {shlex.quote(str(home))}"
    checkpoint = next((t["seq"] for t in timeline if t["type"] == "checkpoint"), 1)
    commands = {
        "log": "every event, one line each",
        "history Dee": "how a memory entry changed, and from what",
        f"show {checkpoint}": "the checkpoint in full, digests and all",
    }
    return [f"{where} {command:<12}# {what}" for command, what in commands.items()]


def run(ctx: CommandContext) -> int:
    given = getattr(ctx.args, "home", None)
    # the demo's own folder: a real profile (~/.hermes, $HERMES_HOME) is never the default
    ctx = replace(ctx, home=(expanded(given) if given else DEFAULT_HOME).absolute())
    if not ctx.json:
        ctx.out.write(
            f"Demo folder: {ctx.home} (the demo's own; ~/.hermes and $HERMES_HOME are not used)\n"
        )
    if getattr(ctx.args, "peers", False):
        return int(_registered_demo("peers")(ctx))
    try:
        from archive_provider.demo.demo import DemoRefused, run_demo
    except ImportError as exc:  # hermes-agent is the `hermes` extra
        raise UsageError(
            f"the demo needs hermes-agent: bash .ci/setup demo, or pip install '.[hermes]' ({exc})"
        ) from None
    narration = io.StringIO()  # under --json the narration stays out of the JSON document
    stream = narration if ctx.json else ctx.out

    def say(line: str) -> None:
        stream.write(line + "\n")

    # under --json whatever the host itself prints goes to stderr: stdout is one JSON document
    quiet = contextlib.redirect_stdout(sys.stderr) if ctx.json else contextlib.nullcontext()
    try:
        with quiet:
            result = run_demo(ctx.home, say=say)
    except DemoRefused as exc:
        raise UsageError(str(exc)) from None
    data = asdict(result) | {"home": str(result.home), "fact_recalled": result.fact_recalled}

    def human(_: object) -> str:
        verified = result.verified
        lines = ["", "Timeline of the archive:"]
        lines += [
            f"  {t['seq']:>3} {t['time'][11:19]} {t['type']:<16} {t['summary']}"
            for t in result.timeline
        ]
        lines.append("")
        lines.append(
            f"verify: ok, {verified['events_checked']} events and {verified['payloads_checked']} payloads"
            if verified.get("ok")
            else f"verify: FAILED at seq {verified.get('first_bad_seq')}: {verified.get('problem')}"
        )
        lines.append(
            "The fact from session 1 reached session 2 through recall: "
            + ("yes" if result.fact_recalled else "NO")
        )
        lines += ["", "Try next:", *(f"  {c}" for c in next_commands(result.home, result.timeline))]
        return "\n".join(lines)

    ctx.emit(data, human)
    return 0 if result.verified.get("ok") and result.fact_recalled else 1
