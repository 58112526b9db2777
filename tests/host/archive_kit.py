"""Helpers for the tier A/B acceptance tests of the real archive provider inside Hermes.

Kept apart from ``hostkit`` (host mechanics, provider-agnostic): everything here knows our
provider and its SQLite log. Reads always go through a *fresh* connection (never the
writer's), so an assertion sees only what is committed.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from archive_provider import ArchiveProvider
from archive_provider.format.canonical import decode
from archive_provider.format.verifier import verify_database
from archive_provider.host.install import activate, install_plugin
from archive_provider.projections.registry import default_projections
from archive_provider.storage.store import DB_NAME, KEY_NAME, EventStore, archive_dir
from archive_provider.storage.store_pieces import SIGNING_KEY_NAME, STORE_KEY_NAME
from archive_provider.storage.witness import FIRST_WITNESS_REASON

from . import hostkit

REPO_ROOT = Path(__file__).resolve().parents[2]
HOST_TESTS = Path(__file__).resolve().parent
NAME = "archive"


# ---------------------------------------------------------------------------
# Installing the real provider into a profile
# ---------------------------------------------------------------------------


def install_archive(hermes_home: Path, *, activate_it: bool = True) -> Path:
    """Install the provider the supported way (a thin delegating plugin folder) and activate it."""
    folder = install_plugin(hermes_home, NAME)
    if activate_it:
        activate(hermes_home, NAME)
    hostkit.purge_user_plugin_modules(NAME)
    return folder


def archive_provider_of(agent: Any) -> ArchiveProvider:
    provider = hostkit.external_provider(agent)
    assert isinstance(provider, ArchiveProvider), f"archive provider not active: {provider!r}"
    return provider


def flush(provider: ArchiveProvider, timeout: float = 10.0) -> None:
    """Wait until every write queued so far by ``provider`` is committed."""
    writer = provider.core.writer
    assert writer is not None, "the provider has no open archive"
    assert writer.flush(timeout), "the archive writer did not drain"


# ---------------------------------------------------------------------------
# Recording hook calls on a real provider instance
# ---------------------------------------------------------------------------


@dataclass
class Call:
    hook: str
    thread: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    result: Any = None
    error: BaseException | None = None
    #: deep copies of ``args`` taken before the real method ran (to detect mutation)
    args_before: tuple[Any, ...] = ()


@dataclass
class Recorder:
    """Wraps instance methods so every call is recorded (thread, arguments, result) and
    then runs the real method. ``functools.wraps`` keeps the signature visible to the
    host's ``inspect.signature`` checks."""

    calls: list[Call] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def wrap(self, obj: Any, *names: str) -> Recorder:
        for name in names:
            original = getattr(obj, name)

            def make(hook: str, fn: Callable[..., Any]) -> Callable[..., Any]:
                @functools.wraps(fn)
                def wrapper(*args: Any, **kwargs: Any) -> Any:
                    call = Call(
                        hook,
                        threading.current_thread().name,
                        args,
                        dict(kwargs),
                        args_before=copy.deepcopy(args),
                    )
                    with self._lock:
                        self.calls.append(call)
                    try:
                        call.result = fn(*args, **kwargs)
                    except BaseException as exc:
                        call.error = exc
                        raise
                    return call.result

                return wrapper

            setattr(obj, name, make(name, original))
        return self

    def hooks(self) -> list[str]:
        with self._lock:
            return [c.hook for c in self.calls]

    def of(self, hook: str) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.hook == hook]


# ---------------------------------------------------------------------------
# Reading the log from outside the writer
# ---------------------------------------------------------------------------


def db_path(hermes_home: Path) -> Path:
    return archive_dir(hermes_home) / DB_NAME


@contextlib.contextmanager
def open_view(hermes_home: Path) -> Iterator[EventStore]:
    """A fresh read-only view of a profile's log (its own connection)."""
    store = EventStore.open(archive_dir(hermes_home), create=False, readonly=True)
    try:
        yield store
    finally:
        store.close()


def events(hermes_home: Path, *types: str) -> list[Any]:
    """Committed events (optionally of some types), in sequence order: the ones the host's
    hooks caused, so the store's own first event (v2's ``store_created``) and the writer's
    first-witness marker are left out."""
    if not db_path(hermes_home).exists():
        return []
    with open_view(hermes_home) as store:
        return [
            e
            for e in store.events()
            if (not types or e.type in types)
            and not is_first_witness(e)
            and e.type != "store_created"
        ]


def is_first_witness(event: Any) -> bool:
    """The ``witness_accepted`` event the writer appends when a store is first witnessed."""
    return event.type == "witness_accepted" and event.body.get("reason") == FIRST_WITNESS_REASON


def messages_of(hermes_home: Path, event: Any) -> list[Any]:
    """The decoded messages a turn or checkpoint event names (by digest)."""
    digests = event.messages if event.type == "turn" else event.body["evidence"]
    with open_view(hermes_home) as store:
        out = []
        for digest in digests:
            body = store.payload(digest)
            assert body is not None, f"part {digest} of event {event.seq} is missing"
            out.append(decode(body))
        return out


