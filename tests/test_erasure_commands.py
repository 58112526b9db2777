"""The erasure commands say exactly what they will do (issue 31 point 3): the bounds of
``forget --since/--until`` are ``log``'s, a scope naming nothing is refused, a dry run under
a legal hold exits as the real run would, ``retention set`` refuses a period ``apply`` could
not compute, and receipts and prompts read as text (the legal basis included), never as
Python reprs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time

from archive_provider.audit import erasure
from archive_provider.storage.store import EventStore
from tests.test_erasure import fill, turn

AT = "2026-11-30T12:00:00Z"


def run(
    capsys: pytest.CaptureFixture[str], home: Path, *args: str, text: bool = False
) -> tuple[int, Any, str]:
    from archive_provider.cli import main

    code = main(["--home", str(home), *([] if text else ["--json"]), *args])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    if text:
        return code, captured.out, captured.err
    return code, json.loads(captured.out) if captured.out.strip() else None, captured.err


def test_forget_since_until_erases_what_log_lists_with_the_same_bounds(
    capsys: pytest.CaptureFixture[str], home: Path, store: EventStore
) -> None:
    with freeze_time(AT):  # every event at the same instant, as a bulk import writes them
        store.append([turn(store, "s1", k, [f"sentence number {k} of the batch"]) for k in (1, 2)])
    store.close()
    bounds = ("--since", AT, "--until", AT)
    code, listed, _ = run(capsys, home, "log", "--type", "turn", *bounds)
    assert code == 0 and len(listed) == 2
    code, data, _ = run(capsys, home, "forget", *bounds, "--reason", "r", "--yes")
    assert code == 0 and data["events"] == 2 and data["payloads"] == 2, data


def test_forget_of_a_session_or_event_not_in_the_archive_exits_1_and_says_so(
    capsys: pytest.CaptureFixture[str], home: Path, store: EventStore
) -> None:
    fill(store)
    store.close()
    for scope in (("--session", "s-typo"), ("--event", "999"), ("--event", "abcdef0123")):
        code, data, _ = run(capsys, home, "forget", *scope, "--reason", "r", "--yes")
        assert code == 1 and "in this archive" in data["error"], (scope, data)
    code, data, _ = run(capsys, home, "forget", "--session", "s-secret", "--reason", "r", "--yes")
    assert code == 0 and data["seq"]
    # erased, the session is still in the log: forgetting it again is not an error
    code, data, _ = run(capsys, home, "forget", "--session", "s-secret", "--reason", "r", "--yes")
    assert code == 0 and data["seq"] is None


def test_a_dry_run_under_a_legal_hold_exits_1_and_names_the_hold(
    capsys: pytest.CaptureFixture[str], home: Path, store: EventStore
) -> None:
    fill(store)
    hold = erasure.add_hold(store, {"session": "s-secret"}, "litigation 7", "counsel")
    store.close()
    scope = ("forget", "--session", "s-secret", "--reason", "r")
    code, data, _ = run(capsys, home, *scope, "--dry-run")
    assert code == 1 and data["ok"] is False and hold in data["error"], data
    assert data["held"][0]["hold"] == hold  # the receipt of what would be held still shows
    code, out, err = run(capsys, home, *scope, "--dry-run", text=True)
    assert code == 1 and hold in err and "litigation 7" in err
    code, real, _ = run(capsys, home, *scope, "--yes")
    assert code == 1 and hold in real["error"]


def test_retention_set_refuses_a_period_apply_cannot_compute(
    capsys: pytest.CaptureFixture[str], home: Path, store: EventStore
) -> None:
    fill(store)
    store.close()
    huge = str(2**63 - 1)
    for extra in ((), ("--dry-run",)):
        code, data, _ = run(
            capsys, home, "retention", "set", "--days", huge, "--reason", "r", "--yes", *extra
        )
        assert code == 1 and "1,000 years" in data["error"], data
    code, data, _ = run(capsys, home, "retention", "show")
    assert data["policy"] is None  # nothing was recorded
    code, data, _ = run(
        capsys, home, "retention", "set", "--days", "365250", "--reason", "r", "--yes"
    )
    assert code == 0
    code, data, _ = run(capsys, home, "retention", "apply", "--yes")
    assert code == 0 and data["erasures"] == []  # computed: nothing is that old


def test_receipts_and_erasures_read_as_text_with_the_legal_basis(
    capsys: pytest.CaptureFixture[str], home: Path, store: EventStore
) -> None:
    fill(store)
    store.close()
    basis = "GDPR Art. 17(1)(a)"
    code, out, _ = run(
        capsys,
        home,
        *("forget", "--session", "s-secret", "--reason", "request 12"),
        *("--legal-basis", basis, "--yes"),
        text=True,
    )
    assert code == 0 and "session s-secret" in out and basis in out
    code, listed, _ = run(capsys, home, "erasures", text=True)
    assert code == 0 and basis in listed and "session s-secret" in listed
    for shown in (out, listed):
        assert "{'" not in shown and "'kind'" not in shown, shown
    # the confirmation prompt off a terminal names the scope as text too
    code, data, _ = run(capsys, home, "forget", "--event", "3", "--reason", "r")  # s-keep
    assert code == 1 and "event seq 3" in data["error"] and "{'" not in data["error"], data
