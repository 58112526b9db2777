"""The host's own ``hermes backup`` and ``hermes import`` (the real CLI) keep the archive whole.

The host snapshots every ``*.db`` under ``HERMES_HOME`` through SQLite's backup API, but
copies every path a provider's ``backup_paths()`` declares raw, and ``hermes import``
writes those raw copies after the snapshot. A provider that declared its live database and
WAL handed back a torn archive ("payload ... is missing"). This runs a writer in another
process during the backup and checks the restore into a fresh home.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from archive_provider import ArchiveProvider
from archive_provider.storage.store_pieces import SIGNING_KEY_ENV
from archive_provider.storage.witness import WITNESS_ENV

from .archive_kit import HOST_TESTS, REPO_ROOT, child_env, counts, install_archive, verify
from .hostkit import isolate_hermes_home, purge_user_plugin_modules

HERMES_BIN = Path(sys.executable).with_name("hermes")


def _hermes(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(HERMES_BIN), *args],
        env=env,
        cwd=env["HOME"],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


def test_backup_during_writes_then_import_into_a_fresh_home_verifies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The usual layout: the profile at ~/.hermes, so the host captures declared paths
    # (it skips those outside the user's home), and the signing key outside the profile.
    user = tmp_path / "user"
    home = isolate_hermes_home(monkeypatch, user / ".hermes", user)
    purge_user_plugin_modules()
    install_archive(home)
    key = user / "keys" / "alpha.key"
    key.parent.mkdir(mode=0o700)
    env = child_env(home, HOME=str(user), **{SIGNING_KEY_ENV: str(key)})

    stop = tmp_path / "stop"
    writer = subprocess.Popen(
        [sys.executable, str(HOST_TESTS / "archive_child.py"), "write_turns", str(stop)],
        env=env,
        cwd=str(REPO_ROOT),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None
        assert json.loads(writer.stdout.readline()) == {"ready": 50}
        backup = _hermes(env, "backup", "--output", str(tmp_path / "backup.zip"))
    finally:
        stop.touch()
        out, _ = writer.communicate(timeout=120)
    assert writer.returncode == 0
    assert backup.returncode == 0, backup.stdout + backup.stderr
    written = json.loads(out.strip().splitlines()[-1])["turns"]
    assert written > 50  # the writer was still writing when the backup ran

    fresh_user = tmp_path / "fresh"
    fresh = fresh_user / ".hermes"
    fresh.mkdir(parents=True)
    restore_env = {**env, "HOME": str(fresh_user), "HERMES_HOME": str(fresh)}
    restored = _hermes(restore_env, "import", str(tmp_path / "backup.zip"), "--force")
    assert restored.returncode == 0, restored.stdout + restored.stderr

    report = verify(fresh)
    assert report.ok, report.problem
    assert counts(fresh)["events"] >= 50  # at least what was committed before the backup
    assert (fresh_user / "keys" / "alpha.key").read_bytes() == key.read_bytes()
    with zipfile.ZipFile(tmp_path / "backup.zip") as zf:
        names = set(zf.namelist())
    archived = {n for n in names if "archive/" in n and "plugins/" not in n}
    # the snapshot and the keys from the walk; the key outside the profile as declared
    assert {".hermes/archive/events.db", ".hermes/archive/store.key"} <= {
        n if n.startswith(".hermes/") else ".hermes/" + n for n in archived
    }
    assert not any(n.endswith(("-wal", "-shm")) for n in names)
    assert not any(n.startswith("_external/") and "archive/" in n for n in names)
    assert "_external/keys/alpha.key" in names
    assert not any("witness" in n for n in names)

    # ... and the restored archive opens and signs with the restored key (a new witness)
    check = subprocess.run(
        [str(Path(sys.executable).with_name("hermes-archive")), "verify"],
        env={**restore_env, SIGNING_KEY_ENV: str(fresh_user / "keys" / "alpha.key")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert os.listdir(fresh) != []


def test_backup_paths_name_nothing_inside_the_profile_and_never_the_witness(
    hermes_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_archive(hermes_home)
    provider = ArchiveProvider()  # no initialize: hermes backup never initializes it
    assert provider.backup_paths() == []  # the walk already snapshots events.db and the keys

    outside = tmp_path / "keys" / "alpha.key"
    monkeypatch.setenv(SIGNING_KEY_ENV, str(outside))
    monkeypatch.setenv(WITNESS_ENV, str(tmp_path / "witness"))
    assert provider.backup_paths() == [str(outside)]

    monkeypatch.setenv(SIGNING_KEY_ENV, str(hermes_home / "keys" / "inside.key"))
    assert provider.backup_paths() == []
