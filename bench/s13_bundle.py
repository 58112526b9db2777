"""Row 13: a whole-archive ``export`` and its ``verify-bundle`` beside their floors (issue 18).

Both floors are measured in the same run, interleaved with what they bound:

* ``export`` (the bundle written, then checked by the exporter itself, as the command does)
  against a plain zip of the same bytes: ``zipfile`` deflating the bundle's three members,
  read from files, at the same level. The row's unit is the uncompressed bytes per second,
  by the wall clock. The export deflates in a second thread beside its reading (two cores
  when the machine has them free), the plain zip in one: both sides' CPU seconds are in the
  row's extras, so the ratio on one core is there too.
* ``verify-bundle`` of that bundle against row 2's floor (``s2_verify.verify_floor``: one
  sequential pass over ``events`` and ``payloads`` hashing the same bytes, no lookups) on the
  archive it came from.

Each command's peak RSS is read once from a child (``cli_child``): the issue's 100 MB bound.
"""

from __future__ import annotations

import sqlite3
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from statistics import median

from archive_provider.audit.export import Selection, export_bundle
from archive_provider.format.verifier import verify_bundle
from archive_provider.storage.store import EventStore

from .common import Row, Workdir, cli_child, interleaved
from .s2_verify import against_floor, verify_floor

Report = Callable[[str], None]


def _plain_zip(members: list[Path], out: Path, cpu: list[float]) -> float:
    start, started = time.perf_counter(), time.process_time()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in members:
            archive.write(path, path.name)
    cpu.append(time.process_time() - started)
    return time.perf_counter() - start


def run(
    work: Workdir, home: Path, folder: Path, label: str, repeats: int, say: Report
) -> list[Row]:
    """The rows of section 13 on the archive in ``folder`` (``home`` for the children)."""
    scratch = work.fresh("bundle")
    bundle = scratch / "all.zip"
    store = EventStore.open(folder)
    cpu: list[float] = []
    zip_cpu: list[float] = []
    try:

        def export() -> float:
            start, started = time.perf_counter(), time.process_time()
            result = export_bundle(store, bundle, Selection())
            if not result.verification.ok:
                raise RuntimeError(f"the bench export failed: {result.verification.problem}")
            cpu.append(time.process_time() - started)
            return time.perf_counter() - start

        export()  # the members the plain zip compresses, and a warm page cache
        cpu.clear()
        with zipfile.ZipFile(bundle) as archive:
            names = archive.namelist()
            archive.extractall(scratch / "members")
        members = [scratch / "members" / name for name in names]
        raw = sum(path.stat().st_size for path in members)
        ours, theirs, all_ours, all_theirs = interleaved(
            export, lambda: _plain_zip(members, scratch / "plain.zip", zip_cpu), repeats
        )
    finally:
        store.close()
    say(
        f"  export {label}: {raw / ours / 1e6:,.1f} MB/s vs plain zip {raw / theirs / 1e6:,.1f}"
        f" (CPU time: {median(zip_cpu) / median(cpu):.2f}x)"
    )

    conn = sqlite3.connect(folder / "events.db", isolation_level=None)
    conn.execute("PRAGMA cache_size = -262144")
    try:
        n, v_ours, v_theirs, all_v_ours, all_v_theirs = against_floor(
            lambda: verify_bundle(bundle), lambda: verify_floor(conn), folder, repeats, "bundle"
        )
    finally:
        conn.close()
    say(f"  verify-bundle {label}: {n / v_ours:,.0f}/s vs floor {n / v_theirs:,.0f}/s")
    exported = cli_child(home, "export", str(scratch / "child.zip"))
    verified = cli_child(home, "verify-bundle", str(scratch / "child.zip"), "--no-archive")
    say(f"  peak RSS: export {exported.peak_mib:.1f} MiB, verify-bundle {verified.peak_mib:.1f}")
    return [
        Row(
            "13",
            f"export @ {label} (its own check included; 2 threads)",
            raw / ours / 1e6,
            "MB/s",
            raw / theirs / 1e6,
            "plain zip of the same bytes",
            target_kind="min",
            target_value=0.5,
            target_text=">= 0.5x plain zip",
            extra={
                "bytes": raw,
                "seconds": all_ours,
                "zip_seconds": all_theirs,
                "cpu_seconds": cpu,
                "zip_cpu_seconds": zip_cpu,
            },
        ),
        Row(
            "13",
            f"verify-bundle @ {label}",
            n / v_ours,
            "events/s",
            n / v_theirs,
            "sequential pass, no lookups",
            target_kind="min",
            target_value=0.5,
            target_text=">= 0.5x floor",
            extra={"events": n, "seconds": all_v_ours, "floor_seconds": all_v_theirs},
        ),
        *(
            Row(
                "13",
                f"{what} peak RSS @ {label}",
                child.peak_mib,
                "MiB",
                absolute_kind="max",
                absolute_value=100,
                target_text="<= 100 MB at any size",
                extra={"returncode": child.returncode, "seconds": child.seconds},
            )
            for what, child in (("export", exported), ("verify-bundle", verified))
        ),
    ]
