"""Loaded by every Python process ``bench.common.cli_child`` starts (this folder leads its
PYTHONPATH), helpers of ``verify --jobs`` included: at exit each writes its own peak RSS
(``VmHWM``, KiB) to a file named by its pid in ``BENCH_PEAK_DIR``, so the peak of a command
counts every process it ran. A fork's ``ru_maxrss`` would start at its parent's peak."""

import atexit
import os


def _write_peak() -> None:
    with open("/proc/self/status") as status:
        peak = [line.split()[1] for line in status if line.startswith("VmHWM:")]
    with open(os.path.join(os.environ["BENCH_PEAK_DIR"], str(os.getpid())), "w") as out:
        out.write(peak[0])


if os.environ.get("BENCH_PEAK_DIR"):
    atexit.register(_write_peak)
