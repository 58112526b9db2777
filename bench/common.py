"""Shared pieces of the benchmark: result rows, timing, percentiles, machine facts.

Every row pairs the project's figure with a baseline measured in the same run (the
machine is shared and noisy: absolute times drift, ratios hold). ``ratio`` is always
``figure / baseline`` in the row's unit, so whether higher is better depends on the unit
(events/s: higher; µs, ms, bytes: lower); each row's target says which way it must go.
"""

from __future__ import annotations

import os
import platform
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


@dataclass
class Row:
    """One line of the results table."""

    section: str
    name: str
    figure: float
    unit: str
    baseline: float | None = None
    baseline_name: str = ""
    #: "min" (ratio must be >= value) or "max" (ratio must be <= value), or None
    target_kind: str | None = None
    target_value: float | None = None
    target_text: str = ""
    #: an absolute bound on the figure itself (e.g. 300k events/s, p99 <= 50 µs)
    absolute_kind: str | None = None
    absolute_value: float | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        if self.baseline in (None, 0) or self.figure is None:
            return None
        return self.figure / self.baseline  # type: ignore[operator]

    @property
    def met(self) -> bool | None:
        """True/False when the row has a target, None when it only records a figure."""
        checks: list[bool] = []
        ratio = self.ratio
        if self.target_kind and self.target_value is not None and ratio is not None:
            checks.append(_holds(self.target_kind, ratio, self.target_value))
        if self.absolute_kind and self.absolute_value is not None:
            checks.append(_holds(self.absolute_kind, self.figure, self.absolute_value))
        return all(checks) if checks else None

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ratio"] = self.ratio
        data["met"] = self.met
        return data


def _holds(kind: str, value: float, bound: float) -> bool:
    return value >= bound if kind == "min" else value <= bound


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of ``values``."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, int(round(q / 100 * len(ordered) + 0.5)) - 1))
    return ordered[index]


def timed(action: Callable[[], object]) -> float:
    """Seconds one call of ``action`` takes."""
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def interleaved(
    project: Callable[[], float], baseline: Callable[[], float], repeats: int
) -> tuple[float, float, list[float], list[float]]:
    """Run project and baseline alternately ``repeats`` times; medians and all samples.

    Each callable returns the seconds its measured part took (setup excluded). Alternating
    (and swapping who goes first) spreads the machine's drift over both sides evenly.
    """
    ours: list[float] = []
    theirs: list[float] = []
    for index in range(repeats):
        if index % 2 == 0:
            ours.append(project())
            theirs.append(baseline())
        else:
            theirs.append(baseline())
            ours.append(project())
    return median(ours), median(theirs), ours, theirs


class Workdir:
    """A scratch folder for one run; every database lives under it."""

    def __init__(self, root: Path | None) -> None:
        if root is not None:  # ``--workdir`` names a folder that need not exist yet
            root.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix="hermes-archive-bench-", dir=root))
        self._count = 0

    def fresh(self, name: str) -> Path:
        self._count += 1
        path = self.root / f"{self._count:03d}-{name}"
        path.mkdir(parents=True)
        return path

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


@contextmanager
def quiet_logging() -> Iterator[None]:
    """The provider logs loudly on purpose; a benchmark run should not print it."""
    import logging

    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(previous)


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB.

    ``VmHWM``, not ``ru_maxrss``: Linux carries a parent's high-water mark into a child
    across fork+exec, so a child started by a big process reports the parent's peak.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


#: a child that runs one ``hermes-archive`` command in-process, then reports its own peak RSS
_CLI_CHILD = """
import os, resource, sys
cap = int(sys.argv[1])
if cap:
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
from archive_provider.cli import main
try:
    code = main(sys.argv[2:])
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else 1
except MemoryError:
    code = 99
sys.stdout.flush()
with open("/proc/self/status") as status:
    peak = [line.split()[1] for line in status if line.startswith("VmHWM:")]
sys.stderr.write(f"\\nbench-peak-kib {peak[0]} {os.getpid()}\\n")
sys.exit(code or 0)
"""


@dataclass
class ChildRun:
    """One command run in a child: exit code, peak RSS (MiB, its processes' peaks summed),
    wall seconds, output, and how many processes it ran (``verify --jobs`` starts helpers)."""

    returncode: int
    peak_mib: float
    seconds: float
    stdout: str
    stderr: str
    processes: int = 1


def cli_child(home: Path, *args: str, address_cap_mib: int = 0) -> ChildRun:
    """Run ``hermes-archive --home HOME ARGS`` in a fresh interpreter and read its peak RSS.

    The child reports ``VmHWM`` of its own image (a fork's ``ru_maxrss`` starts at the
    parent's peak on Linux, so the parent's size would leak into it), and every Python
    process it starts writes its own at exit (``bench/peak/sitecustomize.py``): the peak is
    their sum, as if all peaked at once. ``address_cap_mib``
    caps the child's address space (``RLIMIT_AS``), so a path that grows with the archive
    fails with MemoryError (exit 99) instead of pressing a shared machine into swap.
    """
    with tempfile.TemporaryDirectory(prefix="bench-peaks-") as peaks:
        path = os.pathsep.join(
            [str(Path(__file__).parent / "peak"), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", _CLI_CHILD, str(address_cap_mib << 20), "--home", str(home)]
            + list(args),
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "PYTHONPATH": path, "BENCH_PEAK_DIR": peaks},
        )
        seconds = time.perf_counter() - started
        marks = [line for line in done.stderr.splitlines() if line.startswith("bench-peak-kib ")]
        main_kib, main_pid = marks[-1].split()[1:3] if marks else ("nan", "")
        helpers = [int(f.read_text()) for f in Path(peaks).iterdir() if f.name != main_pid]
    peak = (float(main_kib) + sum(helpers)) / 1024
    return ChildRun(done.returncode, peak, seconds, done.stdout, done.stderr, 1 + len(helpers))


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                memory = int(line.split()[1]) // 1024
    except OSError:
        pass
    try:
        from importlib.metadata import version

        versions = {name: version(name) for name in ("blake3", "eventsourcing", "hermes-agent")}
    except Exception:
        versions = {}
    try:
        load = os.getloadavg()
    except OSError:
        load = (0.0, 0.0, 0.0)
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_mib": memory,
        "os": platform.platform(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "packages": versions,
        "load_average_at_start": [round(x, 2) for x in load],
    }


def fmt_number(value: float | None, unit: str = "") -> str:
    """Compact human form: 12 345/s, 3.2 µs, 1.5 ms, 12.3 MB."""
    if value is None:
        return "-"
    if unit in ("µs", "ms", "s", "x"):
        if value >= 100:
            return f"{value:,.0f}"
        if value >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def table(rows: Sequence[Row]) -> str:
    """A fixed-width text table (also valid Markdown)."""
    header = ("#", "measurement", "project", "baseline", "ratio", "target", "met")
    lines = [header]
    for row in rows:
        ratio = row.ratio
        met = row.met
        lines.append(
            (
                row.section,
                row.name,
                f"{fmt_number(row.figure, row.unit)} {row.unit}",
                f"{fmt_number(row.baseline, row.unit)} {row.unit} {row.baseline_name}".strip()
                if row.baseline is not None
                else "-",
                f"{ratio:.2f}x" if ratio is not None else "-",
                row.target_text or "-",
                {True: "yes", False: "MISSED", None: "-"}[met],
            )
        )
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    out = []
    for index, line in enumerate(lines):
        out.append(
            "| " + " | ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)) + " |"
        )
        if index == 0:
            out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)
