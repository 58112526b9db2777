"""Subcommands shared by both CLI doors. Each module has NAME, HELP, configure() and run().

``run(ctx)`` writes through ``ctx.emit`` (human text or JSON) and returns the exit code.
"""

from __future__ import annotations

import json
import os
import sys
from argparse import Namespace
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from archive_provider.store import DB_NAME, EventStore, StoreError, archive_dir


class UsageError(Exception):
    """The command was called wrongly (exit code 2)."""


def default_home() -> Path:
    return Path(os.environ.get("HERMES_HOME") or Path.home() / ".hermes").expanduser()


@dataclass
class CommandContext:
    home: Path
    json: bool
    args: Namespace
    out: TextIO = sys.stdout

    @classmethod
    def from_args(cls, args: Namespace) -> CommandContext:
        home = Path(args.home).expanduser() if getattr(args, "home", None) else default_home()
        return cls(home=home, json=bool(getattr(args, "json", False)), args=args)

    @property
    def archive(self) -> Path:
        return archive_dir(self.home)

    def exists(self) -> bool:
        return (self.archive / DB_NAME).exists()

    def open_store(self) -> EventStore:
        """Open read-only (the CLI never writes unless the command says it does)."""
        if not self.exists():
            raise StoreError(f"no archive at {self.archive / DB_NAME}")
        return EventStore.open(self.archive, create=False, readonly=True)

    def emit(self, data: Any, human: Callable[[Any], str] | str) -> None:
        if self.json:
            self.out.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")
        else:
            text = human(data) if callable(human) else human
            self.out.write(text.rstrip("\n") + "\n")

    @contextmanager
    def progress(self, label: str, total: int) -> Iterator[Callable[[int], None]]:
        """A progress callback that draws a bar on a terminal and does nothing otherwise."""
        stream = sys.stderr
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


from archive_provider.commands import demo, install, status, verify  # noqa: E402  (modules register below)

COMMANDS = [status, verify, install, demo]
