"""The audit CLI through both doors (``hermes-archive`` and ``hermes archive``) on a real archive.

The archive is built by driving :class:`ArchiveProvider` the way Hermes does: turns, memory
writes, a checkpoint, a session switch, a recall. Every command runs through
``cli.main``, through a subprocess, and through the hermes door (a hermes-like parser with
``register_cli`` and ``archive_command``), in human and JSON form; the doors must agree.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from archive_provider import ArchiveProvider
from archive_provider.cli import archive_command, main, register_cli
from archive_provider.commands import CommandContext
from archive_provider.domain.builders import session_ended
from archive_provider.storage.store import EventStore, archive_dir

REPO = Path(__file__).resolve().parents[1]
HERMES_ARCHIVE = REPO / ".venv" / "bin" / "hermes-archive"


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def build_archive(home: Path) -> None:
    """Drive the provider through every hook an audit looks at; the log ends up with 11 events."""
    provider = ArchiveProvider()
    provider.initialize("sess-1", hermes_home=str(home), platform="cli", agent_context="primary")
    first = [user("My cat is called Ziggy"), assistant("Ziggy is a fine name for a cat.")]
    provider.on_turn_start(1, first[0]["content"])
    provider.sync_turn(
        first[0]["content"], first[1]["content"], session_id="sess-1", messages=first
    )
    provider.on_memory_write(
        "add",
        "user",
        "Owns a cat named Ziggy",
        {"write_origin": "assistant_tool", "session_id": "sess-1"},
    )
    provider.on_memory_write(
        "replace",
        "user",
        "Owns a tabby cat named Ziggy",
        {"write_origin": "assistant_tool", "old_text": "cat named Ziggy"},
    )
    second = [
        *first,
        user("A blue heron sat by the river"),
        assistant("Herons are patient hunters."),
    ]
    provider.on_turn_start(2, second[2]["content"])
    provider.sync_turn(
        second[2]["content"], second[3]["content"], session_id="sess-1", messages=second
    )
    assert "4 messages" in provider.on_pre_compress(second, require_checkpoint=True)
    provider.on_session_switch("sess-2", parent_session_id="sess-1", reason="compression")
    assert "Ziggy" in provider.prefetch("what is my cat called", session_id="sess-2")
    third = [user("Remind me about the heron"), assistant("It was blue, by the river.")]
    provider.sync_turn(
        third[0]["content"], third[1]["content"], session_id="sess-2", messages=third
    )
    provider.on_memory_write(
        "remove", "user", "", {"write_origin": "assistant_tool", "old_text": "tabby"}
    )
    provider.shutdown()


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cli") / "home"
    build_archive(folder)
    return folder


@pytest.fixture
def copy_home(home: Path, tmp_path: Path) -> Path:
    """A private copy of the archive, for tests that damage it."""
    target = tmp_path / "copy"
    shutil.copytree(home, target)
    return target


def rows(home: Path, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{archive_dir(home) / 'events.db'}?mode=ro", uri=True)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


# -- the three ways in --------------------------------------------------------------------


def via_main(capsys: pytest.CaptureFixture[str], args: Sequence[str]) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def via_hermes(capsys: pytest.CaptureFixture[str], args: Sequence[str]) -> tuple[int, str, str]:
    """``hermes archive ...``: hermes' parser gets a subparser that register_cli fills."""
    parser = argparse.ArgumentParser(prog="hermes")
    commands = parser.add_subparsers(dest="command")
    register_cli(commands.add_parser("archive", help="archive provider commands"))
    try:
        namespace = parser.parse_args(["archive", *args])
        code = namespace.func(namespace)
    except SystemExit as exc:  # archive_command raises for non-zero codes, argparse for usage
        code = exc.code
    captured = capsys.readouterr()
    return int(code or 0), captured.out, captured.err


def via_process(args: Sequence[str]) -> tuple[int, str, str]:
    command = (
        [str(HERMES_ARCHIVE)]
        if HERMES_ARCHIVE.exists()
        else [sys.executable, "-m", "archive_provider.cli"]
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=120, env=env, cwd=REPO
    )
    return done.returncode, done.stdout, done.stderr


