"""Where else the erased words live: the host's own files under the profile.

``forget`` never touches host files (the host's log, its memory files, its session
database): they are the host's, and the archive cannot know their formats or their
owners' duties. It tells the operator which of them still hold an erased text, so a
data-subject request can be finished by hand (docs/OPERATIONS.md, "Data-subject requests").
The scan is read-only, exact-match (each text as UTF-8 and as JSON escapes it) and bounded
in files and bytes; what it did not read it says.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

#: files the scan reads at most, and bytes in all
MAX_FILES = 2000
MAX_BYTES = 1 << 30
#: folders under the profile never read: the archive (erased in place) and installed code
SKIPPED_DIRS = frozenset({"archive", "plugins", "node_modules", ".git", "__pycache__"})
#: the one file of the archive folder no erasure reaches: the format-1 log ``migrate`` kept
#: (FORMAT.md 19), which holds every text the v1 archive held
KEPT_V1_FILE = "archive/events.v1.db"
_CHUNK = 1 << 20


@dataclass
class HostCopies:
    """The host files holding an erased text, and what the scan left unread."""

    files: list[dict[str, object]] = field(default_factory=list)  # {"path", "texts"}
    scanned: int = 0
    unread: list[str] = field(default_factory=list)  # over the bounds, or unreadable

    def as_dict(self) -> dict[str, object]:
        return {"files": self.files, "scanned": self.scanned, "unread": self.unread}

    def lines(self) -> list[str]:
        said = [
            f"the host still holds erased text in {f['path']} ({f['texts']} text(s)): "
            "erase it there by hand (docs/OPERATIONS.md, 'Data-subject requests')"
            for f in self.files
        ]
        if self.unread:
            more = f" and {len(self.unread) - 3} more" if len(self.unread) > 3 else ""
            said.append(f"host files not scanned: {', '.join(self.unread[:3])}{more}")
        return said


def scan(home: Path, texts: Iterable[str]) -> HostCopies:
    """Which files under the profile ``home`` hold one of ``texts`` verbatim."""
    needles = _needles(texts)
    found = HostCopies()
    if not needles:
        return found
    budget = MAX_BYTES
    longest = max(len(n) for group in needles for n in group)
    for path in _files(home):
        relative = path.relative_to(home).as_posix()
        try:
            size = path.stat().st_size
        except OSError:
            found.unread.append(relative)
            continue
        if found.scanned >= MAX_FILES or size > budget:
            found.unread.append(relative)
            continue
        budget -= size
        found.scanned += 1
        try:
            hits = _hits(path, needles, longest)
        except OSError:
            found.unread.append(relative)
            continue
        if hits:
            found.files.append({"path": relative, "texts": hits})
    return found


def _needles(texts: Iterable[str]) -> list[tuple[bytes, ...]]:
    """Each text's byte forms: UTF-8, and JSON's escaping (how logs and JSON files hold it)."""
    out: list[tuple[bytes, ...]] = []
    for text in sorted(set(texts)):
        raw = text.encode("utf-8", "surrogatepass")
        escaped = json.dumps(text)[1:-1].encode()
        out.append((raw,) if escaped == raw else (raw, escaped))
    return out


def _files(home: Path) -> Iterable[Path]:
    kept = home / KEPT_V1_FILE
    if kept.is_file() and not kept.is_symlink():
        yield kept
    for folder, dirs, names in os.walk(home):
        base = Path(folder)
        dirs[:] = sorted(
            d
            for d in dirs
            if not (base / d).is_symlink() and not (base == home and d in SKIPPED_DIRS)
        )
        for name in sorted(names):
            path = base / name
            if path.is_file() and not path.is_symlink():
                yield path


def _hits(path: Path, needles: list[tuple[bytes, ...]], longest: int) -> int:
    """How many of the texts occur in the file, read in chunks that overlap by a needle."""
    left = set(range(len(needles)))
    tail = b""
    with path.open("rb") as handle:
        while left:
            block = handle.read(_CHUNK)
            if not block:
                break
            window = tail + block
            for index in list(left):
                if any(n in window for n in needles[index]):
                    left.discard(index)
            tail = window[-longest:]
    return len(needles) - len(left)
