"""A provider run under libfiu (``fiu-run -x``), failing one chosen system call (run as a
script by ``tests/reliability/test_fault_campaign.py`` and ``bench/faults.py``).

``fiu-run -x python fault_child.py <home> <scenario> <report> <fault> [<fault> ...]``

A ``fault`` is ``<point>@<nth>[+][:shutdown]``: ``point`` a libfiu POSIX failure point
(``posix/io/rw/pwrite``, ``posix/io/sync/fsync``, ...); the child counts the calls made to
it from the start of the scenario (``:shutdown``: from the start of the shutdown) and
fails the ``nth``, or with ``+`` every call from the ``nth`` on (a disk that stays broken
until the provider has shut down). libfiu picks the errno from those the call may return
(EIO, ENOSPC, EBADFD, ...). ``nth`` 0 fails nothing and reports how many calls the
scenario made (the sweep's range).

Scenarios (each makes a new archive in ``home`` unless it already has one):

``hooks``    initialize, 12 turns, memory writes, a checkpoint that is not required, shutdown
``required`` the same with every checkpoint required (``require_checkpoint=True``)
``killed``   the turns only, then a second's pause and ``os._exit`` (no shutdown)
``export``, ``readable-copy``, ``forget``, ``migrate``  ``hooks`` with no fault (for
             ``migrate`` on a format-1 archive), then the command with the faults (its
             output ``<home>.out``); the report says its exit status

With faults off again, the child writes ``report`` (JSON): the turns whose ``sync_turn``
returned, the checkpoints that returned (receipt) and those that raised, and the calls made.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.append("/usr/lib/python3/dist-packages")  # Debian's python3-fiu (fiu-utils' binding)

import fiu  # noqa: E402

from archive_provider import ArchiveProvider  # noqa: E402

TURNS = 12
COMMANDS = ("export", "readable-copy", "forget", "migrate")
#: a user's text in the format-1 fixture (tests/fixtures/v1_archive), kept by migrate
V1_USER_TEXT = "A blue heron sat by the river"
CHECKPOINT_EVERY = 4


class Injector:
    """Counts calls to one failure point and fails the chosen one(s)."""

    def __init__(self, spec: str) -> None:
        point, _, rest = spec.partition("@")
        rest, _, phase = rest.partition(":")
        self.point, self.phase = point, phase or "start"
        self.every = rest.endswith("+")
        self.nth = int(rest.rstrip("+"))
        self.calls = 0
        self.failed = 0
        self.enabled = False

    def __call__(self, name: str, failnum: int, flags: int) -> int:
        self.calls += 1
        hit = self.nth > 0 and (self.calls == self.nth or (self.every and self.calls > self.nth))
        self.failed += hit
        return 1 if hit else 0

    def start(self, phase: str) -> None:
        if phase == self.phase:
            fiu.enable_external(self.point, self)
            self.enabled = True

    def stop(self) -> None:
        if self.enabled:
            fiu.disable(self.point)
            self.enabled = False


def start(injectors: list[Injector], phase: str) -> None:
    for injector in injectors:
        injector.start(phase)


def run(home: str, scenario: str, injectors: list[Injector]) -> dict[str, Any]:
    required = scenario == "required"
    accepted: list[str] = []
    returned: list[str] = []
    raised: list[str] = []
    provider = ArchiveProvider()
    provider.initialize("f1", hermes_home=home, platform="cli", agent_context="primary")
    messages: list[dict[str, Any]] = [{"role": "system", "content": "sys"}]
    for turn in range(1, TURNS + 1):
        user = f"fault user {turn}"
        messages += [
            {"role": "user", "content": user},
            {"role": "assistant", "content": f"fault answer {turn}"},
        ]
        provider.sync_turn(user, f"fault answer {turn}", session_id="f1", messages=list(messages))
        accepted.append(user)
        provider.on_memory_write("add", "memory", f"fault fact {turn}", {"session_id": "f1"})
        if turn % CHECKPOINT_EVERY == 0 and scenario != "killed":
            try:
                receipt = provider.on_pre_compress(list(messages), require_checkpoint=required)
            except Exception as exc:
                raised.append(f"{type(exc).__name__}: {exc}")
            else:
                (returned if "Archive checkpoint" in receipt else raised).append(receipt)
    if scenario == "killed":
        time.sleep(1.5)  # past the spill's fsync interval: what the spill holds is on disk
        for injector in injectors:
            injector.stop()
        return {"accepted": accepted, "returned": returned, "raised": raised, "killed": True}
    start(injectors, "shutdown")
    provider.shutdown()
    return {"accepted": accepted, "returned": returned, "raised": raised}


def command(home: str, name: str, injectors: list[Injector]) -> dict[str, Any]:
    """An archive made without faults, then ``hermes-archive <name>`` with them."""
    from archive_provider.cli import main as archive_cli

    if name == "migrate":  # an archive of 0.1.0 (format 1), which only migrate reads
        from archive_provider.storage.store import archive_dir

        v1 = Path(__file__).resolve().parents[1] / "fixtures" / "v1_archive"
        shutil.copytree(v1, archive_dir(home))
        os.chmod(archive_dir(home), 0o700)
        result: dict[str, Any] = {"accepted": [V1_USER_TEXT], "returned": [], "raised": []}
    else:
        result = run(home, "hooks", [])
    result["migrated"] = name == "migrate"
    args = {
        "forget": ["--memory", "fault fact 3", "--reason", "fault campaign", "--yes"],
        "migrate": [],
    }.get(name, [home + ".out"])
    start(injectors, "start")
    try:
        result["status"] = archive_cli(["--home", home, name, *args])
    except BaseException as exc:  # noqa: BLE001 - the judge says whether this was clear
        result["status"] = f"{type(exc).__name__}: {exc}"
    return result


def main() -> None:
    home, scenario, report = sys.argv[1:4]
    injectors = [Injector(spec) for spec in sys.argv[4:]]
    try:
        if scenario in COMMANDS:
            result = command(home, scenario, injectors)
        else:
            start(injectors, "start")
            result = run(home, scenario, injectors)
    finally:
        for injector in injectors:
            injector.stop()
    result.update(calls=[i.calls for i in injectors], failed=[i.failed for i in injectors])
    Path(report).write_text(json.dumps(result))
    os._exit(0)  # no interpreter teardown (a killed run leaves its provider running)


if __name__ == "__main__":
    main()
