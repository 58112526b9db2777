"""The audit report of one archive of a central store (`--db URL --store ID report`): the
same page as the local one, from the shipped copy, with commands that name the store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from freezegun import freeze_time

from archive_provider.cli import main
from archive_provider.fleet.ship import Shipper
from archive_provider.storage.store import archive_dir
from tests.fleet.conftest import Central
from tests.test_report import HOSTILE, HOSTILE_SESSION, SECRET, build_archive, page_data

pytestmark = pytest.mark.postgres


def test_a_report_of_a_central_archive(
    tmp_path: Path, central_db: Central, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    seqs = build_archive(home)
    central_db.register(home)  # an administrator registers a store before it may ship
    shipper = Shipper(archive_dir(home), central_db.url())
    try:
        assert shipper.ship_once() == seqs["head"]
    finally:
        shipper.close()
    store_id = seqs["store_id"]
    out = tmp_path / "central.html"
    central = ["--db", central_db.url("read_login"), "--store", store_id[:8], "--json"]
    with freeze_time("2026-11-04T12:00:00Z"):
        assert main([*central, "report", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    page = out.read_text("utf-8")
    data = page_data(page)
    assert data["archive"] | {"head_chain": None} == {
        "store_id": store_id,
        "format_version": 2,
        "head_seq": seqs["head"],
        "head_chain": None,
        "central": True,
    }
    assert data["verification"]["ok"] is True
    assert data["verification"]["last_seq"] == seqs["head"]
    assert data["checkpoint"]["size"] == seqs["head"]
    sessions = {s["session"]: s for s in data["sessions"]}
    assert sessions["s-quiet"]["recall_list"][0]["sources"] == [
        {"seq": seqs["hostile_turn"], "session": HOSTILE_SESSION}
    ]
    assert [e["seq"] for e in data["erasures"]] == [seqs["erasure"]]
    assert SECRET not in page and HOSTILE not in page
