"""Witness keys as the standard tools write and read them (issue 32 section 4): every witness
key printed, witness key files in the Ed25519 form Go's note signers read (type 0x01), and a
witness key accepted in either form C2SP allows (0x01 or 0x04)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from archive_provider.format.signed_note import (
    ALG_COSIGNATURE_V1,
    ALG_ED25519,
    Signer,
    Verifier,
    cosigner_verifier,
)
from archive_provider.storage.store import archive_dir
from archive_provider.witnesses.server import KEY_FILE, keygen, load_key
from tests.test_cli import build_archive, run_json, run_text


@pytest.fixture
def home(tmp_path: Path) -> Path:
    folder = tmp_path / "home"
    build_archive(folder)
    return folder


def test_witness_show_prints_the_local_witness_key_in_both_forms(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, data = run_json(capsys, home, "witness", "show")
    assert code == 0, data
    local = data["keys"]["local"]
    key = Verifier.from_vkey(local["vkey"])
    assert key.alg == ALG_COSIGNATURE_V1
    assert cosigner_verifier(local["ed25519_vkey"]).vkey == local["vkey"]
    assert Verifier.from_vkey(local["ed25519_vkey"]).alg == ALG_ED25519
    conn = sqlite3.connect(archive_dir(home) / "events.db")
    ids = {
        bytes(r[0])
        for r in conn.execute("SELECT key_id FROM cosignatures WHERE name = ?", (key.name,))
    }
    conn.close()
    assert ids == {key.key_id.to_bytes(4, "big")}  # the key printed is the one that cosigns
    code, text, _ = run_text(capsys, home, "witness", "show")
    assert f"Local witness key: {local['vkey']}" in text


def test_witness_key_files_are_in_the_form_go_signers_read(tmp_path: Path) -> None:
    """keygen writes the type 0x01 form (Go's note.NewSigner refuses 0x04) and the witness
    cosigns with the same key as type 0x04; a file of type 0x04 (written before) still loads."""
    made = keygen(tmp_path / "w", "w.example/witness")
    stored = Signer.from_private_key((tmp_path / "w" / KEY_FILE).read_text())
    assert stored.alg == ALG_ED25519 and made.alg == ALG_COSIGNATURE_V1
    assert stored.verifier.public_key == made.verifier.public_key
    assert load_key(tmp_path / "w").vkey == made.vkey
    old = tmp_path / "old"
    old.mkdir(mode=0o700)
    earlier = Signer.generate("w.example/old", ALG_COSIGNATURE_V1)
    (old / KEY_FILE).write_text(earlier.private_key + "\n")
    (old / KEY_FILE).chmod(0o600)
    assert load_key(old).vkey == earlier.vkey


def test_a_witness_key_in_either_form_checks_a_cosignature() -> None:
    witness = Signer.generate("w.example/witness", ALG_COSIGNATURE_V1)
    ed25519 = Verifier(witness.name, ALG_ED25519, witness.verifier.public_key).vkey
    assert cosigner_verifier(ed25519).vkey == cosigner_verifier(witness.vkey).vkey == witness.vkey


def test_checkpoint_prints_the_note_with_every_cosignature(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """FORMAT.md 15.5's `hermes-archive checkpoint [SIZE]`: a note C2SP tools read."""
    from archive_provider.format.signed_note import open_checkpoint

    _, key = run_json(capsys, home, "key")
    _, shown = run_json(capsys, home, "witness", "show")
    local = Verifier.from_vkey(shown["keys"]["local"]["vkey"])
    code, text, _ = run_text(capsys, home, "checkpoint")
    assert code == 0
    checkpoint, _, cosigned = open_checkpoint(text, Verifier.from_vkey(key["vkey"]), [local])
    assert [s.name for s in cosigned] == [local.name]
    code, data = run_json(capsys, home, "checkpoint", str(checkpoint.size))
    assert code == 0 and data["note"] == text
    code, data = run_json(capsys, home, "checkpoint", str(checkpoint.size + 1000))
    assert code == 1 and "no checkpoint is signed at size" in data["error"]
