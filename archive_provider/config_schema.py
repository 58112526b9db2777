"""The dashboard panel for the archive provider (loaded by hermes by path).

hermes allows this file to import only from ``plugins.memory.config_schema``. Storage is
``flat_json``: the dashboard writes ``<HERMES_HOME>/archive/config.json``, the same file
``archive_provider.host.settings`` reads.
"""

from plugins.memory.config_schema import (
    KIND_BOOL,
    KIND_NUMBER,
    STORAGE_FLAT_JSON,
    ProviderConfigSchema,
    ProviderField,
)

CONFIG_SCHEMA = ProviderConfigSchema(
    name="archive",
    label="Archive (event-sourced, verifiable)",
    storage=STORAGE_FLAT_JSON,
    fields=(
        ProviderField(
            key="recall_budget_chars",
            label="Recall budget (characters)",
            kind=KIND_NUMBER,
            default="2000",
            inline=True,
            description="How much archive recall may be injected into a turn.",
        ),
        ProviderField(
            key="recall_limit",
            label="Recalled excerpts",
            kind=KIND_NUMBER,
            default="6",
            description="Most excerpts recalled per turn.",
        ),
        ProviderField(
            key="checkpoint_timeout_s",
            label="Checkpoint timeout (s)",
            kind=KIND_NUMBER,
            default="30",
            description="How long a pre-compress checkpoint may wait for the database before it fails.",
        ),
        ProviderField(
            key="redact_secrets",
            label="Redact secrets",
            kind=KIND_BOOL,
            default="true",
            inline=True,
            description="Mask secret-shaped strings (API keys, tokens, private keys) before archiving.",
        ),
        ProviderField(
            key="journal_every_event",
            label="Journal every event",
            kind=KIND_BOOL,
            default="false",
            description="Write each accepted event to the spill journal before the hook returns, "
            "so a killed process loses nothing it accepted (a file write per turn).",
        ),
        ProviderField(
            key="cron_turns",
            label="Archive cron jobs",
            kind=KIND_BOOL,
            default="true",
            description="Archive what a cron job's agent said and did (turns, memory writes, "
            "tool calls); its checkpoints are archived either way.",
        ),
        ProviderField(
            key="subagent_turns",
            label="Archive subagents",
            kind=KIND_BOOL,
            default="true",
            description="Archive a subagent's own turns, memory writes and tool calls; the "
            "parent archives the delegation's task and result either way.",
        ),
    ),
)
