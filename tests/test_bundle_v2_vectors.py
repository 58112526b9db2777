"""Bundle-v2 and proof-v2 vectors (tests/vectors/bundle_v2/, proof_v2/; FORMAT.md 22).

``tiny.zip`` is a v2 export of one session of a real archive; ``tampered.zip`` the same with
one body changed and resealed by a forger who knows the format, caught by its salted digest.
Each is checked with and without the log key; ``turn.proof`` is a ``prove`` file of one turn.
The package and the four standalone files, run as a separate process, give the same reports.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from archive_provider.format import verifier

VECTORS = Path(__file__).parent / "vectors"
BUNDLES, PROOFS = VECTORS / "bundle_v2", VECTORS / "proof_v2"
VKEY = json.loads((BUNDLES / "keys.json").read_text())["log_vkey"]
CASES = [(name, keyed) for name in ("tiny", "tampered") for keyed in (True, False)]


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


def test_the_vectors_say_what_they_are_for() -> None:
    assert expected(BUNDLES, "tiny")["authenticity"] == "verified"
    assert expected(BUNDLES, "tiny.unkeyed")["authenticity"] == "not checked"
    tampered = expected(BUNDLES, "tampered")
    assert (tampered["ok"], tampered["code"]) == (False, "payload_mismatch")
    assert expected(PROOFS, "turn")["ok"] is True


@pytest.mark.parametrize(("name", "keyed"), CASES)
def test_bundles_report_what_the_vector_expects(name: str, keyed: bool, tmp_path: Path) -> None:
    want = expected(BUNDLES, name + ("" if keyed else ".unkeyed"))
    key = VKEY if keyed else None
    assert verifier.verify_bundle(BUNDLES / f"{name}.zip", vkey=key).as_dict() == want
    code, report = standalone(
        tmp_path, "bundle", str(BUNDLES / f"{name}.zip"), *(("--key", VKEY) if keyed else ())
    )
    assert report == want and code == (0 if want["ok"] else 1)


def test_the_proof_reports_what_the_vector_expects(tmp_path: Path) -> None:
    want = expected(PROOFS, "turn")
    assert verifier.verify_proof(PROOFS / "turn.proof", VKEY).as_dict() == want
    code, report = standalone(tmp_path, "proof", str(PROOFS / "turn.proof"), "--key", VKEY)
    assert code == 0 and report == want
