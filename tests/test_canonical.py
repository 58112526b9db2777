"""Canonical encoding (docs/FORMAT.md section 2): frozen vectors, refusals and properties.

Pure tests: no files besides the frozen vectors, no database. Both the package encoder and
the standalone verifier's independent text encoder are held to the same vectors, so a change
to either that would change a digest fails here.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from archive_provider.format import verifier
from archive_provider.format.canonical import (
    MAX_DEPTH,
    CanonicalEncodingError,
    canonical_bytes,
    canonical_text,
    decode,
    encode_text,
    format_float,
    slow_canonical_text,
)

VECTORS = Path(__file__).parent / "vectors"
CANONICAL = json.loads((VECTORS / "canonical.json").read_text(encoding="utf-8"))
REFUSALS = json.loads((VECTORS / "refusals.json").read_text(encoding="utf-8"))


def untag(tagged: Any) -> Any:
    """Tagged vector value -> Python value (the form is described in make_vectors.py)."""
    if tagged is None or isinstance(tagged, bool):
        return tagged
    (kind,) = (name for name in tagged if name != "approx")
    data = tagged[kind]
    if kind == "int":
        return int(data)
    if kind == "float_bits":
        return struct.unpack(">d", bytes.fromhex(data))[0]
    if kind == "text":
        return data
    if kind == "code_points":
        return "".join(map(chr, data))
    if kind == "bytes":
        return bytes.fromhex(data)
    if kind == "array":
        return [untag(item) for item in data]
    if kind == "object":
        return {untag(key): untag(value) for key, value in data}
    raise ValueError(f"unknown tag {kind!r}")


def _ids(cases: list[dict[str, Any]]) -> list[str]:
    return [case["name"] for case in cases]


# -- frozen vectors -------------------------------------------------------------------------


def test_vector_files_are_format_1_and_cover_the_brief() -> None:
    names = " ".join(_ids(CANONICAL["cases"]))
    for needed in (
        "1.0",
        "1e21",
        "1e-7",
        "5e-324",
        "-0.0",
        "0.1",
        "2**63 - 1",
        "-2**63",
        "U+2028",
        "emoji",
        "lone high surrogate",
        "astral key",
        "nested",
    ):
        assert needed in names, needed
    assert CANONICAL["format_version"] == REFUSALS["format_version"] == 1


@pytest.mark.parametrize("case", CANONICAL["cases"], ids=_ids(CANONICAL["cases"]))
def test_canonical_vector(case: dict[str, Any]) -> None:
    value = untag(case["value"])
    expected = bytes.fromhex(case["canonical_hex"])
    assert canonical_bytes(value) == expected
    assert expected.decode("utf-8") == case["canonical_text"]


@pytest.mark.parametrize("case", CANONICAL["cases"], ids=_ids(CANONICAL["cases"]))
def test_canonical_vector_is_a_fixed_point(case: dict[str, Any]) -> None:
    """Decoding canonical bytes and encoding again gives the same bytes (idempotence)."""
    expected = bytes.fromhex(case["canonical_hex"])
    assert canonical_bytes(decode(expected)) == expected


TEXT_CASES = [
    case
    for case in CANONICAL["cases"]
    if case["value"] is not None
    and not isinstance(case["value"], bool)
    and ("text" in case["value"] or "code_points" in case["value"])
]


@pytest.mark.parametrize("case", TEXT_CASES, ids=_ids(TEXT_CASES))
def test_verifier_text_encoder_matches_vectors(case: dict[str, Any]) -> None:
    """The standalone verifier's independent encoder gives the frozen bytes too."""
    assert verifier._text(untag(case["value"])).encode("utf-8") == bytes.fromhex(
        case["canonical_hex"]
    )


