"""Secret redaction before anything is archived (setting ``redact_secrets``, on by default).

Pure functions, no I/O. A secret-shaped span (an API key such as ``sk-...``, a GitHub token,
an AWS key, a bearer token, a PEM private key, the password of a URL) is replaced by the
marker ``[redacted:<kind>]`` in the archived text, and the event records where: a
``redactions`` list of ``{"path": <JSON pointer into the archived value>, "kind": <kind>,
"at": <code-point offset of the marker in that text>}``. Everything else is kept byte for
byte, so an archive with redaction differs from one without only inside the marked spans.

Text a newer host already redacted is left alone. Hermes (``agent/redact.py``) masks a
token as ``head...tail`` (``sk-pro...7890``), as ``***``, as ``«redacted:ghp_…»`` /
``«redacted-secret»`` or as ``[REDACTED PRIVATE KEY]``; none of those shapes matches a pattern
here (a candidate holding ``...``, ``…`` or ``***`` is skipped), and our own markers never
match either, so redacting is idempotent and a no-op on host-redacted text.

Cross-host note: on hermes 0.19.0 the provider receives raw text and the markers are ours;
on hosts that scrub hand-offs (main, #115104) the archive holds the host's masks plus our
markers for what the host let through (e.g. ``https://user:password@host``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

MARKER = "[redacted:{kind}]"

# kind -> pattern; a pattern with a group named after its kind redacts that group only.
#
# Compared with what hermes applies before a provider sees text (``agent/redact.py`` in
# NousResearch/hermes-agent at 006e9a1ca67cddf00b0484cbac954c83d30a203c: vendor prefixes,
# JWTs, Authorization and API-key headers, ``NAME_SECRET=`` assignments, JSON secret fields,
# database URLs with or without a user, bare URL tokens, private keys); its vendor list and
# length floors are covered below (written anew, not copied). Not covered: Telegram bot
# tokens and phone numbers (no literal to prefilter on: see ``may_hold_secret``).
#
# Every pattern stays linear: repeats are bounded or over classes that cannot overlap what
# follows, and a name before ``=`` is anchored at the start of its word.
_VENDOR_PREFIXES = (
    # (prefix, body class, minimum body length)
    ("sk_live_", "A-Za-z0-9", 10),
    ("sk_test_", "A-Za-z0-9", 10),
    ("rk_live_", "A-Za-z0-9", 10),
    ("sk_", "A-Za-z0-9", 20),  # ElevenLabs and others: an opaque body, no underscores
    ("hf_", "A-Za-z0-9", 10),
    ("r8_", "A-Za-z0-9", 10),
    ("npm_", "A-Za-z0-9", 10),
    ("pypi-", "A-Za-z0-9_-", 10),
    ("dop_v1_", "A-Za-z0-9", 10),
    ("doo_v1_", "A-Za-z0-9", 10),
    ("pplx-", "A-Za-z0-9", 10),
    ("fal_", "A-Za-z0-9_-", 10),
    ("fc-", "A-Za-z0-9", 10),
    ("bb_live_", "A-Za-z0-9_-", 10),
    ("gAAAA", "A-Za-z0-9_=-", 20),
    ("SG.", "A-Za-z0-9_-", 10),
    ("xapp-", "A-Za-z0-9-", 10),
    ("gsk_", "A-Za-z0-9", 10),
    ("syt_", "A-Za-z0-9_", 10),
    ("tvly-", "A-Za-z0-9", 10),
    ("exa_", "A-Za-z0-9", 10),
    ("xai-", "A-Za-z0-9", 30),
    ("ntn_", "A-Za-z0-9", 10),
    ("glpat-", "A-Za-z0-9_-", 10),
    ("gldt-", "A-Za-z0-9_-", 10),
    ("glrt-", "A-Za-z0-9_.-", 10),
    ("glcbt-", "A-Za-z0-9_-", 10),
    ("glptt-", "A-Za-z0-9_-", 10),
    ("mem0_", "A-Za-z0-9", 10),
    ("am_", "A-Za-z0-9", 20),
)
_SECRET_NAME = (
    r"(?:PASSWORD|PASSWD|PASSPHRASE|SECRET|TOKEN|API_?KEY|PRIVATE_KEY|ACCESS_KEY|CREDENTIALS?"
    r"|AUTH|_PASS|_PW)"
)
_PATTERNS: dict[str, str] = {
    # a key's body holds base64 and a few header lines; it ends at END or, cut off, at the
    # first character a key body cannot hold (a body under 16 characters is not a key)
    "private_key": (
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----(?:\s*[A-Za-z][A-Za-z-]*:[^\n]*)*"
        r"[\sA-Za-z0-9+/=]*(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----)?"
    ),
    "api_key": r"(?<![A-Za-z0-9_-])sk-(?:proj-|ant-|live-|test-)?[A-Za-z0-9_-]{20,}",
    "github_token": r"(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,})",
    "aws_access_key": r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])",
    "aws_secret_key": (
        r"(?i:aws_?secret_?access_?key)[\"']?\s*[:=]\s*[\"']?(?P<aws_secret_key>[A-Za-z0-9/+]{40})"
        r"(?![A-Za-z0-9/+])"
    ),
    "slack_token": r"(?<![A-Za-z0-9])xox[abposr]-[A-Za-z0-9-]{10,}",
    "google_api_key": r"(?<![A-Za-z0-9])AIza[0-9A-Za-z_-]{30,}",
    "vendor_token": "(?<![A-Za-z0-9_.-])(?:"
    + "|".join(f"{re.escape(p)}[{body}]{{{n},}}" for p, body, n in _VENDOR_PREFIXES)
    + ")",
    "jwt": r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{10,}(?:\.[A-Za-z0-9_=-]{4,}){0,2}",
    "bearer_token": r"(?i:\bbearer)\s+(?P<bearer_token>[A-Za-z0-9\-._~+/]{16,}=*)",
    "auth_header": (
        r"(?i:\b(?:proxy-)?authorization)[ \t]*:[ \t]*(?![Bb][Ee][Aa][Rr][Ee][Rr]\s)"
        r"(?:[A-Za-z][\w.+-]{0,30}[ \t]+)?(?P<auth_header>[^\s\"']{6,})"
    ),
    "secret_header": (
        r"(?i:\b(?:x-api-key|x-goog-api-key|api-key|x-api-token|x-auth-token|x-access-token))"
        r"[ \t]*:[ \t]*(?P<secret_header>[^\s\"']{6,})"
    ),
    "secret_assignment": (
        r"(?<![A-Za-z0-9_])[A-Z0-9_]{0,48}" + _SECRET_NAME + r"[A-Z0-9_]{0,48}"
        r"[ \t]*[:=][ \t]*[\"']?(?P<secret_assignment>[^\s\"']{4,})"
    ),
    "json_secret": (
        r"(?i:\"(?:password|passwd|secret|client_secret|api_?key|access_token|refresh_token"
        r"|auth_token|token|private_key)\")\s*:\s*\"(?P<json_secret>[^\"\\]{4,})\""
    ),
    "url_password": (
        r"\b[A-Za-z][A-Za-z0-9+.-]{1,20}://[^\s:/?#@\[\]]{0,128}:(?P<url_password>[^\s@/?#]{1,256})@"
    ),
    "url_token": (
        r"(?i:\b(?:https?|wss?|git|ssh|ftps?|sftp)://)(?P<url_token>[^\s:@/?#\[\]]{8,256})@"
    ),
}
KINDS = tuple(_PATTERNS)
_COMBINED = re.compile(
    "|".join(
        f"(?P<_{kind}>{pattern})" if f"?P<{kind}>" in pattern else f"(?P<{kind}>{pattern})"
        for kind, pattern in _PATTERNS.items()
    )
)
_ALREADY_MASKED = ("...", "\u2026", "***", "[redacted", "\u00abredacted", "[REDACTED")
_KEY_BODY = re.compile(r"[A-Za-z0-9+/=]")
#: a private key cut off before its END line is taken when its body has this many characters
MIN_CUT_KEY_BODY = 16

#: A pattern for each kind, matching exactly the span that kind redacts (for tests).
SPAN_PATTERNS: dict[str, re.Pattern[str]] = {
    "private_key": re.compile(_PATTERNS["private_key"]),
    "api_key": re.compile(r"sk-(?:proj-|ant-|live-|test-)?[A-Za-z0-9_-]{20,}"),
    "github_token": re.compile(r"gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,}"),
    "aws_access_key": re.compile(r"(?:AKIA|ASIA)[A-Z0-9]{16}"),
    "aws_secret_key": re.compile(r"[A-Za-z0-9/+]{40}"),
    "slack_token": re.compile(r"xox[abposr]-[A-Za-z0-9-]{10,}"),
    "google_api_key": re.compile(r"AIza[0-9A-Za-z_-]{30,}"),
    "vendor_token": re.compile(_PATTERNS["vendor_token"][len("(?<![A-Za-z0-9_.-])") :]),
    "jwt": re.compile(r"eyJ[A-Za-z0-9_-]{10,}(?:\.[A-Za-z0-9_=-]{4,}){0,2}"),
    "bearer_token": re.compile(r"[A-Za-z0-9\-._~+/]{16,}=*"),
    "auth_header": re.compile(r"[^\s\"']{6,}"),
    "secret_header": re.compile(r"[^\s\"']{6,}"),
    "secret_assignment": re.compile(r"[^\s\"']{4,}"),
    "json_secret": re.compile(r"[^\"\\]{4,}"),
    "url_password": re.compile(r"[^\s@/?#]{1,256}"),
    "url_token": re.compile(r"[^\s:@/?#\[\]]{8,256}"),
}


def marker(kind: str) -> str:
    return MARKER.format(kind=kind)


# Every pattern above needs one of these literals (case-sensitively), or "bearer" / "aws" and
# "secret" in any case; text holding none of them cannot match, and checking that with
# substring search is ~100x cheaper than running the combined regex over it.
_TRIGGERS = (
    "-----BEGIN",
    *(prefix for prefix, _, _ in _VENDOR_PREFIXES),
    "eyJ",
    "PASS",
    "_PW",
    "SECRET",
    "TOKEN",
    "API_KEY",
    "APIKEY",
    "PRIVATE_KEY",
    "ACCESS_KEY",
    "CREDENTIAL",
    "AUTH",
    "sk-",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "AKIA",
    "ASIA",
    "xox",
    "AIza",
    "://",
)


#: prose from most to least common (letters in English order); a character not listed
#: (digits, ``_``, ``:``) is rarer than any listed one
_PROSE_ORDER = "etaoinshrdlcumwfgypbvkjxqz ETAOINSHRDLCUMWFGYPBVKJXQZ.,-"


def _grouped(triggers: tuple[str, ...]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The triggers grouped by their rarest character in prose: a text lacking that
    character holds none of the group, and one single-character search settles it."""
    groups: dict[str, list[str]] = {}
    for trigger in triggers:
        rarest = max(trigger, key=lambda c: _PROSE_ORDER.find(c) % (len(_PROSE_ORDER) + 1))
        groups.setdefault(rarest, []).append(trigger)
    return tuple((char, tuple(group)) for char, group in groups.items())


