"""The Typer app, global options, and the helpers every command shares."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from snapver import __version__

if TYPE_CHECKING:
    from snapver.config import Config
    from snapver.store.repo import Store

app = typer.Typer(
    name="snapver",
    help="Snapshots of the code deployed on GPU nodes, in git: pull, diff, patch, push, roll back.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@dataclass
class Globals:
    """Options given before the command, shared by every command."""

    config_path: Optional[str] = None
    verbose: bool = False
    color: bool = True

    def config(self) -> "Config":
        from snapver.config import load_config

        return load_config(self.config_path)

    def store(self, config: "Config", create: bool = False) -> "Store":
        from snapver.store.repo import Store

        return Store.open_or_create(config.store_path) if create else Store(config.store_path)


STATE = Globals()


def _version(value: bool) -> None:
    if value:
        typer.echo(f"snapver {__version__}")
        raise typer.Exit(0)


@app.callback()
def main_options(
    config: Optional[Path] = typer.Option(None, "--config", help="Config file (default: $SNAPVER_CONFIG, "
                                          "else .snapver here or in a parent).", show_default=False),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Show tracebacks and more detail."),
    no_color: bool = typer.Option(False, "--no-color", help="No colours (also: NO_COLOR)."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """snapver: know, compare and patch the code deployed on your nodes."""
    STATE.config_path = str(config) if config else None
    STATE.verbose = verbose or os.environ.get("SNAPVER_DEBUG") == "1"
    STATE.color = not no_color and not os.environ.get("NO_COLOR")
