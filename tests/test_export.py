"""Export bundles and their standalone verifier: what a bundle holds, proves, and refuses.

Three kinds of damage are covered: any single flipped bit (caught by the seal and the member
digests, and named), a forger who re-seals a bundle after changing it (caught by the chain,
payload and selection checks), and a consistent rewrite of the chain (which a bundle alone
cannot reveal: only comparing its head with the archive, or another record, does).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import stat
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from blake3 import blake3

from archive_provider.audit.export import Selection, export_bundle
from archive_provider.domain.builders import session_ended, session_started
from archive_provider.format import verifier
from archive_provider.format.verifier import (
    DOMAIN_CHAIN,
    DOMAIN_PAYLOAD,
    ENVELOPE_FIELDS,
    ENVELOPES,
    KEY_MEMBER,
    MANIFEST,
    PAYLOAD_PREFIX,
    envelope_bytes,
    envelope_line,
    seal_comment,
    seal_digest,
    verify_bundle,
)
from archive_provider.storage.store import EventStore, StoreError, archive_dir

from .conftest import archive_format
from .test_cli import REPO, build_archive, rows, run_json, via_main

# Bundle version 1 from a v1 archive (its manifest, keyed digests, payload.key); bundle v2 is in
# test_bundle_prove_v2.py and test_bundle_v2_vectors.py.
pytestmark = pytest.mark.usefixtures("v1_format")  # the module-scoped home: archive_format(1)

VERIFIER = Path(verifier.__file__)
ONLY_IN_SESSION_ONE = b"Herons are patient hunters."


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("export") / "home"
    with archive_format(1):
        build_archive(folder)
    return folder


def export(home: Path, out: Path, selection: Selection | None = None, **kwargs: Any) -> Path:
    store = EventStore.open(archive_dir(home), create=False, readonly=True)
    try:
        export_bundle(store, out, selection or Selection(), **kwargs)
    finally:
        store.close()
    return out


def members(bundle: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(bundle) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def envelopes(bundle: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in members(bundle)[ENVELOPES].splitlines()]


def referenced(home: Path, where: str = "1", args: tuple[Any, ...] = ()) -> set[str]:
    """Payload and part digests of the events matching ``where``."""
    found: set[str] = set()
    for payload, parts in rows(home, f"SELECT payload, parts FROM events WHERE {where}", args):
        found |= {payload, *json.loads(parts)}
    return found


def payload_members(bundle: Path) -> set[str]:
    return {
        name[len(PAYLOAD_PREFIX) :] for name in members(bundle) if name.startswith(PAYLOAD_PREFIX)
    }


# -- what a bundle holds -----------------------------------------------------------------


def test_a_full_export_holds_every_envelope_and_payload(home: Path, tmp_path: Path) -> None:
    bundle = export(home, tmp_path / "all.zip")
    report = verify_bundle(bundle)
    head_seq, head_chain = rows(home, "SELECT seq, chain FROM head")[0]
    assert report.ok, report.problem
    assert report.events_checked == head_seq and report.envelopes_only == 0
    manifest = json.loads(members(bundle)[MANIFEST])
    assert manifest["head"] == {"seq": head_seq, "chain": head_chain}
    assert manifest["proof"]["start_seq"] == 0 and manifest["selected_events"] == head_seq
    assert payload_members(bundle) == referenced(home)
    assert (
        members(bundle)[KEY_MEMBER].decode().strip()
        == (archive_dir(home) / "payload.key").read_text().strip()
    )
    stored = rows(
        home,
        f"SELECT {', '.join(ENVELOPE_FIELDS)} FROM events ORDER BY seq",
    )
    assert [tuple(e[f] for f in ENVELOPE_FIELDS) for e in envelopes(bundle)] == stored
    assert stat.S_IMODE(bundle.stat().st_mode) == 0o600  # it carries the key and the payloads


def test_a_session_export_discloses_only_that_session(home: Path, tmp_path: Path) -> None:
    bundle = export(home, tmp_path / "s2.zip", Selection(session="sess-2"))
    report = verify_bundle(bundle)
    selected = rows(home, "SELECT count(*) FROM events WHERE session = 'sess-2'")[0][0]
    total = rows(home, "SELECT count(*) FROM events")[0][0]
    assert report.ok, report.problem
    assert (
        report.details["selected_events"] == selected and report.envelopes_only == total - selected
    )
    assert len(envelopes(bundle)) == total  # the whole chain, so the selection is provably complete
    assert payload_members(bundle) == referenced(home, "session = ?", ("sess-2",))
    assert not any(ONLY_IN_SESSION_ONE in body for body in members(bundle).values())
    assert any(
        ONLY_IN_SESSION_ONE in body
        for body in members(export(home, tmp_path / "s1.zip", Selection("sess-1"))).values()
    )


def test_a_time_range_export_selects_by_envelope_time(home: Path, tmp_path: Path) -> None:
    times = [r[0] for r in rows(home, "SELECT time FROM events ORDER BY seq")]
    since, until = times[2], times[5]
    bundle = export(home, tmp_path / "range.zip", Selection(since=since, until=until))
    report = verify_bundle(bundle)
    assert report.ok and report.details["selected_events"] == sum(
        since <= t <= until for t in times
    )
    assert payload_members(bundle) == referenced(home, "time >= ? AND time <= ?", (since, until))


def test_chain_from_the_selection_starts_just_before_it(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = rows(home, "SELECT min(seq) FROM events WHERE session = 'sess-2'")[0][0]
    bundle = export(
        home, tmp_path / "short.zip", Selection(session="sess-2"), chain_from="selection"
    )
    report = verify_bundle(bundle)
    start_chain = rows(home, "SELECT chain FROM events WHERE seq = ?", (first - 1,))[0][0]
    assert report.ok and report.details["proof_start"] == {
        "seq": first - 1,
        "chain": start_chain,
        "genesis": False,
    }
    assert [e["seq"] for e in envelopes(bundle)][0] == first
    assert report.warnings and f"hermes-archive show {first - 1}" in report.warnings[0]
    code, data = run_json(capsys, home, "verify-bundle", str(bundle))
    assert code == 0 and data["archive"]["matches"] is True


def test_an_empty_selection_is_a_proof_of_absence(home: Path, tmp_path: Path) -> None:
    bundle = export(home, tmp_path / "none.zip", Selection(session="never-was"))
    report = verify_bundle(bundle)
    assert report.ok and report.details["selected_events"] == 0 and payload_members(bundle) == set()
    assert report.events_checked == rows(home, "SELECT count(*) FROM events")[0][0]


# -- every bit ----------------------------------------------------------------------------


@pytest.fixture
def tiny_bundle(tmp_path: Path) -> Path:
    """A small but complete partial export: 3 envelopes, 1 selected event, 1 payload."""
    home = tmp_path / "tiny"
    store = EventStore.open(archive_dir(home))
    store.append(
        [
            session_started("a", at="2026-01-01T00:00:00.000000Z", details={"platform": "cli"}),
            session_ended("b", at="2026-01-01T00:00:01.000000Z", message_count=2),
            session_ended("a", at="2026-01-01T00:00:02.000000Z", message_count=4),
        ]
    )
    try:
        export_bundle(store, tmp_path / "tiny.zip", Selection(session="b"))
    finally:
        store.close()
    return tmp_path / "tiny.zip"


def test_every_single_bit_flip_is_caught_and_named(tiny_bundle: Path, tmp_path: Path) -> None:
    original = tiny_bundle.read_bytes()
    assert verify_bundle(tiny_bundle).ok and len(original) < 4096
    damaged = tmp_path / "damaged.zip"
    problems: dict[str, int] = {}
    for bit in range(len(original) * 8):
        data = bytearray(original)
        data[bit // 8] ^= 1 << (bit % 8)
        damaged.write_bytes(data)
        report = verify_bundle(damaged)
        assert not report.ok, f"flipping bit {bit} (byte {bit // 8}) went unnoticed"
        assert report.problem and not report.problem.startswith("cannot read the bundle"), (
            bit,
            report.problem,
        )
        problems[report.problem.split(":")[0][:40]] = (
            problems.get(report.problem.split(":")[0][:40], 0) + 1
        )
    named = " ".join(problems)
    for what in ("envelopes.jsonl", "manifest.json", "payload.key", "payloads/", "seal"):
        assert what in named, what  # each region's damage is attributed to it


def test_the_standalone_cli_fails_cleanly_on_damaged_bundles(
    tiny_bundle: Path, tmp_path: Path
) -> None:
    original = tiny_bundle.read_bytes()
    damaged = tmp_path / "damaged.zip"
    for offset in sorted(
        {
            0,
            5,
            30,
            200,
            len(original) // 2,
            len(original) - 300,
            len(original) - 100,
            len(original) - 1,
        }
    ):
        data = bytearray(original)
        data[offset] ^= 0x10
        damaged.write_bytes(data)
        done = subprocess.run(
            [sys.executable, str(VERIFIER), "bundle", str(damaged)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 1 and done.stdout.startswith("FAILED"), (offset, done.stdout)
        assert "Traceback" not in done.stderr, (offset, done.stderr)
    damaged.write_bytes(original[:-1000])
    done = subprocess.run(
        [sys.executable, str(VERIFIER), "bundle", str(damaged), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and json.loads(done.stdout)["ok"] is False


# -- a forger who re-seals -------------------------------------------------------------------


def reseal(bundle: Path, change: Callable[[dict[str, bytes], dict[str, Any]], None]) -> None:
    """Rewrite a bundle as a forger who knows the format would: members, manifest digests, seal."""
    content = members(bundle)
    manifest = json.loads(content.pop(MANIFEST))
    change(content, manifest)
    manifest["members"] = {
        n: {"size": len(b), "blake3": blake3(b).hexdigest()} for n, b in content.items()
    }
    text = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    with zipfile.ZipFile(bundle, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, body in content.items():
            archive.writestr(name, body)
        archive.writestr(MANIFEST, text)
        archive.comment = seal_comment(blake3(text).hexdigest())
    with open(bundle, "r+b") as handle:
        size = handle.seek(0, 2)
        seal = seal_digest(handle, size)
        handle.seek(size - 64)
        handle.write(seal.encode())


def edit_envelopes(
    content: dict[str, bytes], edit: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]
) -> None:
    lines = edit([json.loads(line) for line in content[ENVELOPES].splitlines()])
    content[ENVELOPES] = b"".join(
        envelope_line(tuple(e[f] for f in ENVELOPE_FIELDS)) for e in lines
    )


def test_resealing_without_changes_still_verifies(home: Path, tmp_path: Path) -> None:
    bundle = export(home, tmp_path / "b.zip", Selection(session="sess-2"))
    reseal(bundle, lambda content, manifest: None)
    assert verify_bundle(bundle).ok  # so the failures below come from the checks, not from reseal


def _first(home: Path, session: str, kind: str | None = None) -> tuple[int, str]:
    sql = (
        "SELECT seq, payload FROM events WHERE session = ?"
        + (" AND type = ?" if kind else "")
        + " ORDER BY seq"
    )
    return rows(home, sql, (session, kind) if kind else (session,))[0]


def test_resealed_forgeries_are_caught(home: Path, tmp_path: Path) -> None:
    seq_two, payload_two = _first(home, "sess-2")
    seq_one, payload_one = _first(home, "sess-1", "turn")
    other_body = rows(home, "SELECT body FROM payloads WHERE digest = ?", (payload_one,))[0][0]

    def drop_selected_payload(content: dict[str, bytes], manifest: dict[str, Any]) -> None:
        del content[PAYLOAD_PREFIX + payload_two]

    def smuggle_unselected_payload(content: dict[str, bytes], manifest: dict[str, Any]) -> None:
        content[PAYLOAD_PREFIX + payload_one] = bytes(other_body)

    def widen_the_selection(content: dict[str, bytes], manifest: dict[str, Any]) -> None:
        manifest["selection"]["session"] = None

    def hide_an_event_from_the_selection(
        content: dict[str, bytes], manifest: dict[str, Any]
    ) -> None:
        edit_envelopes(
            content,
            lambda es: [{**e, "session": "elsewhere"} if e["seq"] == seq_two else e for e in es],
        )

    def delete_an_envelope(content: dict[str, bytes], manifest: dict[str, Any]) -> None:
        edit_envelopes(content, lambda es: [e for e in es if e["seq"] != seq_one])

    def miscount(content: dict[str, bytes], manifest: dict[str, Any]) -> None:
        manifest["selected_events"] += 1

    def claim_another_genesis(content: dict[str, bytes], manifest: dict[str, Any]) -> None:
        manifest["proof"]["start_chain"] = "0" * 64

    cases = [
        (drop_selected_payload, seq_two, "is missing"),
        (smuggle_unselected_payload, None, "not a payload or part of any selected event"),
        (widen_the_selection, 1, "is missing"),
        (hide_an_event_from_the_selection, seq_two, "chain hash does not match"),
        (delete_an_envelope, seq_one, "sequence gap"),
        (miscount, None, "selected events"),
        (claim_another_genesis, None, "not at the genesis"),
    ]
    for number, (change, seq, problem) in enumerate(cases):
        bundle = export(home, tmp_path / f"forged-{number}.zip", Selection(session="sess-2"))
        reseal(bundle, change)
        report = verify_bundle(bundle)
        assert not report.ok and problem in str(report.problem), (change.__name__, report.problem)
        assert report.first_bad_seq == seq, (change.__name__, report.first_bad_seq)


def test_a_consistent_rewrite_passes_alone_but_not_against_the_archive(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Recompute everything after changing an event: only the archive (a witness) can tell."""
    bundle = export(home, tmp_path / "rewritten.zip", Selection(session="sess-2"))
    switched = rows(home, "SELECT seq FROM events WHERE type = 'session_switched'")[0][0]

    def rewrite(content: dict[str, bytes], manifest: dict[str, Any]) -> None:
        key = bytes.fromhex(content[KEY_MEMBER].decode().strip())
        lines = [json.loads(line) for line in content[ENVELOPES].splitlines()]
        prev = manifest["proof"]["start_chain"]
        for envelope in lines:
            if envelope["seq"] == switched:
                body = json.loads(content.pop(PAYLOAD_PREFIX + envelope["payload"]))
                body["reason"] = "the user asked for a fresh start"
                forged = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
                envelope["payload"] = blake3(DOMAIN_PAYLOAD + forged, key=key).hexdigest()
                content[PAYLOAD_PREFIX + envelope["payload"]] = forged
            fields = [envelope[f] for f in ENVELOPE_FIELDS[:-1]]
            envelope["chain"] = blake3(
                DOMAIN_CHAIN + bytes.fromhex(prev) + envelope_bytes(*fields)
            ).hexdigest()
            prev = envelope["chain"]
        manifest["head"]["chain"] = prev
        content[ENVELOPES] = b"".join(
            envelope_line(tuple(e[f] for f in ENVELOPE_FIELDS)) for e in lines
        )

    reseal(bundle, rewrite)
    assert verify_bundle(
        bundle
    ).ok  # documented: a bundle alone proves consistency, not authenticity
    code, data = run_json(capsys, home, "verify-bundle", str(bundle))
    assert (
        code == 1 and data["archive"]["matches"] is False and "differs" in data["archive"]["detail"]
    )
    code, data = run_json(capsys, home, "verify-bundle", str(bundle), "--no-archive")
    assert code == 0 and data["archive"]["compared"] is False


