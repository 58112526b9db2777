"""Protection variables: settings that must come from outside the profile they protect.

The witness location, the signing key and the hivemind peers that witness the archive are
trusted only because whoever can write the profile folder (``HERMES_HOME``) cannot choose
them (docs/DESIGN.md, "Trust boundary").
The process environment is outside the folder only where nothing in the folder feeds it,
and Hermes does feed it: at start-up it loads ``$HERMES_HOME/.env`` into ``os.environ``
with override (CLI, gateway, cron), and ``$HERMES_HOME/.op.env`` for what is still unset.
So a protection variable is refused when either profile file names it, or when its value
resolves inside ``HERMES_HOME`` (a witness or key beside the archive it vouches for).
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

from ..errors import ArchiveDamaged

WITNESS_ENV = "ARCHIVE_WITNESS_DIR"
SIGNING_KEY_ENV = "HERMES_ARCHIVE_SIGNING_KEY"
WITNESS_PEERS_ENV = "HIVEMIND_WITNESS_PEERS"
#: each protection variable and what it protects (docs/OPERATIONS.md lists them)
PROTECTION_VARIABLES = {
    WITNESS_ENV: "the local witness (rollback and rewrite detection, the pinned log key)",
    SIGNING_KEY_ENV: "the signing key (checkpoint signatures, spill record authentication)",
    "ARCHIVE_SHIP_TO": "the central store the archive is shipped to",
    "ARCHIVE_SHIP_REQUIRED": "whether shipping is required",
    "ARCHIVE_SHIP_MAX_LAG_S": "how far shipping may fall behind before it counts as behind",
    WITNESS_PEERS_ENV: "the hivemind peers that witness the archive (and that it witnesses)",
}
#: protection settings a settings file in the profile may still name (they were read there
#: before): (folder, key) -> the variable that sets them now; the file's value is ignored
IGNORED_IN_PROFILE = {("hivemind", "witness_peers"): WITNESS_PEERS_ENV}
#: the protection variables that name a file or folder, refused too when it is inside
PATH_VARIABLES = (WITNESS_ENV, SIGNING_KEY_ENV)
#: the files in the profile Hermes loads into the environment at start-up
PROFILE_ENV_FILES = (".env", ".op.env")
ENV_FILE_LIMIT = 1 << 20
_ASSIGNMENT = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_.-]*)\s*[=:]")


class InsideProfile(ArchiveDamaged):
    """A protection variable comes from inside the profile; the message names it and why."""


def profile_sets(home: Path, name: str) -> Path | None:
    """The profile env file that assigns ``name``, if any (read leniently: a line that may
    assign it counts, so a parse the host reads differently can only refuse more)."""
    for file_name in PROFILE_ENV_FILES:
        path = home / file_name
        text = _profile_file_text(path)
        for line in text.splitlines():
            found = _ASSIGNMENT.match(line)
            if found and found.group(1) == name:
                return path
    return None


def _profile_file_text(path: Path) -> str:
    """The text of a profile env or settings file ('' when absent or not a regular file):
    opened without blocking, so a FIFO put in its place cannot hang ``status``; links are
    followed, as Hermes follows them; at most :data:`ENV_FILE_LIMIT` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        return os.read(fd, ENV_FILE_LIMIT).decode("utf-8", errors="replace")
    finally:
        os.close(fd)


def _inside(value: str, home: Path) -> bool:
    resolved = Path(os.path.realpath(Path(value).expanduser()))
    root = Path(os.path.realpath(home))
    return resolved == root or root in resolved.parents


def outside_value(name: str, home: str | os.PathLike[str]) -> str | None:
    """The value of protection variable ``name`` (None when unset), or :class:`InsideProfile`
    when the profile sets it or it points inside ``home``."""
    folder = Path(home).expanduser().absolute()
    source = profile_sets(folder, name)
    if source is not None:
        raise InsideProfile(
            f"{name} is refused: {source} sets it, and that file is inside the profile it "
            f"protects (Hermes loads it over the environment). Remove it from {source.name} "
            "and set it in the environment of the service that starts Hermes."
        )
    value = os.environ.get(name)
    if value and name in PATH_VARIABLES and _inside(value, folder):
        raise InsideProfile(
            f"{name} is refused: {value} is inside the profile {folder} that it protects. "
            "Keep it outside HERMES_HOME (docs/OPERATIONS.md, 'Keep outside the profile')."
        )
    return value or None


def ignored_in_profile(home: str | os.PathLike[str]) -> list[str]:
    """One line per protection setting named in a settings file of the profile
    (:data:`IGNORED_IN_PROFILE`): it is ignored there, and the line says where it goes."""
    folder = Path(home).expanduser().absolute()
    lines = []
    for (section, key), name in IGNORED_IN_PROFILE.items():
        path = folder / section / "config.json"
        try:
            data = json.loads(_profile_file_text(path) or "{}")
        except ValueError:
            continue  # the settings reader reports a file that is not JSON
        if isinstance(data, dict) and data.get(key) not in (None, "", []):
            lines.append(
                f"{section} setting {key} in {path} is ignored: {PROTECTION_VARIABLES[name]} "
                "cannot be chosen from inside the profile they protect. Remove it there and "
                f"set {name} in the environment of the service that starts Hermes."
            )
    return lines


def inside_problems(home: str | os.PathLike[str]) -> list[str]:
    """One line per protection variable refused for ``home``, and per protection setting
    a settings file in the profile names (for status)."""
    problems = []
    for name in PROTECTION_VARIABLES:
        try:
            outside_value(name, home)
        except InsideProfile as exc:
            problems.append(str(exc))
    return problems + ignored_in_profile(home)