# RFC 8785 Appendix B, copied from the RFC: an oracle independent of this implementation.
RFC8785_TABLE = {
    "0000000000000000": "0",
    "8000000000000000": "0",
    "0000000000000001": "5e-324",
    "8000000000000001": "-5e-324",
    "7fefffffffffffff": "1.7976931348623157e+308",
    "ffefffffffffffff": "-1.7976931348623157e+308",
    "4340000000000000": "9007199254740992",
    "c340000000000000": "-9007199254740992",
    "4430000000000000": "295147905179352830000",
    "44b52d02c7e14af5": "9.999999999999997e+22",
    "44b52d02c7e14af6": "1e+23",
    "44b52d02c7e14af7": "1.0000000000000001e+23",
    "444b1ae4d6e2ef4e": "999999999999999700000",
    "444b1ae4d6e2ef4f": "999999999999999900000",
    "444b1ae4d6e2ef50": "1e+21",
    "3eb0c6f7a0b5ed8c": "9.999999999999997e-7",
    "3eb0c6f7a0b5ed8d": "0.000001",
    "41b3de4355555553": "333333333.3333332",
    "41b3de4355555554": "333333333.33333325",
    "41b3de4355555555": "333333333.3333333",
    "41b3de4355555556": "333333333.3333334",
    "41b3de4355555557": "333333333.33333343",
    "becbf647612f3696": "-0.0000033333333333333333",
    "43143ff3c1cb0959": "1424953923781206.2",
}


@pytest.mark.parametrize(("bits", "text"), sorted(RFC8785_TABLE.items()))
def test_floats_match_rfc8785_appendix_b(bits: str, text: str) -> None:
    assert format_float(struct.unpack(">d", bytes.fromhex(bits))[0]) == text


def test_rfc8785_table_is_in_the_frozen_vectors() -> None:
    frozen = {
        case["value"]["float_bits"]: case["canonical_text"]
        for case in CANONICAL["cases"]
        if case["name"].startswith("RFC 8785")
    }
    assert frozen == RFC8785_TABLE


# -- refusals -------------------------------------------------------------------------------

MESSAGES = {
    "non_finite_float": "is not a finite number",
    "integer_out_of_range": "outside the signed 64-bit range",
    "non_text_key": "is not text",
    "no_encoding": "has no canonical encoding",
    "surrogate_pair": "surrogate pair",
    "too_deep": f"nesting deeper than {MAX_DEPTH}",
}


def test_refusal_vectors_cover_the_brief() -> None:
    errors = {case["error"] for case in REFUSALS["cases"]}
    assert errors == set(MESSAGES) == set(REFUSALS["errors"])


@pytest.mark.parametrize("case", REFUSALS["cases"], ids=_ids(REFUSALS["cases"]))
def test_refusal_vector(case: dict[str, Any]) -> None:
    with pytest.raises(CanonicalEncodingError, match=MESSAGES[case["error"]]):
        canonical_bytes(untag(case["value"]))


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ({"a": [1, float("nan")]}, "$.a[1]"),
        ({"outer": {"n": 2**64}}, "$.outer.n"),
        ([{"k": b"x"}], "$[0].k"),
        ({"x": {3: 1}}, "$.x"),
        ({"msgs": ["ok", "\ud83d\ude00"]}, "$.msgs[1]"),
        ({"a": {"\ud83d\ude00": 1}}, "$.a"),
    ],
)
def test_refusal_names_where(value: Any, where: str) -> None:
    """A refusal says where the bad part is, so a builder bug can be found from a log line."""
    with pytest.raises(CanonicalEncodingError) as caught:
        canonical_bytes(value)
    assert str(caught.value).startswith(where + ":")


def test_depth_limit_is_exactly_64() -> None:
    value: Any = 0
    for _ in range(MAX_DEPTH):
        value = [value]
    assert canonical_text(value) == "[" * 64 + "0" + "]" * 64
    with pytest.raises(CanonicalEncodingError, match="nesting deeper"):
        canonical_text([value])


@pytest.mark.parametrize("value", [{1, 2}, object(), bytearray(b"x"), memoryview(b"x"), 1j])
def test_other_python_types_are_refused(value: Any) -> None:
    with pytest.raises(CanonicalEncodingError, match="has no canonical encoding"):
        canonical_bytes(value)


def test_tuples_encode_as_arrays_and_bool_is_not_int() -> None:
    assert canonical_text((1, (True, None))) == "[1,[true,null]]"
    assert canonical_text({"a": True}) != canonical_text({"a": 1})


