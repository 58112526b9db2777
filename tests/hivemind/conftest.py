"""Fixtures for the hivemind tests: one real Synapse per session, users and backends on demand.

If Synapse cannot start, the tests that need it fail (they never skip): a hivemind that was
never run against a homeserver is not tested.
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hivemind.homeserver import Homeserver
from hivemind.matrix_backend import MatrixBackend, context_thread


@dataclass(frozen=True)
class TestUser:
    """A registered account; the access token stays out of the repr."""

    __test__ = False  # not a test class, despite the name

    user_id: str
    device_id: str
    password: str = field(repr=False)
    access_token: str = field(repr=False)


@pytest.fixture(scope="session")
def homeserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A Synapse on 127.0.0.1 for the whole session; `.down()` stops and restarts it."""
    hs = Homeserver(tmp_path_factory.mktemp("synapse"))
    try:
        hs.start()
        yield hs
    finally:
        hs.stop()


@pytest.fixture
def make_user(homeserver: Any) -> Callable[..., TestUser]:
    """Register a fresh user with a unique name on the session homeserver."""

    def make(prefix: str = "agent") -> TestUser:
        password = secrets.token_urlsafe(12)
        reply = homeserver.register(f"{prefix}_{secrets.token_hex(4)}", password)
        return TestUser(reply["user_id"], reply["device_id"], password, reply["access_token"])

    return make


@pytest.fixture
def make_backend(homeserver: Any, tmp_path: Path) -> Iterator[Callable[..., MatrixBackend]]:
    """Build (not start) backends with a per-user crypto store; all are closed afterwards,
    and their loop threads must be gone within close()'s bound."""
    backends: list[MatrixBackend] = []
    threads: list[threading.Thread] = []

    def recording_factory(target: Callable[[], None], name: str) -> threading.Thread:
        threads.append(context_thread(target, name))
        return threads[-1]

    def make(user: TestUser, *, store_dir: Path | None = None, **kwargs: Any) -> MatrixBackend:
        store = store_dir or tmp_path / f"store-{user.user_id.split(':')[0].lstrip('@')}"
        if "password" not in kwargs:
            kwargs.setdefault("access_token", user.access_token)
            kwargs.setdefault("device_id", user.device_id)
        kwargs.setdefault("thread_factory", recording_factory)
        backend = MatrixBackend(homeserver.base_url, user.user_id, store, **kwargs)
        backends.append(backend)
        return backend

    yield make
    for backend in backends:
        backend.close(timeout=5)
    assert [t.name for t in threads if t.is_alive()] == []


@pytest.fixture
def host_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The host's HERMES_HOME for config.yaml (auxiliary models), with no real account:
    provider keys and base URLs are scrubbed, so summaries find no model unless a test
    configures the loopback fake LLM in ``host_home / "config.yaml"``."""
    home = tmp_path / "hermes-host"
    home.mkdir()
    monkeypatch.setenv("HERMES_HOME", str(home))
    monkeypatch.setenv("HOME", str(tmp_path / "user-home"))
    for name in list(os.environ):
        if name.endswith(("_API_KEY", "_BASE_URL")):
            monkeypatch.delenv(name)
    return home


@pytest.fixture
def make_agent(
    homeserver: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host_home: Path
) -> Iterator[Callable[..., Any]]:
    """Start HivemindProviders, each with its own HERMES_HOME; all are shut down afterwards.

    The credentials are set in the environment just before ``initialize`` (hermes 0.19.0
    has no per-profile secret scope): each provider keeps the ones it started with.
    """
    from hivemind import HivemindProvider

    from .agents import write_config

    started: list[HivemindProvider] = []

    def make(
        user: TestUser, *, home: Path | None = None, session: str = "s1", **config: Any
    ) -> HivemindProvider:
        home = home or tmp_path / user.user_id.split(":")[0].lstrip("@")
        # who witnesses comes from the service's environment, never the profile's files
        monkeypatch.setenv("HIVEMIND_WITNESS_PEERS", ",".join(config.pop("witness_peers", ())))
        write_config(home, **config)
        monkeypatch.setenv("MATRIX_HOMESERVER", homeserver.base_url)
        monkeypatch.setenv("MATRIX_USER_ID", user.user_id)
        monkeypatch.setenv("MATRIX_ACCESS_TOKEN", user.access_token)
        monkeypatch.setenv("MATRIX_DEVICE_ID", user.device_id)
        provider = HivemindProvider()
        assert provider.is_available()
        provider.initialize(session, hermes_home=str(home), platform="cli", agent_context="primary")
        started.append(provider)
        return provider

    yield make
    for provider in started:
        provider.shutdown()
    lingering = [
        t.name
        for t in threading.enumerate()
        if t.name.startswith(("hivemind-", "archive-writer")) and t.is_alive()
    ]
    assert lingering == []