_TRIGGER_GROUPS = _grouped(_TRIGGERS)


def holds_trigger(text: str) -> bool:
    """Whether ``text`` holds one of the case-sensitive triggers. A substring search for
    each of them cost ~20 µs on a 500-B message; a group is ruled out by one search for a
    character, so prose pays a few of those instead."""
    for char, triggers in _TRIGGER_GROUPS:
        if char in text:
            for trigger in triggers:
                if trigger in text:
                    return True
    return False


def may_hold_secret(text: str) -> bool:
    """Cheap necessary condition for any redaction pattern to match ``text``."""
    if holds_trigger(text):
        return True
    lowered = text.lower()
    return (
        "bearer" in lowered
        or "authorization" in lowered
        or "api-key" in lowered
        or "-token" in lowered
        or ('"' in text and any(word in lowered for word in _JSON_WORDS))
        or ("aws" in lowered and "secret" in lowered)
    )


_JSON_WORDS = ("pass", "secret", "key", "token")


def redact_text(text: str) -> tuple[str, list[tuple[str, int]]]:
    """``text`` with every secret-shaped span replaced; and (kind, marker offset) for each."""
    if len(text) < 16 or not may_hold_secret(text):  # every pattern needs more than this
        return text, []
    return scan_text(text)


def scan_text(text: str) -> tuple[str, list[tuple[str, int]]]:
    """The regex pass of :func:`redact_text`, without the prefilter (tests compare the two)."""
    out: list[str] = []
    found: list[tuple[str, int]] = []
    position = 0
    length = 0
    for match in _COMBINED.finditer(text):
        for kind in KINDS:
            if match.group(kind) is not None:
                break
        else:  # pragma: no cover - one alternative always matched
            continue
        start, end = match.span(kind)
        secret = text[start:end]
        if any(mask in secret for mask in _ALREADY_MASKED):
            continue  # a host (or we) already masked it
        if (
            kind == "private_key"
            and "-----END " not in secret
            and len(_KEY_BODY.findall(secret, secret.index("-----", 5) + 5)) < MIN_CUT_KEY_BODY
        ):
            continue  # a BEGIN line alone (no END, almost no body) is text, not a key
        out.append(text[position:start])
        length += start - position
        found.append((kind, length))
        label = marker(kind)
        out.append(label)
        length += len(label)
        position = end
    if not found:
        return text, []
    out.append(text[position:])
    return "".join(out), found


