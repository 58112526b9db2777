"""Turn authors as the host states them (docs/HOST.md §1.2): normalised, never inferred.

Main's ``agent/turn_author.py`` defines the shape ``{"id", "name", "is_bot"}`` (some
versions add ``platform``); ``parse_turn_author`` takes a mapping or its JSON text, drops
control, surrogate, unassigned and private-use characters, strips and caps each text at
200 characters, reads ``is_bot`` from a bool, an int or ``true``/``1``/``yes``, and gives
up (no author) when both id and name are empty. This module does the same, keeps any other
key the host sent (``platform``, ``origin``) and adds ``source``: which hook said it.

No author is ever derived from message text (a ``Message from 🤖 x (@x):`` prefix is for
the model only) nor one field from another (``plugin:`` authors are bots too).
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Mapping
from typing import Any, Literal

from .evidence import archivable

MAX_FIELD_CHARS = 200
_DROPPED_CATEGORIES = frozenset({"Cc", "Cs", "Cn", "Co"})

AuthorSource = Literal["sync_turn", "on_turn_start"]


def clean_text(value: Any) -> str | None:
    """The host's ``_clean_text``: printable, stripped, capped; None when nothing is left."""
    if value is None:
        return None
    text = "".join(
        ch for ch in str(value) if unicodedata.category(ch) not in _DROPPED_CATEGORIES
    ).strip()[:MAX_FIELD_CHARS]
    return text or None


def bot_flag(value: Any) -> bool:
    """The host's ``_bot_flag``: strings ``true``/``1``/``yes``, else the value's truth."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    if isinstance(value, (bool, int)):
        return bool(value)
    return False


def normalize_author(raw: Any, source: AuthorSource) -> dict[str, Any] | None:
    """The author of one turn as the archive keeps it, or None when the host named nobody.

    ``raw`` is ``turn_author`` (a mapping or JSON text) or the ``on_turn_start`` trio as a
    mapping. Unknown keys are kept (made archivable), the three known ones cleaned.
    """
    try:
        if isinstance(raw, str):
            raw = json.loads(raw)
        if not isinstance(raw, Mapping):
            return None
        author_id, name = clean_text(raw.get("id")), clean_text(raw.get("name"))
        if author_id is None and name is None:
            return None
        extra = {
            str(key): value
            for key, value in raw.items()
            if key not in ("id", "name", "is_bot", "source")
        }
        kept: dict[str, Any] = archivable(extra) if extra else {}
        return {
            **kept,
            "id": author_id,
            "name": name,
            "is_bot": bot_flag(raw.get("is_bot")),
            "source": source,
        }
    except Exception:
        return None


def author_label(author: Any) -> str:
    """How people read an author: ``name <id> [bot]`` (``—`` for none)."""
    if not isinstance(author, Mapping):
        return "—"
    name, author_id = author.get("name"), author.get("id")
    text = " ".join(
        part
        for part in (
            name if isinstance(name, str) else None,
            f"<{author_id}>" if author_id else None,
        )
        if part
    )
    return (text or "—") + (" [bot]" if author.get("is_bot") is True else "")
