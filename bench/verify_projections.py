"""``verify --projections`` beside ``replay`` + ``verify`` of the same log (issue 18: <= 1.2x).

``verify --projections`` checks the log, then copies the database, replays every projection
into the copy and compares each projection's digest with the live one. The floor is the two
commands it stands for, run on the same archive in the same run: ``verify`` and ``replay``
(which rebuilds the live projections in place: the archive ends as it began). Each is a
``hermes-archive`` child, timed alone with its peak RSS, the three interleaved ``repeats``
times (medians: a shared machine's noise hits all three alike).

    python -m bench.verify_projections HOME [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path

from .common import Row, cli_child

TARGET = 1.2

Report = Callable[[str], None]


def row(home: Path, label: str, say: Report, repeats: int = 1) -> Row:
    """The row: ``verify --projections`` seconds against ``verify`` + ``replay`` seconds."""
    runs: dict[str, list[float]] = {"verify": [], "replay": [], "verify --projections": []}
    peaks: dict[str, float] = {}
    for _ in range(repeats):
        for name in runs:
            done = cli_child(home, "--json", *name.split())
            if done.returncode != 0:
                raise RuntimeError(f"`{name}` failed ({done.returncode}): {done.stderr[-2000:]}")
            runs[name].append(done.seconds)
            peaks[name] = max(peaks.get(name, 0.0), done.peak_mib)
    seconds = {name: statistics.median(values) for name, values in runs.items()}
    floor = seconds["verify"] + seconds["replay"]
    ours = seconds["verify --projections"]
    say(
        f"  verify --projections @ {label}: {ours:.1f} s vs verify {seconds['verify']:.1f} s "
        f"+ replay {seconds['replay']:.1f} s = {floor:.1f} s ({ours / floor:.2f}x); peak RSS "
        + ", ".join(f"{name} {peak:.0f} MiB" for name, peak in peaks.items())
    )
    return Row(
        "5",
        f"verify --projections, {label}",
        ours,
        "s",
        floor,
        "verify + replay",
        target_kind="max",
        target_value=TARGET,
        target_text=f"<= {TARGET}x (verify + replay)",
        extra={"seconds": seconds, "peak_mib": peaks, "repeats": repeats},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("home", type=Path, help="a Hermes home holding archive/")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    found = row(args.home, str(args.home), print, args.repeats)
    print(json.dumps(found.as_dict(), indent=2, default=str))


if __name__ == "__main__":
    main()
