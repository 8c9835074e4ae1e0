"""Shell completion: the scripts (`--show-completion`, `--install-completion`) and the
words a command line may go on with (node and group names, tags, patch names).

Imported only when completing or showing a script, never by a command: `app.py` holds
the small callbacks that reach here. Every lookup is cheap (the config file, ref files
read from the store's folder, no git process) and never fails: a broken config or a
missing store completes nothing rather than print an error under the cursor.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

SHELLS = ("bash", "zsh", "fish")


def _config(ctx: Any) -> Any:
    """The config the completed command would read (honouring a `--config` already typed)."""
    from snapver.config import load_config

    root = ctx.find_root() if ctx is not None else None
    explicit = root.params.get("config") if root is not None else None
    return load_config(str(explicit) if explicit else None)


def _matching(words: Iterable[str], incomplete: str) -> list[str]:
    return sorted({word for word in words if word.startswith(incomplete)})


def node_names(ctx: Any, incomplete: str, groups: bool = True) -> list[str]:
    """Node names (and group names) of the config that start with ``incomplete``."""
    try:
        config = _config(ctx)
        return _matching([*config.nodes, *(config.groups if groups else ())], incomplete)
    except Exception:  # noqa: BLE001 - completion never fails
        return []


def _refs(store: Path, prefix: str) -> list[str]:
    """Names of the refs under ``prefix`` (e.g. ``refs/tags/``): loose files and packed-refs."""
    names: list[str] = []
    folder = store / prefix
    if folder.is_dir():
        for path in folder.rglob("*"):
            if path.is_file() and not path.name.endswith(".lock"):
                names.append(path.relative_to(folder).as_posix())
    packed = store / "packed-refs"
    if packed.is_file():
        for line in packed.read_text(encoding="utf-8", errors="replace").splitlines():
            parts = line.split(" ", 1)
            if len(parts) == 2 and parts[1].startswith(prefix):
                names.append(parts[1][len(prefix):])
    return names


def tag_names(ctx: Any, incomplete: str) -> list[str]:
    """Tags of the store that start with ``incomplete``."""
    from snapver.store.refs import TAGS

    try:
        return _matching(_refs(_config(ctx).store_path, TAGS), incomplete)
    except Exception:  # noqa: BLE001
        return []


def patch_names(ctx: Any, incomplete: str) -> list[str]:
    """Patches of the store that start with ``incomplete``."""
    from snapver.store.refs import PATCHES

    try:
        return _matching(_refs(_config(ctx).store_path, PATCHES), incomplete)
    except Exception:  # noqa: BLE001
        return []


def ref_names(ctx: Any, incomplete: str) -> list[str]:
    """What a REF may be, by name: tags, nodes (their newest snapshot or live tree), patches."""
    return _matching([*tag_names(ctx, incomplete), *node_names(ctx, incomplete, groups=False),
                      *patch_names(ctx, incomplete)], incomplete)


def script(shell: str) -> str:
    """The completion script for ``shell`` (bash, zsh or fish), as typer writes it."""
    from typer._completion_classes import completion_init
    from typer._completion_shared import get_completion_script

    completion_init()
    return get_completion_script(prog_name="snapver", complete_var="_SNAPVER_COMPLETE", shell=shell)


def chosen_shell() -> str:
    """The shell we run under (as typer finds it: the nearest shell among our parent
    processes, else $SHELL), one of SHELLS."""
    from snapver.errors import UsageError

    shell: str | None = None
    try:
        import shellingham

        shell = shellingham.detect_shell()[0]
    except Exception:  # noqa: BLE001 - not found, or shellingham missing
        shell = os.path.basename(os.environ.get("SHELL", "")) or None
    if shell not in SHELLS:
        raise UsageError(f"no completion for shell {shell or '(unknown)'!r}: bash, zsh and fish have one",
                         hint="run it from the shell to complete in, e.g. `zsh -c 'snapver --show-completion'`")
    return shell


def show() -> None:
    """Print the completion script of the shell we run under."""
    print(script(chosen_shell()))


def install() -> None:
    """Install the completion script where the shell reads it, as typer does; say where."""
    from typer._completion_classes import completion_init
    from typer._completion_shared import install as typer_install

    completion_init()
    shell, path = typer_install(shell=chosen_shell(), prog_name="snapver", complete_var="_SNAPVER_COMPLETE")
    print(f"{shell} completion installed in {path}")
    print("it takes effect in new shells")


def init_completion() -> None:
    """Register typer's bash/zsh/fish completion classes (they read COMP_WORDS and so on)."""
    from typer._completion_classes import completion_init

    completion_init()


# (command, parameter) → what completes it; command None: any command. Attached to the
# commands as they are built for a completion (so the command modules name none of it).
COMPLETERS: dict[tuple[str | None, str], Callable[[Any, str], list[str]]] = {
    (None, "targets"): node_names,
    (None, "nodes"): node_names,
    (None, "node"): lambda ctx, incomplete: node_names(ctx, incomplete, groups=False),
    (None, "ref"): ref_names,
    (None, "refs"): ref_names,
    (None, "against"): ref_names,
    (None, "base"): ref_names,
    (None, "onto"): ref_names,
    (None, "to"): ref_names,
    (None, "patch"): patch_names,
    ("tag", "name"): tag_names,
    ("rm", "name"): lambda ctx, incomplete: node_names(ctx, incomplete, groups=False),  # nodes rm
    **{(command, "name"): patch_names for command in ("save", "show", "export", "rebase", "delete")},
}


def attach(command: Any) -> None:
    """Give ``command``'s parameters (and its subcommands', for `patch`) their completers."""
    for sub in getattr(command, "commands", {}).values():
        attach(sub)
    for param in command.params:
        completer = COMPLETERS.get((command.name, param.name)) or COMPLETERS.get((None, param.name))
        if completer is not None:
            param._custom_shell_complete = _click_completer(completer)


def _click_completer(completer: Callable[[Any, str], list[str]]) -> Callable[[Any, Any, str], list[str]]:
    return lambda ctx, param, incomplete: completer(ctx, incomplete)
