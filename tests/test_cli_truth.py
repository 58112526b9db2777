"""What the CLI says is true, line by line: exit codes by the one rule, Ctrl-C named, no
Python in human output, files as private as their modes promise, shipping state from the
local head, recipes that work on what ``export`` writes, and proofs that say why no witness
cosigned them. Each test runs the real command on an archive the real provider wrote."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from archive_provider import ArchiveProvider
from archive_provider.cli import main
from archive_provider.commands.status import witness_lines
from archive_provider.fleet.ship import STATE_NAME, Shipper, describe_state, read_state
from archive_provider.format.signed_note import Signer
from archive_provider.storage.checkpoint_proof import cosigner
from archive_provider.storage.store import archive_dir
from archive_provider.storage.witness import Witness
from tests.test_cli import assistant, build_archive, user
from tests.test_witness_remote import WitnessProcess, keygen

REPO = Path(__file__).resolve().parents[1]
VERIFIER = REPO / "archive_provider" / "format" / "verifier.py"
#: a PostgreSQL target that refuses at once (nothing listens on port 1), never waited for
DEAD = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("truth") / "home"
    build_archive(folder)
    return folder


@pytest.fixture
def fresh(tmp_path: Path) -> Path:
    """An archive of its own, for commands that write to it."""
    folder = tmp_path / "home"
    build_archive(folder)
    return folder


# -- exit codes -----------------------------------------------------------------------------


def test_ctrl_c_says_interrupted_and_exits_130(tmp_path: Path) -> None:
    """A real SIGINT to a running ``hermes-archive`` (a witness serving until stopped)."""
    state = tmp_path / "witness"
    keygen(state, "w.example")
    served = WitnessProcess(state, [Signer.generate("log.example").vkey])
    served.proc.send_signal(signal.SIGINT)
    assert served.proc.wait(60) == 130
    err = served.stderr_path.read_text()
    assert err.strip().endswith("interrupted") and "Traceback" not in err


def test_the_standalone_verifier_says_interrupted_without_a_traceback(tmp_path: Path) -> None:
    """The verifier gets a real SIGINT while it reads the file it was given."""
    bundle = tmp_path / "b.zip"
    bundle.write_bytes(b"PK\x03\x04")
    child = (
        "import os, signal, sys\n"
        f"sys.path.insert(0, {str(VERIFIER.parent)!r})\n"
        "import verifier\n"
        "reads = verifier._read_regular_head\n"
        "def interrupted(path):\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    return reads(path)\n"
        "verifier._read_regular_head = interrupted\n"
        f"sys.exit(verifier.main([{str(bundle)!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip() == "interrupted"


def test_an_unknown_hold_is_an_ordinary_error(
    fresh: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "--home", str(fresh), "hold", "release", "H99", "--reason", "x")
    assert code == 1
    assert err.startswith("error: no legal hold H99") and "unexpected" not in err


def test_an_unreadable_db_url_is_named_once(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "--db", "not a url", "status")
    assert code == 1 and "an unreadable connection string" in err
    assert "((" not in err and "))" not in err


def test_the_missing_psycopg_hint_names_what_pip_can_install() -> None:
    child = (
        "import sys\n"
        "sys.modules['psycopg'] = None\n"
        "from archive_provider.fleet.central import CentralError, connect\n"
        "try:\n"
        "    connect('postgresql://x@127.0.0.1:1/y')\n"
        "except CentralError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", child],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'psycopg-pool>=3.2' 'psycopg[binary]>=3.2'" in done.stdout
    assert "hermes-archive[fleet]" not in done.stdout


# -- verification says what it did not check --------------------------------------------------


def test_text_verify_says_which_key_checked_the_signatures_or_that_none_did(
    home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, pinned, _ = run(capsys, "--home", str(home), "verify")
    assert code == 0 and "verified with the verifier key the local witness pinned" in pinned
    _, vkey, _ = run(capsys, "--home", str(home), "key")
    code, keyed, _ = run(capsys, "--home", str(home), "verify", "--key", vkey.strip())
    assert code == 0 and "verified with the verifier key given with --key" in keyed
    assert "not checked" not in keyed
    monkeypatch.setenv("ARCHIVE_WITNESS_DIR", str(tmp_path / "no-witness-here"))
    code, plain, _ = run(capsys, "--home", str(home), "verify")
    assert code == 0 and "signed checkpoints were not checked" in plain
    assert "signed checkpoints: verified" not in plain


# -- no Python in human output ----------------------------------------------------------------

#: what a dict or list repr, or JSON escaped inside a quoted string, looks like in a line
PYTHON = re.compile(r"\{'|': |\\\"|\bNone\b")


def test_log_summarises_store_witness_and_switch_events_as_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    provider = ArchiveProvider()
    provider.initialize("s1", hermes_home=str(home), platform="cli")
    messages = [user("a heron by the river"), assistant("a patient bird")]
    provider.sync_turn(messages[0]["content"], messages[1]["content"], messages=messages)
    provider.on_pre_compress(messages)
    provider.on_session_switch("s1", parent_session_id="s1", reason="compression")
    provider.shutdown()
    code, out, _ = run(capsys, "--home", str(home), "log", "--limit", "0")
    assert code == 0
    lines = {line.split()[3]: line for line in out.splitlines()}
    assert "archive created: store" in lines["store_created"]
    assert "witness accepted head seq" in lines["witness_accepted"]
    assert "same session id kept (compression)" in lines["session_switched"]
    assert "from s1" not in lines["session_switched"]
    for line in out.splitlines():
        assert not PYTHON.search(line), line


def test_holds_erasures_forget_and_retention_print_text(
    fresh: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    h = ["--home", str(fresh)]
    assert run(capsys, *h, "hold", "add", "--session", "sess-1", "--reason", "case 7")[0] == 0
    code, out, _ = run(capsys, *h, "hold", "list")
    assert code == 0 and "session=sess-1: case 7" in out and not PYTHON.search(out)
    # without a terminal and without --yes the question is asked in the error
    code, _, err = run(capsys, *h, "forget", "--session", "sess-2", "--reason", "request 12")
    assert code == 1 and "(session sess-2)" in err and not PYTHON.search(err)
    forgot = ["forget", "--session", "sess-2", "--reason", "request 12", "--yes"]
    code, out, _ = run(capsys, *h, *forgot)
    assert code == 0 and "scope: session sess-2" in out
    code, out, _ = run(capsys, *h, "erasures")
    assert code == 0 and "scope: session sess-2" in out and not PYTHON.search(out)
    assert run(capsys, *h, "retention", "show")[1].strip() == "retention: keep forever"


def test_a_witness_that_cosigned_nothing_is_said_so() -> None:
    row = {"name": "w.example", "behind": 12, "cosigned_size": None, "error": "unreachable"}
    (line,) = witness_lines({"remote_witnesses": [row]})
    assert "None" not in line and "nothing cosigned yet" in line


# -- files hold what their modes promise ------------------------------------------------------


def test_the_readable_copy_is_private(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "copy.db"
    previous = os.umask(0o022)
    try:
        assert run(capsys, "--home", str(home), "readable-copy", str(out))[0] == 0
    finally:
        os.umask(previous)
    for written in (out, out.with_name("copy.metadata.json")):
        assert written.exists()
        assert stat.S_IMODE(written.stat().st_mode) == 0o600, written


def test_the_shipping_state_is_private(fresh: Path) -> None:
    previous = os.umask(0o022)
    shipper = Shipper(archive_dir(fresh), DEAD)
    try:
        with pytest.raises(Exception):  # noqa: B017 (nothing listens: any refusal will do)
            shipper.ship_once()
    finally:
        shipper.close()
        os.umask(previous)
    state = archive_dir(fresh) / STATE_NAME
    assert stat.S_IMODE(state.stat().st_mode) == 0o600


# -- shipping state is true -------------------------------------------------------------------


def test_a_manual_ship_elsewhere_leaves_the_providers_shipping_state(
    fresh: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARCHIVE_SHIP_TO", DEAD)  # the provider's target: environment only
    shipper = Shipper(archive_dir(fresh), DEAD)  # the provider's own pass, failing
    try:
        with pytest.raises(Exception):  # noqa: B017
            shipper.ship_once()
    finally:
        shipper.close()
    recorded = read_state(archive_dir(fresh))
    assert recorded is not None and recorded["target"].endswith("user=nobody")
    other = "postgresql://auditor@127.0.0.1:1/none?connect_timeout=1"
    code, _, _ = run(capsys, "--home", str(fresh), "ship", "--to", other)
    assert code == 1
    assert read_state(archive_dir(fresh)) == recorded


def test_the_shipping_line_is_one_line_whatever_the_error() -> None:
    error = "connection failed: refused\n\tIs the server running on that host?"
    line = describe_state({"target": "host=db", "central_seq": 3, "last_error": error})
    assert "\n" not in line and "Is the server running" in line


# -- recipes that work -------------------------------------------------------------------------


def _by_hand_script() -> str:
    text = (REPO / "docs" / "AUDIT.md").read_text("utf-8")
    section = text.split("### By hand", 1)[1].split("\n## ", 1)[0]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize("selection", [[], ["--session", "sess-2"]], ids=["all", "session"])
def test_the_audit_by_hand_recipe_checks_what_export_writes(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], selection: list[str]
) -> None:
    bundle = tmp_path / "audit.zip"
    assert run(capsys, "--home", str(home), "export", *selection, str(bundle))[0] == 0
    script = tmp_path / "by_hand.py"
    script.write_text(_by_hand_script(), "utf-8")
    done = subprocess.run(
        [sys.executable, str(script), str(bundle)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    head = json.loads(zipfile.ZipFile(bundle).read("manifest.json"))["head"]
    assert f"head seq {head['seq']}: chain {head['chain']}" in done.stdout


def test_the_standalone_verifier_names_the_bundle_version_it_cannot_check(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = tmp_path / "audit.zip"
    assert run(capsys, "--home", str(home), "export", str(bundle))[0] == 0
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "verifier.py").write_bytes(VERIFIER.read_bytes())  # without merkle.py and kin
    done = subprocess.run(
        [sys.executable, str(alone / "verifier.py"), str(bundle)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert "cannot check a version-3 bundle" in done.stdout and "version-2" not in done.stdout


def test_prove_after_a_command_write_says_why_no_witness_cosigned(
    fresh: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    h = ["--home", str(fresh)]
    assert run(capsys, *h, "hold", "add", "--session", "sess-1", "--reason", "r")[0] == 0
    code, out, _ = run(capsys, *h, "--json", "status")
    head = json.loads(out)["head"]["seq"]
    code, out, _ = run(capsys, *h, "prove", str(head), "--out", str(tmp_path / "new.proof"))
    assert code == 0 and "note: no witness has cosigned a checkpoint that covers" in out
    # an event the provider wrote is proven with the checkpoint the local witness cosigned
    code, out, _ = run(capsys, *h, "--json", "prove", "3", "--out", str(tmp_path / "old.proof"))
    assert code == 0 and json.loads(out)["cosigned"] is True
    wkey = cosigner(Witness.for_home(fresh).directory).vkey
    _, vkey, _ = run(capsys, *h, "key")
    done = subprocess.run(
        [sys.executable, str(VERIFIER), "proof", str(tmp_path / "old.proof")]
        + ["--key", vkey.strip(), "--witness", wkey, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout
    assert json.loads(done.stdout)["checkpoint"]["cosigned_by"]
