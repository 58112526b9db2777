"""Event builders: host facts in, :class:`NewEvent` out. Pure apart from the keyed hasher.

Each builder decides what makes its event *that* event (the identity key, docs/DESIGN.md
invariant 2) and what the payload records. Message texts are parts, stored once by digest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..format.canonical import canonical_bytes
from ..format.events import Hasher, NewEvent, Part
from .evidence import archivable, archivable_text
from .redaction import host_masks, redact_value

#: cuts an event's single texts (name -> text) of the recalls they echo (FORMAT.md 13.4)
TextCut = Callable[[Mapping[str, Any]], tuple[dict[str, Any], list[dict[str, Any]]]]


def message_parts(hasher: Hasher, messages: Sequence[Mapping[str, Any]]) -> tuple[Part, ...]:
    return tuple(hasher.part(message) for message in messages)


def with_redactions(
    body: dict[str, Any], redactions: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Add the ``redactions`` list (redaction.py) to a body when anything was redacted."""
    if redactions:
        body["redactions"] = [dict(item) for item in redactions]
    return body


def with_host_masks(body: dict[str, Any], handed: Mapping[str, Any]) -> dict[str, Any]:
    """Add ``host_masks``: the masks a scrubbing host left in the texts it ``handed`` over
    (field name -> archived value; paths start with the field, as redactions' do)."""
    masks = host_masks(dict(handed))
    if masks:
        body["host_masks"] = masks
    return body