def doors(capsys: pytest.CaptureFixture[str], args: Sequence[str]) -> tuple[int, str, str]:
    """Run in-process through both doors, insist they agree, return the result."""
    first = via_main(capsys, args)
    second = via_hermes(capsys, args)
    usage = second[2].replace("hermes archive", "hermes-archive")  # argparse names the program
    assert (second[0], _stable(second[1]), usage) == (first[0], _stable(first[1]), first[2]), args
    return first


def run_json(capsys: pytest.CaptureFixture[str], home: Path, *args: str) -> tuple[int, Any]:
    code, out, err = doors(capsys, ["--home", str(home), "--json", *args])
    assert "Traceback" not in err
    return code, json.loads(out)


def run_text(capsys: pytest.CaptureFixture[str], home: Path, *args: str) -> tuple[int, str, str]:
    code, out, err = doors(capsys, ["--home", str(home), *args])
    assert "Traceback" not in err
    return code, out, err


# -- every command, every door ----------------------------------------------------------


def command_lines(home: Path, tmp: Path) -> list[list[str]]:
    """One invocation of every command (export writes a fresh file each time it runs)."""
    checkpoint = rows(home, "SELECT seq, time FROM events WHERE type = 'checkpoint'")[0]
    return [
        ["status"],
        ["log", "--type", "turn"],
        ["show", "2"],
        ["verify"],
        ["verify", "--projections"],
        ["replay"],
        ["search", "heron"],
        ["as-of", str(checkpoint[0]), "--session", "sess-2"],
        ["as-of", checkpoint[1]],
        ["history", "ziggy"],
        ["export", "--session", "sess-2", str(tmp / "bundle.zip"), "--force"],
        ["verify-bundle", str(tmp / "bundle.zip")],
    ]


def _stable(output: str) -> str:
    """Export output minus what differs between two exports (creation time, hence seal and size)."""
    try:
        data = json.loads(output)
    except ValueError:
        return "\n".join(
            line for line in output.splitlines() if not line.startswith(("Wrote", "Seal"))
        )
    if isinstance(data, dict) and "seal" in data:
        data = {k: v for k, v in data.items() if k not in ("seal", "bytes")}
    return json.dumps(data)


