"""Erasure, legal holds and retention on real format-v2 archives (issue 16, FORMAT.md 12.4).

Every forget is checked where it matters: the raw bytes of every file under the profile,
the full-text index's vocabulary (fts5vocab), and a full verification.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time

from archive_provider.audit import erasure
from archive_provider.audit.erasure import Held, Scope
from archive_provider.domain import builders
from archive_provider.format.events import NewEvent
from archive_provider.format.verifier import verify_database
from archive_provider.projections.registry import default_projections
from archive_provider.storage.store import EventStore
from tests.conftest import open_v2

SECRET = "Zorblax Quimby lives at 42 Wallaby Way"
SECRET_TERM = "zorblax"
OTHER = "the weather in Lisbon is mild today"


def turn(
    store: EventStore,
    session: str,
    ordinal: int,
    texts: list[str],
    start: int = 0,
    author: dict[str, Any] | None = None,
) -> NewEvent:
    parts = [store.hasher.part({"role": "user", "content": t}) for t in texts]
    return builders.turn(
        store.hasher, session, ordinal, parts, start=start, legacy=False, author=author
    )


def checkpoint(
    store: EventStore,
    session: str,
    evidence: list[Any],
    parent_session: str = "",
    host_api_version: int = 2,
) -> NewEvent:
    """A pre-compress checkpoint of ``evidence`` (parts), as the host hands it over whole."""
    return builders.checkpoint(
        store.hasher,
        session,
        evidence,
        parent_session=parent_session,
        host_api_version=host_api_version,
        require_checkpoint=False,
        received=len(evidence),
    )


def fill(store: EventStore) -> None:
    """Two sessions: s-secret holds the secret, s-keep does not; a recall quotes the secret."""
    store.append([turn(store, "s-secret", 1, [SECRET, "hello there"])])
    store.append([turn(store, "s-keep", 1, [OTHER])])
    secret_seq = store.conn.execute(
        "SELECT max(seq) FROM events WHERE session = 's-secret'"
    ).fetchone()[0]
    store.append(
        [
            builders.recall_served(
                store.hasher,
                "s-keep",
                turn=2,
                query="where does he live",
                result=f"earlier: {SECRET}",
                sources=[secret_seq],
                at="t1",
            )
        ]
    )


def raw_hits(home: Path, text: str) -> list[str]:
    """Files under the profile whose bytes hold ``text`` (as UTF-8, or JSON-escaped)."""
    needles = {text.encode(), json.dumps(text)[1:-1].encode()}
    found = []
    for path in home.rglob("*"):
        if path.is_file() and any(n in path.read_bytes() for n in needles):
            found.append(str(path.relative_to(home)))
    return found


def fts_terms(store: EventStore) -> set[str]:
    terms = set()
    for (name,) in store.conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE '%USING fts5(%'"
    ).fetchall():
        store.conn.execute(
            f"CREATE VIRTUAL TABLE IF NOT EXISTS temp.v_{name} USING fts5vocab(main, {name}, 'row')"
        )
        terms |= {str(t) for (t,) in store.conn.execute(f"SELECT term FROM temp.v_{name}")}
    return terms


def assert_gone(home: Path, store: EventStore, text: str, term: str) -> None:
    """No byte, no token; the log verifies; the projections equal a rebuild from the log."""
    from archive_provider.audit.replay import verify_projections

    assert raw_hits(home, text) == []
    assert term not in fts_terms(store)
    report = verify_database(store.conn, store.key, vkey=store.vkey)
    assert report.ok, report.problem
    check = verify_projections(store.path.parent, scratch_dir=home.parent)
    assert check.ok, check.mismatched


def test_forget_a_session_leaves_no_byte_of_it_and_still_verifies(
    home: Path, store: EventStore
) -> None:
    fill(store)
    store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert raw_hits(home, SECRET)  # the test can see the text before
    assert SECRET_TERM in fts_terms(store)
    receipt = erasure.forget(
        store, Scope("session", {"session": "s-secret"}), reason="GDPR request", who="dpo"
    )
    # the turn's messages and the recall's result (quotes it); its query is the later
    # session's own words and stays (FORMAT.md 13.4)
    assert receipt.payloads == 3
    assert b"where does he live" in (home / "archive" / "events.db").read_bytes()
    assert receipt.seq is not None and receipt.checkpoint is not None
    assert int(receipt.checkpoint.split("\n")[1]) >= receipt.seq  # the size line covers it
    assert_gone(home, store, SECRET, SECRET_TERM)
    assert OTHER.encode() in (home / "archive" / "events.db").read_bytes()  # the rest stays
    report = verify_database(store.conn, store.key, vkey=store.vkey)
    assert report.payloads_erased == 3
    assert report.erasures == [{"seq": receipt.seq, "payloads": 3}]
    body = json.loads(
        store.payload(
            store.conn.execute(
                "SELECT lower(hex(payload)) FROM events WHERE seq = ?", (receipt.seq,)
            ).fetchone()[0]
        )
        or b"{}"
    )
    assert body["reason"] == "GDPR request" and body["payloads"] == 3
    assert SECRET not in json.dumps(body)


def test_forget_is_idempotent(home: Path, store: EventStore) -> None:
    fill(store)
    scope = Scope("session", {"session": "s-secret"})
    first = erasure.forget(store, scope, reason="r")
    again = erasure.forget(store, scope, reason="r")
    assert first.payloads == 3 and again.payloads == 0 and again.seq is None
    assert store.conn.execute("SELECT count(*) FROM events WHERE type = 'erasure'").fetchone() == (
        1,
    )


def test_forget_one_event_by_seq_and_by_digest_prefix(home: Path, store: EventStore) -> None:
    store.append([turn(store, "s1", 1, [SECRET])])
    store.append([turn(store, "s1", 2, [OTHER])])
    seq = store.conn.execute("SELECT max(seq) FROM events WHERE type = 'turn'").fetchone()[0]
    prefix = store.conn.execute(
        "SELECT lower(hex(identity)) FROM events WHERE seq = ?", (seq - 1,)
    ).fetchone()[0][:12]
    erasure.forget(store, Scope("event", {"digest": prefix}), reason="r")
    assert_gone(home, store, SECRET, SECRET_TERM)
    assert OTHER.encode() in (home / "archive" / "events.db").read_bytes()
    erasure.forget(store, Scope("event", {"seq": seq}), reason="r")
    assert_gone(home, store, OTHER, "lisbon")


def test_forget_a_time_range(home: Path, store: EventStore) -> None:
    with freeze_time("2026-01-01T00:00:00Z"):
        store.append([turn(store, "s1", 1, [SECRET])])
    with freeze_time("2026-03-01T00:00:00Z"):
        store.append([turn(store, "s1", 2, [OTHER])])
    with freeze_time("2026-03-02T00:00:00Z"):
        scope = Scope("time", {"since": "2025-12-31T00:00:00Z", "until": "2026-02-01T00:00:00Z"})
        erasure.forget(store, scope, reason="r")
    assert_gone(home, store, SECRET, SECRET_TERM)
    assert OTHER.encode() in (home / "archive" / "events.db").read_bytes()


def test_forget_an_author_erases_their_turns_and_the_author_payload(
    home: Path, store: EventStore
) -> None:
    alice = {"id": "u-alice-1234", "is_bot": False, "name": "Alice Longname"}
    bob = {"id": "u-bob", "is_bot": False, "name": "Bob"}
    store.append([turn(store, "s1", 1, [SECRET], author=alice)])
    store.append([turn(store, "s1", 2, [OTHER], start=1, author=bob)])
    erasure.forget(store, Scope("author", {"author": "u-alice-1234"}), reason="r")
    assert_gone(home, store, SECRET, SECRET_TERM)
    assert raw_hits(home, "Alice Longname") == []
    assert raw_hits(home, "u-alice-1234") == []  # not even in the erasure's own scope record
    assert OTHER.encode() in (home / "archive" / "events.db").read_bytes()


def test_forget_a_memory_entry_by_a_past_text_erases_every_version(
    home: Path, store: EventStore
) -> None:
    old, new = "user's passport number is X1234567", "user's passport number is Y7654321"
    store.append([builders.memory_write(store.hasher, "s1", 1, "add", "user", old, {})])
    store.append(
        [
            builders.memory_write(
                store.hasher, "s1", 2, "replace", "user", new, {"old_text": "X1234567"}
            )
        ]
    )
    store.append([builders.memory_write(store.hasher, "s1", 3, "add", "user", OTHER, {})])
    erasure.forget(store, Scope("memory", {"text": "X1234567"}), reason="r")
    # the replace's metadata named the old text: its body went too
    for text, term in ((old, "x1234567"), (new, "y7654321"), ("X1234567", "passport")):
        assert_gone(home, store, text, term)
    assert OTHER.encode() in (home / "archive" / "events.db").read_bytes()


def test_a_payload_erased_without_an_erasure_event_is_tampering(
    home: Path, store: EventStore
) -> None:
    fill(store)
    erasure.forget(store, Scope("session", {"session": "s-secret"}), reason="r")
    digest = store.conn.execute(
        "SELECT parts FROM events WHERE session = 's-keep' AND type = 'turn'"
    ).fetchone()[0][:32]
    conn = store.conn
    conn.execute("DROP TRIGGER payloads_erase_only")
    conn.execute(
        "UPDATE payloads SET salt = NULL, lookup = NULL, body = NULL WHERE digest = ?", (digest,)
    )
    report = verify_database(conn, store.key, vkey=store.vkey)
    assert not report.ok and report.code == "erased_without_erasure"


def test_a_legal_hold_blocks_forget_until_released(home: Path, store: EventStore) -> None:
    fill(store)
    hold = erasure.add_hold(store, {"session": "s-secret"}, "litigation 7", "counsel")
    scope = Scope("session", {"session": "s-secret"})
    with pytest.raises(Held, match=f"legal hold {hold}"):
        erasure.forget(store, scope, reason="r")
    assert raw_hits(home, SECRET)
    dry = erasure.forget(store, scope, reason="r", dry_run=True)
    assert dry.held and dry.held[0]["hold"] == hold and dry.payloads == 3
    erasure.release_hold(store, hold, "case closed", "counsel")
    erasure.forget(store, scope, reason="r")
    assert_gone(home, store, SECRET, SECRET_TERM)


def test_retention_erases_what_expired_skips_holds_and_shortening_needs_confirmation(
    home: Path, store: EventStore
) -> None:
    with freeze_time("2026-01-01T00:00:00Z"):
        store.append([turn(store, "old", 1, [SECRET])])
        store.append([turn(store, "held", 1, ["held text is kept for counsel"])])
    with freeze_time("2026-09-01T00:00:00Z"):
        store.append([turn(store, "new", 1, [OTHER])])
        with pytest.raises(erasure.ErasureError, match="confirm"):
            erasure.set_retention(store, 180, "policy", "ops", confirmed=False)
        erasure.set_retention(store, 180, "policy", "ops", confirmed=True)
        erasure.add_hold(store, {"session": "held"}, "audit", "counsel")
        dry = erasure.apply_retention(store, dry_run=True)
        assert dry and dry[0].dry_run and raw_hits(home, SECRET)
        done = erasure.apply_retention(store, batch=1)
    assert [r.reason for r in done if r.seq] == ["retention"]
    assert_gone(home, store, SECRET, SECRET_TERM)
    data = (home / "archive" / "events.db").read_bytes()
    assert b"held text is kept" in data and OTHER.encode() in data


def test_receipts_list_every_erasure_with_its_signed_checkpoint(store: EventStore) -> None:
    fill(store)
    erasure.forget(store, Scope("session", {"session": "s-secret"}), reason="one")
    erasure.forget(store, Scope("session", {"session": "s-keep"}), reason="two")
    listed = erasure.receipts(store)
    assert [r.reason for r in listed] == ["one", "two"]
    assert all(r.checkpoint and r.chain for r in listed)


CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from archive_provider.audit import erasure
    from archive_provider.projections.registry import default_projections
    from archive_provider.storage.store import EventStore

    where = sys.argv[2]
    real = getattr(erasure, where)
    def dying(*args, **kwargs):
        if where == "tombstone":
            real(*args, **kwargs)  # the rows are tombstoned; COMMIT has not run
        os.kill(os.getpid(), signal.SIGKILL)  # scrub: after COMMIT, before the WAL truncate
    setattr(erasure, where, dying)
    store = EventStore.open(sys.argv[1], projections=default_projections)
    erasure.forget(store, erasure.Scope("session", {"session": "s-secret"}), reason="r")
    """
)


