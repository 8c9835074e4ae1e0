"""Options and arguments that several commands share, declared once (Typer's Annotated form).

A command writes ``json_out: JsonOpt = False``; an argument whose help names what the
command does with it takes its shape from ``node_args`` and its own help:
``targets: Annotated[Optional[List[str]], node_args("Nodes or groups to snapshot.")] = None``.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

JsonOpt = Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask (needed without a terminal).")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", "-n", help="Show the plan and stop.")]
AllNodesOpt = Annotated[bool, typer.Option("--all", help="Every node in the config.")]
NoteOpt = Annotated[str, typer.Option("-m", "--message", help="A note kept with the snapshot.")]


def node_args(help: str, required: bool = False) -> Any:
    """Node or group names (ranges too): ``[NODE|GROUP]...``, or ``NODE|GROUP...`` when required."""
    return typer.Argument(metavar="NODE|GROUP..." if required else "[NODE|GROUP]...", show_default=False,
                          help=help)


# The targets of a command that reads every node when none is named (status, ps).
NodesArg = Annotated[list[str] | None, node_args("Nodes or groups (default: every node).")]

