"""The one fence for quoted data put in front of the model (archive recall, hivemind peers).

Quoted text is made a single line of printable characters: NFKC folds look-alikes onto
plain characters (a full-width ``［`` becomes ``[``), format characters such as zero-width
spaces and soft hyphens are dropped, other control characters too, and whitespace is
collapsed, so quoted text can neither start a line of its own nor hide a fence phrase from
the check. Then every ``[`` that opens a fence phrase (``[end of archive recall]``,
``[ peer data``, in any case and spacing, words run together included: a dropped zero-width
space leaves ``endof``) becomes ``(``.
"""

from __future__ import annotations

import re
import unicodedata

_FENCE_PHRASE = re.compile(
    r"\[(?=\s*(?:end\s*of\s*)?(?:archive\s*recall|peer\s*data))", re.IGNORECASE
)


#: ASCII's control characters: whitespace becomes a space, the rest is dropped
_ASCII_CONTROLS = {
    code: " " if chr(code).isspace() else None
    for code in range(128)
    if chr(code).isspace() or unicodedata.category(chr(code)).startswith("C")
}
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")


def _printable(run: re.Match[str]) -> str:
    """A run of non-ASCII characters with whitespace made a space and control, format and
    unassigned characters dropped (the same rule as :data:`_ASCII_CONTROLS`)."""
    return "".join(
        " " if ch.isspace() else ch
        for ch in run.group()
        if ch.isspace() or not unicodedata.category(ch).startswith("C")
    )


def one_line(text: str, limit: int | None = None) -> str:
    """``text`` as one line of printable characters with fence phrases defused, at most
    ``limit`` characters (an ellipsis marks a cut).

    Every character is looked at once; ASCII through a translation table, since a Python
    loop over each character of a 4,000-character excerpt cost ~0.6 ms (six a prefetch)."""
    folded = unicodedata.normalize("NFKC", text).translate(_ASCII_CONTROLS)
    kept = _NON_ASCII.sub(_printable, folded)
    flat = _FENCE_PHRASE.sub("(", " ".join(kept.split()))
    if limit is None or len(flat) <= limit:
        return flat
    return flat[: limit - 1].rstrip() + "…"