@pytest.mark.parametrize("where", ["tombstone", "scrub"])
def test_sigkill_during_erasure_leaves_before_or_after_and_a_rerun_completes(
    home: Path, store: EventStore, where: str
) -> None:
    fill(store)
    folder = home / "archive"
    store.close()
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder), where], capture_output=True, timeout=120
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    again = open_v2(folder)
    try:
        erased = again.conn.execute("SELECT count(*) FROM erased").fetchone()[0]
        assert erased == (0 if where == "tombstone" else 3)  # before, or after: nothing between
        assert verify_database(again.conn, again.key, vkey=again.vkey).ok
        receipt = erasure.forget(again, Scope("session", {"session": "s-secret"}), reason="r")
        assert receipt.payloads == (3 if where == "tombstone" else 0)
        assert_gone(home, again, SECRET, SECRET_TERM)
        assert (
            again.conn.execute("SELECT count(*) FROM events WHERE type = 'erasure'").fetchone()[0]
            == 1
        )
    finally:
        again.close()
    assert os.path.exists(folder / "events.db")


# -- the commands ---------------------------------------------------------------------------


def cli(capsys: pytest.CaptureFixture[str], home: Path, *args: str) -> tuple[int, Any, str]:
    from archive_provider.cli import main

    code = main(["--home", str(home), "--json", *args])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, json.loads(captured.out) if captured.out.strip() else None, captured.err


