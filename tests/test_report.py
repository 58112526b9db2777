"""The audit report (``hermes-archive report``): the reducer from events to the report model
(pure, no archive), the page's escaping, and the command on a real format-v2 archive with
hostile strings, an erasure, a hold and a retention policy."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time

from archive_provider.audit import erasure
from archive_provider.audit import report as report_module
from archive_provider.audit.erasure import Scope
from archive_provider.audit.report import (
    ReportReducer,
    category_of,
    fact_of,
    render_html,
    script_json,
)
from archive_provider.cli import main
from archive_provider.domain import builders
from tests.conftest import open_v2

#: a session name, author and message that would run script if any reached the page as HTML
HOSTILE = '</script><script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
HOSTILE_SESSION = "s-" + HOSTILE + "\u2028<!--"
SECRET = "Zorblax Quimby lives at 42 Wallaby Way"


def build_archive(home: Path) -> dict[str, Any]:
    """A v2 archive over three days: a hostile session (name, author, text), a quiet one
    that recalls from it, memory writes, checkpoints, a hold, a retention policy and an
    erasure of a third session's secret. Returns the seqs the tests look for (and the
    store's id and verifier key)."""
    with freeze_time("2026-11-01T09:00:00Z"):  # its store_created event
        store = open_v2(home / "archive")
    seqs: dict[str, Any] = {}
    try:
        hostile_author = {"id": HOSTILE, "name": HOSTILE, "is_bot": False}
        with freeze_time("2026-11-01T09:15:00Z"):
            store.append([builders.session_started(HOSTILE_SESSION, at="t0", details={})])
            parts = [store.hasher.part({"role": "user", "content": HOSTILE})]
            (appended,) = store.append(
                [
                    builders.turn(
                        store.hasher,
                        HOSTILE_SESSION,
                        1,
                        parts,
                        start=0,
                        legacy=False,
                        author=hostile_author,
                    )
                ]
            )
            seqs["hostile_turn"] = appended.seq
            store.append(
                [
                    builders.memory_write(
                        store.hasher, HOSTILE_SESSION, 1, "add", "memory", HOSTILE, {}
                    )
                ]
            )
            store.append(
                [
                    builders.checkpoint(
                        store.hasher,
                        HOSTILE_SESSION,
                        parts,
                        parent_session="",
                        host_api_version=2,
                        require_checkpoint=False,
                        received=1,
                    )
                ]
            )
        with freeze_time("2026-11-02T14:30:00Z"):
            secret = [store.hasher.part({"role": "user", "content": SECRET})]
            store.append(
                [builders.turn(store.hasher, "s-secret", 1, secret, start=0, legacy=False)]
            )
            quiet = [store.hasher.part({"role": "user", "content": "what did we say"})]
            store.append([builders.turn(store.hasher, "s-quiet", 1, quiet, start=0, legacy=False)])
            (recall,) = store.append(
                [
                    builders.recall_served(
                        store.hasher,
                        "s-quiet",
                        turn=2,
                        query="hostile",
                        result="earlier text",
                        sources=[seqs["hostile_turn"]],
                        at="t1",
                    )
                ]
            )
            seqs["recall"] = recall.seq
        with freeze_time("2026-11-03T08:00:00Z"):
            hold = erasure.add_hold(store, {"session": "s-quiet"}, "litigation " + HOSTILE, "dpo")
            seqs["hold"] = hold
            seqs["retention"] = erasure.set_retention(store, 365, "policy", "dpo", confirmed=True)
            receipt = erasure.forget(
                store,
                Scope("session", {"session": "s-secret"}),
                reason="GDPR request",
                legal_basis="Art. 17 GDPR",
                who="dpo",
            )
            seqs["erasure"] = receipt.seq
        store.checkpoint()
        seqs["head"] = store.head().seq
        seqs["store_id"], seqs["vkey"] = store.store_id, store.vkey
    finally:
        store.close()
    return seqs


def page_data(page: str) -> dict[str, Any]:
    """The model embedded in a report page, as the page's script reads it."""
    found = re.search(
        r'<script type="application/json" id="report-data">(.*?)</script>', page, re.DOTALL
    )
    assert found is not None
    data: dict[str, Any] = json.loads(found.group(1))
    return data


