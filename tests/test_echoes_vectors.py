"""Recall echoes (FORMAT.md 13.4) against the frozen vectors: an oracle written from the
text, and the package, give the vectors' stored messages, echoes and renderings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from archive_provider.domain.echoes import cut_echoes, render_echoes

VECTORS = json.loads((Path(__file__).parent / "vectors" / "echoes.json").read_text())
FIELDS = ("api_content", "content")


def oracle_cut(
    messages: list[dict[str, Any]], recalls: list[tuple[int, str]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """13.4: each result (newest recall first) cut wherever it occurs whole in api_content
    or content, never over an earlier cut; ``at`` counts code points of the stored text."""
    stored, echoes = [dict(m) for m in messages], []
    for index, message in enumerate(messages):
        for name in FIELDS:
            text = message.get(name)
            if not isinstance(text, str):
                continue
            spans: list[tuple[int, int, int]] = []
            for seq, result in sorted(recalls, reverse=True):
                at = text.find(result)
                while at >= 0:
                    if all(at + len(result) <= s or at >= e for s, e, _ in spans):
                        spans.append((at, at + len(result), seq))
                    at = text.find(result, at + len(result))
            removed, kept, last = 0, "", 0
            for start, end, seq in sorted(spans):
                kept += text[last:start]
                echoes.append(
                    {"at": start - removed, "field": name, "message": index, "recall": seq}
                )
                removed, last = removed + end - start, end
            if spans:
                stored[index][name] = kept + text[last:]
    echoes.sort(key=lambda e: (e["message"], FIELDS.index(e["field"]), e["at"]))
    return stored, echoes


def oracle_render(
    message: dict[str, Any], index: int, echoes: list[dict[str, Any]], results: dict[int, str]
) -> dict[str, Any]:
    out, shift = dict(message), {name: 0 for name in FIELDS}
    for echo in echoes:
        if echo["message"] != index:
            continue
        text = results.get(echo["recall"], VECTORS["erased"])
        at = echo["at"] + shift[echo["field"]]
        out[echo["field"]] = out[echo["field"]][:at] + text + out[echo["field"]][at:]
        shift[echo["field"]] += len(text)
    return out


def test_the_oracle_and_the_package_give_the_vectors() -> None:
    recalls = [(r["seq"], r["result"]) for r in VECTORS["recalls"]]
    results = dict(recalls)
    assert len(VECTORS["cases"]) == 3
    for case in VECTORS["cases"]:
        assert oracle_cut(case["sent"], recalls) == (case["stored"], case["echoes"])
        newest_first = sorted(recalls, reverse=True)
        assert cut_echoes(case["sent"], newest_first, VECTORS["marker"]) == (
            case["stored"],
            case["echoes"],
        )
        for i, stored in enumerate(case["stored"]):
            assert oracle_render(stored, i, case["echoes"], results) == case["sent"][i]
            assert render_echoes(stored, i, case["echoes"], results.get) == case["sent"][i]
            erased = oracle_render(stored, i, case["echoes"], {})
            assert erased == case["rendered_erased"][i]
            assert render_echoes(stored, i, case["echoes"], lambda seq: None) == erased
            assert not any(r in json.dumps(erased) for _, r in recalls) or not case["echoes"]


def test_a_stored_message_holds_no_echoed_text_and_a_trimmed_echo_is_kept_as_sent() -> None:
    echoed, twice, trimmed = VECTORS["cases"]
    for case in (echoed, twice):
        assert case["echoes"] and "BLUE HERON" not in json.dumps(case["stored"])
    assert [e["recall"] for e in twice["echoes"]] == [20, 14]  # in the order of the text
    assert trimmed["echoes"] == [] and trimmed["stored"] == trimmed["sent"]
