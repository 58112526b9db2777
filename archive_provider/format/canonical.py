"""Canonical encoding: the one byte form every digest in the archive is computed over.

The encoding is a strict subset of JSON (docs/FORMAT.md section 2 is the spec):

* objects: keys are text, sorted by Unicode code point, no duplicates;
* text: UTF-8; only ``"``, ``\\``, the C0 controls and surrogate code points are escaped
  (``\\b \\t \\n \\f \\r`` by their short forms, the rest as lowercase ``\\u00xx``/``\\udxxx``);
  U+2028/U+2029 and every other character are written raw;
* integers: -2**63 .. 2**63-1, shortest decimal form;
* floats: finite only, written as ECMAScript's ``Number.prototype.toString`` does
  (RFC 8785 section 3.2.2.3), so ``1.0`` is written ``1``;
* ``true``, ``false``, ``null``; arrays; no whitespace anywhere;
* nesting depth at most :data:`MAX_DEPTH`.

Anything else (bytes, NaN, non-text keys, huge integers, a surrogate pair spelled as two
code points, which decoders would silently join) is refused with
:class:`CanonicalEncodingError`. Host input that may contain such values is turned into
encodable values first by :func:`archive_provider.domain.evidence.archivable`.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Any

from ..errors import InvalidRequest

MAX_DEPTH = 64
INT_MIN = -(2**63)
INT_MAX = 2**63 - 1

_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}
_NEEDS_ESCAPE = re.compile('["\\\\\x00-\x1f\ud800-\udfff]')
_SURROGATE_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")


class CanonicalEncodingError(InvalidRequest):
    """A value has no canonical encoding; the message says which part and why."""


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _ESCAPES.get(char) or f"\\u{ord(char):04x}"


def encode_text(text: str) -> str:
    """Return ``text`` as a canonical JSON string literal (with quotes)."""
    if _SURROGATE_PAIR.search(text):
        raise CanonicalEncodingError(
            "text holds a surrogate pair as two code points; join it first "
            "(archivable() does) so decoders cannot change it"
        )
    return '"' + _NEEDS_ESCAPE.sub(_escape, text) + '"'


def format_float(value: float) -> str:
    """Format a finite float as ECMAScript's Number.prototype.toString does."""
    if not math.isfinite(value):
        raise CanonicalEncodingError(f"{value!r} is not a finite number")
    if value == 0:
        return "0"
    # repr() gives the shortest digits that round-trip; Decimal splits them exactly.
    _, digit_tuple, exponent = Decimal(repr(abs(value))).as_tuple()
    digits = "".join(map(str, digit_tuple)).rstrip("0")
    k = len(digits)
    n = len(digit_tuple) + int(exponent)  # value = 0.digits * 10**n
    if k <= n <= 21:
        body = digits + "0" * (n - k)
    elif 0 < n <= 21:
        body = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        body = "0." + "0" * (-n) + digits
    else:
        mantissa = digits[0] + ("." + digits[1:] if k > 1 else "")
        body = f"{mantissa}e{'+' if n - 1 >= 0 else '-'}{abs(n - 1)}"
    return ("-" if value < 0 else "") + body


def _text_at(text: str, path: str) -> str:
    try:
        return encode_text(text)
    except CanonicalEncodingError as exc:
        raise CanonicalEncodingError(f"{path}: {exc}") from None


def _encode(value: Any, out: list[str], depth: int, path: str) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(_text_at(value, path))
    elif isinstance(value, int):
        if not INT_MIN <= value <= INT_MAX:
            raise CanonicalEncodingError(
                f"{path}: integer {value} is outside the signed 64-bit range"
            )
        out.append(str(int(value)))
    elif isinstance(value, float):
        try:
            out.append(format_float(value))
        except CanonicalEncodingError as exc:
            raise CanonicalEncodingError(f"{path}: {exc}") from None
    elif isinstance(value, (list, tuple)):
        if depth >= MAX_DEPTH:
            raise CanonicalEncodingError(f"{path}: nesting deeper than {MAX_DEPTH}")
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _encode(item, out, depth + 1, f"{path}[{index}]")
        out.append("]")
    elif isinstance(value, dict):
        if depth >= MAX_DEPTH:
            raise CanonicalEncodingError(f"{path}: nesting deeper than {MAX_DEPTH}")
        for key in value:
            if not isinstance(key, str):
                raise CanonicalEncodingError(f"{path}: object key {key!r} is not text")
        out.append("{")
        for index, key in enumerate(sorted(value)):
            if index:
                out.append(",")
            out.append(_text_at(key, path))
            out.append(":")
            _encode(value[key], out, depth + 1, f"{path}.{key}")
        out.append("}")
    else:
        raise CanonicalEncodingError(f"{path}: {type(value).__name__} has no canonical encoding")


_SURROGATE = re.compile("[\ud800-\udfff]")
_JSON = json.JSONEncoder(ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def _plain_text(text: str) -> bool:
    return text.isascii() or _SURROGATE.search(text) is None


def _plain(value: Any, depth: int) -> bool:
    """Whether ``json.dumps`` writes exactly the canonical bytes for ``value``.

    True for the common case (messages: text, in-range integers, booleans, null, lists and
    objects with text keys, no surrogates, within the depth limit). Floats, subclasses of
    the built-in types and everything the encoding refuses take the full encoder, which
    also produces the error messages. Exact type checks, with text handled inline, because
    every event's key and body pass through here.
    """
    kind = type(value)
    if kind is str:
        return _plain_text(value)
    if kind is dict:
        for key in value:
            if type(key) is not str or not _plain_text(key):
                return False
        items = value.values()
    elif kind is list or kind is tuple:
        items = value
    elif kind is int:
        return INT_MIN <= value <= INT_MAX
    else:
        return value is None or kind is bool
    if depth >= MAX_DEPTH:
        return False
    for item in items:
        if type(item) is str:
            if not _plain_text(item):
                return False
        elif not _plain(item, depth + 1):
            return False
    return True


def canonical_text(value: Any) -> str:
    """Return the canonical encoding of ``value`` as text (ASCII-safe only if the input is)."""
    if _plain(value, 0):  # the C encoder writes the same bytes, several times faster
        return _JSON.encode(value)
    return slow_canonical_text(value)


def slow_canonical_text(value: Any) -> str:
    """The reference encoder alone (tests check the fast path against it)."""
    out: list[str] = []
    _encode(value, out, 0, "$")
    return "".join(out)


def canonical_bytes(value: Any) -> bytes:
    """Return the canonical encoding of ``value`` as UTF-8 bytes."""
    return canonical_text(value).encode("utf-8")


def _number_token(token: str) -> int | float:
    # An integer token outside the integer range can only come from an integral float
    # (2.0**63 is written 9223372036854776000): read it back as that float, so decoded
    # values encode again to the same bytes.
    value = int(token)
    return value if INT_MIN <= value <= INT_MAX else float(token)


#: made once: json.loads with a parse_int hook builds a new decoder on every call
_DECODER = json.JSONDecoder(parse_int=_number_token)


def decode(data: bytes | str) -> Any:
    """Decode canonical bytes back into Python values (lone surrogates come back as written)."""
    text = data.decode("utf-8") if isinstance(data, (bytes, bytearray, memoryview)) else data
    return _DECODER.decode(text)
