"""Export bundles and their standalone verifier: what a bundle holds, proves, and refuses.

Three kinds of damage are covered: any single flipped bit (caught by the seal and the member
digests, and named), a forger who re-seals a bundle after changing it (caught by the chain,
payload and selection checks), and a consistent rewrite of the chain (which a bundle alone
cannot reveal: only comparing its head with the archive, or another record, does).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from blake3 import blake3

from archive_provider.audit.export import Selection, export_bundle
from archive_provider.domain.builders import session_ended, session_started
from archive_provider.format import verifier
from archive_provider.format.verifier import (
    MANIFEST,
    seal_comment,
    seal_digest,
    verify_bundle,
)
from archive_provider.storage.store import EventStore, StoreError, archive_dir

from .conftest import v1_archive
from .test_cli import REPO, build_archive, rows

# Exports (bundle version 3) and the standalone verifier's refusals; bundle versions 1 and 2 are
# checked from their frozen vectors (test_bundle_vectors.py, test_bundle_v2_vectors.py), bundle 3's
# forgery classes in test_bundle_prove_v2.py.

VERIFIER = Path(verifier.__file__)
ONLY_IN_SESSION_ONE = b"Herons are patient hunters."


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("export") / "home"
    build_archive(folder)
    return folder


def export(home: Path, out: Path, selection: Selection | None = None, **kwargs: Any) -> Path:
    store = EventStore.open(archive_dir(home), create=False, readonly=True)
    try:
        export_bundle(store, out, selection or Selection(), **kwargs)
    finally:
        store.close()
    return out


def members(bundle: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(bundle) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


# -- what a bundle holds -----------------------------------------------------------------


def test_an_empty_selection_is_a_proof_of_absence(home: Path, tmp_path: Path) -> None:
    bundle = export(home, tmp_path / "none.zip", Selection(session="never-was"))
    report = verify_bundle(bundle)
    assert report.ok and report.details["selected_events"] == report.details["payloads"] == 0
    assert report.events_checked == rows(home, "SELECT count(*) FROM events")[0][0]


# -- every bit ----------------------------------------------------------------------------


@pytest.fixture
def tiny_bundle(tmp_path: Path) -> Path:
    """A small but complete partial export: 3 envelopes, 1 selected event, 1 payload."""
    home = tmp_path / "tiny"
    store = EventStore.open(archive_dir(home))
    store.append(
        [
            session_started("a", at="2026-01-01T00:00:00.000000Z", details={"platform": "cli"}),
            session_ended("b", at="2026-01-01T00:00:01.000000Z", message_count=2),
            session_ended("a", at="2026-01-01T00:00:02.000000Z", message_count=4),
        ]
    )
    try:
        export_bundle(store, tmp_path / "tiny.zip", Selection(session="b"))
    finally:
        store.close()
    return tmp_path / "tiny.zip"


def test_the_standalone_cli_fails_cleanly_on_damaged_bundles(
    tiny_bundle: Path, tmp_path: Path
) -> None:
    original = tiny_bundle.read_bytes()
    damaged = tmp_path / "damaged.zip"
    for offset in sorted(
        {
            0,
            5,
            30,
            200,
            len(original) // 2,
            len(original) - 300,
            len(original) - 100,
            len(original) - 1,
        }
    ):
        data = bytearray(original)
        data[offset] ^= 0x10
        damaged.write_bytes(data)
        done = subprocess.run(
            [sys.executable, str(VERIFIER), "bundle", str(damaged)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 1 and done.stdout.startswith("FAILED"), (offset, done.stdout)
        assert "Traceback" not in done.stderr, (offset, done.stderr)
    damaged.write_bytes(original[:-1000])
    done = subprocess.run(
        [sys.executable, str(VERIFIER), "bundle", str(damaged), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and json.loads(done.stdout)["ok"] is False


# -- a forger who re-seals -------------------------------------------------------------------


def reseal(bundle: Path, change: Callable[[dict[str, bytes], dict[str, Any]], None]) -> None:
    """Rewrite a bundle as a forger who knows the format would: members, manifest digests, seal."""
    content = members(bundle)
    manifest = json.loads(content.pop(MANIFEST))
    change(content, manifest)
    manifest["members"] = {
        n: {"size": len(b), "blake3": blake3(b).hexdigest()} for n, b in content.items()
    }
    write_sealed(bundle, content, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())


def write_sealed(bundle: Path, content: dict[str, bytes], manifest: bytes) -> None:
    """Write ``bundle`` with these members and ``manifest`` verbatim, sealed as export seals."""
    with zipfile.ZipFile(bundle, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, body in content.items():
            archive.writestr(name, body)
        archive.writestr(MANIFEST, manifest)
        archive.comment = seal_comment(blake3(manifest).hexdigest())
    seal_file(bundle)


def seal_file(bundle: Path) -> None:
    """Write the seal over the whole file into the last 64 bytes of its comment."""
    with open(bundle, "r+b") as handle:
        size = handle.seek(0, 2)
        seal = seal_digest(handle, size)
        handle.seek(size - 64)
        handle.write(seal.encode())


def test_resealing_without_changes_still_verifies(home: Path, tmp_path: Path) -> None:
    bundle = export(home, tmp_path / "b.zip", Selection(session="sess-2"))
    reseal(bundle, lambda content, manifest: None)
    assert verify_bundle(bundle).ok  # so the failures below come from the checks, not from reseal


# -- the export command ----------------------------------------------------------------------


# -- the verifier alone -----------------------------------------------------------------------


def test_the_copied_out_verifier_runs_in_a_venv_with_only_blake3(tmp_path: Path) -> None:
    """Old bundles (version 1) and format-1 archives need nothing but blake3 to check."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    pip = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "blake3"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert pip.returncode == 0, pip.stderr
    lone = tmp_path / "auditor"
    lone.mkdir()
    shutil.copy(VERIFIER, lone / "verifier.py")
    bundle = lone / "audit.zip"
    shutil.copy(Path(__file__).parent / "vectors" / "bundles" / "tiny.zip", bundle)
    v1_archive(lone / "archive")

    def check(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(python), "verifier.py", *args],
            cwd=lone,
            capture_output=True,
            text=True,
            timeout=120,
        )

    imports = subprocess.run(
        [str(python), "-c", "import archive_provider"], capture_output=True, cwd=lone
    )
    assert imports.returncode != 0  # the package is not there: only the copied file runs
    done = check("bundle", "audit.zip")
    assert done.returncode == 0 and done.stdout.startswith("ok: bundle of store"), (
        done.stdout + done.stderr
    )
    assert check("audit.zip", "--json").returncode == 0  # detected as a bundle by its first bytes
    done = check(str(Path("archive") / "events.db"))
    assert done.returncode == 0 and done.stdout.startswith("ok:"), done.stdout + done.stderr
    data = bytearray(bundle.read_bytes())
    data[len(data) // 3] ^= 0x01
    bundle.write_bytes(data)
    done = check("bundle", "audit.zip")
    assert (
        done.returncode == 1 and done.stdout.startswith("FAILED") and "Traceback" not in done.stderr
    )


def test_a_hostile_database_is_refused_before_its_views_run(tmp_path: Path) -> None:
    """An audited database may come from a compromised system: a view named meta never runs."""
    folder = v1_archive(tmp_path / "archive")  # the verifier's v1 path reads payload.key
    conn = sqlite3.connect(folder / "events.db")
    conn.execute("DROP TABLE meta")
    conn.execute(
        "CREATE VIEW meta AS WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) "
        "SELECT 'store_id' AS name, x AS value FROM r WHERE x < 0"
    )
    conn.commit()
    conn.close()
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "archive_provider" / "format" / "verifier.py"),
            str(folder / "events.db"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "meta is a view, not a table" in done.stdout + done.stderr
    with pytest.raises(StoreError, match="meta is a view, not a table"):
        EventStore.open(folder, create=False, readonly=True)


def test_the_progress_bar_never_reads_a_huge_manifest(tmp_path: Path) -> None:
    """verify-bundle peeks at the claimed head before verifying; a bomb must not be read."""
    from archive_provider.commands.verify_bundle import _claimed_head

    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(MANIFEST, b" " * (65 << 20) + b'{"head": {"seq": 5}}')
    small = tmp_path / "small.zip"
    with zipfile.ZipFile(small, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(MANIFEST, b'{"head": {"seq": 5}}')
    assert (_claimed_head(bomb), _claimed_head(small)) == (0, 5)


@pytest.mark.parametrize(
    "content", [b"", b"garbage, not an archive" * 10], ids=["empty", "garbage"]
)
def test_the_standalone_verifier_tells_what_a_file_is_by_its_first_bytes(
    tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "events.db"
    path.write_bytes(content)
    done = subprocess.run(
        [sys.executable, str(VERIFIER), str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1 and done.stderr == ""
    assert (
        done.stdout == f"FAILED at the file: {path} is not an archive database or bundle "
        "(empty, or other first bytes)\n"
    )


def test_the_standalone_verifier_says_a_database_is_not_a_bundle(home: Path) -> None:
    database = archive_dir(home) / "events.db"
    done = subprocess.run(
        [sys.executable, str(VERIFIER), "bundle", str(database)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and f"{database} is a database, not a bundle" in done.stdout


def test_the_standalone_verifier_without_blake3_says_how_to_install_it(tmp_path: Path) -> None:
    """An auditor's bare Python: one line naming the install command, exit 1, no traceback."""
    hide = (
        "import runpy, sys\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'blake3' or name.startswith('blake3.'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.modules.pop('blake3', None)\n"
        "sys.meta_path.insert(0, Hide())\n"
        "sys.argv = sys.argv[1:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", hide, str(VERIFIER), str(tmp_path / "events.db")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == "verifier.py needs the blake3 package: python3 -m pip install blake3\n"
