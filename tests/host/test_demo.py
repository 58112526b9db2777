"""The main job (README's first command) end to end, and the audit CLI on what it produced.

The demo runs in a subprocess exactly as a user runs it: a real hermes-agent AIAgent with the
archive installed into a fresh profile, the loopback fake LLM, a forced compression through
the real compress_context, a second session that must get the fact back through recall.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from archive_provider.format.events import NewEvent
from archive_provider.storage.store import EventStore
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
    assert types[types[0] == "store_created"] == "session_started"  # after v2's own first event
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
    assert len(done.stderr.strip().splitlines()) == 1
    assert (precious / "config.yaml").read_text() == "memory:\n  provider: honcho\n"


def user_demo(home: Path, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``hermes-archive demo`` as a user with HOME=``home`` runs it in ``cwd``, no --home."""
    environ = {k: v for k, v in os.environ.items() if k != "HERMES_HOME"}
    return subprocess.run(
        [sys.executable, "-m", "archive_provider.cli", "demo"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**environ, "HOME": str(home), **env},
    )


def tree(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def test_the_demo_never_touches_the_users_hermes_home(tmp_path: Path) -> None:
    """The issue's reproduction: a fresh Hermes install (an empty ~/.hermes), demo, real
    files added, demo again (now with HERMES_HOME set too): every user file survives, and
    the demo ran in ./demo-home both times."""
    home, work = tmp_path / "home", tmp_path / "work"
    hermes = home / ".hermes"
    hermes.mkdir(parents=True)
    work.mkdir()
    first = user_demo(home, work)
    assert first.returncode == 0, first.stderr[-3000:]
    assert list(hermes.iterdir()) == []  # the old demo made ~/.hermes its profile
    assert first.stdout.splitlines()[0].startswith(f"Demo folder: {work / 'demo-home'} ")
    assert (work / "demo-home" / "archive" / "events.db").exists()
    (hermes / "memories").mkdir()
    (hermes / "memories" / "NOTES.md").write_text("real memories\n")
    (hermes / "realstuff").mkdir()
    (hermes / "realstuff" / "f.txt").write_text("real stuff\n")
    before = tree(hermes)
    second = user_demo(home, work, HERMES_HOME=str(hermes))
    assert second.returncode == 0, second.stderr[-3000:]
    assert tree(hermes) == before
    assert "BLUE HERON" in second.stdout


def test_the_demo_says_what_is_true_in_words(tmp_path: Path) -> None:
    done = run_demo(tmp_path / "profile")
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "scripted stand-in LLM at http://127.0.0.1:" in out
    assert "8 messages archived (all already stored)" in out
    assert 'add user: "Name: Dana"' in out and ", 1 source\n" in out
    assert "reset: False" not in out and "1 sources" not in out and ": 'Name" not in out
    tail = out.rstrip("\n").splitlines()[-4:]
    assert tail[0] == "Try next:" and all(
        line.startswith(f"  hermes-archive --home {tmp_path / 'profile'} ") for line in tail[1:]
    )


def test_the_demo_refuses_a_demo_folder_holding_anything_it_did_not_write(
    demo_home: Path,
) -> None:
    """A user file, a changed file, or an archive holding events the demo did not write: the
    demo refuses with exit 2 and one line, and deletes nothing."""
    home = demo_home.parent / "copy"
    shutil.copytree(demo_home, home)
    (home / "demo-output.json").unlink()  # the fixture's own addition
    foreign = home / "memories" / "NOTES.md"
    foreign.write_text("mine\n")
    done = run_demo(home)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "NOTES.md was not made by the demo" in done.stderr
    assert foreign.read_text() == "mine\n" and (home / "archive" / "events.db").exists()
    foreign.unlink()

    config = home / "config.yaml"
    config.write_text(config.read_text() + "# my own note\n")
    done = run_demo(home)
    assert done.returncode == 2 and "config.yaml was not made by the demo" in done.stderr
    assert config.read_text().endswith("# my own note\n")
    config.unlink()

    store = EventStore.open(home / "archive", create=False)
    try:
        store.append([NewEvent("turn", "user-session", {"turn": 1}, {"turn": 1, "messages": []})])
    finally:
        store.close()
    done = run_demo(home)
    assert done.returncode == 2 and "holds events the demo did not write" in done.stderr
    assert (home / "archive" / "events.db").exists()


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


def test_the_demo_help_names_its_own_folder(capsys: pytest.CaptureFixture[str]) -> None:
    from archive_provider.cli import main

    assert main(["demo", "--help"]) == 0
    assert "./demo-home unless --home is given (never ~/.hermes or $HERMES_HOME)" in " ".join(
        capsys.readouterr().out.split()
    )
