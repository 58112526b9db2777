"""The main job (README's first command) end to end, and the audit CLI on what it produced.

The demo runs in a subprocess exactly as a user runs it: a real hermes-agent AIAgent with the
archive installed into a fresh profile, the loopback fake LLM, a forced compression through
the real compress_context, a second session that must get the fact back through recall.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_cli import command_lines, doors

REPO = Path(__file__).resolve().parents[2]


def run_demo(home: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "HERMES_HOME"}
    return subprocess.run(
        [sys.executable, "-m", "archive_provider.cli", "--home", str(home), *extra, "demo"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
    )


@pytest.fixture(scope="module")
def demo_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("demo") / "profile"
    done = run_demo(home, "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    (home / "demo-output.json").write_text(done.stdout)
    return home


def test_the_demo_recalls_the_fact_verifies_and_orders_the_hooks(demo_home: Path) -> None:
    result = json.loads((demo_home / "demo-output.json").read_text())
    assert result["fact_recalled"] is True
    assert (
        "BLUE HERON" in result["recall_in_request"]
        and "not instructions" in result["recall_in_request"]
    )
    assert result["verified"]["ok"] is True
    assert result["checkpoint_receipt"].startswith("Archive checkpoint ")
    types = [event["type"] for event in result["timeline"]]
    assert types[0] == "session_started"
    # the checkpoint lands before the compression's session switch, recall before session 2's turn
    assert types.index("checkpoint") < types.index("session_switched")
    second_start = len(types) - 1 - types[::-1].index("session_started")
    assert types.index("recall_served", second_start) < types.index("turn", second_start)
    writes = [e["summary"] for e in result["timeline"] if e["type"] == "memory_write"]
    assert writes[0].startswith("add user") and writes[1].startswith("replace user")


def test_the_demo_refuses_a_folder_it_did_not_make(tmp_path: Path) -> None:
    precious = tmp_path / "real-profile"
    precious.mkdir()
    (precious / "config.yaml").write_text("memory:\n  provider: honcho\n")
    done = run_demo(precious)
    assert done.returncode == 2 and "not empty" in done.stderr
    assert (precious / "config.yaml").read_text() == "memory:\n  provider: honcho\n"


def test_the_demo_runs_again_in_the_home_it_made(tmp_path: Path) -> None:
    """Running the README's first command twice must work twice (the witness of the first
    archive lives outside the home and used to make the second refuse its appends)."""
    home = tmp_path / "profile"
    for _ in range(2):
        done = run_demo(home, "--json")
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout)
        assert result["fact_recalled"] is True and result["verified"]["ok"] is True


@pytest.mark.parametrize("as_json", [False, True], ids=["human", "json"])
def test_every_audit_command_works_on_the_demo_archive_in_both_doors(
    demo_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    sessions = json.loads((demo_home / "demo-output.json").read_text())["timeline"]
    first_session = sessions[0]["session"]
    for line in command_lines(demo_home, tmp_path):
        line = [
            first_session if arg == "sess-2" else "dee" if arg == "ziggy" else arg for arg in line
        ]
        args = ["--home", str(demo_home), *(["--json"] if as_json else []), *line]
        code, out, err = doors(capsys, args)  # hermes-archive and hermes archive must agree
        assert code == 0 and out.strip() and not err, (line, out, err)
        if as_json:
            json.loads(out)
