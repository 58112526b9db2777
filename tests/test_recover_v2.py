"""The recovery procedures of docs/RECOVER.md for a format-v2 archive, run as documented: the
real CLI in a subprocess (as an operator runs it) against a profile a real provider wrote.

* a lost signing key restored from its backup: the same running provider resumes;
* a lost (or leaked) signing key replaced by a new archive: the old one is kept aside and
  still verifies with its old verifier key, ``witness accept`` records the old store and head
  in the new log, and the new key signs from then on.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from archive_provider.host.provider import ArchiveProvider
from archive_provider.storage.store import archive_dir

ROOT = Path(__file__).resolve().parents[1]
VERIFIER = ROOT / "archive_provider" / "format" / "verifier.py"
MESSAGES = [
    {"role": "user", "content": "The heron nests by the old mill"},
    {"role": "assistant", "content": "Noted: the old mill."},
]


def cli(home: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, Any]:
    """``hermes-archive --home HOME --json ARGS`` as a separate process; (exit code, JSON)."""
    result = subprocess.run(
        [sys.executable, "-m", "archive_provider.cli", "--home", str(home), "--json", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout)


def written(make_provider: Callable[..., ArchiveProvider], home: Path) -> None:
    """A profile with a turn and a cosigned checkpoint, Hermes stopped cleanly."""
    provider = make_provider(home)
    provider.sync_turn(*(m["content"] for m in MESSAGES), session_id="s1", messages=MESSAGES)
    assert provider.on_pre_compress(MESSAGES, require_checkpoint=True)
    provider.shutdown()


def checkpoint(provider: ArchiveProvider, text: str) -> str:
    grown = [*MESSAGES, {"role": "user", "content": text}]
    return str(provider.on_pre_compress(grown, require_checkpoint=True))


def test_a_lost_signing_key_restored_from_backup(
    make_provider: Callable[..., ArchiveProvider], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    written(make_provider, home)
    key = archive_dir(home) / "signing.key"
    backup = tmp_path / "backup" / "signing.key"
    backup.parent.mkdir()
    shutil.copy2(key, backup)  # OPERATIONS.md "Keys": back the key up on its own
    code, pinned = cli(home, "key")
    assert code == 0
    key.unlink()

    code, status = cli(home, "status")  # says what is wrong, never a traceback
    assert code == 0 and status["signing_key"]["ok"] is False
    assert "is missing" in status["signing_key"]["problem"]
    code, verified = cli(home, "verify", "--key", pinned["vkey"])  # verifying needs no secret
    assert code == 0 and verified["ok"]

    provider = make_provider(home)
    provider.sync_turn("while the key was lost", "kept", session_id="s1")
    with pytest.raises(Exception, match="signing key"):
        checkpoint(provider, "a checkpoint without a key fails closed")
    withheld = provider.prefetch("heron mill")
    assert "recall withheld" in withheld and "signing key" in withheld
    assert "old mill" not in withheld

    shutil.copy2(backup, key)  # RECOVER.md: restore it from the backup, mode 0600
    os.chmod(key, 0o600)
    code, again = cli(home, "key")
    assert code == 0 and again["vkey"] == pinned["vkey"]
    assert "Archive checkpoint" in checkpoint(provider, "the key is back")  # no restart
    assert "old mill" in provider.prefetch("heron mill")
    provider.shutdown()
    code, verified = cli(home, "verify", "--key", pinned["vkey"])
    assert code == 0 and verified["ok"]
    code, log = cli(home, "log", "--type", "turn")
    assert any("while the key was lost" in e["summary"] for e in log)  # nothing was lost


def test_a_lost_or_leaked_key_is_replaced_by_a_new_archive_that_names_the_old_one(
    make_provider: Callable[..., ArchiveProvider], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    written(make_provider, home)
    code, old = cli(home, "status")
    old_store, old_head = old["store_id"], old["head"]
    code, shown = cli(home, "witness", "show")  # the key the local witness pinned
    old_vkey = shown["recorded"]["log_vkey"]
    (archive_dir(home) / "signing.key").unlink()  # lost (a leaked key is moved aside with it)
    waiting = make_provider(home)  # Hermes ran on until it was stopped: its turns were spilled
    waiting.sync_turn("said while the key was lost", "kept", session_id="s1")
    waiting.shutdown()
    code, status = cli(home, "status")
    assert status["spill"]["segments"] and not status["signing_key"]["ok"]

    kept = tmp_path / "kept" / f"store-{old_store}"  # RECOVER.md: move the archive aside
    kept.mkdir(parents=True)
    shutil.move(archive_dir(home), kept / "archive")
    archive_dir(home).mkdir(mode=0o700)  # and bring its spill back for the new archive
    shutil.move(kept / "archive" / "spill", archive_dir(home) / "spill")
    code, verified = cli(kept, "verify", "--key", old_vkey)
    assert code == 0 and verified["ok"]  # the old history still proves what it always did
    code, turns = cli(kept, "log", "--type", "turn")  # and can still be shown to others
    proof = tmp_path / "old-turn.proof"
    code, proved = cli(kept, "prove", str(turns[0]["seq"]), "--out", str(proof))
    assert code == 0 and proved["vkey"] == old_vkey
    checked = subprocess.run(
        [sys.executable, str(VERIFIER), "proof", str(proof), "--key", old_vkey],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 0 and checked.stdout.startswith("ok:"), checked.stdout
    bundle = tmp_path / "old.zip"
    assert cli(kept, "export", str(bundle))[0] == 0
    code, checked_bundle = cli(kept, "verify-bundle", str(bundle), "--key", old_vkey)
    assert code == 0 and checked_bundle["bundle"]["authenticity"] == "verified"

    provider = make_provider(home)  # a new archive, a new store id and signing key
    provider.sync_turn("the first turn after the new key", "kept", session_id="s2")
    writer = provider.core.writer
    assert writer is not None
    deadline = time.monotonic() + 60  # a liveness bound, never a performance claim
    while writer.refused is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert writer.refused and "replaced" in writer.refused  # appends wait for the accept
    code, status = cli(home, "status")
    assert "replaced" in status["local_witness"]["problem"]
    code, accepted = cli(
        home,
        "witness",
        "accept",
        "--reason",
        f"new signing key: the key of store {old_store} was lost; that archive is kept aside",
    )
    assert code == 0 and accepted["ok"], accepted
    assert accepted["previous_witness"]["store_id"] == old_store
    assert accepted["previous_witness"]["seq"] == old_head["seq"]

    assert "Archive checkpoint" in checkpoint(provider, "signed with the new key")
    provider.shutdown()
    code, new = cli(home, "key")
    assert code == 0 and new["vkey"] != old_vkey
    code, verified = cli(home, "verify", "--key", new["vkey"])
    assert code == 0 and verified["ok"]
    code, refused = cli(home, "verify", "--key", old_vkey)  # the old key proves nothing here
    assert code == 1 and not refused["ok"]
    code, shown = cli(home, "show", str(accepted["event_seq"]))  # the lineage, in the new log
    (event,) = shown["events"]
    assert event["type"] == "witness_accepted"
    before = event["payload"]["previous_witness"]
    assert (before["store_id"], before["seq"], before["chain"]) == (
        old_store,
        old_head["seq"],
        old_head["chain"],
    )
    code, log = cli(home, "log", "--type", "turn")
    said = " ".join(e["summary"] for e in log)
    assert "the first turn after the new key" in said  # it waited for the accept
    assert "said while the key was lost" in said  # the spill was taken in: nothing was lost


NEW_STORE_KEY = "(umask 077; python3 -c 'import secrets; print(secrets.token_hex(32))' > store.key)"


def test_a_lost_lookup_key_is_replaced_by_a_new_one(
    make_provider: Callable[..., ArchiveProvider], tmp_path: Path
) -> None:
    """store.key only finds stored bodies again (FORMAT.md 10): a new one costs deduplication
    across the loss, nothing else; the archive verifies and serves as before."""
    home = tmp_path / "home"
    written(make_provider, home)
    (archive_dir(home) / "store.key").unlink()
    code, status = cli(home, "status")
    assert code == 1 and "lookup key" in status["error"] and "make a new one" in status["error"]
    subprocess.run(["sh", "-c", NEW_STORE_KEY], cwd=archive_dir(home), check=True)  # RECOVER.md
    assert (archive_dir(home) / "store.key").stat().st_mode & 0o777 == 0o600
    provider = make_provider(home)
    assert "Archive checkpoint" in checkpoint(provider, "written with the new lookup key")
    assert "old mill" in provider.prefetch("heron mill")
    provider.shutdown()
    code, verified = cli(home, "verify")
    assert code == 0 and verified["ok"]


def test_the_signing_key_kept_outside_the_profile(
    make_provider: Callable[..., ArchiveProvider],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """OPERATIONS.md "Keys": the key moved out of the profile and named by the environment."""
    home = tmp_path / "home"
    written(make_provider, home)
    code, before = cli(home, "key")
    outside = tmp_path / "etc" / "alpha.key"
    outside.parent.mkdir(mode=0o700)
    shutil.move(archive_dir(home) / "signing.key", outside)  # with Hermes stopped
    env = {"HERMES_ARCHIVE_SIGNING_KEY": str(outside)}
    monkeypatch.setenv("HERMES_ARCHIVE_SIGNING_KEY", str(outside))  # Hermes' environment
    code, status = cli(home, "status", env=env)
    assert status["signing_key"] == {
        "path": str(outside),
        "outside_profile": True,
        "ok": True,
        "problem": None,
        "vkey": before["vkey"],
    }
    provider = make_provider(home)
    assert "Archive checkpoint" in checkpoint(provider, "signed by the key outside")
    provider.shutdown()
    assert not (archive_dir(home) / "signing.key").exists()
    code, verified = cli(home, "verify", "--key", before["vkey"], env=env)
    assert code == 0 and verified["ok"]
    monkeypatch.delenv("HERMES_ARCHIVE_SIGNING_KEY")
    code, status = cli(home, "status")  # a process without the variable cannot sign, and says so
    assert status["signing_key"]["ok"] is False and "is missing" in status["signing_key"]["problem"]
