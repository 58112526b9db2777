"""The benchmark runs end to end on a tiny configuration and writes well-formed JSON.

No timing is asserted anywhere: the machine is shared and absolute times drift. This only
guards against the bench rotting as the code it measures changes.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(900)
def test_bench_smoke_produces_well_formed_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--json", str(out), "--workdir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=840,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    data = json.loads(out.read_text())
    assert data["mode"] == "smoke"
    assert {"date", "cpu", "cores", "python", "sqlite", "revision"} <= set(data["machine"])
    sections = {row["section"] for row in data["rows"]}
    assert sections == {str(n) for n in (*range(1, 11), 12, 13, 14)}, sections
    for row in data["rows"]:
        assert isinstance(row["name"], str) and row["name"]
        assert isinstance(row["figure"], (int, float)) and math.isfinite(row["figure"]), row
        assert isinstance(row["unit"], str) and row["unit"]
        assert row["met"] in (True, False, None)
        if row["baseline"] is not None:
            assert isinstance(row["ratio"], (int, float)), row
        if row["met"] is not None:
            assert row["target_text"], row
    assert data["missed"] == [
        f"{r['section']} {r['name']}" for r in data["rows"] if r["met"] is False
    ]
    assert "| measurement" in done.stdout  # the table was printed


def test_a_workdir_that_does_not_exist_yet_is_made(tmp_path: Path) -> None:
    """``--workdir DIR`` made DIR's scratch folder with mkdtemp, which needs DIR to exist."""
    from bench.common import Workdir

    work = Workdir(tmp_path / "not" / "yet")
    try:
        assert work.root.is_dir() and work.root.parent == tmp_path / "not" / "yet"
        assert work.fresh("log").is_dir()
    finally:
        work.cleanup()
