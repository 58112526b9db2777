"""HivemindProvider: the archive provider with peers enabled.

Everything the archive does, plus awareness of other agents over Matrix: a background loop
syncs with the homeserver and logs every peer fact as an event in the same log, the peers
projection answers the six tools and the ``## Peers`` block that ``prefetch`` adds to the
archive's recall, and ``system_prompt_block`` adds the social-awareness skill.

Only a primary agent context talks to Matrix (one device per profile; a subagent or cron
run of the same profile would otherwise drive the same device twice). Matrix failures are
logged and reported by the tools as JSON errors; they never reach the host, and the archive
keeps working without a homeserver.
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
from collections.abc import Callable, Sequence
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from archive_provider import (
    ArchiveProvider,
    EventStore,
    NewEvent,
    Settings,
    TableProjection,
    bindable_text,
    get_secret,
    load_tool_schema,
)
from archive_provider import save_settings as save_archive_settings

from . import events
from . import peers as projection
from .context import peers_block
from .settings import (
    CREDENTIALS,
    OPTIONAL_CREDENTIALS,
    HivemindSettings,
    load_settings,
    save_settings,
)

if TYPE_CHECKING:  # both import matrix-nio, which waits for initialize()
    from .link import PeerLink
    from .tools import PeerTools
    from .witnessing import PeerWitnessing

log = logging.getLogger(__name__)

T = TypeVar("T")
TOOL_NAMES = (  # each is hivemind.tools.PeerTools.<name without the prefix>
    "hivemind_list_peers",
    "hivemind_check_messages",
    "hivemind_send_to_peer",
    "hivemind_get_peer_info",
    "hivemind_introduce_peers",
    "hivemind_dismiss_spark",
)
RECORD_WAIT_S = 5.0
_FRONT_MATTER = re.compile(r"\A---\n.*?\n---\n+", re.DOTALL)


@cache
def skill_text() -> str:
    """The shipped social-awareness skill, without its front matter."""
    text = files("hivemind").joinpath("skills/social-awareness/SKILL.md").read_text("utf-8")
    return _FRONT_MATTER.sub("", text).strip()


class HivemindProvider(ArchiveProvider):
    """Event-sourced archive plus peer awareness over Matrix (provider name ``hivemind``)."""

    provider_name = "hivemind"

    def __init__(self) -> None:
        super().__init__()
        self._peer_settings = HivemindSettings()
        self._link: PeerLink | None = None
        self._peers_off = "hivemind is not initialized"
        self._tools: PeerTools | None = None

    def kept_projections(self) -> list[TableProjection]:
        """The archive's projections and hivemind's own: only hivemind creates peer tables."""
        return [*super().kept_projections(), projection.PeersProjection()]

    def is_available(self) -> bool:
        """The three Matrix credentials are set (secret scope or environment) and the
        archive's own check holds (required shipping that can work): settings only, no I/O."""
        return not self.missing_credentials() and super().is_available()

    def unavailable_reason(self) -> str:
        """Why ``is_available()`` is False (the host shows it in its warning): the missing
        Matrix credentials first, else the archive's own reason (required shipping)."""
        missing = self.missing_credentials()
        if missing:
            return (
                f"hivemind needs the Matrix credentials {', '.join(missing)} "
                "(the profile's .env or the environment)"
            )
        return super().unavailable_reason()

    @staticmethod
    def missing_credentials() -> list[str]:
        """The Matrix credentials not set (secret scope or environment)."""
        return [name for name in CREDENTIALS if not get_secret(name)]

    # -- lifecycle -----------------------------------------------------------------------

    def initialize(self, session_id: str, **kwargs: Any) -> None:
        super().initialize(session_id, **kwargs)
        if self.core.home is None or self.core.writer is None or self._link is not None:
            return
        if not self.core.primary:
            self._peers_off = f"peers are off in a {self.core.agent_context} context"
            return
        try:
            self._peer_settings = load_settings(self.core.home)
        except Exception as exc:
            log.error("hivemind: unreadable settings, using defaults: %s", exc)
        values = {name: get_secret(name) for name in (*CREDENTIALS, *OPTIONAL_CREDENTIALS)}
        missing = [name for name in CREDENTIALS if not values[name]]
        if missing:
            self._peers_off = f"{', '.join(missing)} not set"
            log.warning("hivemind: %s; peers are off, the archive keeps working", self._peers_off)
            return
        contacts = [c for c in self._peer_settings.contacts if c != values["MATRIX_USER_ID"]]
        for contact in [c for c in contacts if not projection.is_user_id(c)]:
            log.warning("hivemind: ignoring contact %r: not a Matrix user id", contact)
            contacts.remove(contact)
        if contacts:
            self.core.submit(
                lambda store: [events.contact_seen(c) for c in contacts], "peer contacts"
            )
        try:
            from .link import PeerLink  # matrix-nio is the `hivemind` extra

            link = PeerLink(
                crypto_dir=self.core.home / "hivemind" / "crypto",
                homeserver=str(values["MATRIX_HOMESERVER"]),
                user_id=str(values["MATRIX_USER_ID"]),
                access_token=str(values["MATRIX_ACCESS_TOKEN"]),
                device_id=values["MATRIX_DEVICE_ID"] or None,
                settings=self._peer_settings,
                submit=self.core.submit_job,
                read_token=self._logged_sync_token,
                spent=self._model_calls_since,
                witnessing=self._witnessing(str(values["MATRIX_USER_ID"])),
                redact=self.core.settings.redact_secrets,
            )
            link.start()
        except Exception as exc:
            self._peers_off = f"the Matrix link cannot start: {exc}"
            log.error("hivemind: %s; the archive keeps working", self._peers_off)
            return
        self._link = link
        if not link.wait_ready(self._peer_settings.connect_wait_s):
            log.info("hivemind: still connecting to %s in the background", link.user_id)

    def _witnessing(self, user_id: str) -> PeerWitnessing | None:
        """Peers witnessing this archive, when ``HIVEMIND_WITNESS_PEERS`` names any (else None).

        A witness folder that cannot be used turns witnessing off, never the peers."""
        if not self._peer_settings.witness_peers or self.core.home is None:
            return None
        from .witnessing import PeerWitnessing

        try:
            return PeerWitnessing(
                home=self.core.home,
                user_id=user_id,
                peers=self._peer_settings.witness_peers,
                interval_s=self._peer_settings.witness_interval_s,
                submit=self.core.submit_job,
                redact=self.core.settings.redact_secrets,
            )
        except Exception as exc:
            log.error("hivemind: peer witnessing is off: %s", exc)
            return None

    def shutdown(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            try:
                link.close(self._peer_settings.close_timeout_s)
            except Exception as exc:
                log.warning("hivemind: closing the Matrix link failed: %s", exc)
        super().shutdown()

    def system_prompt_block(self) -> str:
        return super().system_prompt_block() + "\n\n" + skill_text()

    # -- prefetch: archive recall plus the peers block ------------------------------------

    def prefetch_text(self, query: str, session_id: str) -> str:
        """Archive recall (its failure costs only the recall) and the peers block."""
        try:
            recall = super().prefetch_text(query, session_id)
        except Exception as exc:
            log.warning("archive: recall failed: %s", exc)
            recall = ""
        block = self.peer_context()
        self.core.record_recall(session_id, query, block, [])
        return "\n\n".join(part for part in (recall, block) if part)

    def peer_context(self) -> str:
        """The ``## Peers`` / ``## Suggestions`` block, from the projection ('' if no peers)."""
        if self.core.home is None or not self.core.primary:
            return ""
        try:
            return self._read(_block)
        except (sqlite3.Error, OSError) as exc:
            log.debug("hivemind: no peer context: %s", exc)
            return ""

    # -- tools ---------------------------------------------------------------------------

    def get_tool_schemas(self) -> list[dict[str, Any]]:
        if self.core.checkpoint_only:  # checkpoints only: no tools at all (docs/HOST.md §5)
            return []
        return [*super().get_tool_schemas(), *(load_tool_schema(name) for name in TOOL_NAMES)]

    def handle_tool_call(self, tool_name: str, args: dict[str, Any], **kwargs: Any) -> str:
        if tool_name not in TOOL_NAMES or self.core.checkpoint_only:
            return super().handle_tool_call(tool_name, args, **kwargs)
        try:
            result = self._peer_tools().handle(tool_name, args)
        except Exception as exc:  # never an exception into the host
            log.warning("hivemind: tool %s failed: %s", tool_name, exc)
            result = {"error": f"{type(exc).__name__}: {exc}"}
        return bindable_text(json.dumps(result, ensure_ascii=False))  # UTF-8 the host can send

    def _peer_tools(self) -> PeerTools:
        if self._tools is None:
            from .tools import PeerTools

            self._tools = PeerTools(
                read=self._read,
                record=self._record,
                link=lambda: self._link,
                session=lambda: self.core.session,
                unavailable=lambda: self._peers_off,
                redact=self.core.settings.redact_secrets,
            )
        return self._tools

    # -- reading and recording through the archive core ---------------------------------

    def _read(self, query: Callable[[sqlite3.Connection], T]) -> T:
        """Committed state, on the archive's one read-only connection."""
        return self.core.read(query, flush_s=RECORD_WAIT_S)

    def _record(self, build: Callable[[EventStore], Sequence[NewEvent]], label_: str) -> bool:
        """Log a tool's outcome and wait (bounded) until it is committed."""
        return self.core.record(build, label_, RECORD_WAIT_S)

    def _logged_sync_token(self) -> str | None:
        """Where the last logged sync ended (after the writer caught up with the log)."""
        writer = self.core.writer
        if writer is not None:
            writer.flush(RECORD_WAIT_S)
        try:
            return self._read(projection.sync_token)
        except sqlite3.OperationalError:
            return None

    def _model_calls_since(self, since: str) -> list[str]:
        """When the summaries' model calls logged from ``since`` on were made."""
        return self._read(lambda conn: projection.model_calls_since(conn, since))

    # -- configuration -------------------------------------------------------------------

    def get_config_schema(self) -> list[dict[str, Any]]:
        """Matrix credentials (written to the profile's .env), hivemind and archive settings."""

        def text(key: str, description: str) -> dict[str, Any]:
            return {"key": key, "description": description, "default": ""}

        return [
            {
                "key": "homeserver",
                "description": "Matrix homeserver URL",
                "env_var": "MATRIX_HOMESERVER",
                "required": True,
            },
            {
                "key": "user_id",
                "description": "This agent's Matrix user id (@name:server)",
                "env_var": "MATRIX_USER_ID",
                "required": True,
            },
            {
                "key": "access_token",
                "description": "This agent's Matrix access token",
                "secret": True,
                "env_var": "MATRIX_ACCESS_TOKEN",
                "required": True,
            },
            text("contacts", "Peers known from the start (user ids, comma-separated)"),
            text("allow_users", "Users who may invite this agent, from any server"),
            text(
                "allow_servers",
                "Servers whose users may invite this agent "
                "(blank: our own; 'none': only allow_users)",
            ),
            text("about", "One line about this agent, published to peers"),
            text("interests", "Interests published to peers (comma-separated)"),
            *Settings.config_schema(),
        ]

    def save_config(self, values: dict[str, Any], hermes_home: str) -> None:
        """Hivemind keys to ``hivemind/config.json``, archive keys to ``archive/config.json``."""
        home = Path(hermes_home)
        mine = {k: v for k, v in values.items() if k in HivemindSettings.__dataclass_fields__}
        archive = {k: v for k, v in values.items() if k in Settings.__dataclass_fields__}
        if mine:
            save_settings(home, mine)
        if archive:
            save_archive_settings(home, archive)


def _block(conn: sqlite3.Connection) -> str:
    return peers_block(*projection.peer_cards(conn), offline=projection.link_offline(conn))
