"""The built-in memory reducer: MEMORY.md / USER.md entries from add/replace/remove writes.

Pure. It mirrors hermes' memory tool (``tools/memory_tool.py``), which only tells
providers about writes that succeeded: ``add`` appends the stripped content unless an equal
entry exists ("already exists" still counts as success); ``replace``/``remove`` find the
entry containing the stripped ``old_text``. hermes-agent 0.19.0 sends that search text as
``metadata["old_text"]`` (and, for ``remove``, empty content); newer hosts also send
``metadata["previous_content"]``, the entry's full text before the write. The reducer
resolves which entry changed from its own state, in this order (the ``resolution``):

1. ``previous_content``: an entry equals the previous content exactly.
2. ``substring``: the entries containing ``old_text`` (or, without it, ``previous_content``)
   hold one distinct text: the first entry with it (the host's rule for exact duplicates).
3. ``exact``: several distinct entries contain it but one equals it exactly: that one.
4. ``ambiguous``: several distinct entries contain it and none equals it: the first in
   order. The host refuses such a write, so it only happens when the archive's state
   differs from the host's (memory written before the archive existed, or by a context the
   archive does not record); ``candidates`` says how many entries were in doubt.
5. ``unresolved``: nothing matches. ``replace`` then adds the new content as an entry (the
   host has it now), ``remove`` changes nothing; the host's ``previous_content``, if sent,
   is kept as ``before`` so history still shows what was replaced.

``duplicate`` (an ``add`` of an existing entry) and ``ignored`` (an unknown action, or
empty new content, which the host refuses) change nothing. A ``replace`` that makes an
entry equal to another collapses the two, keeping the first, as the host's reload does
(``merged`` names the entry that disappeared).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .evidence import bindable_text


@dataclass(frozen=True)
class Entry:
    """One memory entry as it stands."""

    content: str
    entry: int  # lineage id: seq of the write that created the entry (survives replaces)
    seq: int  # seq of the write that set this content


@dataclass(frozen=True)
class MemoryWrite:
    """One write as the host reported it, reduced to what resolution needs."""

    action: str
    target: str
    content: str
    old_text: str | None = None
    previous_content: str | None = None

    @classmethod
    def from_host(cls, action: Any, target: Any, content: Any, metadata: Any) -> MemoryWrite:
        """Accept anything the host (or a damaged payload) sends; never raise."""
        meta = metadata if isinstance(metadata, Mapping) else {}
        old_text, previous = meta.get("old_text"), meta.get("previous_content")
        return cls(
            str(action),
            str(target),
            content if isinstance(content, str) else "" if content is None else str(content),
            old_text if isinstance(old_text, str) else None,
            previous if isinstance(previous, str) else None,
        )

    @classmethod
    def from_event(cls, body: Mapping[str, Any], content: Any) -> MemoryWrite:
        """The write a ``memory_write`` event records (its body, and its content part as
        stored), its texts made bindable as the memory projection stores them; the search
        texts are only compared."""
        write = cls.from_host(body.get("action"), body.get("target"), content, body.get("metadata"))
        return cls(
            bindable_text(write.action),
            bindable_text(write.target),
            bindable_text(write.content),
            write.old_text,
            write.previous_content,
        )


@dataclass(frozen=True)
class MemoryChange:
    """What one write did to one target's entries (for history and as-of)."""

    action: str
    target: str
    entry: int | None  # lineage id of the entry written, None when nothing changed
    index: int | None  # its position after the write (before it, for a remove)
    before: str | None
    after: str | None
    resolution: str
    candidates: int = 0  # distinct entries the search text matched
    merged: int | None = None  # lineage id of an entry collapsed into an equal one


def locate(entries: Sequence[Entry], write: MemoryWrite) -> tuple[int | None, str, int]:
    """Index of the entry a replace/remove targets, the resolution and the candidate count."""
    texts = [entry.content for entry in entries]
    previous = write.previous_content.strip() if write.previous_content else ""
    if previous and previous in texts:
        return texts.index(previous), "previous_content", 1
    needle = (write.old_text or "").strip() or previous
    if not needle:
        return None, "unresolved", 0
    matches = [i for i, text in enumerate(texts) if needle in text]
    distinct = len({texts[i] for i in matches})
    if not matches:
        return None, "unresolved", 0
    if distinct == 1:
        return matches[0], "substring", 1
    if needle in texts:
        return texts.index(needle), "exact", distinct
    return matches[0], "ambiguous", distinct


def apply_write(
    entries: Sequence[Entry], write: MemoryWrite, seq: int
) -> tuple[list[Entry], MemoryChange]:
    """Return one target's entries after the write at ``seq`` and what it changed."""
    result = list(entries)
    action, target = write.action, write.target
    content = write.content.strip()
    nothing = MemoryChange(action, target, None, None, None, None, "ignored")
    if action == "add":
        if not content:
            return result, nothing
        if any(entry.content == content for entry in result):
            return result, MemoryChange(action, target, None, None, None, None, "duplicate")
        result.append(Entry(content, seq, seq))
        return result, MemoryChange(action, target, seq, len(result) - 1, None, content, "appended")
    if action not in ("replace", "remove") or (action == "replace" and not content):
        return result, nothing
    index, resolution, candidates = locate(result, write)
    if index is None:
        before = write.previous_content.strip() if write.previous_content else None
        if action == "remove" or any(entry.content == content for entry in result):
            return result, MemoryChange(action, target, None, None, before, None, resolution)
        result.append(Entry(content, seq, seq))
        return result, MemoryChange(
            action, target, seq, len(result) - 1, before, content, resolution
        )
    old = result[index]
    if action == "remove":
        del result[index]
        return result, MemoryChange(
            action, target, old.entry, index, old.content, None, resolution, candidates
        )
    result[index] = Entry(content, old.entry, seq)
    merged = None
    twin = next(
        (i for i, entry in enumerate(result) if i != index and entry.content == content), None
    )
    if twin is not None:  # the host keeps the first of two equal entries on its next reload
        dropped = max(index, twin)
        merged = result[dropped].entry
        del result[dropped]
        index = min(index, twin)
    return result, MemoryChange(
        action, target, old.entry, index, old.content, content, resolution, candidates, merged
    )
