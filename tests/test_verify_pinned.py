"""`verify` and the key the local witness pinned (FORMAT.md 20.2 step 6), and what a
verified report says is signed and what is not (issue 32 section 3)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from archive_provider.format import merkle, verifier
from archive_provider.format.signed_note import Checkpoint, Signer, format_checkpoint
from archive_provider.storage.store import archive_dir
from tests.test_cli import build_archive, run_json
from tests.test_verifier_v2 import CASES, VECTORS, _database

NOTES_KEY = "generated"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    folder = tmp_path / "home"
    build_archive(folder)  # the provider pinned the log key in the local witness
    return folder


def _zero_signatures(home: Path) -> None:
    conn = sqlite3.connect(archive_dir(home) / "events.db")
    conn.execute("DROP TRIGGER signed_checkpoints_no_update")
    conn.execute("UPDATE signed_checkpoints SET signature = zeroblob(64)")
    conn.commit()
    conn.close()


def test_verify_without_key_checks_with_the_key_the_local_witness_pinned(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, data = run_json(capsys, home, "verify")
    assert code == 0 and data["log"]["authenticity"] == "verified"
    assert data["pinned_key"] == "the local witness"
    _zero_signatures(home)
    code, data = run_json(capsys, home, "verify")
    assert code == 1 and data["log"]["code"] == "checkpoint_signature"
    assert data["log"]["authenticity"] == "failed"


def test_a_pinned_key_and_no_checkpoint_left_is_a_failure(tmp_path: Path) -> None:
    """With a pinned key, an archive whose checkpoints were all deleted has nothing signed."""
    path = _database(
        tmp_path,
        {"sql": ["DROP TRIGGER signed_checkpoints_no_delete", "DELETE FROM signed_checkpoints"]},
    )
    report = verifier.verify_database(sqlite3.connect(path), b"", vkey=VECTORS["log_vkey"])
    assert (report.ok, report.code, report.authenticity) == (
        False,
        "checkpoint_signature",
        "failed",
    )
    unpinned = verifier.verify_database(sqlite3.connect(path), b"")
    assert unpinned.ok and unpinned.authenticity == "not checked"


def test_events_after_the_newest_checkpoint_are_said_to_be_unsigned(tmp_path: Path) -> None:
    """The base's checkpoint at 6 replaced by one at 5, signed by the same key: verified,
    and the report says event 6 is covered by no signature."""
    import json

    notes = json.loads((Path(__file__).parent / "vectors" / "notes.json").read_text())
    log = Signer.from_private_key(notes[NOTES_KEY]["log_private_key"])
    assert log.vkey == VECTORS["log_vkey"]
    path = _database(tmp_path, CASES[0])
    conn = sqlite3.connect(path, isolation_level=None)
    root = merkle.root(5, merkle.TileReader(verifier._TreeCheck(conn).stored, 6))  # from tiles
    origin = log.vkey.split("+")[0]
    signature = log.sign(format_checkpoint(Checkpoint(origin, 5, root))).data
    conn.execute("DROP TRIGGER signed_checkpoints_no_delete")
    conn.execute("DELETE FROM signed_checkpoints")
    conn.execute(
        "INSERT INTO signed_checkpoints VALUES (5, ?, '2026-12-01T14:00:05.000000Z', ?)",
        (root, signature),
    )
    report = verifier.verify_database(conn, b"", vkey=VECTORS["log_vkey"])
    assert report.ok and report.authenticity == "verified", report.problem
    assert any("events 6 to 6 are after it" in w for w in report.warnings), report.warnings


def test_the_witness_record_is_named_and_shaped_as_format_16_1_says(home: Path) -> None:
    """Two files of one content: store-<h(store_id)>.json and <h(archive path)>.json."""
    import hashlib
    import json
    import os

    def h(text: str) -> str:
        return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()

    conn = sqlite3.connect(archive_dir(home) / "events.db")
    store_id = conn.execute("SELECT value FROM meta WHERE name = 'store_id'").fetchone()[0]
    conn.close()
    folder = Path(f"{home}.archive-witness")
    archive = os.path.realpath(archive_dir(home))
    names = {f"store-{h(store_id)}.json", f"{h(archive)}.json"}
    assert names <= {p.name for p in folder.iterdir()}
    first, second = (json.loads((folder / n).read_text()) for n in sorted(names))
    assert first == second and first["format"] == 2 and first["store_id"] == store_id
    assert set(first) == {
        "format", "store_id", "seq", "chain", "time", "archive", "fingerprint", "accepted",
        "log_vkey", "checkpoint", "walked",
    }  # fmt: skip
    assert first["archive"] == archive
    assert first["log_vkey"].split("+")[0] == f"hermes-archive.invalid/{store_id}"


def test_export_offers_no_proof_start_but_the_genesis(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A bundle always carries every envelope from the genesis (its tree root is checked
    against the signed checkpoint): ``--chain-from`` is not offered, and not accepted."""
    from tests.test_cli import via_main

    code, out, _ = via_main(capsys, ["export", "--help"])
    assert code == 0 and "--chain-from" not in out
    code, _, err = via_main(capsys, ["export", "--chain-from", "selection", "out.zip"])
    assert code == 2 and "unrecognized arguments: --chain-from" in err
