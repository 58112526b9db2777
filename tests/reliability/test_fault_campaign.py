"""Faults injected with libfiu (``fiu-run``) into a real provider process, one failed system
call at a time; the profile is judged with faults off (``fault_campaign.judge``).

The bounded sweep here runs in CI (a few evenly spaced calls per failure point); the full
sweep over every call is ``bench/faults.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .fault_campaign import POINTS, fault_run, sweep

#: the calls an archive's making makes first (keys, folder, schema, first event)
MAKING = {
    "posix/io/sync/fsync": range(1, 7),
    "posix/io/oc/open": range(1, 13, 4),
    "posix/io/rw/pwrite": range(1, 13, 5),
}


@pytest.mark.timeout(900)
def test_a_fault_while_the_archive_is_made_never_bricks_it(tmp_path: Path) -> None:
    """Issue 35 point 1: a fault between the signing key and a whole database left a profile
    no open could use ("the signing key ... already exists and belongs to another archive")."""
    outcomes = [
        fault_run(tmp_path, "hooks", [f"{point}@{nth}"])
        for point, calls in MAKING.items()
        for nth in calls
    ]
    bad = [o for o in outcomes if o.verdict not in ("survived", "refused")]
    assert not bad, bad
    assert not [o for o in outcomes if o.verdict == "refused"], outcomes


def test_turns_accepted_while_the_archive_cannot_be_made_are_spilled_before_a_kill(
    tmp_path: Path,
) -> None:
    """Issue 35 point 2: every write of the database fails, so no archive can be made; the
    turns accepted meanwhile go to the spill (on disk within its fsync interval), not only to
    memory, so a process killed without shutdown loses none, and the next open takes them in."""
    outcome = fault_run(tmp_path, "killed", ["posix/io/rw/pwrite@1+"])
    assert outcome.verdict == "survived", outcome


@pytest.mark.parametrize("call", ["posix/io/sync/fsync", "posix/io/rw/write"])
def test_a_spill_fault_at_shutdown_is_tried_again(tmp_path: Path, call: str) -> None:
    """Issue 35 points 2 and 3: the archive cannot be written, and one spill write or fsync
    fails at shutdown (libfiu's EBADFD, "File descriptor in bad state", among them): the
    queued turns and the drain record were dropped; now a failed try leaves nothing behind
    and is made again."""
    outcome = fault_run(tmp_path, "hooks", ["posix/io/rw/pwrite@1+", f"{call}@1:shutdown"])
    assert outcome.verdict == "survived", outcome


def test_when_neither_archive_nor_spill_can_be_written_the_loss_is_said_once(
    tmp_path: Path,
) -> None:
    """No write of the database and no fsync succeeds, and at shutdown no file opens: the
    spill cannot take what was accepted either; shutdown says so in one loud line with the
    count."""
    outcome = fault_run(
        tmp_path,
        "hooks",
        ["posix/io/rw/pwrite@1+", "posix/io/sync/fsync@1+", "posix/io/oc/open@1+:shutdown"],
    )
    assert outcome.loud == 1 and outcome.verdict == "lost-said", outcome


def test_a_spill_the_disk_will_not_fsync_is_still_written_and_said_once(
    tmp_path: Path,
) -> None:
    """No fsync succeeds: shutdown's last try writes the spill without it (a process exit
    keeps it; a power loss might not), says so once, and the next open takes it in."""
    outcome = fault_run(
        tmp_path,
        "hooks",
        ["posix/io/rw/pwrite@1+", "posix/io/sync/fdatasync@1+", "posix/io/sync/fsync@1+"],
    )
    assert outcome.loud == 1 and outcome.verdict == "survived", outcome


@pytest.mark.timeout(1200)
@pytest.mark.parametrize(
    "scenario", ["hooks", "required", "export", "readable-copy", "witness", "retention", "ship"]
)
def test_bounded_fault_sweep(tmp_path: Path, scenario: str) -> None:
    """Two evenly spaced calls of each failure point, each failed once: nothing accepted
    is lost, every returned checkpoint is there, the archive opens and verifies; a command
    that met the fault leaves its output whole or absent."""
    points = POINTS if scenario in ("hooks", "required") else POINTS[:3]
    table = sweep(tmp_path, scenario, points, 2, every=False)
    print("\n" + table.markdown())
    bad = [o for o in table.outcomes if o.verdict not in ("survived", "refused")]
    assert not bad, bad
