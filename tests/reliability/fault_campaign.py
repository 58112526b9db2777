"""The fault campaign: run ``fault_child.py`` under ``fiu-run``, one failed call at a time,
then judge the profile with faults off (used by ``test_fault_campaign.py`` and
``bench/faults.py``).

After each fault a new provider opens the profile and takes a required checkpoint: the
archive must open, prove itself and verify, and hold every turn whose ``sync_turn``
returned and every checkpoint that returned a receipt; or refuse with a line that names
the fault and the way out (``docs/RECOVER.md``). A loss is only ever acceptable when the
faulted run said so loudly ("accepted events are lost"): the disk refused the spill too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from archive_provider import ArchiveProvider
from archive_provider.format.canonical import decode
from archive_provider.storage.store import EventStore, archive_dir
from tests.fleet.conftest import Central, central_rows, local_rows, make_central
from tests.fleet.pgserver import PgServer

from .conftest import verify_home

HERE = Path(__file__).resolve().parent
CHILD = HERE / "fault_child.py"
ROOT = HERE.parent.parent
#: the failure points swept (libfiu's names for the POSIX calls the archive makes)
POINTS = (
    "posix/io/rw/pwrite",
    "posix/io/rw/write",
    "posix/io/sync/fsync",
    "posix/io/sync/fdatasync",
    "posix/io/oc/open",
    "posix/io/dir/rename",
)
RECEIPT = re.compile(r"event seq (\d+)\.")
LOUD = "accepted events are lost"
#: either of shutdown's loud lines: lost, or in the spill without its fsync
LOUD_ANY = "accepted events are "


@dataclass
class Outcome:
    point: str
    faults: str
    scenario: str
    verdict: str  # survived | refused | lost-said | LOST | BROKEN
    detail: str = ""
    loud: int = 0  # how often the run said "accepted events are lost"


@dataclass
class Table:
    outcomes: list[Outcome] = field(default_factory=list)

    def rows(self) -> dict[tuple[str, str], Counter[str]]:
        rows: dict[tuple[str, str], Counter[str]] = {}
        for o in self.outcomes:
            rows.setdefault((o.scenario, o.point.rsplit("/", 1)[1]), Counter())[o.verdict] += 1
        return rows

    def markdown(self) -> str:
        lines = [
            "| scenario | call failed | faults injected | survived | refused clearly | "
            "lost, said loudly | lost silently | other |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for (scenario, call), c in sorted(self.rows().items()):
            other = sum(c.values()) - c["survived"] - c["refused"] - c["lost-said"] - c["LOST"]
            lines.append(
                f"| {scenario} | {call} | {sum(c.values())} | {c['survived']} | "
                f"{c['refused']} | {c['lost-said']} | {c['LOST']} | {other} |"
            )
        return "\n".join(lines)


def fiu_run() -> str:
    path = shutil.which("fiu-run")
    if path is None:
        raise RuntimeError(
            "fiu-run is required for the fault campaign: apt-get install fiu-utils python3-fiu "
            "(in .ci/setup)"
        )
    return path


@contextmanager
def central_for(scenario: str) -> Iterator[Central | None]:
    """A real PostgreSQL with a central database for ``ship`` (none for the others)."""
    if scenario != "ship":
        yield None
        return
    server = PgServer()
    server.start()
    try:
        yield make_central(server)
    finally:
        server.cleanup()


def run_child(
    home: Path, scenario: str, report: Path, faults: list[str], central: Central | None = None
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HERMES_HOME=str(home))
    if central is not None:
        env.update(FAULT_SHIP_TO=central.url(), FAULT_CENTRAL_ADMIN=central.url("admin_login"))
    return subprocess.run(
        [fiu_run(), "-x", "-f", "", sys.executable, str(CHILD), str(home), scenario]
        + [str(report), *faults],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def calls_made(tmp: Path, point: str, scenario: str, central: Central | None = None) -> int:
    """How many calls to ``point`` the scenario makes with no fault (the sweep's range)."""
    home, report = tmp / f"count-{scenario}-{point.replace('/', '_')}", tmp / "count.json"
    done = run_child(home, scenario, report, [f"{point}@0"], central)
    if done.returncode != 0 or not report.exists():
        raise RuntimeError(f"the counting run failed: {done.stderr[-2000:]}")
    result = json.loads(report.read_text())
    if result.get("status", 0) != 0:
        raise RuntimeError(f"the counting run's command failed: {result['status']}")
    return int(result["calls"][0])


def fault_run(
    tmp: Path, scenario: str, faults: list[str], central: Central | None = None
) -> Outcome:
    """One run of the child with ``faults``, judged with faults off."""
    name = "-".join(f.replace("/", "_") for f in faults)
    home = tmp / f"home-{scenario}-{name}"
    report = home.with_suffix(".json")
    done = run_child(home, scenario, report, faults, central)
    point = faults[0].partition("@")[0]
    label = " ".join(f.rpartition("/")[2] for f in faults)
    if not report.exists():
        return Outcome(point, label, scenario, "BROKEN", done.stderr[-500:])
    result = json.loads(report.read_text())
    verdict, detail = judge(home, result, done.stderr)
    if verdict == "survived" and scenario in ("export", "readable-copy"):
        verdict, detail = judge_output(home, scenario, result["status"], done.stderr)
    elif verdict == "survived" and central is not None:
        verdict, detail = judge_central(home, central, str(result["store_id"]), result["status"])
    elif verdict == "survived" and result.get("status", 0) != 0:
        verdict, detail = "refused", f"{scenario} exit {result['status']}"
    shutil.rmtree(home, ignore_errors=True)
    for leftover in [*home.parent.glob(home.name + ".out*"), *home.parent.glob("*.stderr")]:
        leftover.unlink()
    shutil.rmtree(home.with_name(home.name + ".witness"), ignore_errors=True)
    return Outcome(point, label, scenario, verdict, detail, done.stderr.count(LOUD_ANY))


def turn_texts(home: Path) -> tuple[list[str], set[int]]:
    """The user texts of the archived turns and the seqs of its checkpoints."""
    store = EventStore.open(archive_dir(home), create=False, readonly=True)
    try:
        texts, checkpoints = [], set()
        for event in store.events():
            if event.type == "turn":
                for digest in event.messages:  # either format (v2: the parts)
                    value = decode(store.payload(digest) or b"null")
                    if isinstance(value, dict) and value.get("role") == "user":
                        texts.append(str(value.get("content")))
            elif event.type == "checkpoint":
                checkpoints.add(event.seq)
        return texts, checkpoints
    finally:
        store.close()


def judge(home: Path, result: dict[str, object], stderr: str) -> tuple[str, str]:
    """Open the profile with faults off and say what the fault left."""
    provider = ArchiveProvider()
    try:
        provider.initialize("judge", hermes_home=str(home), platform="cli")
        try:
            provider.on_pre_compress(
                [{"role": "user", "content": "after the fault"}], require_checkpoint=True
            )
        except Exception as exc:
            text = str(exc)
            clear = "RECOVER.md" in text or "restore" in text or "hermes-archive" in text
            return ("refused" if clear else "BROKEN"), text[:300]
    finally:
        provider.shutdown()
    report = verify_home(home)
    if not report.ok:
        return "BROKEN", f"verify: {report.problem} at {report.first_bad_seq}"
    texts, checkpoints = turn_texts(home)
    missing = [t for t in result["accepted"] if t not in texts]  # type: ignore[attr-defined]
    receipts = [int(m.group(1)) for r in result["returned"] for m in [RECEIPT.search(r)] if m]  # type: ignore[attr-defined]
    # a migrated archive numbers its events anew: its turns are checked, not those seqs
    gone = [seq for seq in receipts if seq not in checkpoints and not result.get("migrated")]
    if gone:
        return "LOST", f"returned checkpoints missing: {gone}"
    if missing:
        return ("lost-said" if LOUD in stderr else "LOST"), f"{len(missing)} turns: {missing[:3]}"
    return "survived", ""


def judge_output(home: Path, scenario: str, status: object, stderr: str) -> tuple[str, str]:
    """A command's output after a fault: whole (it checks) or absent with a clear error."""

    out = Path(str(home) + ".out")
    if status != 0 and not out.exists():
        clear = "Error" in stderr or "error" in stderr or "cannot" in stderr
        return ("refused" if clear else "BROKEN"), f"{scenario} exit {status}"
    if not out.exists():
        return "BROKEN", f"{scenario} said it succeeded but wrote nothing"
    verdict, detail = _output_whole(home, scenario, out)
    if status != 0 and verdict != "survived":
        return "LOST", f"{scenario} failed ({status}) and left a partial {out.name}: {detail}"
    return verdict, detail or ("" if status == 0 else "whole; only the report failed")


def judge_central(home: Path, central: Central, store_id: str, status: object) -> tuple[str, str]:
    """A ship after a fault: the central copy is the local archive's first events, never
    a different or torn sequence, and shipping again with faults off brings it level."""
    from archive_provider.cli import main as archive_cli

    shipped, local = central_rows(central, store_id), local_rows(home)
    if shipped != local[: len(shipped)]:
        return "BROKEN", f"the central copy differs from the archive ({len(shipped)} events)"
    if archive_cli(["--home", str(home), "ship", "--to", central.url()]) != 0:
        return "BROKEN", "shipping again with faults off failed"
    if central_rows(central, store_id) != local_rows(home):
        return "BROKEN", "shipping again did not bring the central copy level"
    return ("survived", "") if status == 0 else ("refused", f"ship exit {status}")


def _output_whole(home: Path, scenario: str, out: Path) -> tuple[str, str]:
    from archive_provider.cli import main as archive_cli

    if scenario == "export":
        checked = archive_cli(["--home", str(home), "verify-bundle", str(out)])
        return ("survived", "") if checked == 0 else ("BROKEN", "the bundle does not verify")
    try:
        conn = sqlite3.connect(f"{out.absolute().as_uri()}?mode=ro", uri=True)
        try:
            ok = conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return "BROKEN", f"the readable copy does not open: {exc}"
    return ("survived", "") if ok else ("BROKEN", "the readable copy fails integrity_check")


def sweep(
    tmp: Path, scenario: str, points: tuple[str, ...], per_point: int | None, every: bool
) -> Table:
    """Fail each call of each point in turn (``per_point`` evenly spaced ones, or all);
    with ``every``, that call and every one after it."""
    table = Table()
    with central_for(scenario) as central:
        for point in points:
            table.outcomes += _sweep_point(tmp, scenario, point, per_point, every, central)
    return table


def _sweep_point(
    tmp: Path,
    scenario: str,
    point: str,
    per_point: int | None,
    every: bool,
    central: Central | None,
) -> list[Outcome]:
    total = calls_made(tmp, point, scenario, central)
    chosen = list(range(1, total + 1))
    if per_point is not None and total > per_point:
        step = total / per_point
        chosen = sorted({1 + int(i * step) for i in range(per_point)})
    suffix = "+" if every else ""
    return [fault_run(tmp, scenario, [f"{point}@{nth}{suffix}"], central) for nth in chosen]
