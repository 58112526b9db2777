"""The dashboard panel for the hivemind provider (loaded by hermes by path).

hermes allows this file to import only from ``plugins.memory.config_schema``. Storage is
``flat_json``: the dashboard writes ``<HERMES_HOME>/hivemind/config.json``, the file
``hivemind.settings`` reads. The three Matrix credentials are declared as secrets with an
``env_key`` so the dashboard writes them to the profile's environment store, where the
provider reads them through the host's secret scope: they never land in config.json.
"""

from plugins.memory.config_schema import (
    KIND_NUMBER,
    KIND_SECRET,
    KIND_TEXT,
    STORAGE_FLAT_JSON,
    ProviderConfigSchema,
    ProviderField,
)

CONFIG_SCHEMA = ProviderConfigSchema(
    name="hivemind",
    label="Hivemind (peer agents over Matrix)",
    storage=STORAGE_FLAT_JSON,
    fields=(
        ProviderField(
            key="homeserver",
            label="Matrix homeserver URL",
            kind=KIND_SECRET,
            env_key="MATRIX_HOMESERVER",
            inline=True,
            placeholder="https://matrix.example.org",
            description="The homeserver this agent's Matrix account lives on.",
        ),
        ProviderField(
            key="user_id",
            label="Matrix user id",
            kind=KIND_SECRET,
            env_key="MATRIX_USER_ID",
            inline=True,
            placeholder="@hermes-of-alice:example.org",
            description="This agent's Matrix account.",
        ),
        ProviderField(
            key="access_token",
            label="Matrix access token",
            kind=KIND_SECRET,
            env_key="MATRIX_ACCESS_TOKEN",
            inline=True,
            description="The account's access token; never written to the archive or the logs.",
        ),
        ProviderField(
            key="allow_servers",
            label="Accept invites from servers",
            kind=KIND_TEXT,
            default="",
            group="Trust",
            description="Comma-separated server names whose users may invite this agent. Blank: "
            "only its own homeserver. 'none': only the users listed below.",
        ),
        ProviderField(
            key="allow_users",
            label="Accept invites from users",
            kind=KIND_TEXT,
            default="",
            group="Trust",
            description="Comma-separated Matrix user ids that may invite this agent, from any "
            "server.",
        ),
        ProviderField(
            key="contacts",
            label="Contacts",
            kind=KIND_TEXT,
            default="",
            group="Peers",
            description="Comma-separated user ids of peers this agent knows from the start.",
        ),
        ProviderField(
            key="about",
            label="About this agent",
            kind=KIND_TEXT,
            default="",
            group="Profile",
            description="One line published to peers in shared rooms (room state: not encrypted).",
        ),
        ProviderField(
            key="interests",
            label="Interests",
            kind=KIND_TEXT,
            default="",
            group="Profile",
            description="Comma-separated topics published to peers; introductions are suggested "
            "between peers who share them.",
        ),
        ProviderField(
            key="poll_ms",
            label="Sync long-poll (ms)",
            kind=KIND_NUMBER,
            default="5000",
            group="Advanced",
            description="How long one background sync waits for news on the homeserver.",
        ),
        ProviderField(
            key="op_timeout_s",
            label="Request timeout (s)",
            kind=KIND_NUMBER,
            default="10",
            group="Advanced",
            description="Bound of one Matrix request made by a tool call.",
        ),
        ProviderField(
            key="summary_llm_per_hour",
            label="Model summaries per hour",
            kind=KIND_NUMBER,
            default="20",
            group="Summaries",
            description="At most this many peer summaries per hour go through the host's "
            "auxiliary model (config.yaml auxiliary.hivemind_summary); the rest, and all of "
            "them at 0, are extractive (quoted sentences, no model).",
        ),
        ProviderField(
            key="witness_interval_s",
            label="Checkpoint to peers every (s)",
            kind=KIND_NUMBER,
            default="60",
            group="Witnessing",
            description="At most one checkpoint per peer this often, only when it changed. "
            "Which peers witness this archive is not set here: HIVEMIND_WITNESS_PEERS in the "
            "environment of the service that starts Hermes (a protection the profile must "
            "not choose).",
        ),
        ProviderField(
            key="summary_input_chars",
            label="Peer text per summary (characters)",
            kind=KIND_NUMBER,
            default="4000",
            group="Summaries",
            description="How much of a peer's latest messages one model call may read.",
        ),
    ),
)
