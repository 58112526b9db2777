"""What the central commands and the shipping state say is true: a missing store is named,
search prints the text it found, and ``status`` counts the lag from the local head."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from archive_provider.cli import main
from archive_provider.domain import builders
from archive_provider.fleet.ship import Shipper
from archive_provider.storage.store import archive_dir
from tests.conftest import open_v2
from tests.fleet.conftest import Central
from tests.fleet.test_central_commands import shipped
from tests.test_cli import build_archive

pytestmark = pytest.mark.postgres
__all__ = ["shipped"]  # the fixture, shared


def test_a_store_that_is_not_there_is_named_not_the_seq(
    shipped: tuple[Path, str, str], central_db: Central, capsys: pytest.CaptureFixture[str]
) -> None:
    reader = central_db.url("read_login")
    for command in (["show", "1"], ["log"], ["search", "heron"]):
        assert main(["--db", reader, "--store", "ffff", *command]) == 1
        err = capsys.readouterr().err
        assert "no store 'ffff' in the central store" in err and "'1'" not in err, command


def test_central_search_prints_the_text_it_found(
    shipped: tuple[Path, str, str], central_db: Central, capsys: pytest.CaptureFixture[str]
) -> None:
    reader = central_db.url("read_login")
    assert main(["--db", reader, "search", "heron"]) == 0
    out = capsys.readouterr().out
    assert '"A blue heron sat by the river"' in out
    assert "<b>" not in out and '{"' not in out and "\\" not in out


def test_status_counts_the_lag_from_the_local_head(
    tmp_path: Path, central_db: Central, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    build_archive(home)
    central_db.register(home)  # an administrator registers a store before it may ship
    shipper = Shipper(archive_dir(home), central_db.url())
    try:
        shipper.ship_once()
    finally:
        shipper.close()
    assert main(["--home", str(home), "hold", "add", "--session", "sess-1", "--reason", "r"]) == 0
    capsys.readouterr()
    assert main(["--home", str(home), "--json", "status"]) == 0
    status = json.loads(capsys.readouterr().out)
    shipping = status["shipping"]
    assert shipping["local_seq"] == status["head"]["seq"]
    assert shipping["lag_events"] == status["head"]["seq"] - shipping["central_seq"] >= 1
    assert main(["--home", str(home), "status"]) == 0
    assert f"lag {shipping['lag_events']} events" in capsys.readouterr().out


def test_central_log_and_search_keep_a_session_id_on_its_row(
    tmp_path: Path, central_db: Central, capsys: pytest.CaptureFixture[str]
) -> None:
    """The central table prints the host's session id as the local one does: a line break
    in it is shown escaped, so it cannot start a row of its own (a forged event)."""
    home = tmp_path / "home"
    forged = "s1\n     9  2026-01-01 00:00:00  erasure  archive  nothing was erased"
    store = open_v2(archive_dir(home))
    try:
        store.append([builders.session_started(forged, at="t0", details={})])
        store.append(
            [builders.memory_write(store.hasher, forged, 1, "add", "memory", "escape fact", {})]
        )
    finally:
        store.close()
    central_db.ship(home)
    for command in (["log"], ["search", "escape"]):
        assert main(["--db", central_db.url("read_login"), *command]) == 0, command
        out = capsys.readouterr().out
        assert "s1\\x0a     9" in out, (command, out)
        assert not any(line.lstrip().startswith("9  ") for line in out.splitlines()), out