# -- the reducer (pure) -------------------------------------------------------------------


def turn_fact(seq: int, time: str, session: str, author: str = "Ann <1>") -> Any:
    text = f"turn {seq} by {author}: 2 messages"
    return fact_of(seq, time, "turn", session, {"turn": seq}, text, author=author)


def test_the_reducer_counts_per_day_and_category_and_keeps_each_session() -> None:
    reducer = ReportReducer()
    reducer.add(turn_fact(1, "2026-11-01T10:00:00Z", "s1"))
    reducer.add(
        fact_of(
            2,
            "2026-11-01T11:00:00Z",
            "memory_write",
            "s1",
            {"action": "add", "target": "user"},
            'add user: "likes tea"',
            memory_content="likes tea",
        )
    )
    reducer.add(
        fact_of(
            3,
            "2026-11-02T10:00:00Z",
            "recall_served",
            "s2",
            {"turn": 4, "sources": [1]},
            'turn 4: query "tea", 1 sources',
            sources=((1, "s1"),),
        )
    )
    reducer.add(
        fact_of(4, "2026-11-02T10:01:00Z", "checkpoint", "s2", {"evidence": ["x"]}, "1 messages")
    )
    model = reducer.model(verification={"ok": True})
    assert model["verification"] == {"ok": True}
    assert model["timeline"]["days"] == [
        ["2026-11-01", {"turn": 1, "memory": 1}],
        ["2026-11-02", {"recall": 1, "checkpoint": 1}],
    ]
    assert [h for h, _ in model["timeline"]["hours"]] == [
        "2026-11-01T10",
        "2026-11-01T11",
        "2026-11-02T10",
    ]
    s2, s1 = model["sessions"]  # the most recently active first
    assert (s1["session"], s1["turns"], s1["memory_changes"]) == ("s1", 1, 1)
    assert s1["authors"] == [{"author": "Ann <1>", "turns": 1}]
    assert s1["memory"][0] == {
        "seq": 2,
        "time": "2026-11-01T11:00:00Z",
        "action": "add",
        "target": "user",
        "content": "likes tea",
    }
    assert s2["recall_list"][0]["sources"] == [{"seq": 1, "session": "s1"}]
    assert s2["checkpoint_list"][0]["seq"] == 4
    assert model["items"][2]["text"] == 'turn 4: query "tea", 1 sources'


def test_the_reducer_stays_bounded_and_says_what_it_left_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(report_module, "DETAIL_ITEMS", 10)
    monkeypatch.setattr(report_module, "SESSIONS", 3)
    monkeypatch.setattr(report_module, "HOUR_DAYS", 2)
    reducer = ReportReducer()
    seq = 0
    for day in range(1, 11):  # ten days, a session a day, 30 turns each
        for minute in range(30):
            seq += 1
            reducer.add(turn_fact(seq, f"2026-11-{day:02d}T{minute % 24:02d}:00:00Z", f"s{day}"))
    model = reducer.model()
    assert model["events"] == 300
    assert [i["seq"] for i in model["items"]] == list(range(291, 301))  # the newest 10
    assert [s["session"] for s in model["sessions"]] == ["s10", "s9", "s8"]
    assert model["sessions_total"] == 10
    assert len(model["timeline"]["days"]) == 10  # every day still counted
    assert sum(c["turn"] for _, c in model["timeline"]["days"]) == 300
    hours = [h for h, _ in model["timeline"]["hours"]]
    assert len(hours) <= (2 + 2) * 24 and hours[-1] == "2026-11-10T23"
    assert model["bounds"]["items"] == 10 and model["bounds"]["sessions"] == 3


