"""A throw-away Synapse on 127.0.0.1, for the hivemind tests and ``hermes-archive demo --peers``.

Stdlib only: callers talk to Synapse over HTTP and never import it, so this module can be
loaded next to matrix-nio without pulling Twisted into the process. Synapse runs as a child
process from the interpreter in ``$SYNAPSE_PYTHON`` (default: this one, with the ``test``
extra installed). Loopback only, no federation, rate limits off, users created with the
shared-secret admin API, and a death signal so Synapse never outlives its parent.
"""

from __future__ import annotations

import base64
import ctypes
import hashlib
import hmac
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SERVER_NAME = "localhost"
READY_DEADLINE_S = 60.0
STOP_GRACE_S = 15.0

# Never let an http_proxy variable reroute loopback traffic.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_UNLIMITED = {"per_second": 10000, "burst_count": 100000}


# Loaded in the parent: the child must not dlopen between fork and exec (other threads may
# hold the loader lock at fork time). Linux only; elsewhere stop() is the only guard.
try:
    _LIBC: ctypes.CDLL | None = ctypes.CDLL("libc.so.6", use_errno=True)
except OSError:
    _LIBC = None
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child between fork and exec: Synapse dies with its parent."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _config(data_dir: Path, port: int, shared_secret: str) -> dict[str, Any]:
    return {
        "server_name": SERVER_NAME,
        "public_baseurl": f"http://127.0.0.1:{port}/",
        "listeners": [
            {
                "port": port,
                "bind_addresses": ["127.0.0.1"],
                "type": "http",
                "tls": False,
                "resources": [{"names": ["client"], "compress": False}],
            }
        ],
        "database": {"name": "sqlite3", "args": {"database": str(data_dir / "homeserver.db")}},
        "media_store_path": str(data_dir / "media"),
        "signing_key_path": str(data_dir / "signing.key"),
        "log_config": str(data_dir / "log.yaml"),
        "registration_shared_secret": shared_secret,
        "macaroon_secret_key": secrets.token_hex(32),
        "form_secret": secrets.token_hex(32),
        "enable_registration": False,
        "bcrypt_rounds": 4,
        "report_stats": False,
        "enable_metrics": False,
        "presence": {"enabled": False},
        "url_preview_enabled": False,
        "federation_domain_whitelist": [],
        "trusted_key_servers": [],
        "suppress_key_server_warning": True,
        "allow_public_rooms_over_federation": False,
        "rc_message": _UNLIMITED,
        "rc_registration": _UNLIMITED,
        "rc_login": {"address": _UNLIMITED, "account": _UNLIMITED, "failed_attempts": _UNLIMITED},
        "rc_joins": {"local": _UNLIMITED, "remote": _UNLIMITED},
        "rc_invites": {"per_room": _UNLIMITED, "per_user": _UNLIMITED, "per_issuer": _UNLIMITED},
        "rc_room_creation": _UNLIMITED,
        "rc_key_requests": _UNLIMITED,
    }


def _log_config(log_file: Path) -> dict[str, Any]:
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
        "handlers": {
            "file": {
                "class": "logging.FileHandler",
                "filename": str(log_file),
                "formatter": "plain",
            }
        },
        "root": {"level": "WARNING", "handlers": ["file"]},
    }


class Homeserver:
    """One Synapse process bound to loopback; stop() and start() keep its port and data."""

    def __init__(self, data_dir: Path, python: str | None = None) -> None:
        self.data_dir = data_dir
        self.python = python or os.environ.get("SYNAPSE_PYTHON") or sys.executable
        self.port = _free_port()
        self.shared_secret = secrets.token_hex(32)
        self.proc: subprocess.Popen[bytes] | None = None
        self.stdout_log = data_dir / "stdout.log"
        self.server_log = data_dir / "homeserver.log"
        self.config_path = data_dir / "homeserver.yaml"
        self._write_files()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def server_name(self) -> str:
        return SERVER_NAME

    def _write_files(self) -> None:
        # JSON is YAML: no templating, no flow-style brace surprises.
        key = base64.b64encode(secrets.token_bytes(32)).decode().rstrip("=")
        (self.data_dir / "signing.key").write_text(f"ed25519 a_{secrets.token_hex(2)} {key}\n")
        (self.data_dir / "log.yaml").write_text(json.dumps(_log_config(self.server_log)))
        config = _config(self.data_dir, self.port, self.shared_secret)
        self.config_path.write_text(json.dumps(config, indent=1))

    def start(self, deadline_s: float = READY_DEADLINE_S) -> None:
        """Spawn Synapse and return once the client API answers; fail fast if it dies."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("Synapse is already running")
        with self.stdout_log.open("ab") as out:
            # Spawned from the calling (main) thread: the death signal is tied to that thread.
            self.proc = subprocess.Popen(
                [self.python, "-m", "synapse.app.homeserver", "-c", str(self.config_path)],
                cwd=self.data_dir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        try:
            self._wait_ready(deadline_s)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, deadline_s: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + deadline_s
        url = f"{self.base_url}/_matrix/client/versions"
        while True:
            code = self.proc.poll()
            if code is not None:
                raise RuntimeError(
                    f"Synapse exited with {code} before it was ready; see {self.stdout_log} "
                    f"and {self.server_log}:\n{self._log_tail()}"
                )
            try:
                with _NO_PROXY.open(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"Synapse not ready after {deadline_s:.0f} s; see {self.stdout_log}:\n"
                    f"{self._log_tail()}"
                )
            time.sleep(0.1)

    def _log_tail(self, lines: int = 30) -> str:
        text = ""
        for path in (self.stdout_log, self.server_log):
            if path.exists():
                text += "".join(path.read_text(errors="replace").splitlines(True)[-lines:])
        return text

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM, wait, then SIGKILL: never leave a Synapse behind."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    @contextmanager
    def down(self) -> Iterator[None]:
        """Stop Synapse for the duration of the block, then start it again (same port, data)."""
        self.stop()
        try:
            yield
        finally:
            self.start()

    def client_api(
        self, access_token: str, method: str, path: str, body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """A raw client-server API call, for set-ups the backend deliberately cannot do."""
        request = urllib.request.Request(
            f"{self.base_url}{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {access_token}", "Content-Type": "application/json"},
        )
        with _NO_PROXY.open(request, timeout=10) as response:
            return json.load(response)

    def register(self, username: str, password: str, admin: bool = False) -> dict[str, Any]:
        """Create a user with the shared-secret admin API; returns user_id, access_token, ..."""
        url = f"{self.base_url}/_synapse/admin/v1/register"
        with _NO_PROXY.open(url, timeout=10) as response:
            nonce = json.load(response)["nonce"]
        signed = b"\x00".join(
            [
                nonce.encode(),
                username.encode(),
                password.encode(),
                b"admin" if admin else b"notadmin",
            ]
        )
        mac = hmac.new(self.shared_secret.encode(), signed, hashlib.sha1).hexdigest()
        payload = {
            "nonce": nonce,
            "username": username,
            "password": password,
            "admin": admin,
            "mac": mac,
        }
        request = urllib.request.Request(
            url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
        )
        with _NO_PROXY.open(request, timeout=10) as response:
            return json.load(response)
