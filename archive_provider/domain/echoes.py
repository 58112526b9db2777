"""Recall echoes: the served recall a host hands back inside its next messages, archived by
reference to the ``recall_served`` event that produced it (docs/FORMAT.md 13.4). Pure.

Cutting the echo out of a message before it is hashed leaves one copy of the recall's text,
in the recall's own ``result`` payload: erasing that payload erases every echo of it without
reading a later message, and a rendering shows ``[erased]`` in its place.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: the message fields an echo is cut from, in the order echoes list them
ECHO_FIELDS = ("api_content", "content")
#: what a rendering shows where the echoed recall has been erased
ERASED = "[erased]"


def cut_echoes(
    messages: Sequence[Mapping[str, Any]],
    recalls: Iterable[tuple[int, str]],
    marker: str,
    names: Sequence[str] = ECHO_FIELDS,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``messages`` with every served recall result cut out of their text fields, and the
    echoes recording each cut (``message``, ``field``, ``at``, ``recall``), sorted; ``names``
    are the text fields cut, in the order echoes list them.

    ``recalls`` are (seq, result text) newest first; it is read only while a ``marker`` (the
    fence every served result starts with) in the messages is not yet cut, so a turn with
    one echo reads one recall.
    """
    fields = [
        (i, name, message[name])
        for i, message in enumerate(messages)
        for name in names
        if isinstance(message.get(name), str) and marker in message[name]
    ]
    if not fields:
        return [dict(m) for m in messages], []
    spans: dict[tuple[int, str], list[tuple[int, int, int]]] = {(i, n): [] for i, n, _ in fields}
    for seq, result in recalls:
        if not result:
            continue
        for i, name, text in fields:
            taken = spans[(i, name)]
            start = text.find(result)
            while start >= 0:
                end = start + len(result)
                if all(end <= s or start >= e for s, e, _ in taken):
                    taken.append((start, end, seq))
                start = text.find(result, end)
        if all(_uncut(text, marker, spans[(i, n)]) == 0 for i, n, text in fields):
            break
    out = [dict(m) for m in messages]
    echoes: list[dict[str, Any]] = []
    for i, name, text in fields:
        kept, removed, last = [], 0, 0
        for start, end, seq in sorted(spans[(i, name)]):
            kept.append(text[last:start])
            echoes.append({"at": start - removed, "field": name, "message": i, "recall": seq})
            removed += end - start
            last = end
        if kept:
            out[i][name] = "".join(kept) + text[last:]
    echoes.sort(key=lambda e: (e["message"], names.index(e["field"]), e["at"]))
    return out, echoes


def cut_text_echoes(
    texts: Mapping[str, Any], recalls: Iterable[tuple[int, str]], marker: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """An event's single texts (a delegation's ``task`` and ``result``, a peer message's
    ``text``: name -> text) cut as one message's fields, in the given order; their echoes
    name no ``message`` (FORMAT.md 13.4, "Which texts are cut")."""
    out, echoes = cut_echoes([texts], recalls, marker, tuple(texts))
    return out[0], [{k: v for k, v in echo.items() if k != "message"} for echo in echoes]


def _uncut(text: str, marker: str, taken: list[tuple[int, int, int]]) -> int:
    """How many occurrences of ``marker`` in ``text`` no span covers."""
    count, start = 0, text.find(marker)
    while start >= 0:
        if not any(s <= start < e for s, e, _ in taken):
            count += 1
        start = text.find(marker, start + 1)
    return count


def render_echoes(
    message: Any, index: int | None, echoes: Sequence[Mapping[str, Any]], result: Any
) -> Any:
    """Message ``index`` of a turn as the host sent it: each of its echoes filled in from
    ``result(seq)`` (the recall's result text, or None once erased: then ``[erased]``).
    ``index`` None: an event's single texts, whose echoes name no message.

    Echoes are inserted in list order, each at its ``at`` plus the length of what was
    inserted before it in the same field.
    """
    if not isinstance(message, Mapping):
        return message
    out = dict(message)
    shift: dict[str, int] = {}
    for echo in echoes:
        name = echo.get("field")
        if echo.get("message") != index or not isinstance(out.get(name), str):
            continue
        text = result(echo.get("recall"))
        text = text if isinstance(text, str) else ERASED
        at = int(echo.get("at", 0)) + shift.get(str(name), 0)
        out[name] = out[name][:at] + text + out[name][at:]
        shift[str(name)] = shift.get(str(name), 0) + len(text)
    return out
