"""Fixtures for tests that run the real Hermes host (hermes-agent) offline.

Every test in ``tests/host`` gets the network guard (loopback only, contract section 6) and
an environment snapshot restored afterwards: ``AIAgent`` sets ``HERMES_SESSION_ID`` in
``os.environ`` itself, which would otherwise leak between tests.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_REPO_ROOT = Path(__file__).resolve().parents[2]
if str(_REPO_ROOT) not in sys.path:  # plain ``pytest`` (not ``python -m pytest``)
    sys.path.insert(0, str(_REPO_ROOT))

try:
    import agent.memory_manager  # noqa: F401  (hermes-agent is what these tests exercise)
except ImportError:  # pragma: no cover - run without the host: nothing here applies
    collect_ignore_glob = ["*"]
else:
    from . import hostkit

from archive_provider.demo.fake_llm import FakeLLM  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tag everything here with the ``host`` marker declared in pyproject.toml."""
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.host)


@pytest.fixture(autouse=True)
def _restore_environ() -> Iterator[None]:
    """Put ``os.environ`` back exactly as it was (the host writes to it)."""
    saved = dict(os.environ)
    yield
    for name in set(os.environ) - set(saved):
        del os.environ[name]
    for name, value in saved.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> hostkit.NetworkGuard:
    """Allow only loopback and Unix-socket connects; blocked attempts are recorded."""
    return hostkit.NetworkGuard().install(monkeypatch)


@pytest.fixture
def hermes_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh ``HERMES_HOME``; ``HOME`` points at another empty dir so nothing hits ``~``."""
    home = hostkit.isolate_hermes_home(monkeypatch, tmp_path / "hermes_home", tmp_path / "user")
    hostkit.purge_user_plugin_modules()
    yield home
    hostkit.purge_user_plugin_modules()


@pytest.fixture
def user_home(hermes_home: Path) -> Path:
    """The empty directory ``HOME`` points at (assert it stays empty)."""
    return Path(os.environ["HOME"])


@pytest.fixture
def fake_llm() -> Iterator[FakeLLM]:
    """A started loopback fake LLM; script it with ``fake_llm.set_script`` / ``push``."""
    with FakeLLM() as server:
        yield server


@pytest.fixture
def install_memory_plugin(hermes_home: Path) -> Callable[..., Path]:
    """``install_memory_plugin(name, source=None, settings=None, activate=True) -> Path``."""

    def _install(name: str, **kwargs: Any) -> Path:
        return hostkit.install_memory_plugin(hermes_home, name, **kwargs)

    return _install


@pytest.fixture
def offline_agent(hermes_home: Path, fake_llm: FakeLLM) -> Iterator[Callable[..., Any]]:
    """Factory for real ``AIAgent``s against ``fake_llm``; all are torn down afterwards."""
    agents: list[Any] = []

    def _build(**overrides: Any) -> Any:
        agent = hostkit.build_offline_agent(fake_llm.base_url, model=fake_llm.model, **overrides)
        agents.append(agent)
        return agent

    yield _build
    for agent in agents:
        hostkit.close_agent(agent)
