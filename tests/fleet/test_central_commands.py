"""`--db` for history, as-of, export and prove: the same answers from the central copy as
from the local archive, and a bundle and a proof that verify offline with the archive key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from archive_provider.cli import main
from archive_provider.format.verifier import main as verifier_main
from archive_provider.storage.store import EventStore, archive_dir
from tests.fleet.conftest import Central
from tests.test_cli import build_archive

pytestmark = pytest.mark.postgres


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, object]:
    code = main(["--json", *args])
    return code, json.loads(capsys.readouterr().out)


@pytest.fixture
def shipped(tmp_path: Path, central_db: Central) -> tuple[Path, str, str]:
    """A provider-made v2 archive (turns, memory writes, a checkpoint), shipped."""
    home = tmp_path / "home"
    build_archive(home)
    central_db.ship(home)
    store = EventStore.open(archive_dir(home), create=False, readonly=True)
    store_id, vkey = store.store_id, store.vkey  # type: ignore[attr-defined]
    store.close()
    return home, store_id, vkey


def test_history_and_as_of_read_the_central_copy_as_the_local_archive(
    shipped: tuple[Path, str, str], central_db: Central, capsys: pytest.CaptureFixture[str]
) -> None:
    home, store_id, _ = shipped
    central = ["--db", central_db.url("read_login"), "--store", store_id[:8]]
    for command in (["history", "ziggy"], ["as-of", "6", "--session", "sess-2"], ["as-of", "3"]):
        local = _json(capsys, "--home", str(home), *command)
        assert _json(capsys, *central, *command) == local, command
        assert local[0] == 0
    # one archive at a time: without --store it is a usage error
    assert main(["--db", central_db.url("read_login"), "history", "ziggy"]) == 2
    assert "give --store ID" in capsys.readouterr().err


def test_export_and_prove_from_the_central_copy_verify_with_the_archive_key(
    shipped: tuple[Path, str, str],
    central_db: Central,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    home, store_id, vkey = shipped
    central = ["--db", central_db.url("read_login"), "--store", store_id]
    bundle = tmp_path / "central.zip"
    code, data = _json(capsys, *central, "export", "--session", "sess-1", str(bundle))
    assert code == 0, data
    assert (
        main(
            [
                "--json",
                "--home",
                str(tmp_path / "none"),
                "verify-bundle",
                str(bundle),
                "--key",
                vkey,
            ]
        )
        == 0
    )
    checked = json.loads(capsys.readouterr().out)
    assert checked["ok"] and checked["bundle"]["authenticity"] == "verified"

    proofs = tmp_path / "central"  # two seqs: one proof file each
    code, data = _json(capsys, *central, "prove", "2", "4", "--out", str(proofs))
    assert code == 0 and data["vkey"] == vkey  # type: ignore[index]
    for seq in (2, 4):
        assert verifier_main(["proof", str(proofs / f"{seq}.proof"), "--key", vkey]) == 0
        assert "ok" in capsys.readouterr().out.lower()
