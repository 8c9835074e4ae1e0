"""A pull's connections, begun before the command line is loaded, and handed to the pull.

A pull waits on its nodes (TCP, key exchange, authentication, the node's shell and
Python, its walk of the tree), and before it can start them it has to import Typer and
the CLI just to read which nodes. So a command line of the one shape read here,
``snapver [--config PATH] [-v] [--no-color] [--no-pager] pull [--json] [--all]
[-m MSG] [NODE|GROUP]...``, has its nodes' connections begun before those imports
(``transport.connect.Starting``); the pull command then takes them over if it selects
exactly those nodes (``adopt``), else they are closed. Any other token — another command,
``--help``, ``--tag``, ``--``, an option this does not know — and nothing is begun
here: the command runs as it always does. An error (no config, an unknown node) begins
nothing either, and the command reports it as it always does.

Imported by ``snapver.entry`` before anything else: it imports nothing until a pull is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from snapver.config import NodeSpec
    from snapver.transport.connect import Starting

# The options this grammar reads (tests/transport/test_prestart.py checks them against the CLI's):
GLOBAL_FLAGS = {"-v", "--verbose", "--no-color", "--no-pager"}  # before the command, besides --config
PULL_FLAGS = {"--json", "--all"}
PULL_VALUED = {"-m", "--message"}

_prestarted: tuple[list[NodeSpec], Starting] | None = None


def pull_command(argv: Sequence[str]) -> tuple[str | None, list[str], bool] | None:
    """(``--config`` path, targets, ``--all``) of a pull command line of the shape above, else None."""
    config: str | None = None
    words = list(argv)
    while words and words[0].startswith("-"):
        word = words.pop(0)
        if word == "--config" and words:
            config = words.pop(0)
        elif word.startswith("--config="):
            config = word[len("--config="):]
        elif word not in GLOBAL_FLAGS:
            return None
    if config == "" or not words or words.pop(0) != "pull":  # Typer reads an empty path as "."
        return None
    targets: list[str] = []
    all_nodes = False
    while words:
        word = words.pop(0)
        if word in PULL_VALUED and words:
            words.pop(0)
        elif word.startswith("--message="):
            continue
        elif word in PULL_FLAGS:
            all_nodes = all_nodes or word == "--all"
        elif word.startswith("-"):
            return None
        else:
            targets.append(word)
    return config, targets, all_nodes


def prestart(argv: Sequence[str]) -> None:
    """Begin the connections of a pull command line (see the module's docstring)."""
    global _prestarted
    parsed = pull_command(argv)
    if parsed is None:
        return
    from snapver.config import load_config
    from snapver.errors import SnapverError

    config_path, targets, all_nodes = parsed
    try:
        specs = load_config(config_path).select(targets, all_nodes)
    except (SnapverError, OSError, ValueError):
        return  # the command itself reports it
    from snapver.transport.connect import Starting

    _prestarted = (specs, Starting(specs))


def adopt(specs: list[NodeSpec]) -> Starting | None:
    """The connections begun for exactly ``specs``, now the caller's; else None (any begun
    for other nodes are closed)."""
    global _prestarted
    if _prestarted is None:
        return None
    begun, starting = _prestarted
    _prestarted = None
    if begun == specs:
        return starting
    starting.close()
    return None