def test_forget_command_needs_yes_off_a_terminal_and_dry_run_changes_nothing(
    capsys: pytest.CaptureFixture[str], home: Path, store: EventStore
) -> None:
    fill(store)
    store.close()
    code, data, _ = cli(capsys, home, "forget", "--session", "s-secret", "--reason", "r")
    assert code == 1 and "--yes" in data["error"]
    code, data, _ = cli(
        capsys, home, "forget", "--session", "s-secret", "--reason", "r", "--dry-run"
    )
    assert code == 0 and data["dry_run"] and data["payloads"] == 3
    assert raw_hits(home, SECRET)
    code, data, _ = cli(
        capsys, home, "forget", "--session", "s-secret", "--reason", "GDPR", "--yes"
    )
    assert code == 0 and data["seq"] and data["payloads"] == 3 and data["checkpoint"]
    assert raw_hits(home, SECRET) == []
    code, listed, _ = cli(capsys, home, "erasures")
    assert code == 0 and [e["seq"] for e in listed["erasures"]] == [data["seq"]]
    code, report, _ = cli(capsys, home, "verify")
    assert code == 0 and report["log"]["payloads_erased"] == 3
    assert report["log"]["erasures"] == [{"seq": data["seq"], "payloads": 3}]


def test_hold_commands_block_forget_with_the_hold_named(
    capsys: pytest.CaptureFixture[str], home: Path, store: EventStore
) -> None:
    fill(store)
    store.close()
    code, added, _ = cli(capsys, home, "hold", "add", "--session", "s-secret", "--reason", "case")
    assert code == 0
    code, data, _ = cli(capsys, home, "forget", "--session", "s-secret", "--reason", "r", "--yes")
    assert code == 1 and added["hold"] in data["error"]
    code, listed, _ = cli(capsys, home, "hold", "list")
    assert [h["hold"] for h in listed["holds"]] == [added["hold"]]
    code, _, _ = cli(capsys, home, "hold", "release", added["hold"], "--reason", "closed")
    assert code == 0
    code, data, _ = cli(capsys, home, "forget", "--session", "s-secret", "--reason", "r", "--yes")
    assert code == 0 and raw_hits(home, SECRET) == []


