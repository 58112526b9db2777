"""Install the provider into a profile for hosts without entry-point discovery (0.19.0).

hermes-agent 0.19.0 only discovers memory providers in ``$HERMES_HOME/plugins/<name>/``,
recognising a folder whose ``__init__.py`` mentions ``register_memory_provider``. The
folder written here is thin: every file delegates to the installed package, so upgrading
the package upgrades the plugin.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from importlib.resources import files
from pathlib import Path

from ..errors import InvalidRequest

PROVIDERS = {"archive": "archive_provider", "hivemind": "hivemind"}

_INIT = '''"""{name}: installed by `hermes-archive install`; delegates to the {package} package."""

# hermes recognises this folder by the name register_memory_provider.
from {package} import register  # noqa: F401  (calls ctx.register_memory_provider)
'''

_CLI = '''"""`hermes {name} ...`: the same commands as `hermes-archive`."""

from archive_provider.cli import archive_command, register_cli  # noqa: F401

{name}_command = archive_command
'''


def plugin_files(name: str) -> dict[str, str]:
    """The files of the plugin folder for provider ``name``."""
    package = PROVIDERS[name]
    source = files(package)
    return {
        "__init__.py": _INIT.format(name=name, package=package),
        "cli.py": _CLI.format(name=name),
        "plugin.yaml": source.joinpath("plugin.yaml").read_text(encoding="utf-8"),
        "config_schema.py": source.joinpath("config_schema.py").read_text(encoding="utf-8"),
    }


def install_plugin(home: Path, name: str) -> Path:
    """Write (or refresh) ``<home>/plugins/<name>/``; returns the folder."""
    if name not in PROVIDERS:
        raise ValueError(f"unknown provider {name!r}; choose from {', '.join(PROVIDERS)}")
    target = home / "plugins" / name
    staging = target.with_name(f".{name}.installing")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for filename, text in plugin_files(name).items():
        (staging / filename).write_text(text, encoding="utf-8")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


_MEMORY_BLOCK = re.compile(r"^memory:[ \t]*(#.*)?$", re.MULTILINE)
_TOP_LEVEL = re.compile(r"^\S", re.MULTILINE)
_PROVIDER_LINE = re.compile(r"^([ \t]+)provider:[^\n]*$", re.MULTILINE)


_MEMORY_EMPTY = re.compile(r"^memory:[ \t]*(\{\s*\}|null|~)[ \t]*(#.*)?$", re.MULTILINE)
_MEMORY_INLINE = re.compile(r"^memory:[ \t]*[^\s#]", re.MULTILINE)


class ConfigError(InvalidRequest):
    """config.yaml cannot be edited as it is; the message says where."""


def set_memory_provider(text: str, name: str) -> str:
    """Set ``memory.provider`` in config.yaml text, leaving every other line as it was.

    A flow-style ``memory: {...}`` mapping with content is the one shape edited through a
    YAML round trip (comments in the file are then lost; the values are kept).
    """
    text = _MEMORY_EMPTY.sub("memory:", text)
    if _MEMORY_INLINE.search(text):
        import yaml

        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            where = getattr(exc, "problem_mark", None)
            raise ConfigError(
                f"config.yaml is not valid YAML ({getattr(exc, 'problem', None) or 'unreadable'}"
                f"{f' at line {where.line + 1}' if where else ''}); fix it and run again"
            ) from None
        if not isinstance(data, dict) or not isinstance(data.get("memory", {}), dict):
            raise ConfigError("config.yaml has no mapping at its top or under memory:; fix it")
        data.setdefault("memory", {})["provider"] = name
        return str(yaml.safe_dump(data, sort_keys=False))
    block = _MEMORY_BLOCK.search(text)
    if block is None:
        prefix = text if not text or text.endswith("\n") else text + "\n"
        return f"{prefix}memory:\n  provider: {name}\n"
    start = block.end()
    following = _TOP_LEVEL.search(text, start + 1)
    end = following.start() if following else len(text)
    body = text[start:end]
    line = _PROVIDER_LINE.search(body)
    if line:
        body = body[: line.start()] + f"{line.group(1)}provider: {name}" + body[line.end() :]
    else:
        indent = re.search(r"^([ \t]+)\S", body, re.MULTILINE)
        body = f"\n{indent.group(1) if indent else '  '}provider: {name}" + body
    return text[:start] + body + text[end:]


def activate(home: Path, name: str) -> Path:
    """Make ``name`` the profile's memory provider in ``<home>/config.yaml``.

    The file is rewritten atomically with the mode and owner it had (a private 0600 file
    stays private whatever the umask); a symlinked config.yaml is written through to its
    target, which stays a link. Anything but a regular file there is refused.
    """
    link = home / "config.yaml"
    path = Path(os.path.realpath(link))
    try:
        st: os.stat_result | None = os.stat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{link} is not a regular file; refusing to rewrite it")
    text = path.read_text(encoding="utf-8") if st is not None else ""
    updated = set_memory_provider(text, name)
    mode = stat.S_IMODE(st.st_mode) if st is not None else 0o600
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(updated)
            handle.flush()
            if st is not None and (st.st_uid, st.st_gid) != (os.geteuid(), os.getegid()):
                os.fchown(handle.fileno(), st.st_uid, st.st_gid)
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return link
