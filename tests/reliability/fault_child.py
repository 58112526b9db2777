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
``witness``  ``hooks`` with no fault, a real ``witness serve`` on 127.0.0.1 added with
             ``witness add``, then ``hooks`` again with the faults while the writer submits
             its checkpoints to that witness
``export``, ``readable-copy``, ``forget``, ``migrate``, ``retention``, ``ship``  ``hooks``
             with no fault (for ``migrate`` on a format-1 archive; for ``retention`` first
             12 turns dated 30 days back, then a 7-day policy; for ``ship`` the store
             registered at the central PostgreSQL named by ``FAULT_CENTRAL_ADMIN``), then the
             command with the faults (``retention apply``; ``ship --to $FAULT_SHIP_TO``; its
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
COMMANDS = ("export", "readable-copy", "forget", "migrate", "retention", "ship")
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


def run(home: str, scenario: str, injectors: list[Injector], tag: str = "") -> dict[str, Any]:
    """The provider's hooks; ``tag`` tells apart the turns of a second run on one profile."""
    required = scenario == "required"
    accepted: list[str] = []
    returned: list[str] = []
    raised: list[str] = []
    provider = ArchiveProvider()
    provider.initialize("f1", hermes_home=home, platform="cli", agent_context="primary")
    messages: list[dict[str, Any]] = [{"role": "system", "content": "sys"}]
    for turn in range(1, TURNS + 1):
        user = f"fault user {tag}{turn}"
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
        if name == "retention":
            from datetime import datetime, timedelta

            from freezegun import freeze_time

            with freeze_time(datetime.now() - timedelta(days=30), tick=True):
                run(home, "hooks", [], tag="expired ")  # erased by the policy: not counted
            policy = ["set", "--days", "7", "--reason", "fault campaign", "--yes"]
            if archive_cli(["--home", home, "retention", *policy]) != 0:
                raise RuntimeError("the retention policy could not be set")
        result = run(home, "hooks", [])
    result["migrated"] = name == "migrate"
    if name == "ship":
        result["store_id"] = register(home)
    args = {
        "forget": ["--memory", "fault fact 3", "--reason", "fault campaign", "--yes"],
        "migrate": [],
        "retention": ["apply", "--yes"],
        "ship": ["--to", os.environ.get("FAULT_SHIP_TO", "")],
    }.get(name, [home + ".out"])
    start(injectors, "start")
    try:
        result["status"] = archive_cli(["--home", home, name, *args])
    except BaseException as exc:  # noqa: BLE001 - the judge says whether this was clear
        result["status"] = f"{type(exc).__name__}: {exc}"
    return result


def register(home: str) -> str:
    """The administrator's step before a store may ship: register it to the shipper."""
    from archive_provider.fleet import central
    from archive_provider.fleet.ship import registration
    from archive_provider.storage.store import EventStore, archive_dir

    store = EventStore.open(archive_dir(home), create=False, readonly=True)
    try:
        found = registration(store)
    finally:
        store.close()
    central.register(os.environ["FAULT_CENTRAL_ADMIN"], found, "ship_login", "fault campaign")
    return found.store_id


def witnessed(home: str, injectors: list[Injector]) -> dict[str, Any]:
    """``hooks`` on an archive with a remote witness added, the faults on while it runs."""
    from archive_provider.cli import main as archive_cli
    from archive_provider.storage.store import EventStore, archive_dir
    from tests.test_witness_remote import WitnessProcess, keygen

    run(home, "hooks", [])
    store = EventStore.open(archive_dir(home), create=False, readonly=True)
    try:
        log_key = store.vkey
    finally:
        store.close()
    state = Path(home + ".witness")
    keygen(state, "fault.example/witness")
    server = WitnessProcess(state, [log_key])
    try:
        added = ["witness", "add", server.url, server.vkey, "--reason", "fault campaign"]
        if archive_cli(["--home", home, *added]) != 0:
            raise RuntimeError("the remote witness could not be added")
        start(injectors, "start")
        return run(home, "hooks", injectors, tag="witnessed ")
    finally:
        for injector in injectors:
            injector.stop()
        server.stop()


def main() -> None:
    home, scenario, report = sys.argv[1:4]
    injectors = [Injector(spec) for spec in sys.argv[4:]]
    try:
        if scenario in COMMANDS:
            result = command(home, scenario, injectors)
        elif scenario == "witness":
            result = witnessed(home, injectors)
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
