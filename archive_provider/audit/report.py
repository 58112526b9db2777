"""The audit report: the log reduced to a picture, and that picture as one HTML file.

:class:`ReportReducer` folds facts (one per event, streamed in sequence order) into the
report model in bounded memory, whatever the archive's size: a count per day and category
for the whole archive, per hour for the newest :data:`HOUR_DAYS` days, the newest
:data:`DETAIL_ITEMS` events in detail (and the newest :data:`NOTABLE_ITEMS` erasures, holds,
retention passes, witness changes and refusals apart, so turns never push them out), the
:data:`SESSIONS` most recently active sessions with their turns, memory, recalls and
checkpoints (each list capped at :data:`PER_SESSION`). Everything older is in the counts.

:func:`fact_of` makes a fact from an event, its line (``audit/summary.py``, the same as
``log`` shows) and what the caller looked up for it (the author's label, a memory write's
content, the sessions a recall drew from), so the reducer reads no archive. :func:`render_html` writes the model into the page template
(``report.html`` beside this module): the data as JSON inside a ``<script>`` that no
archive string can close, the page's own script and style pinned by hash in a
Content-Security-Policy that loads nothing from anywhere.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections import Counter, OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from .summary import cut, one_line

#: events kept in detail (the newest); older ones are counted in the timeline's buckets
DETAIL_ITEMS = 2_000
#: erasures, holds, retention passes, witness changes and refusals kept in detail apart
NOTABLE_ITEMS = 500
#: sessions kept in detail (the most recently active)
SESSIONS = 200
#: turns, memory changes, recalls and checkpoints listed per session (the newest)
PER_SESSION = 25
#: days (before the newest event) counted per hour, so the newest days zoom to hours
HOUR_DAYS = 31
#: characters of any text from the archive shown in one place
TEXT_CHARS = 160
#: characters of a session name or an author shown (cut, never reflowed)
NAME_CHARS = 200
#: items of a list in a receipt shown (an erasure's list of memory writes, say)
RECEIPT_ITEMS = 100

#: the timeline's categories, in the order the page stacks them
CATEGORIES = (
    "session",
    "turn",
    "checkpoint",
    "memory",
    "recall",
    "erasure",
    "hold",
    "retention",
    "witness",
    "refusal",
    "other",
)
_CATEGORY = {
    "session_started": "session",
    "session_switched": "session",
    "session_ended": "session",
    "delegation": "session",
    "turns_rewound": "session",
    "turn": "turn",
    "checkpoint": "checkpoint",
    "memory_write": "memory",
    "recall_served": "recall",
    "erasure": "erasure",
    "legal_hold": "hold",
    "legal_hold_released": "hold",
    "retention_policy": "retention",
    "witness_added": "witness",
    "witness_removed": "witness",
    "witness_refused": "refusal",
    "peer_witness_refused": "refusal",
    "peer_input_rejected": "refusal",
    "checkpoint_failed": "refusal",
    "write_failed": "refusal",
}
#: categories that are rare and matter to an auditor: kept in detail apart from the rest
NOTABLE = frozenset({"erasure", "hold", "retention", "witness", "refusal"})
#: the store-level session (FORMAT.md 18): no conversation
STORE_SESSION = "archive"


def category_of(event_type: str, body: Any) -> str:
    """The timeline category of an event; a retention pass is an erasure by the policy."""
    if event_type == "erasure" and isinstance(body, Mapping) and body.get("reason") == "retention":
        return "retention"
    return _CATEGORY.get(event_type, "other")


def bounded(value: Any) -> Any:
    """A receipt's value with every string cut and every list shortened, so no record
    event can make the page (or the reducer) as large as itself."""
    if isinstance(value, str):
        return cut(value, 4 * NAME_CHARS)
    if isinstance(value, Mapping):
        return {cut(str(k), NAME_CHARS): bounded(v) for k, v in list(value.items())[:RECEIPT_ITEMS]}
    if isinstance(value, (list, tuple)):
        more = len(value) - RECEIPT_ITEMS
        return [bounded(v) for v in value[:RECEIPT_ITEMS]] + (
            [f"… {more} more"] if more > 0 else []
        )
    return value


@dataclass(frozen=True)
class Fact:
    """What the report keeps of one event: its envelope, category and a line to show."""

    seq: int
    time: str
    type: str
    session: str
    category: str
    text: str
    author: str | None = None  # a turn's author, as people read it
    turn: int | None = None
    #: a recall's sources as (seq, session); a memory write's (action, target, content)
    sources: tuple[tuple[int, str], ...] = ()
    memory: tuple[str, str, str] | None = None
    #: an erasure's, hold's or retention policy's receipt (never erased content)
    receipt: dict[str, Any] | None = None


def _receipt(event_type: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The fields of a record event that make its receipt; an erasure's digests stay out
    (counts only), and no record event holds erased content."""
    if event_type == "erasure":
        keys: tuple[str, ...] = (
            "scope",
            "reason",
            "legal_basis",
            "who",
            "payloads",
            "events",
            "kept_shared",
        )
    elif event_type == "legal_hold":
        keys = ("hold", "selector", "reason", "who")
    elif event_type == "legal_hold_released":
        keys = ("hold", "reason", "who")
    elif event_type == "retention_policy":
        keys = ("days", "reason", "who", "confirmed")
    elif event_type in ("witness_added", "witness_removed", "witness_refused"):
        keys = ("name", "vkey", "url", "peer", "reason", "who")
    else:
        return None
    return {key: bounded(body[key]) for key in keys if key in body}


