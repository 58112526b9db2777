"""The full fault campaign (outside CI): every call of each failure point, failed once (and
with ``--every``, from that call on), for each scenario; prints the table for OPERATIONS.md.

    python -m bench.faults [--per-point N] [--every] [--scenario hooks --scenario required]

Needs Debian's ``fiu-utils`` and ``python3-fiu`` (``.ci/setup`` installs them).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from tests.reliability.fault_campaign import POINTS, Table, sweep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--per-point", type=int, default=None, help="calls per point (all)")
    parser.add_argument("--every", action="store_true", help="fail every call from the n-th")
    parser.add_argument("--scenario", action="append", default=None)
    args = parser.parse_args()
    table = Table()
    with tempfile.TemporaryDirectory() as tmp:
        for scenario in args.scenario or ["hooks", "required"]:
            part = sweep(Path(tmp), scenario, POINTS, args.per_point, args.every)
            table.outcomes += part.outcomes
            for outcome in part.outcomes:
                if outcome.verdict not in ("survived", "refused"):
                    print(outcome)
    print(table.markdown())


if __name__ == "__main__":
    main()