def _masked(redact: bool, **fields: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The fields, secret-shaped spans masked when ``redact``, and the redactions made.

    Each redaction's path starts with its field's name (``/query``, ``/metadata/...``).
    """
    return redact_value(fields) if redact else (fields, [])


def _masked_body(
    redact: bool, body: dict[str, Any], redactions: Sequence[Mapping[str, Any]] = ()
) -> dict[str, Any]:
    """``body`` with its own text masked too when ``redact`` (digests never match a pattern),
    and every redaction, its parts' first, listed."""
    masked, found = redact_value(body) if redact else (body, [])
    return with_redactions(masked, [*redactions, *found])


def turn(
    hasher: Hasher,
    session: str,
    ordinal: int,
    parts: Sequence[Part],
    *,
    start: int,
    legacy: bool,
    redactions: Sequence[Mapping[str, Any]] = (),
    author: Mapping[str, Any] | None = None,
    host_masks: Sequence[Mapping[str, Any]] = (),
    echoes: Sequence[Mapping[str, Any]] = (),
) -> NewEvent:
    """A completed turn: its new messages (all roles, as the host sent them, after redaction).

    The messages are named by position (they are the parts, FORMAT.md 13.4); the recall
    ``echoes`` cut out of them are recorded (domain/echoes.py). The identity covers the
    session and the parts (FORMAT.md 13.2), so the key is the ordinal alone.

    ``author`` (domain/authors.py) is a payload of its own, carried as :attr:`NewEvent.author`
    and named by the envelope's ``author`` field (13.1): erasable with its payload and never
    in the identity.
    """
    body: dict[str, Any] = {"turn": ordinal, "start": start, "legacy_shape": legacy}
    if echoes:
        body["echoes"] = [dict(echo) for echo in echoes]
    if host_masks:
        body["host_masks"] = [dict(mask) for mask in host_masks]
    return NewEvent(
        "turn",
        session,
        {"turn": ordinal},
        with_redactions(body, redactions),
        tuple(parts),
        author=hasher.part(dict(author)) if author is not None else None,
    )


def turns_rewound(
    session: str,
    *,
    switch_seq: int,
    start: int,
    rewound: Sequence[tuple[int, str]],
    detected_by: str,
) -> NewEvent:
    """Archived messages the user rewound (``/undo``), found from the shortened transcript.

    ``rewound`` is each (turn event seq, message digest) from transcript position ``start``
    on. Nothing is deleted: projections mark these messages; memory writes stand (the host
    does not revert MEMORY.md, docs/HOST.md §2.3).
    """
    digests = [digest for _, digest in rewound]
    return NewEvent(
        "turns_rewound",
        session,
        {"session": session, "switch_seq": switch_seq, "from": start, "messages": digests},
        {
            "switch_seq": switch_seq,
            "from_message": start,
            "to_message": start + len(digests),
            "messages": digests,
            "turn_seqs": sorted({seq for seq, _ in rewound}),
            "detected_by": detected_by,
        },
    )


def checkpoint(
    hasher: Hasher,
    session: str,
    parts: Sequence[Part],
    *,
    parent_session: str,
    host_api_version: int | None,
    require_checkpoint: bool,
    received: int,
    redactions: Sequence[Mapping[str, Any]] = (),
    received_roles: Mapping[str, int] | None = None,
    summaries_skipped: int = 0,
    host_masks: Sequence[Mapping[str, Any]] = (),
    echoes: Sequence[Mapping[str, Any]] = (),
    filtered_by: str = "provider",
) -> NewEvent:
    """A pre-compress checkpoint: the ordered evidence digests; identity = session + list.

    ``echoes`` are the recalls cut out of the evidence (FORMAT.md 13.4, as in a turn).

    The receipt says who reduced the transcript to its evidence (``filtered_by``). When the
    provider did, it also says what was handed over (``received_roles``) and how many prior
    compaction summaries (``_compressed_summary`` rows) were left out as not evidence; when
    the host did (checkpoint API v2), those counts would only describe the host's output,
    so they are left out.
    """
    counts = (
        {"received_roles": dict(received_roles or {}), "summaries_skipped": summaries_skipped}
        if filtered_by == "provider"
        else {}
    )
    digests = [part.digest for part in parts]
    evidence = hasher.digest(canonical_bytes(digests))
    return NewEvent(
        "checkpoint",
        session,
        {},  # the identity covers session and parts (FORMAT.md 13.2)
        with_redactions(
            {
                "evidence": digests,
                "evidence_digest": evidence,
                "parent_session": parent_session,
                "host_api_version": host_api_version,
                "provider_api_version": 2,
                "require_checkpoint": require_checkpoint,
                "received_messages": received,
                "filtered_by": filtered_by,
                **counts,
                **({"host_masks": [dict(m) for m in host_masks]} if host_masks else {}),
                **({"echoes": [dict(e) for e in echoes]} if echoes else {}),
            },
            redactions,
        ),
        tuple(parts),
    )


def checkpoint_failed(
    session: str,
    *,
    at: str,
    error: str,
    require_checkpoint: bool,
    evidence_count: int,
    redact: bool = False,
) -> NewEvent:
    text, found = redact_value(archivable_text(error), "/error") if redact else (error, [])
    return NewEvent(
        "checkpoint_failed",
        session,
        {"session": session, "at": at},
        with_redactions(
            {
                "error": archivable_text(text),
                "require_checkpoint": require_checkpoint,
                "evidence_count": evidence_count,
            },
            found,
        ),
    )


def memory_write(
    hasher: Hasher,
    session: str,
    order: int,
    action: str,
    target: str,
    content: Any,
    metadata: Any,
    *,
    redact: bool = False,
) -> NewEvent:
    """A built-in memory write, exactly as the host sent it (content kept apart by digest).

    With ``redact``, secret-shaped spans of the content and metadata are masked first
    (redaction.py) and listed under ``redactions`` (paths ``/content``, ``/metadata/...``);
    the masks a scrubbing host put there are listed under ``host_masks`` (same paths).
    """
    fields, redactions = _masked(
        redact,
        content=archivable(content),
        metadata=archivable(metadata),
        action=archivable(action),
        target=archivable(target),
    )
    content, metadata = fields["content"], fields["metadata"]
    part = hasher.part(content)
    body = {
        "order": order,
        "action": fields["action"],
        "target": fields["target"],
        "content": part.digest,
        "metadata": metadata,
    }
    return NewEvent(
        "memory_write",
        session,
        {"order": order},  # the identity covers session and parts (FORMAT.md 13.2)
        with_host_masks(
            with_redactions(body, redactions), {"content": content, "metadata": metadata}
        ),
        (part,),
    )


def session_started(
    session: str, *, at: str, details: Mapping[str, Any], redact: bool = False
) -> NewEvent:
    body = _masked_body(redact, archivable(dict(details)))
    return NewEvent("session_started", session, {"session": session, "at": at}, body)


def session_switched(
    session: str, *, previous: str, at: str, details: Mapping[str, Any], redact: bool = False
) -> NewEvent:
    body = _masked_body(redact, archivable({"from": previous, **details}))
    return NewEvent(
        "session_switched", session, {"session": session, "from": previous, "at": at}, body
    )


def session_ended(session: str, *, at: str, message_count: int) -> NewEvent:
    return NewEvent(
        "session_ended", session, {"session": session, "at": at}, {"message_count": message_count}
    )


def recall_served(
    hasher: Hasher,
    session: str,
    *,
    turn: int,
    query: str,
    result: str,
    sources: Sequence[int],
    at: str,
    redact: bool = False,
) -> NewEvent:
    """What the provider returned as recall for which turn (the host may still trim it).

    ``host_masks`` covers the query only: it is the host's hand-off; the result is ours.
    """
    fields, redactions = _masked(
        redact, query=archivable_text(query), result=archivable_text(result)
    )
    query, result = fields["query"], fields["result"]
    query_part, result_part = hasher.part(query), hasher.part(result)
    return NewEvent(
        "recall_served",
        session,
        {
            "session": session,
            "turn": turn,
            "query": query_part.digest,
            "result": result_part.digest,
            "at": at,
        },
        with_host_masks(
            with_redactions(
                {
                    "turn": turn,
                    "query": query_part.digest,
                    "result": result_part.digest,
                    "sources": list(sources),
                },
                redactions,
            ),
            {"query": query},
        ),
        (query_part, result_part),
    )


def tool_call(
    hasher: Hasher,
    session: str,
    *,
    at: str,
    tool: str,
    args: Any,
    result: Any,
    details: Mapping[str, Any],
    redact: bool = False,
) -> NewEvent:
    """A tool the agent called and what it returned, as the host's ``post_tool_call`` hook
    reported them (arguments and result kept apart by digest, erasable). With ``redact``,
    secret-shaped spans are masked first: no host scrubs this path."""
    fields, redactions = _masked(redact, args=archivable(args), result=archivable(result))
    args, result = fields["args"], fields["result"]
    args_part, result_part = hasher.part(args), hasher.part(result)
    body = archivable(
        {**details, "tool": tool, "at": at, "args": args_part.digest, "result": result_part.digest}
    )
    body = with_host_masks(_masked_body(redact, body, redactions), {"args": args, "result": result})
    return NewEvent(
        "tool_call",
        session,
        {
            "session": session,
            "at": at,
            "tool": tool,
            "call": body.get("tool_call_id", ""),
            "args": args_part.digest,
            "result": result_part.digest,
        },
        body,
        (args_part, result_part),
    )


def delegation(
    hasher: Hasher,
    session: str,
    *,
    task: Any,
    result: Any,
    child_session: str,
    details: Mapping[str, Any],
    redact: bool = False,
    cut: TextCut | None = None,
) -> NewEvent:
    """A subagent's task and result as parts; ``cut`` takes out the recalls they echo
    (FORMAT.md 13.4), after redaction, and the body names them in ``echoes``."""
    fields, redactions = _masked(redact, task=archivable(task), result=archivable(result))
    texts = {"task": fields["task"], "result": fields["result"]}
    stored, echoes = cut(texts) if cut is not None else (texts, [])
    task_part, result_part = hasher.part(stored["task"]), hasher.part(stored["result"])
    body = archivable(
        {
            "task": task_part.digest,
            "result": result_part.digest,
            "child_session": child_session,
            **details,
        }
    )
    body = with_host_masks(_masked_body(redact, body, redactions), texts)
    if echoes:
        body["echoes"] = echoes
    return NewEvent(
        "delegation",
        session,
        {
            "session": session,
            "child": child_session,
            "task": task_part.digest,
            "result": result_part.digest,
        },
        body,
        (task_part, result_part),
    )


def shutdown_drain(
    *,
    at: str,
    drain: str,
    pending: int,
    spilled: int,
    unwritten: int,
    unwritten_hooks: Mapping[str, int],
    finished: bool,
    timeout_s: float,
    error: str | None,
) -> NewEvent:
    """A shutdown whose drain did not finish: what was queued, spilled and lost (counts of
    hook calls). Written to the spill at close and archived by the next open (HOST.md §3)."""
    return NewEvent(
        "shutdown_drain",
        "",
        {"drain": drain, "at": at},
        {
            "pending": pending,
            "spilled": spilled,
            "unwritten": unwritten,
            "unwritten_hooks": dict(unwritten_hooks),
            "finished": finished,
            "timeout_s": timeout_s,
            "error": None if error is None else archivable_text(error),
        },
    )


def spill_taken(segment: str, *, file: str) -> NewEvent:
    """Records of a spill segment are in the log: appended with the first commit that takes
    one in. Its identity is the segment id alone, so the log itself remembers every segment
    it took records from and a copy put back later adds nothing (FORMAT.md, "Spill file")."""
    return NewEvent("spill_taken", "", {"segment": segment}, {"file": file})


def spill_accepted(
    segment: str,
    *,
    file: str,
    digest: str,
    kinds: Mapping[str, int],
    reason: str,
    who: Mapping[str, Any],
) -> NewEvent:
    """An operator took in the records of a spill segment that nothing authenticates (one
    kept aside in ``spill/damaged/``): who, why, and which file (its BLAKE3 ``digest``). The
    records follow it in the log; its identity is the segment id, so it is recorded once."""
    return NewEvent(
        "spill_accepted",
        "",
        {"segment": segment},
        {
            "file": file,
            "digest": digest,
            "records": sum(kinds.values()),
            "kinds": dict(kinds),
            "reason": archivable_text(reason),
            **who,
        },
    )


def write_failed(session: str, *, at: str, hook: str, error: str) -> NewEvent:
    """A hook's input could not be archived: recorded, never silently dropped."""
    return NewEvent(
        "write_failed",
        session,
        {"session": session, "hook": hook, "at": at},
        {"hook": hook, "error": archivable_text(error)},
    )
