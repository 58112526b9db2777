"""Evidence normalization and deltas: pure functions, no database."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from archive_provider.domain.evidence import (
    archivable,
    archivable_message,
    direct_evidence,
    message_text,
    new_messages_start,
)
from archive_provider.format.canonical import canonical_bytes, decode

RAW = [
    {"role": "system", "content": "You are Hermes."},
    {"role": "user", "content": "hello"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "1", "function": {"name": "x"}}]},
    {"role": "tool", "tool_call_id": "1", "content": "result"},
    {"role": "assistant", "content": "I looked it up.", "tool_calls": [{"id": "2"}]},
    {"role": "user", "content": "summary so far", "_compressed_summary": True},
    "not a dict",
    {"role": "assistant", "content": "done"},
]


def test_direct_evidence_keeps_only_direct_user_and_assistant_prose() -> None:
    kept = direct_evidence(RAW)
    assert kept == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "I looked it up."},
        {"role": "assistant", "content": "done"},
    ]
    assert "tool_calls" in RAW[4]  # the caller's rows are not mutated


def test_direct_evidence_is_idempotent() -> None:
    once = direct_evidence(RAW)
    assert direct_evidence(once) == once


def test_tool_call_rows_follow_the_v2_hosts_prose_rule() -> None:
    """Any non-empty content list counts as prose, as upstream's filter decides it."""
    parts = [{"type": "text", "text": "  "}]
    assert direct_evidence([{"role": "assistant", "content": parts, "tool_calls": [{}]}]) == [
        {"role": "assistant", "content": parts}
    ]
    assert direct_evidence([{"role": "assistant", "content": "  ", "tool_calls": [{}]}]) == []
    # an empty or missing tool_calls list is no tool call: the row is kept as it is
    assert direct_evidence([{"role": "assistant", "content": "", "tool_calls": []}]) == [
        {"role": "assistant", "content": "", "tool_calls": []}
    ]
    assert direct_evidence([{"role": "assistant", "content": "x", "tool_calls": None}]) == [
        {"role": "assistant", "content": "x", "tool_calls": None}
    ]


def test_archivable_keeps_bytes_recoverable_and_tags_what_json_cannot_say() -> None:
    raw = b"caf\xe9 \xff"
    value = archivable({"b": raw, 1: "int key", "n": float("nan"), "big": 2**70, "obj": object()})
    encoded = canonical_bytes(value)
    back = decode(encoded)
    assert back["b"].encode("utf-8", "surrogateescape") == raw
    assert back["$key:1"] == "int key"
    assert back["n"] == {"$type": "float", "$text": "nan"}
    assert back["big"] == {"$type": "int", "$text": str(2**70)}
    assert back["obj"]["$type"] == "object"


def test_archivable_joins_surrogate_pairs_spelled_as_two_code_points() -> None:
    split = "\ud83d\ude00"  # what a bad decoder leaves for U+1F600
    assert archivable(split) == "\U0001f600"
    assert archivable("lone \ud800 stays") == "lone \ud800 stays"


def test_archivable_bounds_depth_without_losing_the_content() -> None:
    deep: object = "leaf"
    for _ in range(200):
        deep = [deep]
    encoded = canonical_bytes(archivable(deep))
    assert b"leaf" in encoded


def test_non_dict_messages_are_archived_tagged() -> None:
    assert archivable_message(["odd"]) == {"role": "$invalid", "$value": ["odd"]}
    assert archivable_message(None) == {"role": "$invalid", "$value": None}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text() | st.integers(), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(json_values)
def test_archivable_output_always_has_a_canonical_encoding(value: object) -> None:
    encoded = canonical_bytes(archivable(value))
    assert canonical_bytes(decode(encoded)) == encoded


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_finite_floats_survive_as_numbers(value: float) -> None:
    """JSON has one number type: integral floats come back as ints, with the same value as a float."""
    back = decode(canonical_bytes(archivable(value)))
    assert float(back) == value


def test_delta_is_the_tail_when_the_old_transcript_is_a_prefix() -> None:
    assert new_messages_start(["a", "b"], ["a", "b", "c", "d"], ["user"] * 4) == 2
    assert new_messages_start([], ["a"], ["user"]) == 0
    assert new_messages_start(["a", "b"], ["a", "b"], ["user", "assistant"]) == 2


def test_delta_after_a_rewrite_starts_at_the_last_user_message() -> None:
    roles = ["system", "user", "assistant", "user", "assistant", "tool", "assistant"]
    assert new_messages_start(["x", "y", "z"], list("abcdefg"), roles) == 3


def test_a_repeated_message_in_a_later_turn_is_new() -> None:
    previous = ["u:yes", "a:ok"]
    current = ["u:yes", "a:ok", "u:yes", "a:ok"]
    assert new_messages_start(previous, current, ["user", "assistant"] * 2) == 2


def test_message_text_reads_text_parts_only() -> None:
    assert message_text({"content": "plain"}) == "plain"
    parts = [
        {"type": "text", "text": "a"},
        {"type": "image_url", "image_url": {}},
        {"type": "text", "text": "b"},
    ]
    assert message_text({"content": parts}) == "a\nb"
    assert message_text({"content": None}) == ""


class _BrokenRepr:
    def __repr__(self) -> str:
        raise RuntimeError("repr refuses")


def test_a_value_whose_repr_raises_is_tagged_not_lost() -> None:
    row = archivable_message({"role": "tool", "content": _BrokenRepr()})
    assert row == {
        "role": "tool",
        "content": {"$type": "_BrokenRepr", "$text": "<_BrokenRepr without a repr: RuntimeError>"},
    }


class _Ambiguous:
    """A value whose truth raises, as a NumPy array's does."""

    def __bool__(self) -> bool:
        raise ValueError("the truth value is ambiguous")


def test_values_upstream_would_raise_on_never_abort_the_evidence_filter() -> None:
    """On 0.19.0 a raise here would lose the checkpoint; each such value gets a decision."""
    ambiguous = _Ambiguous()
    rows = [
        {"role": ["user"], "content": "a role that is a list"},
        {"role": {"r": 1}, "content": "a role that is a dict"},
        {"role": "user", "content": "kept", "_compressed_summary": False},
        {"role": "assistant", "content": "prose", "tool_calls": ambiguous},
        {"role": "assistant", "content": ambiguous, "tool_calls": [{"id": "t"}]},
        {"role": "user", "content": "marked", "_compressed_summary": ambiguous},
    ]
    kept = direct_evidence(rows)
    assert kept == [
        {"role": "user", "content": "kept", "_compressed_summary": False},
        {"role": "assistant", "content": "prose"},
        {"role": "assistant", "content": ambiguous},
    ]
    assert direct_evidence(kept) == kept  # still idempotent


class _SameRepr:
    def __init__(self, raises: bool = False) -> None:
        self.raises = raises

    def __repr__(self) -> str:
        if self.raises:
            raise RuntimeError("no repr")
        return "k"


def test_keys_that_read_the_same_keep_every_value() -> None:
    nan_a, nan_b = float("nan"), float("nan")
    odd = {nan_a: "A", nan_b: "B", _SameRepr(): "C", _SameRepr(): "D", "$key:k": "E"}
    odd[_SameRepr(raises=True)] = "F"
    odd["\ud83d\ude00"] = "G"  # a surrogate pair spelled as two code points
    assert archivable(odd) == {
        "$key:nan": "A",
        "$key:nan#2": "B",
        "$key:k": "C",
        "$key:k#2": "D",
        "$key:k#3": "E",
        "$key:<_SameRepr without a repr: RuntimeError>": "F",
        "\U0001f600": "G",
    }