def test_a_session_seen_again_after_eviction_is_marked_partial(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(report_module, "SESSIONS", 2)
    reducer = ReportReducer()
    for seq, session in enumerate(["a", "b", "c", "a"], start=1):
        reducer.add(turn_fact(seq, "2026-11-01T10:00:00Z", session))
    model = reducer.model()
    assert [(s["session"], s["partial"]) for s in model["sessions"]] == [
        ("a", True),
        ("c", False),
    ]
    assert model["sessions_total"] == 3


def test_huge_names_and_receipts_from_the_archive_are_cut() -> None:
    huge = "x" * 1_000_000
    reducer = ReportReducer()
    for seq in range(1, 4):  # the same huge session three times: one session, not three
        reducer.add(turn_fact(seq, "2026-11-01T10:00:00Z", huge + "tail", author=huge))
    reducer.add(
        fact_of(
            4,
            "2026-11-01T10:00:00Z",
            "legal_hold",
            "archive",
            {"hold": "H4", "selector": {"session": huge}, "reason": huge, "who": [huge] * 10_000},
            "hold H4 on " + huge,
        )
    )
    model = reducer.model()
    assert len(json.dumps(model)) < 200_000  # of some 10 GB given
    (session,) = model["sessions"]
    assert session["turns"] == 3 and len(session["session"]) == report_module.NAME_CHARS
    assert len(model["holds"][0]["who"]) == report_module.RECEIPT_ITEMS + 1  # "… 9900 more"
    assert max(len(item["text"]) for item in model["items"]) == report_module.TEXT_CHARS


def test_receipts_hold_counts_and_reasons_never_the_erased_digests() -> None:
    body = {
        "scope": {"kind": "session", "session": "s"},
        "reason": "retention",
        "legal_basis": "retention policy",
        "who": "retention",
        "digests": ["ab" * 32],
        "payloads": 3,
        "events": 2,
    }
    fact = fact_of(9, "2026-11-01T10:00:00Z", "erasure", "archive", body, "erasure (session)")
    assert category_of("erasure", body) == "retention"
    assert fact.receipt is not None and "digests" not in fact.receipt
    assert fact.receipt["payloads"] == 3
    reducer = ReportReducer()
    reducer.add(fact)
    model = reducer.model()
    assert model["erasures"][0]["legal_basis"] == "retention policy"
    assert "ab" * 32 not in json.dumps(model)
    assert model["sessions"] == []  # the store-level session is no conversation


# -- the page's escaping ------------------------------------------------------------------


def test_embedded_json_cannot_close_the_script_or_break_a_line() -> None:
    text = script_json({"s": HOSTILE_SESSION + "&\u2029"})
    assert not re.search(r"[<>&\u2028\u2029]", text)
    assert json.loads(text) == {"s": HOSTILE_SESSION + "&\u2029"}


def test_the_page_loads_nothing_and_runs_only_its_own_script() -> None:
    reducer = ReportReducer()
    reducer.add(turn_fact(1, "2026-11-01T10:00:00Z", HOSTILE_SESSION, author=HOSTILE))
    page = render_html(reducer.model(verification={"ok": True}))
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page)
    assert policy is not None
    assert "default-src 'none'" in policy.group(1)
    assert re.search(r"script-src 'sha256-[A-Za-z0-9+/=]+';", policy.group(1))
    assert "unsafe" not in policy.group(1)
    assert HOSTILE not in page and "window.__pwned" in page  # present, but only escaped
    assert page.count("<script") == 2  # the data block and the page's own script
    assert not re.search(r"(src|href)=\"(https?:)?//", page)
    assert page_data(page)["sessions"][0]["session"] == HOSTILE_SESSION
    assert "innerHTML" not in page and "insertAdjacentHTML" not in page


# -- the command on a real archive --------------------------------------------------------