def _pointer(path: str, key: Any) -> str:
    return f"{path}/{str(key).replace('~', '~0').replace('/', '~1')}"


def redact_value(value: Any, path: str = "") -> tuple[Any, list[dict[str, Any]]]:
    """Redact every text inside ``value`` (dict values, list items; keys are kept).

    Returns the redacted value (a new object only where something changed) and the list
    of redactions, each ``{"path": JSON pointer, "kind": ..., "at": offset}``.
    """
    new, found, _ = _walk(value, path, True, False)
    return new, found


def _walk(
    value: Any, path: str, redact: bool, masks: bool
) -> tuple[Any, list[dict[str, Any]], list[dict[str, Any]]]:
    """One walk over ``value``: redacted (when ``redact``) as :func:`redact_value` says, its
    redactions, and (when ``masks``) the host masks in the redacted texts (:func:`host_masks`)."""
    if isinstance(value, str):
        text, spans = redact_text(value) if redact else (value, [])
        found = [{"path": path, "kind": kind, "at": at} for kind, at in spans]
        if not masks:
            return text, found, []
        return text, found, [{"path": path, "kind": k, "at": at} for k, at in host_masks_in(text)]
    if isinstance(value, Mapping):
        redactions: list[dict[str, Any]] = []
        masked: list[dict[str, Any]] = []
        changed = {}
        for key, item in value.items():
            new, found, more = _walk(item, _pointer(path, key), redact, masks)
            masked.extend(more)
            if found:
                changed[key] = new
                redactions.extend(found)
        if not redactions:
            return value, [], masked
        return {k: changed.get(k, v) for k, v in value.items()}, redactions, masked
    if isinstance(value, (list, tuple)):
        redactions, masked, items = [], [], []
        for index, item in enumerate(value):
            new, found, more = _walk(item, _pointer(path, index), redact, masks)
            items.append(new)
            redactions.extend(found)
            masked.extend(more)
        if not redactions:
            return value, [], masked
        return (items if isinstance(value, list) else tuple(items)), redactions, masked
    return value, [], []


