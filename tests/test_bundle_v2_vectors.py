"""Bundle and proof vectors of format-2 archives (tests/vectors/bundle_v2/, bundle_v3/,
proof_v2/; FORMAT.md 22).

``tiny.zip`` is an export of one session of a real archive; ``tampered.zip`` the same with
one body changed and resealed by a forger who knows the format, caught by its salted digest.
``bundle_v2/`` holds bundles of version 2 (0.1's exporter): still verified as they were;
``bundle_v3/`` the version the exporter writes now (21.3).
Each is checked with and without the log key; ``turn.proof`` is a ``prove`` file of one turn.
The package and the four standalone files, run as a separate process, give the same reports.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from archive_provider.format import verifier

VECTORS = Path(__file__).parent / "vectors"
PROOFS = VECTORS / "proof_v2"
VERSIONS = {2: VECTORS / "bundle_v2", 3: VECTORS / "bundle_v3"}
#: failures derived from tiny.zip (make_bundles.py --derived): one per rule of 20.1, 20.2
#: step 4 and 21.4 a second verifier must name alike
DERIVED = {
    "duplicate-member": "duplicate_key",
    "head-chain": "head_chain",
    "changed-member": "bundle_member",
}
CASES = [
    (version, name, keyed)
    for version in VERSIONS
    for name in ("tiny", "tampered", *(DERIVED if version == 3 else ()))
    for keyed in (True, False)
]


def vkey(folder: Path) -> str:
    return str(json.loads((folder / "keys.json").read_text())["log_vkey"])


def expected(folder: Path, name: str) -> dict[str, Any]:
    report: dict[str, Any] = json.loads((folder / f"{name}.expected.json").read_text())
    return report


def standalone(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    for name in ("verifier.py", "merkle.py", "signed_note.py", "tlog_proof.py"):
        shutil.copy(Path(verifier.__file__).with_name(name), tmp_path / name)
    done = subprocess.run(
        [sys.executable, "-I", str(tmp_path / "verifier.py"), *args, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_vectors_say_what_they_are_for(version: int) -> None:
    bundles = VERSIONS[version]
    with zipfile.ZipFile(bundles / "tiny.zip") as archive:
        manifest = json.loads(archive.read("manifest.json"))
        assert manifest["bundle_version"] == version
        assert ("payloads.bin" in archive.namelist()) == (version == 3)
    assert expected(bundles, "tiny")["authenticity"] == "verified"
    assert expected(bundles, "tiny.unkeyed")["authenticity"] == "not checked"
    tampered = expected(bundles, "tampered")
    assert (tampered["ok"], tampered["code"]) == (False, "payload_mismatch")
    assert expected(PROOFS, "turn")["ok"] is True


@pytest.mark.parametrize(("version", "name", "keyed"), CASES)
def test_bundles_report_what_the_vector_expects(
    version: int, name: str, keyed: bool, tmp_path: Path
) -> None:
    bundles = VERSIONS[version]
    want = expected(bundles, name + ("" if keyed else ".unkeyed"))
    key = vkey(bundles) if keyed else None
    assert verifier.verify_bundle(bundles / f"{name}.zip", vkey=key).as_dict() == want
    code, report = standalone(
        tmp_path, "bundle", str(bundles / f"{name}.zip"), *(("--key", key) if key else ())
    )
    assert report == want and code == (0 if want["ok"] else 1)


def test_the_derived_vectors_say_what_they_are_for() -> None:
    for name, code in DERIVED.items():
        for suffix in ("", ".unkeyed"):
            report = expected(VERSIONS[3], name + suffix)
            assert (report["ok"], report["code"]) == (False, code)
    proof = expected(PROOFS, "no-final-newline")
    assert (proof["ok"], proof["code"]) == (False, "proof_format")


def test_a_proof_without_its_final_newline_reports_what_the_vector_expects(tmp_path: Path) -> None:
    want = expected(PROOFS, "no-final-newline")
    key = vkey(PROOFS)
    assert verifier.verify_proof(PROOFS / "no-final-newline.proof", key).as_dict() == want
    code, report = standalone(
        tmp_path, "proof", str(PROOFS / "no-final-newline.proof"), "--key", key
    )
    assert code == 1 and report == want


def test_the_proof_reports_what_the_vector_expects(tmp_path: Path) -> None:
    want = expected(PROOFS, "turn")
    key = vkey(PROOFS)
    assert verifier.verify_proof(PROOFS / "turn.proof", key).as_dict() == want
    code, report = standalone(tmp_path, "proof", str(PROOFS / "turn.proof"), "--key", key)
    assert code == 0 and report == want
