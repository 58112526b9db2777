"""Our evidence filter equals the v2 host's, for any message shapes (archives match across hosts)."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from archive_provider.domain.evidence import direct_evidence

from .v2_host import direct_messages_for_pre_compress_memory

content = (
    st.none()
    | st.text(max_size=8)
    | st.lists(
        st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=4)}), max_size=2
    )
)
tool_calls = st.none() | st.lists(st.fixed_dictionaries({"id": st.text(max_size=3)}), max_size=2)
row = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "other"]), "content": content},
    optional={"tool_calls": tool_calls, "_compressed_summary": st.booleans()},
)
messages = st.lists(row | st.integers() | st.text(max_size=3), max_size=8)


@settings(max_examples=400)
@given(messages)
def test_direct_evidence_matches_the_v2_host_filter(rows: list[Any]) -> None:
    before = copy.deepcopy(rows)
    ours = direct_evidence(rows)
    assert ours == direct_messages_for_pre_compress_memory(rows)
    assert direct_evidence(ours) == ours  # idempotent: filtering host evidence changes nothing
    assert rows == before  # the caller's list is not mutated
