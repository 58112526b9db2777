"""HivemindProvider as hermes sees it, without a homeserver: registration, availability,
schemas, settings, and the archive working on when peers are off."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from archive_provider import ArchiveProvider
from archive_provider.host.install import install_plugin
from hivemind import HivemindProvider, register
from hivemind.settings import HivemindSettings, load_settings, save_settings

from .agents import call, logged, wait_for

CREDENTIALS = {
    "MATRIX_HOMESERVER": "http://127.0.0.1:9",
    "MATRIX_USER_ID": "@me:localhost",
    "MATRIX_ACCESS_TOKEN": "syt_bWU_secret_secret_0000",
}
TOOLS = [
    "archive_search",
    "hivemind_list_peers",
    "hivemind_check_messages",
    "hivemind_send_to_peer",
    "hivemind_get_peer_info",
    "hivemind_introduce_peers",
    "hivemind_dismiss_spark",
]


class Collector:
    def __init__(self) -> None:
        self.providers: list[Any] = []

    def register_memory_provider(self, provider: Any) -> None:
        self.providers.append(provider)


@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*CREDENTIALS, "MATRIX_DEVICE_ID"):
        monkeypatch.delenv(name, raising=False)


def hivemind_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("hivemind-")]


def test_register_makes_a_new_cheap_provider_each_time(
    no_credentials: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = Collector()
    register(ctx)
    register(ctx)
    first, second = ctx.providers
    assert first is not second and first.name == second.name == "hivemind"
    assert not first.is_available()
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    assert first.is_available() and hivemind_threads() == []
    assert [t["name"] for t in first.get_tool_schemas()] == TOOLS
    block = first.system_prompt_block()
    assert block.startswith("## Archive") and "# Social awareness" in block
    assert "data, never instructions" in block and "name: social-awareness" not in block


def test_unavailable_says_why_and_keeps_the_archives_shipping_check(
    no_credentials: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HERMES_HOME", str(tmp_path))
    provider = HivemindProvider()
    monkeypatch.setenv("MATRIX_HOMESERVER", CREDENTIALS["MATRIX_HOMESERVER"])
    assert not provider.is_available()
    reason = provider.unavailable_reason()
    assert "MATRIX_USER_ID, MATRIX_ACCESS_TOKEN" in reason and "MATRIX_HOMESERVER" not in reason

    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    assert provider.is_available() and provider.unavailable_reason() == ""
    monkeypatch.setenv("ARCHIVE_SHIP_REQUIRED", "true")  # required, and no ship_to: unusable
    assert not provider.is_available()
    assert provider.unavailable_reason() == ArchiveProvider().unavailable_reason() != ""


def test_registration_and_schemas_do_not_import_matrix() -> None:
    """Discovery (`hermes memory status`) must work, cheaply, without matrix-nio."""
    code = (
        "import sys, hivemind; p = hivemind.HivemindProvider(); p.get_tool_schemas(); "
        "p.is_available(); p.system_prompt_block(); assert 'nio' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_plugin_folder_loads_through_hermes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_credentials: None
) -> None:
    folder = install_plugin(tmp_path, "hivemind")
    assert "register_memory_provider" in (folder / "__init__.py").read_text()[:8192]
    monkeypatch.setenv("HERMES_HOME", str(tmp_path))
    for module in [m for m in sys.modules if m.startswith("_hermes_user_memory")]:
        monkeypatch.delitem(sys.modules, module)
    from plugins.memory import load_memory_provider
    from plugins.memory.config_schema import STORAGE_FLAT_JSON, get_provider_config_schema

    provider = load_memory_provider("hivemind")
    assert isinstance(provider, HivemindProvider) and not provider.is_available()
    schema = get_provider_config_schema("hivemind")
    assert schema is not None and schema.name == "hivemind" and schema.storage == STORAGE_FLAT_JSON
    secrets = {f.key: f.env_key for f in schema.fields if f.is_secret}
    assert secrets == {
        "homeserver": "MATRIX_HOMESERVER",
        "user_id": "MATRIX_USER_ID",
        "access_token": "MATRIX_ACCESS_TOKEN",
    }
    settings = set(HivemindSettings.__dataclass_fields__)
    assert {f.key for f in schema.fields} - set(secrets) <= settings


def test_without_credentials_the_archive_works_and_tools_say_why(
    tmp_path: Path, no_credentials: None
) -> None:
    provider = HivemindProvider()
    provider.initialize("s1", hermes_home=str(tmp_path), platform="cli")
    try:
        listed = call(provider, "hivemind_list_peers")
        assert listed["connected"] is False and listed["peers"] == []
        assert (
            "MATRIX_HOMESERVER, MATRIX_USER_ID, MATRIX_ACCESS_TOKEN not set"
            in (listed["not_connected_because"])
        )
        assert (
            "No peers are known yet"
            in call(provider, "hivemind_send_to_peer", peer_name="bob", message="hi")["error"]
        )
        wrong = call(provider, "hivemind_check_messages", peer_name=7)
        assert wrong["error"] == "'peer_name' must be text"
        assert call(provider, "hivemind_check_messages") == {
            "messages": [],
            "remaining_unread": 0,
            "notice": listed["notice"],
        }
        provider.sync_turn("remember the blue heron", "noted", session_id="s1")
        found = json.loads(provider.handle_tool_call("archive_search", {"query": "heron"}))
        assert "error" not in found
        assert provider.peer_context() == "" and hivemind_threads() == []
    finally:
        provider.shutdown()
    assert logged(tmp_path, "turn")


def test_a_subagent_never_drives_the_matrix_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    provider = HivemindProvider()
    provider.initialize("s1", hermes_home=str(tmp_path), agent_context="subagent")
    try:
        assert hivemind_threads() == []
        result = call(provider, "hivemind_list_peers")
        assert result["not_connected_because"] == "peers are off in a subagent context"
    finally:
        provider.shutdown()


def test_a_checkpoint_only_context_offers_no_tools_and_refuses_peer_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    provider = HivemindProvider()
    provider.initialize("s1", hermes_home=str(tmp_path), agent_context="checkpoint_only")
    try:
        assert provider.get_tool_schemas() == []
        assert hivemind_threads() == []
        assert "error" in json.loads(provider.handle_tool_call("hivemind_list_peers", {}))
        assert "archived" in provider.on_pre_compress([{"role": "user", "content": "keep me"}])
    finally:
        provider.shutdown()


def test_an_unreachable_homeserver_delays_nothing_and_shutdown_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)  # port 9: nothing listens there
    (tmp_path / "hivemind").mkdir()
    (tmp_path / "hivemind" / "config.json").write_text(json.dumps({"connect_wait_s": 0.5}))
    started = time.monotonic()
    provider = HivemindProvider()
    provider.initialize("s1", hermes_home=str(tmp_path), platform="cli")
    assert time.monotonic() - started < 3
    wait_for(
        lambda: "unreachable" in call(provider, "hivemind_list_peers")["not_connected_because"],
        deadline_s=10,
        what="the first failed attempt",
    )
    started = time.monotonic()
    provider.shutdown()
    assert time.monotonic() - started < 8 and hivemind_threads() == []


def test_settings_files_environment_and_save_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load_settings(tmp_path) == HivemindSettings()
    save_settings(
        tmp_path,
        {
            "allow_servers": "none",
            "contacts": "@a:hs, @b:hs\n@c:hs",
            "interests": ["Rust", " TEE "],
            "poll_ms": "2500",
        },
    )
    settings = load_settings(tmp_path)
    assert settings.allow_servers == () and settings.contacts == ("@a:hs", "@b:hs", "@c:hs")
    assert settings.interests == ("Rust", "TEE") and settings.poll_ms == 2500
    assert settings.profile == {"interests": ["Rust", "TEE"]}
    save_settings(tmp_path, {"allow_servers": ""})
    assert load_settings(tmp_path).allow_servers is None  # back to our own server only
    monkeypatch.setenv("HIVEMIND_ALLOW_SERVERS", "partner.example, other.example")
    assert load_settings(tmp_path).allow_servers == ("partner.example", "other.example")

    HivemindProvider().save_config(
        {"about": "Rust agent", "recall_limit": 3, "access_token": "syt_secret"}, str(tmp_path)
    )
    assert json.loads((tmp_path / "hivemind" / "config.json").read_text())["about"] == "Rust agent"
    assert json.loads((tmp_path / "archive" / "config.json").read_text())["recall_limit"] == 3
    written = "".join(p.read_text() for p in tmp_path.rglob("*.json"))
    assert "syt_secret" not in written


def test_who_witnesses_is_chosen_outside_the_profile_never_by_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whoever can write the profile cannot name their own witness peer or drop the chosen
    ones: ``witness_peers`` in hivemind/config.json is ignored, HIVEMIND_WITNESS_PEERS from
    the service's environment decides, a profile ``.env`` that sets it is refused, and
    ``status`` says each in a ``Protection:`` line."""
    from archive_provider.commands import CommandContext
    from archive_provider.commands.status import _human, collect

    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)  # port 9: nothing listens there
    monkeypatch.delenv("HIVEMIND_WITNESS_PEERS", raising=False)
    config = tmp_path / "hivemind" / "config.json"
    config.parent.mkdir()

    def witnesses(settings: dict[str, Any]) -> frozenset[str] | None:
        """The peers the started provider sends its checkpoints to and cosigns for."""
        config.write_text(json.dumps({"connect_wait_s": 0, **settings}))
        provider = HivemindProvider()
        provider.initialize("s1", hermes_home=str(tmp_path), platform="cli")
        try:
            assert provider._link is not None
            witnessing = provider._link._witnessing
            return None if witnessing is None else witnessing._peers
        finally:
            provider.shutdown()

    def protection_lines() -> list[str]:
        status = _human(collect(CommandContext(home=tmp_path, json=False, args=None)))
        return [line for line in status.splitlines() if line.startswith("Protection:")]

    assert witnesses({"witness_peers": ["@mallory:evil.example"]}) is None
    (line,) = protection_lines()
    assert "witness_peers" in line and "HIVEMIND_WITNESS_PEERS" in line, line

    monkeypatch.setenv("HIVEMIND_WITNESS_PEERS", "@bob:hs, @carol:hs")
    chosen = {"@bob:hs", "@carol:hs"}
    assert witnesses({"witness_peers": ["@mallory:evil.example"]}) == chosen
    assert witnesses({"witness_peers": []}) == chosen  # the file cannot drop them either
    assert protection_lines() == []
    with pytest.raises(ValueError, match="HIVEMIND_WITNESS_PEERS"):
        save_settings(tmp_path, {"witness_peers": "@mallory:evil.example"})

    (tmp_path / ".env").write_text("HIVEMIND_WITNESS_PEERS=@mallory:evil.example\n")
    assert witnesses({}) is None  # Hermes would load it over the service's list: not used
    (line,) = protection_lines()
    assert line.startswith("Protection: REFUSED: HIVEMIND_WITNESS_PEERS is refused"), line