def test_retention_commands_record_an_event_and_apply(
    capsys: pytest.CaptureFixture[str], home: Path, store: EventStore
) -> None:
    with freeze_time("2026-01-01T00:00:00Z"):
        store.append([turn(store, "old", 1, [SECRET])])
    store.close()
    with freeze_time("2026-09-01T00:00:00Z"):
        code, data, _ = cli(capsys, home, "retention", "set", "--days", "180", "--reason", "p")
        assert code == 1 and "--yes" in data["error"]
        code, data, _ = cli(
            capsys, home, "retention", "set", "--days", "180", "--reason", "p", "--yes"
        )
        assert code == 0 and "EU AI Act" in data["note"]  # 180 < six months: said, not refused
        assert not [p for p in home.rglob("*") if "retention" in p.name]  # no policy file
        code, data, _ = cli(capsys, home, "retention", "apply", "--dry-run")
        assert code == 0 and raw_hits(home, SECRET)
        code, data, _ = cli(capsys, home, "retention", "apply", "--yes")
        assert code == 0 and [e["reason"] for e in data["erasures"]] == ["retention"]
    assert raw_hits(home, SECRET) == []


def test_show_log_and_verify_name_the_erased_slot_never_the_text(
    capsys: pytest.CaptureFixture[str], home: Path, store: EventStore
) -> None:
    from archive_provider.cli import main

    fill(store)
    receipt = erasure.forget(store, Scope("session", {"session": "s-secret"}), reason="GDPR")
    turn_seq = store.conn.execute(
        "SELECT seq FROM events WHERE session = 's-secret' AND type = 'turn'"
    ).fetchone()[0]
    store.close()
    views = (  # (args, exit code): nothing found is 1
        (["show", str(turn_seq)], 0),
        (["log"], 0),
        (["search", "Zorblax"], 1),
        (["verify"], 0),
        (["as-of", "2099-01-01T00:00:00Z", "--session", "s-keep"], 0),
        (["history", "Zorblax"], 1),
    )
    for args, code in views:
        assert main(["--home", str(home), *args]) == code, args
        out = capsys.readouterr().out
        assert SECRET not in out and "Zorblax" not in out.replace("'Zorblax'", "")
        if args[0] == "show":
            assert f"(erased at {receipt.time} by seq {receipt.seq}: GDPR)" in out
        if args[0] == "verify":
            assert f"erasure at seq {receipt.seq}: 3 payloads erased" in out
    code, data, _ = cli(capsys, home, "replay")
    assert code == 0
    assert raw_hits(home, SECRET) == []  # a rebuild from the log does not bring it back
    reopened = open_v2(home / "archive")
    try:
        assert SECRET_TERM not in fts_terms(reopened)
    finally:
        reopened.close()


