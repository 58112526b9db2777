"""The built-in memory reducer: MEMORY.md / USER.md entries from add/replace/remove writes.

Pure. hermes-agent 0.19.0 sends ``replace``/``remove`` with the caller's search text
(``metadata["old_text"]``, a substring) and, for ``remove``, empty content; newer hosts
also send ``metadata["previous_content"]``. The reducer resolves which entry changed from
its own state, mirroring the host's memory tool:

1. ``previous_content`` given and an entry equals it exactly: that entry.
2. otherwise the entries containing ``old_text`` (stripped): one distinct text → the first
   entry with it (the host's rule for exact duplicates).
3. several distinct entries match (the host would have refused; it can only happen when the
   archive started after the memory did): the first match, recorded as ``ambiguous``.
4. nothing matches (the entry predates the archive): ``replace`` adds the new content,
   ``remove`` changes nothing; both recorded as ``unresolved``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MemoryChange:
    """What one write did to one target's entries (for history and as-of)."""

    action: str
    target: str
    index: int | None  # position affected, None when nothing changed
    before: str | None
    after: str | None
    resolution: str  # exact | substring | ambiguous | unresolved | appended | ignored


def _locate(entries: Sequence[str], metadata: Mapping[str, Any]) -> tuple[int | None, str]:
    previous = metadata.get("previous_content")
    if isinstance(previous, str) and previous in entries:
        return entries.index(previous), "exact"
    old_text = metadata.get("old_text")
    if not isinstance(old_text, str) or not old_text.strip():
        return None, "unresolved"
    needle = old_text.strip()
    matches = [i for i, entry in enumerate(entries) if needle in entry]
    if not matches:
        return None, "unresolved"
    distinct = {entries[i] for i in matches}
    return matches[0], "substring" if len(distinct) == 1 else "ambiguous"


def apply_write(
    entries: Sequence[str], action: str, target: str, content: str, metadata: Mapping[str, Any]
) -> tuple[list[str], MemoryChange]:
    """Return the entries after one write and a description of the change."""
    result = list(entries)
    if action == "add":
        result.append(content)
        return result, MemoryChange(action, target, len(result) - 1, None, content, "appended")
    if action not in ("replace", "remove"):
        return result, MemoryChange(action, target, None, None, None, "ignored")
    index, resolution = _locate(result, metadata)
    if index is None:
        if action == "replace" and content:
            result.append(content)
            return result, MemoryChange(action, target, len(result) - 1, None, content, "unresolved")
        return result, MemoryChange(action, target, None, None, None, "unresolved")
    before = result[index]
    if action == "replace":
        result[index] = content
        return result, MemoryChange(action, target, index, before, content, resolution)
    del result[index]
    return result, MemoryChange(action, target, index, before, None, resolution)
