"""No tracked file names a path of the machine the project was written and measured on.

Docs speak of the product, code and tests of what any checkout has: a path like these in a
tracked file is a reference to something only that machine holds. The prefixes are built
from pieces so that this file does not hold them itself.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: folders that exist only on the machine of the work: its worktrees and shared notes, its
#: job and test scratch folders, root's home, its local package mirrors
MACHINE_PREFIXES = tuple(
    "/" + "/".join(parts)
    for parts in (
        ("work", ""),
        ("tmp", "bash_jobs"),
        ("tmp", "pytest-of-"),
        ("root", ""),
        ("opt", "pypi"),
    )
)


def tracked_files() -> list[Path]:
    done = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60
    )
    return [REPO / name for name in done.stdout.decode("utf-8").split("\0") if name]


def machine_paths(data: bytes) -> list[tuple[int, str]]:
    """(line, prefix) of each machine prefix ``data`` holds."""
    found = []
    for prefix in MACHINE_PREFIXES:
        at = data.find(prefix.encode())
        if at >= 0:
            found.append((data.count(b"\n", 0, at) + 1, prefix))
    return found


def test_a_planted_path_is_found() -> None:
    planted = ("line one\nsee " + MACHINE_PREFIXES[0] + "shared/notes.md\n").encode()
    assert machine_paths(planted) == [(2, MACHINE_PREFIXES[0])]
    assert machine_paths(b"/tmp/audit.db and ~/.hermes are fine") == []


def test_no_tracked_file_names_a_path_of_the_machine() -> None:
    files = tracked_files()
    assert len(files) > 100, "not a checkout of the project"
    found = []
    for path in files:
        if not path.is_file():  # a deletion not committed yet
            continue
        found += [
            f"{path.relative_to(REPO)}:{line}: {prefix}"
            for line, prefix in machine_paths(path.read_bytes())
        ]
    assert not found, "paths of the machine in tracked files:\n" + "\n".join(found)
