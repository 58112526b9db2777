"""A real PostgreSQL server for the fleet tests, started from Debian's binaries.

PostgreSQL refuses to run as root, and CI runs as root: the server runs as an unprivileged
user (``postgres``, created when missing) in a fresh folder under /tmp that the user owns,
listening on 127.0.0.1 on a free port and on a unix socket in the same folder. Local socket
connections are trusted (the tests' superuser door); TCP connections need a password
(SCRAM), so the password handling of the shipper is exercised for real.

Test-only: :meth:`PgServer.kill` stops the server the way a crash does (``pg_ctl stop -m
immediate``: no checkpoint, WAL recovery at the next start) and :meth:`start` brings it
back on the same port.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

PG_BIN = Path(os.environ.get("HERMES_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
SUPERUSER = "postgres"
SUPERUSER_PASSWORD = "super-secret-pw"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _server_user() -> str | None:
    """The OS user the server runs as: ``postgres`` when we are root, else ourselves."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/bin/false", "postgres"],
            check=True,
        )
    return "postgres"


class PgServer:
    """One PostgreSQL cluster in a temporary folder; ``start`` / ``kill`` / ``stop``."""

    def __init__(self) -> None:
        for tool in ("initdb", "pg_ctl", "postgres"):
            if not (PG_BIN / tool).exists():
                raise RuntimeError(
                    f"{PG_BIN / tool} is missing: install Debian's postgresql-15 "
                    "(.ci/setup does) or set HERMES_TEST_PG_BIN"
                )
        self.user = _server_user()
        self.root = Path(tempfile.mkdtemp(prefix="hermes-pg-"))
        self.data = self.root / "data"
        self.socket_dir = self.root / "sock"
        self.socket_dir.mkdir()
        self.log = self.root / "server.log"
        self.port = _free_port()
        self.host = "127.0.0.1"
        if self.user:
            for path in (self.root, self.socket_dir):
                shutil.chown(path, self.user, self.user)
        os.chmod(self.root, 0o755)  # the test process reads the log and the socket
        pwfile = self.root / "pw"
        pwfile.write_text(SUPERUSER_PASSWORD + "\n")
        if self.user:
            shutil.chown(pwfile, self.user, self.user)
        self._run(
            [
                str(PG_BIN / "initdb"),
                "-D",
                str(self.data),
                "-U",
                SUPERUSER,
                "--pwfile",
                str(pwfile),
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
                "--locale=C",
            ]
        )
        pwfile.unlink()

    def _run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            argv,
            user=self.user,
            cwd=self.root,
            capture_output=True,
            text=True,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C"},
            timeout=120,
        )
        if done.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(
                f"{argv[0]} failed ({done.returncode}): {done.stdout}{done.stderr}\n{log[-3000:]}"
            )
        return done

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.socket_dir} -c listen_addresses={self.host} "
            "-c fsync=off -c full_page_writes=off -c max_connections=60 "
            "-c shared_buffers=32MB"
        )
        self._run(
            [str(PG_BIN / "pg_ctl"), "start", "-w", "-t", "60", "-D", str(self.data)]
            + ["-l", str(self.log), "-o", options]
        )

    def kill(self) -> None:
        """Stop like a crash: every backend gone at once, recovery at the next start."""
        self._run([str(PG_BIN / "pg_ctl"), "stop", "-m", "immediate", "-D", str(self.data)])

    def stop(self) -> None:
        self._run([str(PG_BIN / "pg_ctl"), "stop", "-m", "fast", "-D", str(self.data)])

    def running(self) -> bool:
        done = subprocess.run(
            [str(PG_BIN / "pg_ctl"), "status", "-D", str(self.data)],
            user=self.user,
            capture_output=True,
        )
        return done.returncode == 0

    def cleanup(self) -> None:
        if self.running():
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def superuser_dsn(self, dbname: str = "postgres") -> str:
        """The trusted unix-socket door (no password): for setting up and tampering."""
        return f"host={self.socket_dir} port={self.port} user={SUPERUSER} dbname={dbname}"

    def url(self, user: str, password: str | None, dbname: str) -> str:
        """A libpq URL over TCP (password auth), as a user would write it."""
        auth = f"{user}:{password}" if password is not None else user
        return f"postgresql://{auth}@{self.host}:{self.port}/{dbname}?sslmode=disable"