@pytest.fixture
def archive(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    home = tmp_path / "home"
    return home, build_archive(home)


def test_the_report_of_a_real_archive(
    archive: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home, seqs = archive
    out = tmp_path / "report.html"
    with freeze_time("2026-11-04T12:00:00Z"):
        assert main(["--home", str(home), "--json", "report", str(out), "--key", seqs["vkey"]]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["ok"] is True and said["path"] == str(out)
    page = out.read_text("utf-8")
    data = page_data(page)
    assert data["generated"].startswith("2026-11-04T12:00:00")
    assert data["verification"]["ok"] is True
    assert data["verification"]["last_seq"] == seqs["head"]
    assert data["verification"]["warnings"] == []  # the signed checkpoints checked with the key
    assert data["checkpoint"]["size"] == seqs["head"]
    assert data["archive"]["head_seq"] == seqs["head"]
    assert [d for d, _ in data["timeline"]["days"]] == ["2026-11-01", "2026-11-02", "2026-11-03"]
    # per session: its turns and authors, memory, what was recalled into it and from where
    sessions = {s["session"]: s for s in data["sessions"]}
    hostile = sessions[HOSTILE_SESSION]
    assert hostile["turns"] == 1 and hostile["checkpoints"] == 1
    assert HOSTILE in hostile["authors"][0]["author"]
    assert hostile["memory"][0]["content"] == HOSTILE
    quiet = sessions["s-quiet"]
    assert quiet["recall_list"][0]["sources"] == [
        {"seq": seqs["hostile_turn"], "session": HOSTILE_SESSION}
    ]
    # the erasure's receipt, and none of what it erased
    (receipt,) = data["erasures"]
    assert receipt["seq"] == seqs["erasure"]
    assert (receipt["reason"], receipt["legal_basis"]) == ("GDPR request", "Art. 17 GDPR")
    assert receipt["scope"] == {"kind": "session", "session": "s-secret"}
    assert receipt["payloads"] >= 1
    assert SECRET not in page and "Zorblax" not in page
    (hold,) = data["holds"]
    assert hold["hold"] == seqs["hold"] and hold["released"] is None
    assert data["retention"][0]["days"] == 365
    assert data["retention"][0]["seq"] == seqs["retention"]
    assert HOSTILE not in page
    assert oct(out.stat().st_mode & 0o777) == "0o600"


def test_the_report_refuses_to_overwrite_without_force(
    archive: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    home, _ = archive
    out = tmp_path / "report.html"
    out.write_text("keep me")
    assert main(["--home", str(home), "report", str(out)]) == 2
    assert out.read_text() == "keep me"
    assert main(["--home", str(home), "report", str(out), "--force"]) == 0
    assert "report-data" in out.read_text()


def test_a_report_of_a_damaged_log_says_so_and_exits_1(
    archive: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    import sqlite3

    home, seqs = archive
    db = sqlite3.connect(home / "archive" / "events.db")
    db.execute("DROP TRIGGER IF EXISTS events_no_update")
    for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        db.execute(f'DROP TRIGGER "{name}"')
    db.execute("UPDATE events SET time = '2026-11-09T00:00:00Z' WHERE seq = ?", (seqs["recall"],))
    db.commit()
    db.close()
    out = tmp_path / "report.html"
    assert main(["--home", str(home), "report", str(out)]) == 1
    data = page_data(out.read_text("utf-8"))
    assert data["verification"]["ok"] is False
    assert data["verification"]["first_bad_seq"] == seqs["recall"]


def test_a_format_1_archive_is_refused_with_the_way_to_migrate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.conftest import v1_archive

    home = tmp_path / "home"
    v1_archive(home / "archive")
    out = tmp_path / "v1.html"
    assert main(["--home", str(home), "report", str(out)]) == 1
    assert "hermes-archive migrate" in capsys.readouterr().err and not out.exists()


def test_events_whose_body_was_erased_are_counted_and_shown_as_erased(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with freeze_time("2026-11-01T09:00:00Z"):
        store = open_v2(home / "archive")
        store.append([builders.session_started("s-gone", at="t0", details={"platform": SECRET})])
        store.append(
            [builders.memory_write(store.hasher, "s-gone", 1, "add", "memory", SECRET, {})]
        )
        store.append([builders.session_started("s-kept", at="t1", details={})])
        receipt = erasure.forget(
            store, Scope("session", {"session": "s-gone"}), reason="asked", who="dpo"
        )
        head = store.head().seq
    store.close()
    out = tmp_path / "erased.html"
    assert main(["--home", str(home), "report", str(out)]) == 0
    page = out.read_text("utf-8")
    data = page_data(page)
    assert data["events"] == head  # every event of the log, its body erased or not
    assert [i["seq"] for i in data["items"]] == list(range(1, head + 1))
    gone = {i["type"]: i["text"] for i in data["items"] if i["session"] == "s-gone"}
    assert gone == {
        "session_started": "session started: its body was erased",
        "memory_write": "memory write: its body was erased",
    }
    (session,) = (s for s in data["sessions"] if s["session"] == "s-gone")
    assert session["memory_changes"] == 1 and session["memory"][0]["content"] == "(erased)"
    assert data["erasures"][0]["seq"] == receipt.seq
    assert SECRET not in page
