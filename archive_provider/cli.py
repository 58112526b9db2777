"""The command line, with two doors: ``hermes-archive <command>`` and ``hermes archive <command>``.

Both doors build the same parser from :mod:`archive_provider.commands` and print the same
output. Human text by default, ``--json`` for machines; exit codes follow the one rule of
docs/AUDIT.md section 2 (0 done and found, 1 the data says no, 2 the command line is wrong,
130 interrupted).

This file is also what Hermes imports *by path* to wire ``hermes archive`` (only for the
active memory provider), so it uses absolute imports only.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from archive_provider.commands import COMMANDS, CommandContext, UsageError

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a Ctrl-C


def _add_version(parser: argparse.ArgumentParser) -> None:
    from archive_provider import __version__

    parser.add_argument("--version", action="version", version=f"hermes-archive {__version__}")


def _add_common(parser: argparse.ArgumentParser, *, nested: bool = False) -> None:
    """--home and --json, accepted before or after the command (nested ones never reset them)."""
    default: dict[str, Any] = {"default": argparse.SUPPRESS} if nested else {}
    parser.add_argument(
        "--home", help="profile folder (default: $HERMES_HOME, else ~/.hermes)", **default
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output", **default)
    parser.add_argument(
        "--db",
        metavar="URL",
        help="read a central PostgreSQL store instead (libpq URL, key=value or service name; "
        "status, verify, log, show, search, history, as-of, export, prove, report)",
        **default,
    )
    parser.add_argument(
        "--store", metavar="ID", help="with --db: only this archive (store id or prefix)", **default
    )


def _add_commands(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="archive_command", metavar="COMMAND")
    for command in COMMANDS:
        child = sub.add_parser(command.NAME, help=command.HELP, description=command.HELP)
        _add_common(child, nested=True)
        command.configure(child)
        child.set_defaults(archive_run=command.run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hermes-archive",
        description="Audit, verify and manage a hermes-archive event log (no command: status).",
    )
    _add_version(parser)
    _add_common(parser)
    _add_commands(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run a parsed command; the one dispatcher both doors share (no command: ``status``).

    ``hermes <plugin>`` with no subcommand shows the plugin's status in Hermes' own plugin
    CLIs; both doors do the same.
    """
    runner = getattr(args, "archive_run", None) or next(
        command.run for command in COMMANDS if command.NAME == "status"
    )
    try:
        return int(runner(CommandContext.from_args(args)))
    except UsageError as exc:
        if getattr(args, "json", False):  # machines read stdout, as for every other error
            print(json.dumps({"ok": False, "error": str(exc), "usage": True}))
        else:
            print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # Ctrl-C: one word, the shell's code for SIGINT
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    return run(args)


# -- the hermes door (plugins.memory.discover_plugin_cli_commands) -----------------------


def register_cli(subparser: argparse.ArgumentParser) -> None:
    """Called by hermes with the parser of ``hermes archive``."""
    _add_version(subparser)
    _add_common(subparser)
    _add_commands(subparser)
    subparser.set_defaults(func=archive_command)


def archive_command(args: Any) -> int:
    code = run(args)
    if code:
        raise SystemExit(code)
    return code


# hermes looks for ``<provider>_command``; the hivemind provider shares these commands.
hivemind_command = archive_command


if __name__ == "__main__":
    sys.exit(main())
