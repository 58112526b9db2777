"""Export bundle test vectors (tests/vectors/bundles/): what a second verifier must report.

``tiny.zip`` is a partial export (3 envelopes, 1 selected event, 1 payload) that verifies;
``tampered.zip`` is the same bundle with its payload changed and resealed by a forger who
knows the format, which only the keyed payload digest catches, at seq 2. Each has the
report this implementation gives beside it; the package and the standalone verifier, run
as a separate process, must both give exactly that report.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from archive_provider.format import verifier

BUNDLES = Path(__file__).parent / "vectors" / "bundles"
NAMES = ("tiny", "tampered")


def expected(name: str) -> dict[str, object]:
    report: dict[str, object] = json.loads((BUNDLES / f"{name}.expected.json").read_text())
    return report


def test_the_vectors_say_what_they_are_for() -> None:
    assert expected("tiny")["ok"] is True
    tampered = expected("tampered")
    assert tampered["ok"] is False and tampered["first_bad_seq"] == 2


@pytest.mark.parametrize("name", NAMES)
def test_the_package_reports_what_the_vector_expects(name: str) -> None:
    assert verifier.verify_bundle(BUNDLES / f"{name}.zip").as_dict() == expected(name)


@pytest.mark.parametrize("name", NAMES)
def test_the_standalone_verifier_reports_what_the_vector_expects(name: str) -> None:
    done = subprocess.run(
        [sys.executable, verifier.__file__, "bundle", str(BUNDLES / f"{name}.zip"), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert json.loads(done.stdout) == expected(name), done.stderr
    assert done.returncode == (0 if expected(name)["ok"] else 1)