def fact_of(
    seq: int,
    time: str,
    event_type: str,
    session: str,
    body: Any,
    text: str,
    *,
    author: str | None = None,
    memory_content: Any = None,
    sources: tuple[tuple[int, str], ...] = (),
    erased: bool = False,
) -> Fact:
    """The fact of one event (pure): ``text`` is its line (the one summariser's, as ``log``
    shows it); ``author``, ``memory_content`` and ``sources`` are what the caller read from
    the archive for it (a turn's author label, a memory write's content, a recall's source
    events with their sessions); ``erased``: an event whose body an erasure removed (its
    envelope is all there is)."""
    if erased:
        memory = ("(erased)", "", "(erased)") if event_type == "memory_write" else None
        return Fact(
            seq,
            time,
            event_type,
            cut(session, NAME_CHARS),
            category_of(event_type, None),
            one_line(text, TEXT_CHARS),
            memory=memory,
        )
    category = category_of(event_type, body)
    author = None if author is None else cut(author, NAME_CHARS)
    mapping: Mapping[str, Any] = body if isinstance(body, Mapping) else {}
    memory = None
    if event_type == "memory_write":
        content = "(erased)" if memory_content is None else one_line(memory_content, 80)
        memory = (one_line(mapping.get("action"), 20), one_line(mapping.get("target"), 40), content)
    turn = mapping.get("turn")
    return Fact(
        seq,
        time,
        event_type,
        cut(session, NAME_CHARS),
        category,
        one_line(text, TEXT_CHARS),
        author=author,
        turn=turn if isinstance(turn, int) and not isinstance(turn, bool) else None,
        sources=tuple((seq, cut(where, NAME_CHARS)) for seq, where in sources[:RECEIPT_ITEMS]),
        memory=memory,
        receipt=_receipt(event_type, mapping),
    )


def _item(fact: Fact) -> dict[str, Any]:
    return {
        "seq": fact.seq,
        "time": fact.time,
        "type": fact.type,
        "category": fact.category,
        "session": fact.session,
        "text": fact.text,
    }


