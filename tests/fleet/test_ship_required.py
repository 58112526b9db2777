"""Shipping required by setting (issue 19 point 1): unavailable only when shipping cannot
work by configuration; lag beyond the bound said in `unavailable_reason`, `status` (exit 3),
`hermes memory status` and the recall label, and never in a turn's or a checkpoint's way.

Through the real host where it matters: hermes' own plugin discovery and `hermes memory
status` (`cmd_status`), a real PostgreSQL stopped mid-test for the lag, the one clock
frozen for its seconds.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from freezegun import freeze_time

from archive_provider import ArchiveProvider
from archive_provider.cli import main
from archive_provider.domain.clock import parse_time
from archive_provider.fleet.ship import read_state
from archive_provider.host.install import activate, install_plugin
from archive_provider.host.settings import save_settings
from archive_provider.storage.store import archive_dir
from tests.fleet.conftest import PASSWORDS, Central, central_rows, local_rows, make_archive
from tests.fleet.pgserver import PgServer
from tests.host import hostkit

REPO = Path(__file__).resolve().parents[2]
DEAD = "postgresql://shipper:dead-pw-3141@127.0.0.1:9/nowhere?sslmode=disable&connect_timeout=1"
#: psycopg's own frames read the real clock (its pool's timeouts), everything else the frozen one
REAL_CLOCK_FOR = ["psycopg"]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A profile with the archive plugin installed and active, as `hermes memory setup` does."""
    home = hostkit.isolate_hermes_home(monkeypatch, tmp_path / "home", tmp_path / "user")
    install_plugin(home, "archive")
    activate(home, "archive")
    hostkit.purge_user_plugin_modules()
    yield home
    hostkit.purge_user_plugin_modules()


def ship_env(monkeypatch: pytest.MonkeyPatch, **values: object) -> None:
    """Set shipping settings where they are read from: the environment only (issue 29)."""
    for key, value in values.items():
        monkeypatch.setenv(f"ARCHIVE_{key.upper()}", str(value))


def memory_status(capsys: pytest.CaptureFixture[str]) -> str:
    """What the host's `hermes memory status` prints (plugin loaded afresh)."""
    from hermes_cli.memory_setup import cmd_status

    hostkit.purge_user_plugin_modules()
    capsys.readouterr()
    cmd_status(SimpleNamespace())
    return capsys.readouterr().out


def status(home: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["--home", str(home), "status"])
    return code, capsys.readouterr().out


def wait_until(condition: Callable[[], bool], what: str, limit: float = 120.0) -> None:
    """Poll until ``condition`` holds (a liveness bound, not a timed assertion)."""
    import threading

    done, waited = threading.Event(), 0.0
    while not condition():
        if waited >= limit:
            pytest.fail(f"gave up waiting for {what}")
        done.wait(0.1)
        waited += 0.1