@pytest.mark.parametrize("as_json", [False, True], ids=["human", "json"])
def test_every_command_agrees_across_the_three_doors(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    for line in command_lines(home, tmp_path):
        args = ["--home", str(home), *(["--json"] if as_json else []), *line]
        code, out, err = doors(capsys, args)
        assert code == 0, (line, out, err)
        assert out.strip() and not err, (line, err)
        if as_json:
            json.loads(out)
        process = via_process(args)
        assert process[0] == 0 and process[2] == "", (line, process)
        assert _stable(process[1]) == _stable(out), line


def test_global_options_work_before_and_after_the_command(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = doors(capsys, ["--home", str(home), "--json", "status"])
    after = doors(capsys, ["status", "--json", "--home", str(home)])
    assert before == after and before[0] == 0


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = via_main(capsys, ["--help"])
    assert code == 0
    for name in (
        "status",
        "log",
        "show",
        "verify",
        "replay",
        "search",
        "as-of",
        "history",
        "export",
        "verify-bundle",
    ):
        assert name in out


def test_no_command_runs_status_in_both_doors(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``hermes archive`` alone shows the status, as Hermes' own plugin CLIs do."""
    bare = doors(capsys, ["--home", str(home)])
    assert bare == doors(capsys, ["--home", str(home), "status"])
    assert bare[0] == 0 and bare[1].startswith(f"Archive: {archive_dir(home)}")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from archive_provider import __version__

    code, out, _ = doors(capsys, ["--version"])
    assert (code, out) == (0, f"hermes-archive {__version__}\n")


# -- what each command says ------------------------------------------------------------------


def test_status_reports_the_head_an_auditor_writes_down(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, data = run_json(capsys, home, "status")
    last_seq, last_chain = rows(home, "SELECT seq, chain FROM events_v ORDER BY seq DESC LIMIT 1")[
        0
    ]
    assert code == 0 and data["exists"] is True
    assert data["head"] == {"seq": last_seq, "chain": last_chain} and data["events"] == last_seq
    assert data["events_by_type"]["memory_write"] == 3 and data["checkpoints"] == 1
    assert data["sessions"] == 2
    assert (
        all(p["current"] for p in data["projections"].values()) and "memory" in data["projections"]
    )
    _, text, _ = run_text(capsys, home, "status")
    assert f"Head: seq {last_seq} chain {last_chain}" in text


def test_status_without_an_archive_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, data = run_json(capsys, tmp_path, "status")
    assert code == 1 and data["exists"] is False  # AUDIT.md: no archive is exit 1


def test_log_lists_oldest_first_with_summaries(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, events = run_json(capsys, home, "log", "--limit", "0")
    assert code == 0
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    types = [e["type"] for e in events]
    first = 1  # a log begins with store_created
    assert types[:first] == ["store_created"]
    assert types[first : first + 3] == ["session_started", "turn", "memory_write"]
    assert "checkpoint" in types
    turn = events[first + 1]
    assert 'user: "My cat is called Ziggy"' in turn["summary"]
    _, text, _ = run_text(capsys, home, "log")
    assert text.splitlines()[-1].split()[0] == str(events[-1]["seq"])  # the newest is the last line


def test_log_filters(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, everything = run_json(capsys, home, "log", "--limit", "0")
    _, turns = run_json(capsys, home, "log", "--type", "turn", "--type", "checkpoint")
    assert {e["type"] for e in turns} == {"turn", "checkpoint"} and len(turns) == 4
    _, second = run_json(capsys, home, "log", "--session", "sess-2")
    assert second and {e["session"] for e in second} == {"sess-2"}
    _, last_two = run_json(capsys, home, "log", "--limit", "2")
    assert [e["seq"] for e in last_two] == [e["seq"] for e in everything[-2:]]
    middle = everything[4]["time"]
    _, since = run_json(capsys, home, "log", "--since", middle, "--limit", "0")
    _, until = run_json(capsys, home, "log", "--until", middle, "--limit", "0")
    assert all(e["time"] >= middle for e in since) and all(e["time"] <= middle for e in until)
    assert len(since) + len(until) == len(everything) + sum(e["time"] == middle for e in everything)


def test_log_exit_codes(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, events = run_json(capsys, home, "log", "--session", "no-such-session")
    assert code == 1 and events == []
    code, _, err = run_text(capsys, home, "log", "--type", "no_such_type")
    assert code == 2 and "unknown event type" in err
    code, _, err = run_text(capsys, home, "log", "--since", "last tuesday")
    assert code == 2 and "ISO 8601" in err


def test_search_limit_must_be_positive(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """0 results is no search: refused as a usage error, like a negative limit."""
    code, _, err = run_text(capsys, home, "search", "Ziggy", "--limit", "0")
    assert code == 2 and "from 1 to" in err
    code, data = run_json(capsys, home, "search", "Ziggy", "--limit", "1")
    assert code == 0 and len(data["results"]) == 1


def test_show_by_seq_decodes_payload_and_parts(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seq, chain = rows(home, "SELECT seq, chain FROM events_v WHERE type = 'turn' ORDER BY seq")[0]
    code, data = run_json(capsys, home, "show", str(seq))
    (event,) = data["events"]
    assert code == 0 and event["type"] == "turn" and event["chain"] == chain
    listed = event["payload"].get("messages")  # v1 lists them; v2: the parts (FORMAT 13.4)
    assert listed is None or listed == [p["digest"] for p in event["parts"]]
    assert [p["value"] for p in event["parts"]] == [
        user("My cat is called Ziggy"),
        assistant("Ziggy is a fine name for a cat."),
    ]
    _, text, _ = run_text(capsys, home, "show", str(seq))
    assert '"content": "My cat is called Ziggy"' in text and f"chain     {chain}" in text


def test_show_by_identity_and_payload_prefix(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seq, identity, payload = rows(
        home,
        "SELECT seq, identity, payload FROM events_v WHERE type = 'memory_write' ORDER BY seq",
    )[0]
    for ref in (identity[:10], identity.upper()[:12], payload[:10], payload):
        code, data = run_json(capsys, home, "show", ref)
        assert code == 0 and [e["seq"] for e in data["events"]] == [seq], ref


def test_show_prefix_rules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two digests under one prefix are refused; a number is a seq before it is a prefix."""
    store = EventStore.open(archive_dir(tmp_path))
    store.append([session_ended(f"s{i}", at=f"t{i}", message_count=0) for i in range(800)])
    store.close()
    identities = [r[0] for r in rows(tmp_path, "SELECT identity FROM events_v")]
    by_prefix: dict[str, int] = {}
    for digest in identities:
        by_prefix[digest[:4]] = by_prefix.get(digest[:4], 0) + 1
    crowded = next(prefix for prefix, count in by_prefix.items() if count > 1)  # birthday bound
    code, _, err = run_text(capsys, tmp_path, "show", crowded)
    assert code == 2 and "give more digits" in err
    code, _, err = run_text(capsys, tmp_path, "show", "abc")
    assert code == 2 and "neither" in err
    numeric = next(d for d in identities if d[:6].isdigit())  # about one digest in sixteen
    code, data = run_json(capsys, tmp_path, "show", numeric[:6])
    assert code == 0 and [e["identity"] for e in data["events"]] == [numeric]
    code, data = run_json(capsys, tmp_path, "show", "800")  # an existing seq wins
    assert code == 0 and [e["seq"] for e in data["events"]] == [800]
    code, data = run_json(capsys, tmp_path, "show", "99999999999999999")
    assert code == 1 and data == {"ok": False, "error": "no event matches '99999999999999999'"}
    code, _, err = run_text(capsys, tmp_path, "show", "ffffffffffffffff0000")
    assert code == 1 and "no event matches" in err


def test_verify_passes_and_names_the_first_bad_event(
    copy_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, data = run_json(capsys, copy_home, "verify")
    assert code == 0 and data["ok"] and data["log"]["events_checked"] == data["log"]["last_seq"]
    conn = sqlite3.connect(archive_dir(copy_home) / "events.db")
    conn.execute("DROP TRIGGER events_no_update")
    conn.execute("UPDATE events SET session = 'forged' WHERE seq = 5")
    conn.commit()
    conn.close()
    code, data = run_json(capsys, copy_home, "verify")
    assert code == 1 and data["log"]["first_bad_seq"] == 5
    assert "identity" in data["log"]["problem"]  # the session is in the identity
    code, text, _ = run_text(capsys, copy_home, "verify")
    assert code == 1 and text.startswith("FAILED at seq 5")


def test_verify_projections_catches_a_doctored_projection_and_replay_repairs_it(
    copy_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, data = run_json(capsys, copy_home, "verify", "--projections")
    assert code == 0 and data["projections"]["ok"] and data["projections"]["mismatched"] == []
    conn = sqlite3.connect(archive_dir(copy_home) / "events.db")
    conn.execute("UPDATE memory_history SET before = 'something else' WHERE action = 'replace'")
    conn.commit()
    conn.close()
    code, data = run_json(capsys, copy_home, "verify", "--projections")
    assert code == 1 and data["log"]["ok"] and data["projections"]["mismatched"] == ["memory"]
    code, text, _ = run_text(capsys, copy_home, "verify", "--projections")
    assert "projection memory DIFFERS" in text
    code, data = run_json(capsys, copy_home, "replay")
    assert code == 0 and data["events_replayed"] > 0 and "memory" in data["projections"]
    code, data = run_json(capsys, copy_home, "verify", "--projections")
    assert code == 0 and data["ok"]


def test_replay_refuses_while_this_process_writes(
    copy_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    provider = ArchiveProvider()
    provider.initialize("sess-9", hermes_home=str(copy_home))
    try:
        code, data = run_json(capsys, copy_home, "replay")
    finally:
        provider.shutdown()
    assert code == 1 and "this process is writing" in data["error"]


def test_search_finds_archived_text(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, data = run_json(capsys, home, "search", "blue", "heron")
    assert code == 0 and data["query"] == "blue heron"
    assert any("heron" in hit["text"].lower() for hit in data["results"])
    _, only_two = run_json(capsys, home, "search", "heron", "--session", "sess-2")
    assert only_two["results"] and {hit["session"] for hit in only_two["results"]} == {"sess-2"}
    code, data = run_json(capsys, home, "search", "xylophone")
    assert code == 1 and data["results"] == []


def test_as_of_shows_memory_lineage_and_recalls(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    add, replace, remove = rows(
        home, "SELECT seq FROM events WHERE type = 'memory_write' ORDER BY seq"
    )
    _, at_add = run_json(capsys, home, "as-of", str(add[0]))
    assert at_add["memory"] == {"user": ["Owns a cat named Ziggy"]}
    _, at_replace = run_json(capsys, home, "as-of", str(replace[0]), "--session", "sess-2")
    assert (
        at_replace["memory"] == {"user": ["Owns a tabby cat named Ziggy"]}
        and at_replace["recalls"] == []
    )
    _, now = run_json(capsys, home, "as-of", str(remove[0]), "--session", "sess-2")
    assert now["memory"].get("user", []) == []
    assert [link["parent"] for link in now["lineage"]] == ["sess-1"]
    assert len(now["recalls"]) == 1 and "what is my cat called" in now["recalls"][0]["query"]
    time_of_add = rows(home, "SELECT time FROM events WHERE seq = ?", add)[0][0]
    _, by_time = run_json(capsys, home, "as-of", time_of_add)
    assert by_time["seq"] >= add[0] and by_time["time"] >= time_of_add
    _, before_everything = run_json(capsys, home, "as-of", "2000-01-01")
    assert before_everything["seq"] == 0 and before_everything["memory"] == {}
    _, text, _ = run_text(capsys, home, "as-of", str(remove[0]), "--session", "sess-2")
    assert "lineage: sess-2 <- sess-1" in text
    code, _, err = run_text(capsys, home, "as-of", "99999")
    assert code == 1 and "outside the log" in err
    code, _, err = run_text(capsys, home, "as-of", "soon")
    assert code == 2


def test_history_follows_an_entry_through_its_edits(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, data = run_json(capsys, home, "history", "ZIGGY")
    (entry,) = data["entries"]
    assert code == 0 and entry["target"] == "user" and entry["current"] is None
    actions = [(c["action"], c["before"], c["after"]) for c in entry["changes"]]
    assert actions == [
        ("add", None, "Owns a cat named Ziggy"),
        ("replace", "Owns a cat named Ziggy", "Owns a tabby cat named Ziggy"),
        ("remove", "Owns a tabby cat named Ziggy", None),
    ]
    assert entry["changes"][1]["metadata"] == {
        "write_origin": "assistant_tool",
        "old_text": "cat named Ziggy",
    }
    assert [c["session"] for c in entry["changes"]] == ["sess-1", "sess-1", "sess-2"]
    _, text, _ = run_text(capsys, home, "history", "tabby")  # a later wording finds the whole entry
    assert 'added "Owns a cat named Ziggy"' in text and "origin: " in text
    code, data = run_json(capsys, home, "history", "ziggy", "--target", "memory")
    assert code == 1 and data["entries"] == []


def test_errors_are_clean_in_every_door(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere"
    for command in (
        ["log"],
        ["show", "1"],
        ["verify"],
        ["search", "x"],
        ["as-of", "1"],
        ["history", "x"],
        ["replay"],
        ["export", str(tmp_path / "out.zip")],
        ["report", str(tmp_path / "out.html")],
        ["key"],
        ["migrate"],
    ):
        code, out, err = doors(capsys, ["--home", str(missing), *command])
        assert code == 1 and out == "" and err.startswith("error: no archive at"), command
        code, out, err = doors(capsys, ["--home", str(missing), "--json", *command])
        assert code == 1 and json.loads(out)["ok"] is False and err == "", command
    code, out, err = via_process(["--home", str(missing), "verify"])
    assert code == 1 and "no archive at" in err and "Traceback" not in err


def test_a_corrupt_database_is_a_clean_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = archive_dir(tmp_path)
    folder.mkdir(parents=True)
    (folder / "events.db").write_bytes(b"this is not a database" * 100)
    (folder / "payload.key").write_text("00" * 32)
    code, out, err = via_process(["--home", str(tmp_path), "log"])
    assert code == 1 and err.startswith("error: ") and "Traceback" not in err


def test_progress_draws_only_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    quiet, terminal = io.StringIO(), Terminal()
    for stream in (quiet, terminal):
        ctx = CommandContext(Path("."), False, argparse.Namespace(), out=io.StringIO(), err=stream)
        with ctx.progress("verify", 10) as update:
            update(5)
    assert quiet.getvalue() == ""
    assert "verify [###############...............] 5/10" in terminal.getvalue()


def test_hermes_door_raises_system_exit_with_the_code(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="hermes")
    register_cli(parser.add_subparsers().add_parser("archive"))
    namespace = parser.parse_args(["archive", "--home", str(tmp_path), "log"])
    assert namespace.func is archive_command
    with pytest.raises(SystemExit) as exited:
        archive_command(namespace)
    assert exited.value.code == 1


@pytest.mark.parametrize(
    "args",
    [
        ["--home", "~no-such-user-anywhere", "status"],
        ["--home", "", "status"],
        ["log", "--since", "0001-01-01T00:00:00+01:00"],
        ["search", "x", "--until", "9999-12-31T23:59:59-01:00"],
        ["log", "--limit", "9223372036854775808"],
        ["show", "zz"],
    ],
    ids=[
        "unknown-user-home",
        "empty-home",
        "since-before-year-1",
        "until-after-9999",
        "huge-limit",
        "bad-ref",
    ],
)
def test_odd_arguments_are_usage_errors_in_every_door(
    home: Path, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    full = args if args[0] == "--home" else ["--home", str(home), *args]
    code, out, err = doors(capsys, full)
    assert code == 2 and out == "" and "Traceback" not in err and "error" in err
    code, out, err = doors(capsys, ["--json", *full])
    assert code == 2 and "Traceback" not in err
    if args[0] in ("--home", "show"):  # errors after argparse are JSON on stdout under --json
        assert json.loads(out) == {"ok": False, "error": json.loads(out)["error"], "usage": True}


def test_times_before_year_1000_keep_sorting_as_text() -> None:
    from datetime import datetime, timezone

    from archive_provider.domain.clock import format_time

    early = format_time(datetime(999, 1, 1, tzinfo=timezone.utc))
    assert early == "0999-01-01T00:00:00.000000Z"
    assert early < format_time(datetime(2026, 1, 1, tzinfo=timezone.utc))


def test_json_output_is_utf8_whatever_the_argument(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A non-UTF-8 argument arrives as a lone surrogate; --json must still be valid UTF-8."""
    code, out, _ = doors(capsys, ["--home", str(home), "--json", "search", "zebra \udcff"])
    out.encode("utf-8")
    assert json.loads(out)["query"] == "zebra \udcff"


def test_export_never_replaces_what_is_not_a_regular_file(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bundle lands by rename: a link or a pipe at OUT would be destroyed, not written."""
    link = tmp_path / "link.zip"
    link.symlink_to(tmp_path / "nowhere.zip")
    pipe = tmp_path / "pipe.zip"
    os.mkfifo(pipe)
    for out, extra in ((link, []), (link, ["--force"]), (pipe, ["--force"])):
        code, _, err = doors(capsys, ["--home", str(home), "export", str(out), *extra])
        assert code == 2 and "not a regular file" in err
    assert link.is_symlink() and not (tmp_path / "nowhere.zip").exists()
    assert pipe.is_fifo()


def test_a_damaged_archive_fails_export_with_its_own_message(
    copy_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conn = sqlite3.connect(archive_dir(copy_home) / "events.db")
    conn.execute("DROP TRIGGER payloads_erase_only")
    conn.execute(
        "UPDATE payloads SET body = CAST('{\"tampered\":1}' AS BLOB) "
        "WHERE digest = (SELECT payload FROM events WHERE seq = 1)"
    )
    conn.commit()
    conn.close()
    out = tmp_path / "bundle.zip"
    code, stdout, err = doors(capsys, ["--home", str(copy_home), "export", str(out)])
    assert code == 1 and err.startswith("error: the export failed its own verification")
    assert "unexpected" not in err and not out.exists()


def test_install_names_a_broken_config_yaml_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("memory: {provider: honcho,\n  broken: [\n")
    code, _, err = doors(capsys, ["--home", str(tmp_path), "install", "--activate"])
    assert code == 1 and err.count("\n") == 1 and "config.yaml is not valid YAML" in err
    assert config.read_text() == "memory: {provider: honcho,\n  broken: [\n"


def test_witness_show_without_archive_or_witness_claims_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = doors(capsys, ["--home", str(tmp_path / "none"), "witness", "show"])
    assert code == 0 and out.rstrip().endswith("ok: nothing to compare yet (no witnessed head)")
    assert "holds the witnessed head" not in out


# -- one exit-code rule (docs/AUDIT.md section 2) -----------------------------------------

OK, PROBLEM, USAGE = 0, 1, 2
EXIT_CODES: list[tuple[list[str], int]] = [
    # 0: the command did its work and found what was asked
    ([], OK),
    (["status"], OK),
    (["log"], OK),
    (["show", "1"], OK),
    (["as-of", "1"], OK),
    (["as-of", "2000-01-01"], OK),  # before the first event: a true, empty answer
    (["history", "ziggy"], OK),
    (["history", "ziggy", "--target", "user"], OK),
    (["search", "heron"], OK),
    (["verify"], OK),
    (["export", "--force", "{tmp}/out.zip"], OK),  # --force: both doors write it
    (["readable-copy", "--force", "{tmp}/copy.db"], OK),
    # 1: the data says no: nothing matched, not in the log, no archive, a failed check
    (["show", "999"], PROBLEM),
    (["as-of", "999"], PROBLEM),
    (["history", "no such words anywhere"], PROBLEM),
    (["search", "qqqzzzxxx"], PROBLEM),
    (["log", "--session", "no-such-session"], PROBLEM),
    (["verify-bundle", "{tmp}/missing.zip"], PROBLEM),
    (["export", "/nonexistent/dir/x.zip"], PROBLEM),
    (["readable-copy", "/nonexistent/dir/c.db"], PROBLEM),
    (["--home", "{tmp}/nowhere", "status"], PROBLEM),
    (["--home", "{tmp}/nowhere"], PROBLEM),
    (["--home", "{tmp}/nowhere", "show", "1"], PROBLEM),
    # 2: the command line is wrong: fix it, whatever the archive holds
    (["no-such-command"], USAGE),
    (["show", "xyz"], USAGE),
    (["as-of", "soon"], USAGE),
    (["history", "ziggy", "--target", "bogus"], USAGE),
    (["log", "--type", "bogus"], USAGE),
    (["log", "--limit", "-1"], USAGE),
    (["export", "--since", "2026-12-02", "--until", "2026-12-01", "{tmp}/y.zip"], USAGE),
    (["log", "--since", "2026-12-02", "--until", "2026-12-01"], USAGE),
    (["verify", "--key", "garbage"], USAGE),  # not a verifier key: not "verification failed"
    (["verify", "--witness-key", "garbage"], USAGE),
]


@pytest.mark.parametrize(
    ("args", "expected"), EXIT_CODES, ids=[" ".join(a) or "(none)" for a, _ in EXIT_CODES]
)
def test_every_command_follows_the_one_exit_code_rule(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], expected: int
) -> None:
    line = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "--home" not in line:
        line = ["--home", str(home), *line]
    code, out, err = doors(capsys, line)
    assert code == expected, (line, out, err)
    assert "Traceback" not in err and (out or err)


def test_an_unknown_history_target_lists_the_known_ones(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_text(capsys, home, "history", "ziggy", "--target", "bogus")
    assert (code, out) == (2, "")
    assert err == "error: --target 'bogus' is not a memory target; known: memory, user\n"


def test_export_names_the_path_the_user_gave(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_text(capsys, home, "export", "/nonexistent/dir/x.zip")
    assert code == 1 and err == "error: No such file or directory: /nonexistent/dir/x.zip\n"


def test_export_verify_and_verify_bundle_count_payloads_alike(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One definition (FORMAT.md 7.2): distinct payload digests, payloads and parts alike,
    each counted once however many events name it. Two turns share a part: store_created's
    body, the two turn bodies and the part are four."""
    from archive_provider.format.events import NewEvent

    store = EventStore.open(archive_dir(tmp_path))
    try:
        note = store.hasher.part({"role": "user", "content": "same words"})
        store.append(
            [NewEvent("turn", "s1", {"turn": n}, {"same": "body"}, (note,)) for n in (1, 2)]
        )
    finally:
        store.close()
    code, exported = run_json(capsys, tmp_path, "export", "--force", str(tmp_path / "all.zip"))
    assert code == 0
    code, verified = run_json(capsys, tmp_path, "verify")
    assert code == 0
    code, bundle = run_json(capsys, tmp_path, "verify-bundle", str(tmp_path / "all.zip"))
    assert code == 0
    counts = (
        exported["payloads"],
        verified["log"]["payloads_checked"],
        bundle["bundle"]["payloads_checked"],
    )
    assert counts == (4, 4, 4)