@dataclass
class _Session:
    """One session's detail, each list capped at :data:`PER_SESSION` (the newest)."""

    first: str
    last: str = ""
    events: int = 0
    turns: int = 0
    memory_changes: int = 0
    recalls: int = 0
    checkpoints: int = 0
    partial: bool = False  # evicted once: its earlier events are only in the counts
    authors: Counter[str] = field(default_factory=Counter)
    turn_list: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=PER_SESSION))
    memory: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=PER_SESSION))
    recall_list: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=PER_SESSION))
    checkpoint_list: deque[dict[str, Any]] = field(
        default_factory=lambda: deque(maxlen=PER_SESSION)
    )

    def add(self, fact: Fact) -> None:
        self.last, self.events = fact.time, self.events + 1
        at = {"seq": fact.seq, "time": fact.time}
        if fact.type == "turn":
            self.turns += 1
            if fact.author is not None and (fact.author in self.authors or len(self.authors) < 20):
                self.authors[fact.author] += 1
            self.turn_list.append(
                {**at, "turn": fact.turn, "author": fact.author, "text": fact.text}
            )
        elif fact.memory is not None:
            self.memory_changes += 1
            action, target, content = fact.memory
            self.memory.append({**at, "action": action, "target": target, "content": content})
        elif fact.type == "recall_served":
            self.recalls += 1
            sources = [{"seq": s, "session": where} for s, where in fact.sources[:20]]
            self.recall_list.append({**at, "turn": fact.turn, "sources": sources})
        elif fact.type == "checkpoint":
            self.checkpoints += 1
            self.checkpoint_list.append({**at, "text": fact.text})

    def as_dict(self, name: str) -> dict[str, Any]:
        return {
            "session": name,
            "first": self.first,
            "last": self.last,
            "events": self.events,
            "turns": self.turns,
            "memory_changes": self.memory_changes,
            "recalls": self.recalls,
            "checkpoints": self.checkpoints,
            "partial": self.partial,
            "authors": [{"author": a, "turns": n} for a, n in self.authors.most_common()],
            "turn_list": list(self.turn_list),
            "memory": list(self.memory),
            "recall_list": list(self.recall_list),
            "checkpoint_list": list(self.checkpoint_list),
        }


