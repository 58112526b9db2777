"""Hostile input: hypothesis throws odd message lists, memory writes, tool arguments and queries.

Nothing may escape into the host but the required checkpoint's own ``CheckpointError``, and
every accepted input reads back from the log byte-identical to ``archivable(input)`` (the
lossless, encodable form), or, with redaction on, identical except the redacted spans,
which carry markers. A few hundred examples run by default; the ``slow`` variants run
``ARCHIVE_FUZZ_EXAMPLES`` per target and redaction mode (default 1,250: 10,000 in all).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from archive_provider.domain.evidence import archivable, archivable_message, direct_evidence
from archive_provider.format.canonical import canonical_bytes, decode
from archive_provider.host.provider import ArchiveProvider, CheckpointError
from archive_provider.host.settings import save_settings
from archive_provider.storage.store import EventStore, archive_dir

from .conftest import env_int, same_but_redacted

SLOW = env_int("ARCHIVE_FUZZ_EXAMPLES", 1250)  # per target and redaction mode: 10,000 in all
FAST = 100
SECRETISH = st.sampled_from(
    [
        "sk-proj-Abcdefghijklmnopqrstuvwxyz0123456789",
        "ghp_Abcdefghijklmnopqrstuvwxyz0123456789",
        "Bearer abcdefghijklmnopqrstuvwxyz012345",
        "https://u:pw123456@h.example/x",
        "AKIAIOSFODNN7EXAMPLE",
        "sk-pro...6789",
        "***",
    ]
)
ANY_CHAR = st.characters(codec=None, categories=None)  # surrogates and controls included
TEXT = st.one_of(
    st.text(ANY_CHAR, max_size=60),
    st.builds(lambda a, s, b: f"{a}{s}{b}", st.text(max_size=20), SECRETISH, st.text(max_size=20)),
)
SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**63, max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    TEXT,
    st.binary(max_size=20),
)
VALUE = st.recursive(
    SCALAR,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(TEXT, st.integers()), inner, max_size=4),
        st.tuples(inner, inner),
    ),
    max_leaves=12,
)
CONTENT = st.one_of(
    TEXT,
    st.none(),
    VALUE,
    st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), max_size=3),
)
MESSAGE = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "tool"]), "content": CONTENT},
        optional={
            "tool_calls": st.lists(
                st.fixed_dictionaries(
                    {
                        "id": TEXT,
                        "type": st.just("function"),
                        "function": st.fixed_dictionaries({"name": TEXT, "arguments": TEXT}),
                    }
                ),
                max_size=2,
            ),
            "_compressed_summary": st.booleans(),
            "tool_call_id": TEXT,
            "extra": VALUE,
        },
    ),
    st.dictionaries(TEXT, VALUE, max_size=3),
    SCALAR,
)
MESSAGES = st.lists(MESSAGE, max_size=6)


class Harness:
    """One provider (and a reader) per module and redaction mode; a fresh session per example."""

    def __init__(self, home: Path, redact: bool) -> None:
        save_settings(home, {"redact_secrets": redact})
        self.home, self.redact = home, redact
        self.provider = ArchiveProvider()
        self.provider.initialize("fuzz-0", hermes_home=str(home), platform="cli")
        self.sessions = itertools.count(1)
        self.examples = 0
        self._reader: EventStore | None = None

    def session(self) -> str:
        name = f"fuzz-{next(self.sessions)}"
        self.provider.on_session_switch(name, parent_session_id="", reason="fuzz")
        self.examples += 1
        return name

    def flush(self) -> None:
        assert self.provider.core.writer is not None and self.provider.core.writer.flush(30)

    @property
    def reader(self) -> EventStore:
        if self._reader is None:
            self._reader = EventStore.open(archive_dir(self.home), create=False, readonly=True)
        return self._reader

    def events(self, session: str, type_: str) -> list[Any]:
        store = self.reader
        rows = store.conn.execute(
            "SELECT seq FROM events WHERE session = ? AND type = ? ORDER BY seq",
            (session, type_),
        ).fetchall()
        return [
            (e, [store.payload(d) for d in e.part_digests])
            for e in (store.event(r[0]) for r in rows)
        ]

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        self.provider.shutdown()


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "redacting"])
def harness(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Harness]:
    made = Harness(tmp_path_factory.mktemp("fuzz") / "home", request.param)
    yield made
    made.close()
    print(
        f"\nfuzz ({'redacting' if made.redact else 'plain'}): {made.examples} examples through the provider"
    )


def leaves(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, f"{path}/{key.replace('~', '~0').replace('/', '~1')}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from leaves(item, f"{path}/{index}")
    else:
        yield path, value


def same(stored: bytes | None, sent: Any, redactions: list[dict[str, Any]], prefix: str) -> None:
    """Byte-identical, or identical except redacted spans (each listed, each secret-shaped)."""
    assert stored is not None
    expected = archivable(sent)
    if stored == canonical_bytes(expected):
        assert not [
            r for r in redactions if r["path"].startswith(prefix + "/") or r["path"] == prefix
        ]
        return
    value = decode(stored)
    got, want = dict(leaves(value, prefix)), dict(leaves(expected, prefix))
    assert got.keys() == want.keys()
    for path, leaf in got.items():
        spans = [(r["kind"], r["at"]) for r in redactions if r["path"] == path]
        if canonical_bytes(leaf) != canonical_bytes(want[path]):  # 1.0 is written 1
            assert spans and isinstance(leaf, str) and same_but_redacted(want[path], leaf, spans), (
                path
            )


def check_turn(h: Harness, messages: list[Any]) -> None:
    session = h.session()
    h.provider.sync_turn("u", "a", session_id=session, messages=messages)
    h.flush()
    found = h.events(session, "turn")
    if not messages:
        assert not found
        return
    ((event, parts),) = found
    assert len(parts) == len(messages)
    redactions = event.body.get("redactions", [])
    for index, (stored, sent) in enumerate(zip(parts, messages, strict=True)):
        same(stored, archivable_message(sent), redactions, f"/messages/{index}")


def check_checkpoint(h: Harness, messages: Any, required: bool) -> None:
    h.session()
    try:
        receipt = h.provider.on_pre_compress(messages, require_checkpoint=required)
    except CheckpointError:
        assert required and not isinstance(messages, (list, tuple))
        return
    if not isinstance(messages, (list, tuple)):
        assert receipt == "" and not required
        return
    seq = int(re.search(r"event seq (\d+)\.", receipt).group(1))  # type: ignore[union-attr]
    event = h.reader.event(seq)
    assert event is not None and event.type == "checkpoint"
    parts = [h.reader.payload(d) for d in event.body["evidence"]]
    evidence = [archivable_message(m) for m in direct_evidence(messages)]
    assert len(parts) == len(evidence)
    for index, (stored, sent) in enumerate(zip(parts, evidence, strict=True)):
        same(stored, sent, event.body.get("redactions", []), f"/evidence/{index}")


def check_memory(h: Harness, action: Any, target: Any, content: Any, metadata: Any) -> None:
    session = h.session()
    h.provider.on_memory_write(action, target, content, metadata)
    h.flush()
    ((event, (part,)),) = h.events(session, "memory_write")
    redactions = event.body.get("redactions", [])
    same(part, content, redactions, "/content")
    meta = (
        dict(metadata)
        if isinstance(metadata, dict)
        else ({} if metadata is None else {"$value": metadata})
    )
    got = {"metadata": event.body["metadata"]}
    same(canonical_bytes(got["metadata"]), meta, redactions, "/metadata")
    same(canonical_bytes(event.body["action"]), action, redactions, "/action")
    same(canonical_bytes(event.body["target"]), target, redactions, "/target")


def check_tool(h: Harness, name: Any, args: Any) -> None:
    h.examples += 1
    answer = h.provider.handle_tool_call(name, args)
    data = json.loads(answer)
    assert isinstance(data, dict) and ("results" in data or "error" in data)


def check_query(h: Harness, query: Any) -> None:
    assert isinstance(h.provider.prefetch(query), str)
    data = json.loads(h.provider.handle_tool_call("archive_search", {"query": query, "limit": 5}))
    assert isinstance(data, dict)


FUZZ = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck))
TOOL_ARGS = st.one_of(
    VALUE,
    st.dictionaries(st.sampled_from(["query", "limit", "session", "since", "until"]), VALUE),
    st.builds(lambda q: {"query": q}, TEXT),
    st.text(ANY_CHAR, max_size=40),
)
TOOL_NAME = st.one_of(st.just("archive_search"), TEXT)
QUERY = st.one_of(
    TEXT, st.sampled_from(['"', "NEAR(", "a OR b*", "^x", "col:val", "(((", "-", "*"]), SCALAR
)


@settings(max_examples=FAST, **FUZZ)
@given(messages=MESSAGES)
def test_fuzz_turns(harness: Harness, messages: list[Any]) -> None:
    check_turn(harness, messages)


@settings(max_examples=FAST, **FUZZ)
@given(messages=st.one_of(MESSAGES, SCALAR), required=st.booleans())
def test_fuzz_checkpoints(harness: Harness, messages: Any, required: bool) -> None:
    check_checkpoint(harness, messages, required)


@settings(max_examples=FAST, **FUZZ)
@given(
    action=st.one_of(st.sampled_from(["add", "replace", "remove"]), SCALAR),
    target=st.one_of(st.sampled_from(["memory", "user"]), SCALAR),
    content=CONTENT,
    metadata=st.one_of(st.none(), VALUE),
)
def test_fuzz_memory_writes(
    harness: Harness, action: Any, target: Any, content: Any, metadata: Any
) -> None:
    check_memory(harness, action, target, content, metadata)


@settings(max_examples=FAST, **FUZZ)
@given(name=TOOL_NAME, args=TOOL_ARGS, query=QUERY)
def test_fuzz_tools_and_queries(harness: Harness, name: Any, args: Any, query: Any) -> None:
    check_tool(harness, name, args)
    check_query(harness, query)


@pytest.mark.slow
@settings(max_examples=SLOW, **FUZZ)
@given(messages=MESSAGES)
def test_fuzz_turns_long(harness: Harness, messages: list[Any]) -> None:
    check_turn(harness, messages)


@pytest.mark.slow
@settings(max_examples=SLOW, **FUZZ)
@given(messages=st.one_of(MESSAGES, SCALAR), required=st.booleans())
def test_fuzz_checkpoints_long(harness: Harness, messages: Any, required: bool) -> None:
    check_checkpoint(harness, messages, required)


@pytest.mark.slow
@settings(max_examples=SLOW, **FUZZ)
@given(action=SCALAR, target=SCALAR, content=CONTENT, metadata=st.one_of(st.none(), VALUE))
def test_fuzz_memory_writes_long(
    harness: Harness, action: Any, target: Any, content: Any, metadata: Any
) -> None:
    check_memory(harness, action, target, content, metadata)


@pytest.mark.slow
@settings(max_examples=SLOW, **FUZZ)
@given(name=TOOL_NAME, args=TOOL_ARGS, query=QUERY)
def test_fuzz_tools_and_queries_long(harness: Harness, name: Any, args: Any, query: Any) -> None:
    check_tool(harness, name, args)
    check_query(harness, query)
