"""Export bundles of a v2 archive (bundle version 3 since 0.2.0), verify-bundle --key, and proof files (FORMAT.md 21).

A v2 bundle carries no key: salts travel with bodies, the signed checkpoint and the
consistency proof from the bundle's head travel in the manifest. Its seal is a plain BLAKE3
anyone can recompute, so a forger who knows the format can reseal any change: only the
checkpoint's signature, checked with the archive's verifier key, says who wrote it.
"""

from __future__ import annotations

import base64
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from archive_provider.audit.export import Selection
from archive_provider.format import tlog_proof
from archive_provider.format.signed_note import Checkpoint, Signer, format_checkpoint, sign_note
from archive_provider.format.verifier import verify_bundle, verify_proof
from tests.conftest import verifier_key
from tests.test_bundle_v3 import envelopes, pack_envelopes, records
from tests.test_cli import run_json, via_main
from tests.test_export import export, members, reseal

FORMAT = Path(__file__).resolve().parents[1] / "archive_provider" / "format"
STANDALONE = ("verifier.py", "merkle.py", "signed_note.py", "tlog_proof.py")


def prove_cli(
    capsys: pytest.CaptureFixture[str], home: Path, *args: str
) -> tuple[int, dict[str, Any]]:
    """`prove` through one door (the file it writes may be written once)."""
    code, out, err = via_main(capsys, ["--home", str(home), "--json", "prove", *args])
    assert "Traceback" not in err
    return code, json.loads(out)


@pytest.fixture(scope="module")
def home(cli_home_v2: Path) -> Path:
    return cli_home_v2


@pytest.fixture(scope="module")
def vkey(cli_home_v2: Path) -> str:
    return verifier_key(cli_home_v2)


def test_a_v2_bundle_has_no_key_and_carries_the_signed_checkpoint(home: Path, vkey: str) -> None:
    bundle = export(home, home.parent / "all.zip")
    content = members(bundle)
    manifest = json.loads(content["manifest.json"])
    assert "payload.key" not in content and manifest["bundle_version"] == 3
    assert manifest["checkpoint"].startswith(f"hermes-archive.invalid/{manifest['store_id']}\n")
    assert manifest["consistency"] == [] and manifest["erased"] == 0
    _, digest, salt, body = records(content["payloads.bin"])[0]
    assert isinstance(salt, bytes) and tlog_proof.payload_digest(salt, body) == digest
    pinned = verify_bundle(bundle, vkey=vkey)
    assert pinned.ok and pinned.authenticity == "verified", pinned.problem
    assert pinned.events_checked == manifest["envelopes"] == manifest["head"]["seq"]
    alone = verify_bundle(bundle)
    assert alone.ok and alone.authenticity == "not checked"
    assert any(w.startswith("integrity only") for w in alone.warnings)