def test_integral_float_beyond_int64_decodes_as_float() -> None:
    """2.0**63 is written as digits; reading them back must not give an unencodable int."""
    data = canonical_bytes({"x": 2.0**68})
    assert data == b'{"x":295147905179352830000}'
    value = decode(data)["x"]
    assert isinstance(value, float) and value == 2.0**68
    assert canonical_bytes(decode(data)) == data
    assert decode(b"9223372036854775807") == 2**63 - 1
    assert isinstance(decode(b"-9223372036854775808"), int)


# -- properties -----------------------------------------------------------------------------

SURROGATE = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, categories=["Cs"])
ANY_CHAR = st.one_of(
    st.characters(codec=None),
    SURROGATE,
    st.sampled_from('"\\\x00\x1f\x7f\u2028\u2029\ufeff\U0001f600/'),
)
ANY_TEXT = st.text(ANY_CHAR, max_size=40)


def _no_pair(text: str) -> bool:
    return not any(
        0xD800 <= ord(a) <= 0xDBFF and 0xDC00 <= ord(b) <= 0xDFFF
        for a, b in zip(text, text[1:], strict=False)
    )


ENCODABLE_TEXT = ANY_TEXT.filter(_no_pair)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    ENCODABLE_TEXT,
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(ENCODABLE_TEXT, inner, max_size=5)
    ),
    max_leaves=25,
)


def same_value(decoded: Any, original: Any) -> bool:
    """Equality modulo the one thing the encoding forgets: whether a number was a float."""
    if isinstance(original, float):
        return (
            isinstance(decoded, (int, float))
            and not isinstance(decoded, bool)
            and float(decoded) == original
        )
    if isinstance(original, list):
        return (
            isinstance(decoded, list)
            and len(decoded) == len(original)
            and all(same_value(d, o) for d, o in zip(decoded, original, strict=True))
        )
    if isinstance(original, dict):
        return (
            isinstance(decoded, dict)
            and decoded.keys() == original.keys()
            and all(same_value(decoded[k], original[k]) for k in original)
        )
    return type(decoded) is type(original) and decoded == original


def _reversed_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _reversed_keys(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [_reversed_keys(item) for item in value]
    return value


@settings(max_examples=400, deadline=None)
@given(VALUES)
@example({"x": 2.0**63, "y": -0.0, "z": 1.0})
@example(["\ud800", "\udc00"])
def test_round_trip_and_determinism(value: Any) -> None:
    data = canonical_bytes(value)
    assert same_value(decode(data), value)
    assert canonical_bytes(_reversed_keys(value)) == data  # insertion order does not matter
    assert canonical_bytes(decode(data)) == data  # canonical bytes are a fixed point
    json.loads(data.decode("utf-8"))  # any JSON parser reads it


@settings(max_examples=1000, deadline=None)
@given(ANY_TEXT)
@example("\ud83d\ude00")
@example("\ude00\ud83d")
def test_verifier_text_agrees_with_encode_text(text: str) -> None:
    """Where the package encodes text, the verifier's independent encoder gives the same."""
    try:
        expected = encode_text(text)
    except CanonicalEncodingError:
        assert not _no_pair(text)  # refused only for a surrogate pair
        return
    assert verifier._text(text) == expected
    assert decode(expected) == text  # lone surrogates come back as written
    assert all(not 0xD800 <= ord(char) <= 0xDFFF for char in expected)  # always valid UTF-8


@settings(max_examples=500, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_float_text_round_trips_and_is_shortest(value: float) -> None:
    text = format_float(value)
    assert float(text) == value
    digits = text.lstrip("-").split("e")[0].replace(".", "").strip("0")
    assert (
        len(digits) <= len(repr(abs(value)).split("e")[0].replace(".", "").strip("0")) or value == 0
    )


def test_non_finite_is_refused_by_format_float() -> None:
    for value in (math.nan, math.inf, -math.inf):
        with pytest.raises(CanonicalEncodingError):
            format_float(value)


_plain_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=1000, deadline=None)
@given(_plain_values)
def test_the_json_fast_path_writes_exactly_the_reference_bytes(value: object) -> None:
    """canonical_text takes json.dumps for plain values; it must equal the reference encoder."""
    try:
        reference = slow_canonical_text(value)
    except CanonicalEncodingError:
        with pytest.raises(CanonicalEncodingError):
            canonical_text(value)
        return
    assert canonical_text(value) == reference
