"""Resolve the ``peer_name`` an agent typed to exactly one Matrix user id.

Agents name peers loosely ("Carol", "hermes-of-carol", "@carol:example.org"). Sending to the
wrong peer leaks a conversation, so guessing is not allowed: a name that fits several peers is
an error that lists them, and a name that fits none is an error too.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping

from archive_provider import InvalidRequest

_MAX_LISTED = 10
_MAX_NAME_CHARS = 64


class PeerNameError(InvalidRequest):
    """``peer_name`` does not designate exactly one known peer; the message says why."""


class UnknownPeer(PeerNameError):
    """No known peer matches the name."""


class AmbiguousPeer(PeerNameError):
    """Several known peers match the name; ``candidates`` are their user ids, sorted."""

    def __init__(self, message: str, candidates: tuple[str, ...]) -> None:
        super().__init__(message)
        self.candidates = candidates


def _norm(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).split()).casefold()


def _label(user_id: str, display_name: str | None) -> str:
    if not display_name:
        return user_id
    name = " ".join(display_name.split())
    if len(name) > _MAX_NAME_CHARS:
        name = name[: _MAX_NAME_CHARS - 1] + "…"
    return f"{name} ({user_id})"


def _localpart(user_id: str) -> str:
    return user_id[1:].partition(":")[0] if user_id.startswith("@") else user_id


def resolve_peer(peer_name: str, peers: Mapping[str, str | None]) -> str:
    """The one user id in ``peers`` (user id -> display name or None) that ``peer_name`` means.

    Tried in order, each case-insensitively: the user id itself, the display name, the
    localpart (``carol`` for ``@carol:example.org``). The first rule with any match decides.
    """
    wanted = _norm(peer_name)
    if not wanted:
        raise UnknownPeer("peer_name is empty")
    if peer_name.strip() in peers:
        return peer_name.strip()
    rules = (
        lambda uid, _name: _norm(uid) == wanted,
        lambda _uid, name: bool(name) and _norm(name) == wanted,
        lambda uid, _name: _norm(_localpart(uid)) == wanted,
    )
    for rule in rules:
        matches = sorted(uid for uid, name in peers.items() if rule(uid, name))
        if len(matches) == 1:
            return matches[0]
        if matches:
            listed = ", ".join(_label(uid, peers[uid]) for uid in matches[:_MAX_LISTED])
            raise AmbiguousPeer(
                f"{peer_name.strip()!r} matches {len(matches)} peers: {listed}. "
                "Use the Matrix user id.",
                tuple(matches),
            )
    known = ", ".join(_label(uid, peers[uid]) for uid in sorted(peers)[:_MAX_LISTED])
    more = f" and {len(peers) - _MAX_LISTED} more" if len(peers) > _MAX_LISTED else ""
    raise UnknownPeer(
        f"no known peer is called {peer_name.strip()!r}. "
        + (f"Known peers: {known}{more}." if peers else "No peers are known yet.")
    )
