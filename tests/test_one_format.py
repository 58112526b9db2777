"""One format in the product (issue 32): a format-1 archive is only ever migrated.

The provider, the store and every command but ``migrate`` refuse the frozen v1 archive
(tests/fixtures/v1_archive, written by the 0.1.0 code) with one line naming
``hermes-archive migrate``, and none of them writes a byte to it; ``migrate`` still makes
it format 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from archive_provider import ArchiveProvider
from archive_provider.storage.migrate import file_blake3
from archive_provider.storage.store import EventStore, NeedsMigration, archive_dir
from tests.conftest import v1_archive

MIGRATE = "`hermes-archive migrate`"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    v1_archive(archive_dir(tmp_path / "home"))
    return tmp_path / "home"


def _v1_bytes(home: Path) -> dict[str, str]:
    return {p.name: file_blake3(p) for p in sorted(archive_dir(home).iterdir()) if p.is_file()}


@pytest.mark.parametrize("readonly", [False, True])
def test_the_store_refuses_a_v1_archive_and_writes_nothing(home: Path, readonly: bool) -> None:
    before = _v1_bytes(home)
    with pytest.raises(NeedsMigration, match=MIGRATE) as refused:
        EventStore.open(archive_dir(home), readonly=readonly).close()
    assert "\n" not in str(refused.value) and "format version 1" in str(refused.value)
    assert _v1_bytes(home) == before


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["search", "Ziggy"],
        ["log"],
        ["show", "1"],
        ["verify"],
        ["key"],
        ["export", "{tmp}/bundle.zip"],
        ["prove", "3", "--out", "{tmp}/proof"],
        ["forget", "--session", "s1", "--reason", "r", "--yes"],
        ["replay"],
        ["readable-copy", "{tmp}/copy.db"],
    ],
)
def test_every_command_but_migrate_refuses_a_v1_archive_in_one_line(
    home: Path, tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from archive_provider.cli import main

    before = _v1_bytes(home)
    args = [a.replace("{tmp}", str(tmp_path)) for a in command]
    assert main(["--home", str(home), *args]) != 0
    err = capsys.readouterr().err.strip()
    assert MIGRATE in err and len(err.splitlines()) == 1, err
    assert _v1_bytes(home) == before


def test_the_provider_serves_no_v1_archive_and_migrate_makes_it_format_2(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from archive_provider.cli import main

    before = _v1_bytes(home)
    provider = ArchiveProvider()
    provider.initialize("s9", hermes_home=str(home), platform="cli")
    try:
        served = provider.prefetch("Ziggy")
        assert "withheld" in served and MIGRATE in served and "Ziggy" not in served
        writer = provider.core.writer
        assert writer is not None and not writer.flush(5)
        assert MIGRATE in (writer.last_error or "")
    finally:
        provider.shutdown()
    assert {k: v for k, v in _v1_bytes(home).items() if not k.endswith(".spill")} == before
    assert main(["--home", str(home), "--json", "migrate"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"]
    assert main(["--home", str(home), "--json", "search", "Ziggy"]) == 0
    assert "Ziggy" in capsys.readouterr().out


def test_the_serve_time_proof_withholds_a_v1_file_by_its_format(home: Path) -> None:
    """The one check every served excerpt passes proves format 2 only: a v1 file (an intact
    one, its chain and identities sound) is withheld at its envelope, before any payload is
    read (a v1 file swapped in never serves; before, the prover took the v1 path)."""
    from archive_provider.projections.recall import Hit, Prover
    from archive_provider.storage.store import connect

    conn = connect(archive_dir(home) / "events.db", readonly=True)
    try:
        prover = Prover(conn, None)
        hit = Hit("My cat is called Ziggy", "turn", "sess-1", 2, "user", None, 1.0)
        assert prover.proven([hit]) == []
        assert prover.withheld == ["seq 2: its envelope cannot be read: no such column: author"]
    finally:
        conn.close()