class ReportReducer:
    """Folds facts, oldest first, into the report model; memory stays bounded by the
    constants above, not by the number of events."""

    def __init__(self) -> None:
        self.events = 0
        self.first_time: str | None = None
        self.last_time: str | None = None
        self.by_category: Counter[str] = Counter()
        self.days: dict[str, Counter[str]] = {}
        self.hours: dict[str, Counter[str]] = {}
        self.detail: deque[dict[str, Any]] = deque(maxlen=DETAIL_ITEMS)
        self.notable: deque[dict[str, Any]] = deque(maxlen=NOTABLE_ITEMS)
        self.sessions: OrderedDict[str, _Session] = OrderedDict()
        self.evicted: set[int] = set()  # names' hashes, capped: to mark a returning session
        self.sessions_seen = 0
        self.receipts: deque[dict[str, Any]] = deque(maxlen=NOTABLE_ITEMS)
        self.holds: dict[str, dict[str, Any]] = {}

    def add(self, fact: Fact) -> None:
        self.events += 1
        self.first_time = self.first_time or fact.time
        self.last_time = fact.time
        self.by_category[fact.category] += 1
        self.days.setdefault(fact.time[:10], Counter())[fact.category] += 1
        self.hours.setdefault(fact.time[:13], Counter())[fact.category] += 1
        if len(self.hours) > (HOUR_DAYS + 2) * 24:
            self._prune_hours()
        item = _item(fact)
        self.detail.append(item)
        if fact.category in NOTABLE:
            self.notable.append(item)
        if fact.receipt is not None:
            self._record(fact)
        if fact.session and fact.session != STORE_SESSION:
            self._session(fact)

    def _prune_hours(self) -> None:
        newest = sorted(self.hours)[-HOUR_DAYS * 24 :]
        self.hours = {hour: self.hours[hour] for hour in newest}

    def _record(self, fact: Fact) -> None:
        receipt = {"seq": fact.seq, "time": fact.time, "type": fact.type, **(fact.receipt or {})}
        if fact.type == "legal_hold":
            self.holds[str(receipt.get("hold"))] = {**receipt, "released": None}
            if len(self.holds) > NOTABLE_ITEMS:  # the oldest hold leaves the detail first
                self.holds.pop(next(iter(self.holds)))
        elif fact.type == "legal_hold_released":
            hold = self.holds.get(str(receipt.get("hold")))
            if hold is not None:
                hold["released"] = receipt
        if fact.type in ("erasure", "retention_policy"):
            self.receipts.append(receipt)

    def _session(self, fact: Fact) -> None:
        found = self.sessions.get(fact.session)
        if found is None:
            returning = hash(fact.session) in self.evicted
            self.sessions_seen += not returning
            found = _Session(first=fact.time, partial=returning)
            self.sessions[fact.session] = found
            if len(self.sessions) > SESSIONS:
                gone, _ = self.sessions.popitem(last=False)
                if len(self.evicted) < 50 * SESSIONS:
                    self.evicted.add(hash(gone))
        else:
            self.sessions.move_to_end(fact.session)
        found.add(fact)

    def model(self, **context: Any) -> dict[str, Any]:
        """The report model: what the page shows, with ``context`` (verification,
        checkpoint, witnesses, archive) as the caller measured it at report time."""
        hours_from = min(self.hours) if self.hours else None
        return {
            **context,
            "events": self.events,
            "first_time": self.first_time,
            "last_time": self.last_time,
            "categories": list(CATEGORIES),
            "by_category": {c: self.by_category[c] for c in CATEGORIES if self.by_category[c]},
            "timeline": {
                "days": [[day, dict(counts)] for day, counts in sorted(self.days.items())],
                "hours": [[hour, dict(counts)] for hour, counts in sorted(self.hours.items())],
                "hours_from": hours_from,
            },
            "items": list(self.detail),
            "notable": list(self.notable),
            "sessions": [
                found.as_dict(name) for name, found in reversed(list(self.sessions.items()))
            ],
            "sessions_total": self.sessions_seen,
            "erasures": [r for r in self.receipts if r["type"] == "erasure"],
            "retention": [r for r in self.receipts if r["type"] == "retention_policy"],
            "holds": list(self.holds.values()),
            "bounds": {
                "items": DETAIL_ITEMS,
                "notable": NOTABLE_ITEMS,
                "sessions": SESSIONS,
                "per_session": PER_SESSION,
                "hour_days": HOUR_DAYS,
                "text_chars": TEXT_CHARS,
            },
        }


# -- the page ---------------------------------------------------------------------------

_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)
_STYLE = re.compile(r"<style>(.*?)</style>", re.DOTALL)
_DATA = "<!--REPORT-DATA-->"
_CSP = "<!--REPORT-CSP-->"


def script_json(value: Any) -> str:
    """JSON that is safe inside a ``<script>`` element: no ``<``, ``>`` or ``&`` (so no
    ``</script>`` or ``<!--`` can end or bend it) and no U+2028/9, all as ``\\u`` escapes."""
    text = json.dumps(value, ensure_ascii=True, sort_keys=True, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def render_html(model: Mapping[str, Any]) -> str:
    """The report page: the template with the model embedded as JSON, its one script and
    one style allowed by hash, and nothing else allowed (no network, no other script)."""
    template = resources.files(__package__).joinpath("report.html").read_text("utf-8")
    (script,) = _SCRIPT.findall(template)
    (style,) = _STYLE.findall(template)
    policy = (
        "default-src 'none'; "
        f"script-src {_sha256(script)}; style-src {_sha256(style)}; "
        "base-uri 'none'; form-action 'none'"
    )
    data = f'<script type="application/json" id="report-data">{script_json(model)}</script>'
    return template.replace(_CSP, policy).replace(_DATA, data)