def counts(hermes_home: Path) -> dict[str, int]:
    """Row counts of the log tables (events, payloads, head seq)."""
    if not db_path(hermes_home).exists():
        return {"events": 0, "payloads": 0, "head": 0}
    conn = sqlite3.connect(f"{db_path(hermes_home).as_uri()}?mode=ro", uri=True)
    try:
        head = conn.execute("SELECT seq FROM head WHERE id = 1").fetchone()
        return {
            "events": conn.execute("SELECT count(*) FROM events").fetchone()[0],
            "payloads": conn.execute("SELECT count(*) FROM payloads").fetchone()[0],
            "head": head[0] if head else 0,
        }
    finally:
        conn.close()


def query(hermes_home: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"{db_path(hermes_home).as_uri()}?mode=ro", uri=True)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def all_payload_values(hermes_home: Path) -> list[Any]:
    """Every stored payload body, decoded (to prove a text is *not* anywhere in the store)."""
    return [decode(bytes(row[0])) for row in query(hermes_home, "SELECT body FROM payloads")]


def verify(hermes_home: Path) -> Any:
    """The standalone verifier over the profile's log."""
    with open_view(hermes_home) as store:
        return verify_database(store.conn, store.key)


# ---------------------------------------------------------------------------
# Replay: rebuild every projection from the log alone and compare with the live ones
# ---------------------------------------------------------------------------


def projection_digests(conn: sqlite3.Connection) -> dict[str, str]:
    return {p.name: p.digest(conn) for p in default_projections()}


def live_and_replayed(hermes_home: Path, scratch: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(live projection digests, digests after rebuilding every projection from the log).

    The rebuild runs on a copy: the projection tables are dropped, then the store is
    reopened, which replays the whole log into fresh projections (``EventStore.open``
    catches up any projection behind the log).
    """
    source = archive_dir(hermes_home)
    copy_dir = scratch / "replayed_archive"
    shutil.rmtree(copy_dir, ignore_errors=True)
    copy_dir.mkdir(parents=True)
    for key_file in (KEY_NAME, STORE_KEY_NAME, SIGNING_KEY_NAME):  # v1's key, or v2's two
        if (source / key_file).exists():
            shutil.copy2(source / key_file, copy_dir / key_file)
    src = sqlite3.connect(f"{(source / DB_NAME).as_uri()}?mode=ro", uri=True)
    dst = sqlite3.connect(copy_dir / DB_NAME)
    try:
        live = projection_digests(src)
        src.backup(dst)
    finally:
        src.close()
    try:
        for projection in default_projections():
            projection.drop(dst)
        dst.commit()
        left = dst.execute("SELECT count(*) FROM projection_state").fetchone()[0]
        assert left == 0, "projection state survived the drop"
    finally:
        dst.close()
    rebuilt = EventStore.open(copy_dir, projections=default_projections())
    try:
        replayed = projection_digests(rebuilt.conn)
    finally:
        rebuilt.close()
    check = replay_module_check(hermes_home, scratch)
    if check is not None:  # the package's own replay agrees with the independent rebuild
        assert check.ok, f"replay.verify_projections mismatched: {check.mismatched}"
        assert (check.live, check.rebuilt) == (live, replayed)
    return live, replayed


def replay_module_check(hermes_home: Path, scratch: Path) -> Any:
    """``archive_provider.audit.replay.verify_projections`` when the package has it, else None."""
    try:
        from archive_provider.audit.replay import verify_projections
    except ImportError:
        return None
    folder = scratch / "replay_module_scratch"
    folder.mkdir(parents=True, exist_ok=True)
    return verify_projections(archive_dir(hermes_home), scratch_dir=folder)


# ---------------------------------------------------------------------------
# Failure injection
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def write_lock_held(hermes_home: Path) -> Iterator[sqlite3.Connection]:
    """Hold ``BEGIN EXCLUSIVE`` on the profile's database from another connection."""
    path = db_path(hermes_home)
    assert path.exists(), "create the store first (the lock needs the file)"
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("BEGIN EXCLUSIVE")
    try:
        yield conn
    finally:
        conn.execute("ROLLBACK")
        conn.close()


def wait_for(predicate: Callable[[], bool], timeout: float = 15.0, interval: float = 0.05) -> bool:
    """Poll until ``predicate()`` holds (for effects that land on another thread)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


# ---------------------------------------------------------------------------
# Subprocesses
# ---------------------------------------------------------------------------


def child_env(hermes_home: Path, **extra: str) -> dict[str, str]:
    """Environment for a child process: this profile, a bare HOME, no real credentials,
    and proxies pointing nowhere so an accidental HTTP call fails fast instead of leaving."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.endswith(("_API_KEY", "_BASE_URL")) and k not in {"HERMES_SESSION_ID"}
    }
    env.update(
        HERMES_HOME=str(hermes_home),
        PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(HOST_TESTS)]),
        HTTP_PROXY="http://127.0.0.1:9",
        HTTPS_PROXY="http://127.0.0.1:9",
        NO_PROXY="127.0.0.1,localhost",
        PYTHONDONTWRITEBYTECODE="1",
    )
    env.update(extra)
    return env


def run_child(script: str, hermes_home: Path, *args: str, timeout: float = 60.0) -> Any:
    """Run ``archive_child.py <script> args...`` and return its JSON stdout."""
    proc = subprocess.run(
        [sys.executable, str(HOST_TESTS / "archive_child.py"), script, *args],
        env=child_env(hermes_home),
        cwd=str(REPO_ROOT),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"child {script} failed ({proc.returncode}):\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])
