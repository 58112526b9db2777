"""A folder's fsync (``safe_files.sync_dir``, the one the store, the spill, migrate and
export use) lets pass only a file system that cannot sync a folder; an I/O error is raised,
so an export never says written what the disk refused. Failures injected with libfiu into
a real child process (``sync_child.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from archive_provider.domain import builders
from tests.conftest import open_v2

from .fault_campaign import fiu_run

CHILD = Path(__file__).with_name("sync_child.py")
ROOT = Path(__file__).resolve().parents[2]


def child(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        [fiu_run(), "-x", "-f", "", sys.executable, str(CHILD), *args],
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


@pytest.mark.parametrize(
    ("code", "error"),
    [("EINVAL", None), ("EOPNOTSUPP", None), ("EIO", "EIO"), ("EROFS", "EROFS")],
)
def test_a_folder_that_cannot_be_synced_passes_an_io_error_is_raised(
    tmp_path: Path, code: str, error: str | None
) -> None:
    assert child(code, str(tmp_path))["error"] == error


@pytest.mark.parametrize(("code", "said"), [("EINVAL", None), ("EIO", "Input/output error")])
def test_export_says_so_when_its_folder_cannot_be_made_durable(
    tmp_path: Path, code: str, said: str | None
) -> None:
    store = open_v2(tmp_path / "archive")
    try:
        store.append([builders.session_started("s1", at="t0", details={})])
    finally:
        store.close()
    out = tmp_path / "out" / "all.zip"
    out.parent.mkdir()
    result = child(code, str(tmp_path / "archive"), str(out))
    assert result["exists"]  # written and verified: never removed for this
    if said is None:
        assert result["error"] is None
    else:
        assert result["error"].startswith("ExportError: ") and said in result["error"]
        assert "could not be made durable" in result["error"]