def test_required_without_ship_to_is_unavailable_through_the_host(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from plugins.memory import discover_memory_providers, load_memory_provider

    ship_env(monkeypatch, ship_required=True)
    entry = next(e for e in discover_memory_providers() if e[0] == "archive")
    assert entry[2] is False
    provider = load_memory_provider("archive")
    assert provider is not None and not provider.is_available()
    reason = provider.unavailable_reason()
    assert "ship_to is empty" in reason and "set ARCHIVE_SHIP_TO" in reason and "\n" not in reason
    out = memory_status(capsys)
    assert "not available" in out
    assert f"shipping_required: {reason}" in out
    assert not archive_dir(home).joinpath("events.db").exists()  # is_available read settings only

    # the environment says it too; and a target makes it available again (no server needed:
    # whether the server answers is run time, never availability)
    ship_env(monkeypatch, ship_to=DEAD)
    assert load_memory_provider("archive").is_available()
    assert load_memory_provider("archive").unavailable_reason() == ""
    ship_env(monkeypatch, ship_required=False, ship_to="")
    assert next(e for e in discover_memory_providers() if e[0] == "archive")[2] is True
    monkeypatch.setenv("ARCHIVE_SHIP_REQUIRED", "yes")
    assert not ArchiveProvider().is_available()


_CHILD = """
import json, sys
for name in sys.argv[1:]:
    sys.modules[name] = None  # how Python itself marks a module that cannot be imported
from plugins.memory import discover_memory_providers, load_memory_provider
entry = next(e for e in discover_memory_providers() if e[0] == "archive")
provider = load_memory_provider("archive")
print(json.dumps([entry[2], provider.is_available(), provider.unavailable_reason()]))
"""


def _host_child(home: Path, *blocked: str) -> list[Any]:
    """Discovery in a fresh interpreter where ``blocked`` modules cannot be imported."""
    import os

    done = subprocess.run(
        [sys.executable, "-c", _CHILD, *blocked],
        cwd=REPO,
        env={**os.environ, "HERMES_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    result: list[Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("blocked", [["psycopg"], ["psycopg_pool"], ["psycopg", "psycopg_pool"]])
def test_required_without_the_fleet_extra_is_unavailable(
    home: Path, blocked: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ship_env(monkeypatch, ship_required=True, ship_to=DEAD)
    discovered, available, reason = _host_child(home, *blocked)
    assert (discovered, available) == (False, False)
    assert f"{' and '.join(blocked)} cannot be imported" in reason
    assert "pip install 'psycopg-pool>=3.2' 'psycopg[binary]>=3.2'" in reason
    assert "hermes-archive[fleet]" not in reason and "dead-pw" not in reason
    # the same child with everything importable: available, so the block is the only cause
    assert _host_child(home) == [True, True, ""]
    # and without the requirement a missing extra only stops shipping, never the archive
    ship_env(monkeypatch, ship_required=False)
    assert _host_child(home, *blocked) == [True, True, ""]


def _turns(provider: ArchiveProvider, *texts: str) -> None:
    for text in texts:
        provider.sync_turn(f"tell me about {text}", f"{text} are flowers")
    assert provider.flush_pending(60)


@pytest.mark.postgres
def test_lag_beyond_the_bound_is_said_everywhere_and_never_blocks(
    home: Path,
    central_db: Central,
    pg: PgServer,
    make_provider: Callable[..., ArchiveProvider],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = central_db.url()
    ship_env(monkeypatch, ship_to=url, ship_required=True, ship_max_lag_s=60)
    save_settings(home, {"ship_interval_s": 0.1})
    make_archive(home).close()
    central_db.register(home)
    provider = make_provider(home)
    assert provider.is_available()
    _turns(provider, "tulips", "roses")
    store_id = str(read_state_when(home, lambda s: s.get("store_id"))["store_id"])
    wait_until(
        lambda: len(central_rows(central_db, store_id)) == len(local_rows(home)),
        "the background shipper to catch up",
    )
    code, out = status(home, capsys)
    assert code == 0 and "Shipping required: met (no lag beyond 60 s recorded)" in out

    pg.stop()  # the central store goes away
    try:
        _turns(provider, "daisies", "lilies")
        state = read_state_when(home, lambda s: s.get("last_error") and s.get("lag_events") >= 2)
        oldest = parse_time(str(state["oldest_unshipped_time"]))
        # the checkpoint a compression needs is durable locally while central is down
        receipt = provider.on_pre_compress(
            [{"role": "user", "content": "daisies?"}, {"role": "assistant", "content": "yes"}],
            require_checkpoint=True,
        )
        assert "event seq" in receipt

        with freeze_time(oldest + timedelta(seconds=30), ignore=REAL_CLOCK_FOR):
            assert provider.unavailable_reason() == ""  # within the bound: nothing to say
            assert status(home, capsys)[0] == 0
            assert provider.prefetch("tulips")
            assert provider.recall_status().provider_label == "archive"

        with freeze_time(oldest + timedelta(seconds=90), ignore=REAL_CLOCK_FOR):
            reason = provider.unavailable_reason()
            assert re.fullmatch(
                r"shipping required but behind: \d+ events, 90\.0 s, last error: .+ \(bound 60 s,"
                r" to host=127\.0\.0\.1 .*user=ship_login.*\); bring the central store back .*",
                reason,
            ), reason
            assert provider.is_available()  # lag never makes the archive unavailable
            code, out = status(home, capsys)
            assert code == 3
            assert re.search(r"^shipping required but behind: \d+ events, 90\.0 s", out, re.M)
            assert provider.prefetch("tulips")
            label = provider.recall_status().provider_label
            assert re.fullmatch(r"archive \(shipping behind: \d+ events\)", label), label
            hermes = memory_status(capsys)
            assert re.search(r"shipping_required: shipping required but behind: \d+ events", hermes)
            assert "Status:    available" in hermes
            assert main(["--home", str(home), "--json", "status"]) == 3
            data = json.loads(capsys.readouterr().out)
            assert data["shipping_required"]["met"] is False
            assert PASSWORDS["ship_login"] not in reason + out + label + hermes + json.dumps(data)
    finally:
        pg.start()
    wait_until(  # back: the background shipper catches up and the alarm clears
        lambda: len(central_rows(central_db, store_id)) == len(local_rows(home)),
        "the shipper to catch up after the restart",
    )
    read_state_when(home, lambda s: s.get("lag_events") == 0 and not s.get("last_error"))
    assert provider.unavailable_reason() == ""
    assert status(home, capsys)[0] == 0


def read_state_when(home: Path, condition: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    """The shipping state once ``condition`` holds for it."""
    found: list[dict[str, Any]] = []

    def check() -> bool:
        state = read_state(archive_dir(home))
        if state is not None and condition(state):
            found.append(state)
            return True
        return False

    wait_until(check, "the shipping state")
    return found[-1]


def test_lag_without_the_requirement_changes_nothing(
    home: Path,
    make_provider: Callable[..., ArchiveProvider],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ship_env(monkeypatch, ship_to=DEAD, ship_max_lag_s=1)
    save_settings(home, {"ship_interval_s": 0.1})
    provider = make_provider(home)
    _turns(provider, "tulips")
    state = read_state_when(home, lambda s: s.get("last_error") and s.get("lag_events"))
    later = parse_time(str(state["oldest_unshipped_time"])) + timedelta(hours=1)
    with freeze_time(later, ignore=REAL_CLOCK_FOR):
        assert provider.is_available() and provider.unavailable_reason() == ""
        code, out = status(home, capsys)
        assert code == 0 and "Shipping to" in out and "hipping required" not in out
        assert provider.prefetch("tulips")
        assert provider.recall_status().provider_label == "archive"
        assert "shipping_required" not in memory_status(capsys)
