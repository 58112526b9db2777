"""Evidence normalization and transcript deltas: pure functions, no I/O.

Hosts hand the provider whatever their callers built: dicts with odd shapes, ``None``
content, content as a list of parts, bytes, lone surrogates, numbers JSON cannot say.
:func:`archivable` turns any of it into a value with a canonical encoding *without losing
information* (anything it cannot keep as-is is kept as tagged text), so archiving never
fails on input and never drops it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..format.canonical import INT_MAX, INT_MIN, MAX_DEPTH

COMPRESSED_SUMMARY_KEY = "_compressed_summary"
DIRECT_ROLES = frozenset({"user", "assistant"})
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_DEPTH_BUDGET = MAX_DEPTH - 8  # room for the envelope around a message


def archivable_text(text: str) -> str:
    """Join surrogate pairs spelled as two code points; lone surrogates stay (escaped later)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "surrogatepass")


def bindable_text(text: str) -> str:
    """Text SQLite can store: lone surrogates become U+FFFD (for projections; the log keeps them)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return _LONE_SURROGATE.sub("\ufffd", archivable_text(text))


def archivable(value: Any, _depth: int = 0) -> Any:
    """Return ``value`` in a form the canonical encoding accepts, keeping all information.

    bytes become text via UTF-8 with ``surrogateescape`` (the bytes are recoverable);
    numbers JSON cannot carry and unknown objects become ``{"$type": ..., "$text": ...}``;
    a non-text key becomes ``"$key:<repr>"``, and a key that reads like one before it gets
    ``#2``, ``#3``... appended, so no value is ever overwritten.
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return archivable_text(value)
    if isinstance(value, int):
        return int(value) if INT_MIN <= value <= INT_MAX else {"$type": "int", "$text": str(value)}
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$type": "float", "$text": repr(value)}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "surrogateescape")
    if _depth >= _DEPTH_BUDGET and isinstance(value, (Mapping, list, tuple)):
        return {"$type": "deep", "$text": _described(value)}
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            name = archivable_text(key) if isinstance(key, str) else "$key:" + _described(key)
            base, count = name, 1
            while name in out:  # two keys that read the same (two NaNs): number the later
                count += 1
                name = f"{base}#{count}"
            out[name] = archivable(item, _depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [archivable(item, _depth + 1) for item in value]
    return {"$type": type(value).__name__, "$text": _described(value)}


def _described(value: Any) -> str:
    """``repr(value)`` as archivable text, or why there is none: a broken repr costs no row."""
    try:
        return archivable_text(repr(value))
    except Exception as exc:  # a raising __repr__, or RecursionError on a cyclic structure
        return f"<{type(value).__name__} without a repr: {type(exc).__name__}>"


def archivable_message(message: Any) -> dict[str, Any]:
    """A transcript row as archived: dicts as sent (made encodable), anything else tagged."""
    if isinstance(message, Mapping):
        return dict(archivable(message))
    return {"role": "$invalid", "$value": archivable(message)}


def transcript_snapshot(messages: Any) -> list[Any]:
    """The transcript a hook received, as a list taken now (the host may reuse its list).

    A list or tuple is copied shallowly and ``None`` is empty. Any other value (text, a
    mapping, a generator) becomes one row, which :func:`archivable_message` tags: nothing
    the host sent is reinterpreted, consumed or dropped.
    """
    if isinstance(messages, (list, tuple)):
        return list(messages)
    return [] if messages is None else [messages]


def is_set(value: Any) -> bool:
    """Python truthiness that cannot raise: a value whose truth is ambiguous (an array's)
    counts as set, so an odd host value never aborts a checkpoint."""
    try:
        return bool(value)
    except Exception:
        return True


def _has_prose(content: Any) -> bool:
    """The v2 host's test: non-blank text, or any other non-empty content (e.g. parts)."""
    return bool(content.strip()) if isinstance(content, str) else is_set(content)


def direct_evidence(messages: Iterable[Any]) -> list[dict[str, Any]]:
    """The v2 host's direct-evidence filter, applied to whatever list arrives.

    Mirrors upstream's ``_direct_messages_for_pre_compress_memory``, so archives are the
    same on 0.19.0 (raw list) and on v2 hosts (pre-filtered list): keeps user/assistant
    rows only; drops non-dicts, system and tool rows and rows marked ``_compressed_summary``;
    an assistant row with non-empty ``tool_calls`` is kept only when it has prose, and the
    kept copy loses ``tool_calls``. Idempotent; never mutates its input. Where upstream
    would raise on a value (a role that is a list, an array's truth), this decides as
    :func:`is_set` says, because on 0.19.0 a raise here loses the checkpoint.
    """
    kept: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        role = message.get("role")
        if not isinstance(role, str) or role not in DIRECT_ROLES:
            continue
        if is_set(message.get(COMPRESSED_SUMMARY_KEY)):
            continue
        if role == "assistant" and is_set(message.get("tool_calls")):
            if not _has_prose(message.get("content")):
                continue
            message = {k: v for k, v in message.items() if k != "tool_calls"}
        kept.append(dict(message))
    return kept


def new_messages_start(
    previous: Sequence[str], current: Sequence[str], roles: Sequence[Any]
) -> int:
    """Index in ``current`` where the messages not yet archived begin.

    ``previous`` and ``current`` are message digests of the last archived transcript and
    the one just received. When the old transcript is a prefix of the new one (0.19.0
    re-sends the whole conversation every turn) the new messages are the tail. When the
    transcript was rewritten (compression, rewind), the turn is taken to start at its last
    user message, so a rewrite never re-archives the whole history as new.

    After such a rewrite the archived transcript is the old prefix plus the rows archived
    since, which sit at the positions they have in the host's rewritten transcript. So when
    the last archived turn (from its user message on) is still in place, everything up to
    the end of ``previous`` is archived and only what follows is new: a re-sent transcript
    (sync retry, ``on_session_end``) adds nothing and a later turn adds only its own rows.
    """
    count = len(previous)
    if count <= len(current) and list(current[:count]) == list(previous):
        return count
    if 0 < count <= len(current):
        turn_start = next((i for i in range(count - 1, -1, -1) if roles[i] == "user"), None)
        if turn_start is not None and list(current[turn_start:count]) == list(
            previous[turn_start:]
        ):
            return count
    for index in range(len(roles) - 1, -1, -1):
        if roles[index] == "user":
            return index
    return 0


def message_text(message: Mapping[str, Any]) -> str:
    """The searchable prose of a message: text content and text parts, nothing else."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [part.get("text") for part in content if isinstance(part, Mapping)]
        return "\n".join(text for text in texts if isinstance(text, str))
    return ""