def test_verify_bundle_says_what_it_checked(
    home: Path, vkey: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = export(home, home.parent / "cli.zip", Selection(session="sess-2"))
    code, data = run_json(capsys, home, "verify-bundle", str(bundle), "--key", vkey)
    assert code == 0 and data["bundle"]["authenticity"] == "verified"
    assert data["archive"]["matches"] is True  # the head's chain is this archive's
    code, data = run_json(capsys, home, "verify-bundle", str(bundle))
    assert code == 0 and data["bundle"]["authenticity"] == "not checked"
    assert data["bundle"]["envelopes_only"] > 0  # events outside the session: chained only


def test_a_resealed_forgery_passes_integrity_and_fails_authenticity(
    home: Path, vkey: str, tmp_path: Path
) -> None:
    """The forger rewrites a turn, the chain, the root and the checkpoint, signed with a key of
    their own under the archive's name: the bundle is consistent, but not the archive's."""
    bundle = export(home, tmp_path / "forged.zip")
    forger = Signer.generate(vkey.split("+")[0])

    def forge(content: dict[str, bytes], manifest: dict[str, Any]) -> None:
        from archive_provider.format import merkle, verifier

        records = envelopes(content["envelopes.bin"])
        chain = verifier.blake3(verifier.V2_GENESIS + manifest["store_id"].encode()).digest()
        tree = merkle.CompactRange()
        for record in records:
            if record["type"] == "turn":
                record["time"] = "2000-01-01T00:00:00.000000Z"
            data = verifier.envelope_bytes_v2(
                record["seq"],
                record["time"],
                record["type"],
                record["session"],
                record["key"],
                record["identity"],
                record["payload"],
                b"".join(record["parts"]),
                record["author"],
            )
            chain = verifier.blake3(verifier.V2_CHAIN + chain + data).digest()
            record["chain"] = chain
            tree.append(merkle.leaf_hash(data))
        content["envelopes.bin"] = pack_envelopes(records)
        manifest["head"] = {"seq": tree.size, "chain": chain.hex(), "root": tree.root().hex()}
        text = format_checkpoint(Checkpoint(forger.name, tree.size, tree.root()))
        manifest["checkpoint"] = sign_note(text, [forger]).decode()

    reseal(bundle, forge)
    assert verify_bundle(bundle).ok  # integrity only: everything agrees with everything
    pinned = verify_bundle(bundle, vkey=vkey)
    assert not pinned.ok and pinned.authenticity == "failed"
    assert pinned.as_dict()["code"] == "checkpoint_signature"


def test_a_head_the_checkpoint_does_not_extend_is_refused(
    home: Path, vkey: str, tmp_path: Path
) -> None:
    bundle = export(home, tmp_path / "short.zip")

    def claim_a_later_checkpoint(content: dict[str, bytes], manifest: dict[str, Any]) -> None:
        manifest["consistency"] = [base64.b64encode(bytes(32)).decode()]

    reseal(bundle, claim_a_later_checkpoint)
    report = verify_bundle(bundle, vkey=vkey)
    assert not report.ok and report.as_dict()["code"] == "consistency"


def test_prove_writes_a_file_the_standalone_verifier_checks_offline(
    home: Path, vkey: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "turn.proof"
    code, data = prove_cli(capsys, home, "3", "--out", str(out))
    assert code == 0 and data["seqs"] == [3] and out.stat().st_mode & 0o077 == 0
    report = verify_proof(out, vkey)
    assert report.ok and report.authenticity == "verified", report.problem
    (event,) = report.details["events"]
    assert event["seq"] == 3 and event["type"] == "turn"
    assert any("My cat is called Ziggy" in body for body in event["disclosed"].values())
    # --only discloses fewer bodies: the others stay digests
    digest = next(d for d, body in event["disclosed"].items() if "Ziggy is a fine" in body)
    code, _ = prove_cli(capsys, home, "3", "--out", str(tmp_path / "one"), "--only", digest)
    (one,) = verify_proof(tmp_path / "one", vkey).details["events"]
    assert code == 0 and list(one["disclosed"]) == [digest]
    # a disclosed body changed by one character no longer proves anything
    forged = out.read_bytes().decode()
    extra_line = next(line for line in forged.splitlines() if line.startswith("extra "))
    extra = base64.b64decode(extra_line[6:]).replace(b"Ziggy", b"Zaggy")
    out.write_text(forged.replace(extra_line, "extra " + base64.b64encode(extra).decode()))
    bad = verify_proof(out, vkey)
    assert not bad.ok and "does not match its body and salt" in (bad.problem or "")


def test_the_standalone_files_check_a_proof_and_a_bundle_with_only_their_dependencies(
    home: Path, vkey: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A venv with the standard library, blake3 and cryptography, and the four copied files."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    pip = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        + ["blake3", "cryptography"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert pip.returncode == 0, pip.stderr
    alone = tmp_path / "auditor"
    alone.mkdir()
    for name in STANDALONE:
        shutil.copy(FORMAT / name, alone / name)
    assert prove_cli(capsys, home, "3", "5", "--out", str(alone / "p"))[0] == 0
    export(home, alone / "b.zip")

    def check(*args: str) -> tuple[int, dict[str, Any]]:
        done = subprocess.run(
            [str(python), "-I", "verifier.py", *args, "--json"],
            cwd=alone,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert "Traceback" not in done.stderr, done.stderr
        return done.returncode, json.loads(done.stdout)

    imports = subprocess.run([str(python), "-c", "import archive_provider"], cwd=alone)
    assert imports.returncode != 0  # only the copied files run
    code, report = check("p/3.proof", "--key", vkey)  # detected as a proof by its first line
    assert code == 0 and report["events_checked"] == 1 and report["authenticity"] == "verified"
    other = Signer.generate(vkey.split("+")[0]).vkey
    code, report = check("proof", "p/5.proof", "--key", other)
    assert code == 1 and not report["ok"]
    code, report = check("b.zip", "--key", vkey)
    assert code == 0 and report["authenticity"] == "verified"


def test_prove_writes_one_proof_per_file(
    home: Path, vkey: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A C2SP tlog-proof holds one proof: several seqs make a folder of files, each one
    document that stock parsers read whole (a concatenation made them fail on a signature)."""
    out = tmp_path / "proofs"
    code, data = prove_cli(capsys, home, "5", "3", "--out", str(out))
    assert code == 0 and data["paths"] == [str(out / "3.proof"), str(out / "5.proof")]
    for seq in (3, 5):
        text = (out / f"{seq}.proof").read_bytes()
        assert text.count(b"c2sp.org/tlog-proof@v1\n") == 1
        report = verify_proof(out / f"{seq}.proof", vkey)
        assert report.ok and report.last_seq == seq, report.problem
    assert prove_cli(capsys, home, "3", "5", "--out", str(out))[0] == 2  # not over a folder


def test_a_proof_line_stays_within_what_stock_parsers_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Go's bufio.Scanner stops at 64 KiB: a turn whose bodies make a longer extra line is
    refused with what to do; a file with such a line is refused by the reader too."""
    from archive_provider import ArchiveProvider

    home = tmp_path / "home"
    provider = ArchiveProvider()
    provider.initialize("big", hermes_home=str(home), platform="cli", agent_context="primary")
    big = "x" * 60_000  # two bodies of 60 kB: the line would be 160 kB of base64
    provider.sync_turn(big, big + "y", session_id="big")
    provider.shutdown()
    seq = int(
        sqlite3.connect(home / "archive" / "events.db")
        .execute("SELECT max(seq) FROM events WHERE type = 'turn'")
        .fetchone()[0]
    )
    code, data = prove_cli(capsys, home, str(seq), "--out", str(tmp_path / "big.proof"))
    assert code == 1 and "64 KiB" in data["error"] and "--only" in data["error"]
    assert not (tmp_path / "big.proof").exists()
    long_line = b"c2sp.org/tlog-proof@v1\nextra " + b"A" * tlog_proof.MAX_LINE + b"\nindex 0\n\n"
    with pytest.raises(tlog_proof.ProofFileError, match="stock parsers read at most"):
        tlog_proof.parse_tlog_proofs(long_line)


def test_verify_proof_checks_a_proof_file_from_the_cli(
    home: Path, vkey: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An auditor with the package installed checks a proof file without a second tool."""
    out = tmp_path / "turn.proof"
    assert prove_cli(capsys, home, "3", "--out", str(out))[0] == 0
    code, data = run_json(capsys, tmp_path / "nohome", "verify-proof", str(out), "--key", vkey)
    assert code == 0 and data["ok"] and data["proof"]["authenticity"] == "verified"
    assert data["proof"]["last_seq"] == 3
    other = Signer.generate(vkey.split("+")[0]).vkey
    code, data = run_json(capsys, tmp_path / "nohome", "verify-proof", str(out), "--key", other)
    assert code == 1 and data["proof"]["code"] == "checkpoint_signature"
