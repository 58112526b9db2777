"""Row 14: ``hermes-archive report`` on the big logs: build time, peak RSS and page size.

The report streams the log once (after verifying it) into a reducer whose memory is bounded
by its detail limits, not by the archive, so peak RSS should stay flat from 100k to 1M
events while the time grows with the log; the page's size is bounded the same way.
``python -m bench.s14_report --events 100000 1000000 [--workdir DIR]`` measures it alone
(logs built as the modes build them: corpus sessions of 40 turns, setup only).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from archive_provider.storage.store import archive_dir

from .common import Row, Workdir, cli_child, fmt_number, quiet_logging
from .workload import build_log


def _label(events: int) -> str:
    return f"{events / 1e6:.1f}M events" if events >= 1_000_000 else f"{events / 1e3:.0f}k events"


def run(homes: dict[int, Path], say: Callable[[str], None]) -> list[Row]:
    """One ``report`` per log, each in a child process with its own peak RSS."""
    rows: list[Row] = []
    for events, home in sorted(homes.items()):
        out = home.parent / f"report-{events}.html"
        made = cli_child(home, "report", str(out), "--force")
        if made.returncode not in (0, 1):  # 1: written, the log did not verify
            raise RuntimeError(f"report failed: {made.stderr[-2000:]}")
        size = out.stat().st_size
        out.unlink()
        label = _label(events)
        say(
            f"  {label}: {made.seconds:.1f} s, peak {made.peak_mib:.0f} MiB, "
            f"page {size / 1024:.0f} KiB"
        )
        extra = {"processes": made.processes, "returncode": made.returncode}
        rows += [
            Row("14", f"report build time (verify included), {label}", made.seconds, "s"),
            Row("14", f"report peak RSS, {label}", made.peak_mib, "MiB", extra=extra),
            Row("14", f"report page size, {label}", size / 1024, "KiB"),
        ]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.s14_report", description=__doc__)
    parser.add_argument("--events", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args(argv)
    work = Workdir(args.workdir)
    try:
        with quiet_logging():
            rows = _measure(work, sorted(args.events))
    finally:
        if args.workdir is None:
            work.cleanup()
    for row in rows:
        print(f"{row.name}: {fmt_number(row.figure, row.unit)}")
    print(json.dumps([row.as_dict() for row in rows]))
    return 0


def _measure(work: Workdir, sizes: list[int]) -> list[Row]:
    homes: dict[int, Path] = {}
    for events in sizes:
        home = work.fresh(f"report-{events}")
        built = build_log(archive_dir(home), round(events * 40 / 43), projections=False)
        print(f"built {built.events:,} events in {built.seconds:.0f} s", file=sys.stderr)
        homes[built.events] = home
    return run(homes, lambda line: print(line, file=sys.stderr))


if __name__ == "__main__":
    sys.exit(main())
