"""Subcommands shared by both CLI doors. Each module has NAME, HELP, configure() and run().

``run(ctx)`` writes through ``ctx.emit`` (human text or JSON) and returns the exit code, by
the one rule of docs/AUDIT.md section 2: 0 done and found, 1 the data says no (a check
failed, no archive, nothing matched, not in the log), 2 the command line is wrong. Every command is wrapped so that any failure becomes a one-line message
(``{"ok": false, "error": ...}`` under ``--json``) and exit code 1, never a traceback; set
``HERMES_ARCHIVE_DEBUG=1`` to see the traceback instead.

This package is imported by hermes while it builds its own argument parser, and every
``hermes-archive`` call builds the whole parser, so modules here import only what the parser
needs: the store, the verifier and anything heavier are imported inside ``run`` (and
``tests/test_cli_startup.py`` checks that ``--help`` loads none of them).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sqlite3
import sys
from argparse import Namespace
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TextIO

from archive_provider.domain.clock import format_time, parse_time
from archive_provider.errors import ArchiveError, UsageError
from archive_provider.format.canonical import INT_MAX

if TYPE_CHECKING:  # the store, the verifier and the central store load when a command runs
    from archive_provider.storage.store import EventStore

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2


class CommandError(ArchiveError):
    """The command found a problem or could not do its work (exit code 1)."""


def expanded(path: str | os.PathLike[str]) -> Path:
    """``path`` with ``~`` expanded; an unknown ``~user`` is a usage error, not a traceback."""
    try:
        return Path(path).expanduser()
    except RuntimeError as exc:
        raise UsageError(f"cannot expand {os.fspath(path)!r}: {exc}") from None


def default_home() -> Path:
    return expanded(os.environ.get("HERMES_HOME") or "~/.hermes")


def time_arg(text: str) -> str:
    """argparse type for --since/--until: any ISO 8601 time (naive is UTC) as envelope time text."""
    try:
        return format_time(parse_time(text))
    except (ValueError, OverflowError):  # OverflowError: an offset past year 1 or 9999
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO 8601 time (e.g. 2026-11-30 or 2026-11-30T12:00:00Z)"
        ) from None


def time_range(args: Namespace) -> tuple[str | None, str | None]:
    """``--since`` and ``--until``; a range that ends before it starts is a usage error."""
    since, until = getattr(args, "since", None), getattr(args, "until", None)
    if since and until and since > until:  # envelope time text sorts as time
        raise UsageError(f"--since {since} is after --until {until}")
    return since, until


def _whole_number(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if not least <= value <= INT_MAX:  # SQLite's largest integer, as the log's encoding
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number from {least} to {INT_MAX}"
        )
    return value


def positive_int(text: str) -> int:
    """argparse type for counts that must be 1 or more, as large as SQLite takes."""
    return _whole_number(text, 1)


def count_or_all(text: str) -> int:
    """argparse type for limits where 0 means no limit."""
    return _whole_number(text, 0)


@dataclass
class CommandContext:
    home: Path
    json: bool
    args: Namespace
    #: a central PostgreSQL store to read instead of the local archive (--db), and one store
    db: str | None = None
    central_store: str | None = None
    # looked up when the context is made, so redirected and captured streams are honoured
    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)

    @classmethod
    def from_args(cls, args: Namespace) -> CommandContext:
        given = getattr(args, "home", None)
        if given == "":
            raise UsageError("--home is empty; give the profile folder (HERMES_HOME)")
        home = expanded(given) if given else default_home()
        db, store = getattr(args, "db", None), getattr(args, "store", None)
        if store is not None and db is None:
            raise UsageError("--store picks an archive of a central store: give --db too")
        return cls(
            home=home,
            json=bool(getattr(args, "json", False)),
            args=args,
            db=db,
            central_store=store,
        )

    @property
    def archive(self) -> Path:
        from archive_provider.storage.store import archive_dir

        return archive_dir(self.home)

    def exists(self) -> bool:
        from archive_provider.storage.store import DB_NAME

        return (self.archive / DB_NAME).exists()

    def open_store(self) -> EventStore:
        """Open read-only (the CLI never writes unless the command says it does)."""
        from archive_provider.storage.store import DB_NAME, EventStore

        if not self.exists():
            raise CommandError(
                f"no archive at {self.archive / DB_NAME} (it is created when the provider "
                "first runs; --home picks another profile)"
            )
        return EventStore.open(self.archive, create=False, readonly=True)

    def open_writable(self) -> EventStore:
        """Open to append, after the provider's own open-time proof and witness rule: what
        the provider refuses, every command that writes refuses, in the same words (a
        second signed history of a refused copy is never started here)."""
        from archive_provider.projections.registry import default_projections
        from archive_provider.storage.store import DB_NAME, EventStore
        from archive_provider.storage.witness import Witness, fast_path_ok
        from archive_provider.storage.writer import open_time_proof, refusal

        if not self.exists():
            self.open_store()  # raises the "no archive" message
        witness = Witness.for_home(self.home)
        fast = fast_path_ok(self.archive / DB_NAME, witness)
        store = EventStore.open(self.archive, create=False, projections=default_projections)
        try:
            proof = open_time_proof(store, witness, fast=fast)
        except BaseException:
            store.close()
            raise
        if not proof.ok:
            store.close()
            raise CommandError(refusal(store.path, proof))
        return store

    @contextmanager
    def store(self) -> Iterator[EventStore]:
        """The archive, read-only, closed afterwards."""
        store = self.open_store()
        try:
            yield store
        finally:
            store.close()

    def emit(self, data: Any, human: Callable[[Any], str] | str) -> None:
        from archive_provider.format.verifier import printable

        if self.json:
            # ASCII: text from argv or the log may hold lone surrogates, which are not UTF-8
            self.out.write(json.dumps(data, indent=2, default=str) + "\n")
        else:
            text = human(data) if callable(human) else human
            # text from the log or a bundle may hold ESC sequences: escape every control
            # character (the line breaks the view itself makes are kept)
            safe = "\n".join(printable(line) for line in text.rstrip("\n").split("\n"))
            self.out.write(safe + "\n")

    def fail(self, message: str) -> int:
        """Report a problem cleanly (JSON on stdout under --json, else stderr); exit code 1."""
        from archive_provider.format.verifier import printable

        if self.json:
            self.emit({"ok": False, "error": message}, "")
        else:
            self.err.write(f"error: {printable(message)}\n")
        return EXIT_PROBLEM

    @contextmanager
    def progress(self, label: str, total: int) -> Iterator[Callable[[int], None]]:
        """A progress callback that draws a bar on a terminal and does nothing otherwise."""
        stream = self.err
        if not stream.isatty() or total <= 0:
            yield lambda done: None
            return

        def update(done: int) -> None:
            width = 30
            filled = int(width * min(done, total) / total)
            stream.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
            stream.flush()

        try:
            yield update
        finally:
            stream.write("\r" + " " * 70 + "\r")
            stream.flush()


def _message(exc: Exception) -> str:
    if isinstance(exc, ArchiveError):  # the archive's own errors say what, and what to do
        return str(exc)
    if type(exc).__module__.startswith("psycopg"):
        return f"the central store refused ({type(exc).__name__}: {str(exc).strip()})"
    if isinstance(exc, sqlite3.Error):
        return f"the archive database refused the query ({type(exc).__name__}: {exc})"
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc)
    return f"unexpected {type(exc).__name__}: {exc} (HERMES_ARCHIVE_DEBUG=1 shows the traceback)"


@dataclass(frozen=True)
class Command:
    """One subcommand as both doors see it (the attribute names are what cli.py reads)."""

    NAME: str
    HELP: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[CommandContext], int]

    @classmethod
    def of(cls, module: ModuleType) -> Command:
        command_run: Callable[[CommandContext], int] = module.run

        @functools.wraps(command_run)
        def guarded(ctx: CommandContext) -> int:
            runner = command_run
            if ctx.db is not None and not getattr(module, "USES_DB", False):
                from archive_provider.commands.central_read import runner_for

                runner = runner_for(module.NAME)
            try:
                return int(runner(ctx))
            except UsageError:
                raise
            except Exception as exc:
                if os.environ.get("HERMES_ARCHIVE_DEBUG"):
                    raise
                from archive_provider.fleet.central import scrub

                secrets = (ctx.db or "", str(getattr(ctx.args, "to", "") or ""))
                return ctx.fail(scrub(_message(exc), *secrets))

        return cls(module.NAME, module.HELP, module.configure, guarded)


from archive_provider.commands import (  # noqa: E402  (the modules import the context above)
    as_of,
    central,
    checkpoint,
    demo,
    erasures,
    export,
    forget,
    history,
    hold,
    install,
    key,
    log,
    migrate,
    prove,
    readable_copy,
    replay,
    report,
    retention,
    search,
    ship,
    show,
    spill,
    status,
    verify,
    verify_bundle,
    verify_proof,
    witness,
)

COMMANDS = [
    Command.of(module)
    for module in (
        status,
        log,
        show,
        verify,
        replay,
        search,
        as_of,
        history,
        export,
        verify_bundle,
        readable_copy,
        prove,
        verify_proof,
        witness,
        spill,
        key,
        checkpoint,
        migrate,
        forget,
        erasures,
        hold,
        report,
        retention,
        ship,
        central,
        install,
        demo,
    )
]