def test_a_bundle_ahead_of_the_archive_reveals_a_rollback(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = export(home, tmp_path / "ahead.zip")
    rolled_back = tmp_path / "rolled-back"
    folder = archive_dir(rolled_back)
    folder.mkdir(parents=True)
    shutil.copy(archive_dir(home) / "payload.key", folder)
    source = sqlite3.connect(archive_dir(home) / "events.db")
    target = sqlite3.connect(folder / "events.db")
    source.backup(target)
    source.close()
    target.execute("DROP TRIGGER events_append_only_delete")
    last = target.execute("SELECT max(seq) FROM events").fetchone()[0]
    target.execute("DELETE FROM events WHERE seq = ?", (last,))
    target.execute(
        "UPDATE head SET seq = ?, chain = (SELECT chain FROM events WHERE seq = ?)",
        (last - 1, last - 1),
    )
    target.commit()
    target.close()
    code, data = run_json(capsys, rolled_back, "verify")
    assert code == 0  # the rolled-back archive is consistent on its own
    code, data = run_json(capsys, rolled_back, "verify-bundle", str(bundle))
    assert code == 1 and "rolled back" in data["archive"]["detail"]


# -- the export command ----------------------------------------------------------------------


def test_export_command_refuses_to_overwrite_and_leaves_nothing_when_the_archive_is_damaged(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out" / "audit.zip"
    out.parent.mkdir()
    code, text, _ = via_main(
        capsys, ["--home", str(home), "--json", "export", "--session", "sess-1", str(out)]
    )
    data = json.loads(text)
    selected = rows(home, "SELECT count(*) FROM events WHERE session = 'sess-1'")[0][0]
    assert code == 0 and data["selected_events"] == selected
    assert verify_bundle(out).ok and data["seal"] == out.read_bytes()[-64:].decode()
    code, _, err = via_main(capsys, ["--home", str(home), "export", str(out)])
    assert code == 2 and "exists" in err
    code, data = run_json(capsys, home, "export", str(out), "--force", "--since", "2000-01-01")
    assert code == 0 and data["selection"]["since"] == "2000-01-01T00:00:00.000000Z"

    damaged = tmp_path / "damaged"
    shutil.copytree(home, damaged)
    conn = sqlite3.connect(archive_dir(damaged) / "events.db")
    conn.execute("DROP TRIGGER events_append_only_update")
    conn.execute("UPDATE events SET time = '2000-01-01T00:00:00.000000Z' WHERE seq = 3")
    conn.commit()
    conn.close()
    target = tmp_path / "out" / "never.zip"
    code, data = run_json(capsys, damaged, "export", str(target))
    assert code == 1 and "failed its own verification at seq 3" in data["error"]
    assert sorted(p.name for p in out.parent.iterdir()) == [
        "audit.zip"
    ]  # no bundle, no partial file


# -- the verifier alone -----------------------------------------------------------------------


def test_the_copied_out_verifier_runs_in_a_venv_with_only_blake3(
    home: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    pip = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "blake3"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert pip.returncode == 0, pip.stderr
    lone = tmp_path / "auditor"
    lone.mkdir()
    shutil.copy(VERIFIER, lone / "verifier.py")
    bundle = export(home, lone / "audit.zip", Selection(session="sess-2"))
    shutil.copytree(archive_dir(home), lone / "archive")

    def check(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(python), "verifier.py", *args],
            cwd=lone,
            capture_output=True,
            text=True,
            timeout=120,
        )

    imports = subprocess.run(
        [str(python), "-c", "import archive_provider"], capture_output=True, cwd=lone
    )
    assert imports.returncode != 0  # the package is not there: only the copied file runs
    done = check("bundle", "audit.zip")
    assert done.returncode == 0 and done.stdout.startswith("ok: bundle of store"), (
        done.stdout + done.stderr
    )
    assert check("audit.zip", "--json").returncode == 0  # detected as a bundle by its first bytes
    done = check(str(Path("archive") / "events.db"))
    assert done.returncode == 0 and done.stdout.startswith("ok:"), done.stdout + done.stderr
    data = bytearray(bundle.read_bytes())
    data[len(data) // 3] ^= 0x01
    bundle.write_bytes(data)
    done = check("bundle", "audit.zip")
    assert (
        done.returncode == 1 and done.stdout.startswith("FAILED") and "Traceback" not in done.stderr
    )


def test_a_resealed_oversized_key_is_refused_before_it_is_read(home: Path, tmp_path: Path) -> None:
    """A bundle is untrusted: a member's size is checked before it is read into memory."""
    bundle = export(home, tmp_path / "b.zip", Selection(session="sess-2"))

    def swell(content: dict[str, bytes], manifest: dict[str, Any]) -> None:
        content["payload.key"] = content["payload.key"].strip() + b" " * 4096 + b"\n"

    reseal(bundle, swell)
    report = verify_bundle(bundle)
    assert not report.ok and "a key is 64 hex digits" in report.problem


def test_an_envelope_line_is_read_with_a_bound(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One endless line cannot be read whole: past the bound it is not an envelope record."""
    bundle = export(home, tmp_path / "b.zip", Selection(session="sess-2"))
    assert verify_bundle(bundle).ok
    monkeypatch.setattr("archive_provider.format.verifier._MAX_ENVELOPE_LINE", 64)
    report = verify_bundle(bundle)
    assert not report.ok and "line 1 is not" in report.problem


def test_a_hostile_database_is_refused_before_its_views_run(tmp_path: Path) -> None:
    """An audited database may come from a compromised system: a view named meta never runs."""
    folder = tmp_path / "archive"
    EventStore.open(folder).close()
    conn = sqlite3.connect(folder / "events.db")
    conn.execute("DROP TABLE meta")
    conn.execute(
        "CREATE VIEW meta AS WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) "
        "SELECT 'store_id' AS name, x AS value FROM r WHERE x < 0"
    )
    conn.commit()
    conn.close()
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "archive_provider" / "format" / "verifier.py"),
            str(folder / "events.db"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "meta is a view, not a table" in done.stdout + done.stderr
    with pytest.raises(StoreError, match="meta is a view, not a table"):
        EventStore.open(folder, create=False, readonly=True)


def test_the_progress_bar_never_reads_a_huge_manifest(tmp_path: Path) -> None:
    """verify-bundle peeks at the claimed head before verifying; a bomb must not be read."""
    from archive_provider.commands.verify_bundle import _claimed_head

    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(MANIFEST, b" " * (65 << 20) + b'{"head": {"seq": 5}}')
    small = tmp_path / "small.zip"
    with zipfile.ZipFile(small, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(MANIFEST, b'{"head": {"seq": 5}}')
    assert (_claimed_head(bomb), _claimed_head(small)) == (0, 5)


@pytest.mark.parametrize(
    "content", [b"", b"garbage, not an archive" * 10], ids=["empty", "garbage"]
)
def test_the_standalone_verifier_tells_what_a_file_is_by_its_first_bytes(
    tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "events.db"
    path.write_bytes(content)
    done = subprocess.run(
        [sys.executable, str(VERIFIER), str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1 and done.stderr == ""
    assert (
        done.stdout == f"FAILED at the file: {path} is not an archive database or bundle "
        "(empty, or other first bytes)\n"
    )


def test_the_standalone_verifier_says_a_database_is_not_a_bundle(home: Path) -> None:
    database = archive_dir(home) / "events.db"
    done = subprocess.run(
        [sys.executable, str(VERIFIER), "bundle", str(database)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and f"{database} is a database, not a bundle" in done.stdout


def test_the_standalone_verifier_without_blake3_says_how_to_install_it(tmp_path: Path) -> None:
    """An auditor's bare Python: one line naming the install command, exit 1, no traceback."""
    hide = (
        "import runpy, sys\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'blake3' or name.startswith('blake3.'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.modules.pop('blake3', None)\n"
        "sys.meta_path.insert(0, Hide())\n"
        "sys.argv = sys.argv[1:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", hide, str(VERIFIER), str(tmp_path / "events.db")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == "verifier.py needs the blake3 package: python3 -m pip install blake3\n"
