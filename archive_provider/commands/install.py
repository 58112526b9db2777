"""install: write the plugin folder into a profile (hermes 0.19.0 discovers only those)."""

from __future__ import annotations

import argparse

from archive_provider.commands import CommandContext, CommandError
from archive_provider.host.install import PROVIDERS, ConfigError, activate, install_plugin

NAME = "install"
HELP = "install the provider as a plugin folder in the profile (and optionally activate it)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--provider", choices=sorted(PROVIDERS), default="archive")
    parser.add_argument(
        "--activate", action="store_true", help="set memory.provider in config.yaml"
    )


def run(ctx: CommandContext) -> int:
    name = ctx.args.provider
    ctx.home.mkdir(parents=True, exist_ok=True)
    folder = install_plugin(ctx.home, name)
    try:
        config = activate(ctx.home, name) if ctx.args.activate else None
    except ConfigError as exc:
        raise CommandError(f"{ctx.home / 'config.yaml'}: {exc}") from None
    data = {
        "provider": name,
        "plugin_dir": str(folder),
        "activated": bool(config),
        "config": str(config) if config else None,
    }
    human = f"Installed the {name} provider in {folder}." + (
        f"\nActivated it: memory.provider = {name} in {config}."
        if config
        else f"\nActivate it with: hermes-archive --home {ctx.home} install --provider {name} --activate"
    )
    ctx.emit(data, human)
    return 0