def test_a_text_another_session_still_names_is_kept_unless_the_scope_says_shared(
    home: Path, store: EventStore
) -> None:
    both = "the shared sentence both sessions hold"
    store.append([turn(store, "a", 1, [SECRET, both])])
    store.append([turn(store, "b", 1, [both])])
    kept = erasure.forget(store, Scope("session", {"session": "a"}), reason="r")
    assert kept.payloads == 1 and kept.kept_shared == 1
    assert raw_hits(home, SECRET) == [] and raw_hits(home, both)
    gone = erasure.forget(store, Scope("session", {"session": "a", "shared": True}), reason="r")
    assert gone.payloads == 1 and gone.events == 2  # b's turn is touched: its part dangles
    assert_gone(home, store, both, "shared")
    body = json.loads(
        store.payload(
            store.conn.execute(
                "SELECT lower(hex(payload)) FROM events WHERE seq = ?", (gone.seq,)
            ).fetchone()[0]
        )
        or b"{}"
    )
    assert body["dangling"] == body["digests"]


def test_the_background_worker_applies_retention_in_batches_on_its_own_thread(
    home: Path, store: EventStore
) -> None:
    import threading

    with freeze_time("2026-01-01T00:00:00Z"):
        store.append([turn(store, "old", 1, [SECRET])])
        store.append([turn(store, "old", 2, ["another expired sentence here"], start=1)])
    with freeze_time("2026-09-01T00:00:00Z"):
        store.append([turn(store, "new", 1, [OTHER])])
        erasure.set_retention(store, 180, "policy", "ops", confirmed=True)
        store.close()
        worker = erasure.RetentionWorker(
            home / "archive",
            default_projections,
            lambda target, name, daemon: threading.Thread(target=target, name=name, daemon=daemon),
            pause_s=0.0,
            batch=1,
        ).start()
        try:
            assert worker.passed.wait(60)
        finally:
            worker.close()
    reopened = open_v2(home / "archive")
    try:
        assert_gone(home, reopened, SECRET, SECRET_TERM)
        assert_gone(home, reopened, "another expired sentence here", "expired")
        batches = [r.scope for r in erasure.receipts(reopened)]
        assert len(batches) == 2 and all(r["kind"] == "time" for r in batches)  # one per batch
    finally:
        reopened.close()
    assert OTHER.encode() in (home / "archive" / "events.db").read_bytes()


def test_every_new_event_matches_its_schema_and_holds_no_erased_text(
    home: Path, store: EventStore
) -> None:
    import jsonschema

    from archive_provider.host.schemas import load_event_schema
    from archive_provider.storage.store import iter_events

    fill(store)
    hold = erasure.add_hold(store, {"session": "s-keep"}, "case", "counsel")
    erasure.release_hold(store, hold, "closed", "counsel")
    erasure.set_retention(store, 365, "policy", "ops", confirmed=True)
    erasure.forget(store, Scope("session", {"session": "s-secret"}), reason="r", legal_basis="b")
    kinds = set()
    for event in iter_events(store.conn, types=sorted(erasure.RECORD_TYPES - {"store_created"})):
        jsonschema.validate(event.body, load_event_schema(event.type))
        assert SECRET not in json.dumps(event.body)
        kinds.add(event.type)
    assert kinds == {"erasure", "retention_policy", "legal_hold", "legal_hold_released"}


