"""The install README and OPERATIONS.md give: the wheel and the sdist built from this tree,
each installed non-editable into a fresh venv, run.

Only the project itself is installed (``--no-deps --no-index``: nothing is fetched); its
dependencies (and, for the sdist, its build backend) are borrowed from the test venv through a
path file, so the check costs seconds. What it catches: a module or the schemas missing from
the wheel or the sdist, a broken entry point, code that only works from the source tree.
"""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from archive_provider import __version__

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.wheel


def run(*args: str | Path, cwd: Path) -> str:
    done = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=300, cwd=cwd
    )
    assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout


def build(kind: str, dist: Path) -> Path:
    """The ``wheel`` or ``sdist`` of this tree, built into ``dist`` as a release builds it."""
    if kind == "wheel":
        run(
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            dist,
            REPO,
            cwd=dist.parent,
        )
    else:
        code = "import sys; from hatchling.build import build_sdist; build_sdist(sys.argv[1])"
        run(sys.executable, "-c", code, dist, cwd=REPO)
    (built,) = dist.glob(
        f"hermes_archive-{__version__}{'-py3-none-any.whl' if kind == 'wheel' else '.tar.gz'}"
    )
    return built


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_a_built_wheel_and_sdist_install_and_run_outside_the_source_tree(
    tmp_path: Path, kind: str
) -> None:
    dist = tmp_path / "dist"
    wheel = build(kind, dist)
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    site = Path(
        run(
            python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path
        ).strip()
    )
    # the dependencies (blake3, sqlite-utils), not this project: the test venv's path files
    # (its editable install among them) are not read from a directory added this way
    (site / "borrowed-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "install",
        "--no-deps",
        "--no-index",
        "--no-build-isolation",  # the sdist is built with the borrowed hatchling
        "-q",
        wheel,
        cwd=tmp_path,
    )

    where = run(
        python,
        "-c",
        "import archive_provider, hivemind; "
        "print(archive_provider.__file__); print(hivemind.__file__)",
        cwd=tmp_path,
    )
    assert all(line.startswith(str(site)) for line in where.splitlines()), where
    assert (site / "archive_provider" / "schemas" / "envelope.json").is_file()
    assert (site / "archive_provider" / "audit" / "report.html").is_file()  # the report's page
    tool = venv / "bin" / "hermes-archive"
    assert run(tool, "--version", cwd=tmp_path) == f"hermes-archive {__version__}\n"

    home = tmp_path / "home"
    run(
        python,
        "-c",
        "import sys; from archive_provider.format.events import NewEvent; "
        "from archive_provider.storage.store import EventStore, archive_dir; "
        "s = EventStore.open(archive_dir(sys.argv[1])); "
        "s.append([NewEvent('turn', 's1', {'turn': 1}, {'turn': 1, 'messages': []})]); s.close()",
        home,
        cwd=tmp_path,
    )
    assert run(tool, "--home", home, "verify", cwd=tmp_path).startswith("ok")
    run(tool, "--home", home, "report", tmp_path / "report.html", cwd=tmp_path)
    assert 'id="report-data"' in (tmp_path / "report.html").read_text()
    status = run(tool, "--home", home, cwd=tmp_path)  # v2 also counts its store_created
    assert re.search(r"^Events: \d+ \((.+, )?turn 1\)$", status, re.MULTILINE), status
    # the central store's schema is a package resource beside fleet/central.py
    assert "CREATE SCHEMA IF NOT EXISTS hermes_archive" in run(tool, "central", "sql", cwd=tmp_path)
