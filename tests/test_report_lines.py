"""The audit report, ``log`` and ``show`` say the same line for the same event: one
summariser (``archive_provider/audit/summary.py``) behind both, on a real archive with a
turn, memory writes, a served recall echoed back in the next turn, and an erasure that
took a session's messages (parts) and its memory write (a whole body)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from archive_provider.audit import erasure
from archive_provider.audit.erasure import Scope
from archive_provider.cli import main
from archive_provider.domain import builders
from tests.conftest import open_v2
from tests.test_erasure_echoes import ASKED, SAID, served_in_new_session
from tests.test_provider import SYSTEM, flush
from tests.test_report import page_data


def cli_json(capsys: pytest.CaptureFixture[str], home: Path, *args: str) -> Any:
    assert main(["--home", str(home), "--json", *args]) == 0, args
    return json.loads(capsys.readouterr().out)


def test_the_report_and_log_and_show_say_the_same_line_for_each_event(
    make_provider: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    old = make_provider(home, session="s-old")
    old.on_memory_write("add", "memory", "the locker is behind the gym")
    flush(old)
    old.shutdown()
    new, served = served_in_new_session(make_provider, home)
    sent = ASKED + "\n\n" + served  # the recall handed back inside the next user message
    messages = [SYSTEM, {"role": "user", "content": ASKED, "api_content": sent}]
    new.sync_turn("", "", session_id="s-new", messages=messages)
    new.on_memory_write("add", "user", "keeps a locker")
    flush(new)
    new.shutdown()
    store = open_v2(home / "archive")
    try:
        erasure.forget(store, Scope("session", {"session": "s-old"}), reason="asked")
    finally:
        store.close()
    capsys.readouterr()

    out = tmp_path / "report.html"
    assert main(["--home", str(home), "report", str(out)]) == 0
    capsys.readouterr()
    reported = {item["seq"]: item["text"] for item in page_data(out.read_text("utf-8"))["items"]}
    logged = {e["seq"]: e["summary"] for e in cli_json(capsys, home, "log", "--limit", "0")}
    assert logged == reported  # every event, its body erased or not, in both
    for seq, line in reported.items():  # show too, an event whose body was erased included
        assert cli_json(capsys, home, "show", str(seq))["events"][0]["summary"] == line

    # what the lines say: each case the brief names is among them
    lines = "\n".join(logged.values())
    assert re.search(
        r'turn \d+ by .*: 2 messages; user: "Which locker .*" \[echoes recall seq', lines
    )
    assert re.search(r"turn \d+ by .*: 2 messages; \"\(erased at \S+ by seq \d+", lines)
    assert 'add user: "keeps a locker"' in lines
    assert "memory write: its body was erased" in lines
    assert "erasure (session):" in lines and "reason asked" in lines
    assert SAID not in lines and "PLUM-4417" not in lines


def test_show_of_an_event_whose_body_was_erased_shows_its_envelope(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    store = open_v2(home / "archive")
    try:
        (written,) = store.append(
            [builders.memory_write(store.hasher, "s-gone", 1, "add", "memory", "a secret", {})]
        )
        receipt = erasure.forget(store, Scope("session", {"session": "s-gone"}), reason="asked")
    finally:
        store.close()
    (shown,) = cli_json(capsys, home, "show", str(written.seq))["events"]
    assert shown["summary"] == "memory write: its body was erased"
    assert shown["erased"] == f"erased at {receipt.time} by seq {receipt.seq}: asked"
    assert shown["payload"] is None and shown["parts"] == [] and shown["chain"]
    assert main(["--home", str(home), "show", shown["identity"][:12]]) == 0
    out = capsys.readouterr().out
    assert f"(erased at {receipt.time} by seq {receipt.seq}: asked)" in out
    assert "a secret" not in out