def test_the_standalone_verifier_alone_passes_an_erased_archive_and_fails_a_bare_tombstone(
    home: Path, store: EventStore, tmp_path: Path
) -> None:
    import shutil

    import archive_provider.format as fmt

    alone = tmp_path / "alone"
    alone.mkdir()
    for name in ("verifier.py", "merkle.py", "signed_note.py"):
        shutil.copy(Path(fmt.__file__).parent / name, alone / name)
    fill(store)
    receipt = erasure.forget(store, Scope("session", {"session": "s-secret"}), reason="r")
    vkey = store.vkey
    db = home / "archive" / "events.db"

    def standalone() -> dict[str, Any]:
        done = subprocess.run(
            [
                sys.executable,
                str(alone / "verifier.py"),
                "database",
                str(db),
                "--key",
                vkey,
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=alone,
        )
        return dict(json.loads(done.stdout))

    report = standalone()
    assert report["ok"] and report["payloads_erased"] == 3
    assert report["erasures"] == [{"seq": receipt.seq, "payloads": 3}]
    store.conn.execute("DROP TRIGGER payloads_erase_only")
    store.conn.execute(
        "UPDATE payloads SET salt = NULL, lookup = NULL, body = NULL WHERE digest = ("
        "SELECT substr(parts, 1, 32) FROM events WHERE session = 's-keep' AND type = 'turn')"
    )
    store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    report = standalone()
    assert not report["ok"] and report["code"] == "erased_without_erasure"


def test_the_recall_search_prefetch_and_archive_search_use_finds_nothing_erased(
    store: EventStore,
) -> None:
    from archive_provider.projections import recall

    fill(store)
    assert recall.search(store.conn, "Zorblax Quimby Wallaby")
    erasure.forget(store, Scope("session", {"session": "s-secret"}), reason="r")
    assert recall.search(store.conn, "Zorblax Quimby Wallaby") == []
    assert recall.search(store.conn, "weather Lisbon")  # the rest is still found


def test_no_tool_the_model_can_call_erases(make_provider: Any) -> None:
    """The model's tools read and message; erasing is an operator command only."""
    provider = make_provider()
    names = {schema["name"] for schema in provider.get_tool_schemas()}
    shipped = {p.stem for p in (Path(__file__).parent.parent / "schemas" / "tools").glob("*")}
    assert names and names <= shipped
    for name in names | shipped:
        assert not any(word in name for word in ("forget", "erase", "retention", "hold", "delete"))


def test_the_provider_applies_the_recorded_retention_policy_when_it_opens(
    home: Path, store: EventStore, make_provider: Any
) -> None:
    """Issue 16 point 4: retention runs at open, in the background, from the log's policy."""
    with freeze_time("2026-01-01T00:00:00Z"):
        store.append([turn(store, "old", 1, [SECRET])])
    with freeze_time("2026-09-01T00:00:00Z"):
        store.append([turn(store, "new", 1, [OTHER])])
        erasure.set_retention(store, 180, "policy", "ops", confirmed=True)
        store.close()
        provider = make_provider(home)
        retention = provider.core.retention
        assert retention is not None and retention.passed.wait(60)
        provider.shutdown()
    reopened = open_v2(home / "archive")
    try:
        assert_gone(home, reopened, SECRET, SECRET_TERM)
        assert [r.scope["kind"] for r in erasure.receipts(reopened)] == ["time"]
    finally:
        reopened.close()
    assert OTHER.encode() in (home / "archive" / "events.db").read_bytes()


def test_a_subagent_provider_applies_no_retention(home: Path, make_provider: Any) -> None:
    provider = make_provider(home, agent_context="subagent")
    assert provider.core.retention is None


def test_a_new_profile_logs_no_retention_warning(
    tmp_path: Path, make_provider: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The retention pass at open finds no archive yet on a new profile: nothing to say."""
    worker = erasure.RetentionWorker(
        tmp_path / "no-archive-yet",
        default_projections,
        lambda *a, **k: None,  # never started
    )
    with caplog.at_level("WARNING"):
        assert worker.run_once() == []
    assert not [r for r in caplog.records if "retention" in r.getMessage()]