def redact_rows(
    rows: list[Any], enabled: bool, prefix: str = ""
) -> tuple[list[Any], list[list[dict[str, Any]]], list[list[dict[str, Any]]]]:
    """Redact each row (a message) when ``enabled`` and find the host's masks in what is
    archived, in one walk; per row, its redactions and its masks, with paths under
    ``prefix/i`` (see :func:`renumber`)."""
    out, per_row, masks = [], [], []
    for index, row in enumerate(rows):
        new, found, masked = _walk(row, f"{prefix}/{index}", enabled, True)
        out.append(new)
        per_row.append(found)
        masks.append(masked)
    return out, per_row, masks


def renumber(per_row: list[list[dict[str, Any]]], start: int, prefix: str) -> list[dict[str, Any]]:
    """Redactions of rows ``start:`` with their row index rebased to the event's own list."""
    rebased: list[dict[str, Any]] = []
    for offset, found in enumerate(per_row[start:]):
        old = f"{prefix}/{start + offset}"
        for item in found:
            rebased.append({**item, "path": f"{prefix}/{offset}" + item["path"][len(old) :]})
    return rebased


# -- the host's masks ---------------------------------------------------------------------
#
# A host that scrubs hand-offs (main, about 0.21.6+, docs/HOST.md §4) sends no flag; the
# masks it leaves in the text are the evidence. Each shape below is one ``agent/redact.py``
# produces, or (``learned_redacted``: a bare ``[redacted]``) main's ``_redact_for_provider``
# when it masks everywhere in a hand-off a token it masked once; the detector only reports
# them (kind, JSON pointer, offset), it never changes text, and :func:`redact_text` leaves
# every one of them as it is.
REDACTION_UNAVAILABLE = "[redaction-unavailable]"
_HOST_MASKS = re.compile(
    "|".join(
        (
            r"(?P<private_key_label>\[REDACTED PRIVATE KEY\])",
            r"(?P<vault_label>\u00abredacted-vault-secret\u00bb)",
            r"(?P<redacted_label>\u00abredacted(?::[^\u00bb\s]{1,40}|-secret)\u00bb)",
            r"(?P<bearer_redacted>(?i:\bbearer) \[redacted\])",
            r"(?P<learned_redacted>\[redacted\])",
            r"(?P<head_tail>(?<![A-Za-z0-9_+/=.-])[A-Za-z0-9_+/=-]{6}\.\.\.[A-Za-z0-9_+/=-]{4}"
            r"(?![A-Za-z0-9_+/=-]))",
            r"(?P<stars>(?:(?<=[=:])|(?<=[=:][ \t])|(?<=[=:][ \t][\"'])|(?<=[=:][\"'])|(?<=')"
            r"|(?<=\"))\*\*\*(?![*\w]))",
        )
    )
)
HOST_MASK_KINDS = (
    "head_tail",
    "stars",
    "redacted_label",
    "vault_label",
    "private_key_label",
    "bearer_redacted",
    "learned_redacted",
    "redaction_unavailable",
)


def host_masks_in(text: str) -> list[tuple[str, int]]:
    """(kind, offset) of each mask a host redactor left in ``text``."""
    if text == REDACTION_UNAVAILABLE:
        return [("redaction_unavailable", 0)]
    if not (
        "..." in text
        or "***" in text
        or "\u00abredacted" in text
        or "[REDACTED" in text
        or "[redacted]" in text
    ):
        return []
    found = []
    for match in _HOST_MASKS.finditer(text):
        kind = match.lastgroup
        if kind is not None:
            found.append((kind, match.start()))
    return found


def host_masks(value: Any, path: str = "") -> list[dict[str, Any]]:
    """Every host mask inside ``value`` as ``{"path", "kind", "at"}`` (paths as redactions')."""
    return _walk(value, path, False, True)[2]
