"""The Typer app, global options, and the helpers every command shares."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperCommand, TyperGroup

from snapver import __version__
from snapver.cli.state import STATE, SYNC_AFTER, sync_after

if TYPE_CHECKING:
    from typer._click import Command
    from typer._click import Context as ClickContext  # what TyperGroup's methods take

# Every command → the module of snapver/cli/ that registers it, in the order `--help` lists
# them: the order of the work (set up, snapshot, look, compare, patch, deploy, repair).
# Running a command imports its module only; `--help` (and an unknown name) imports them all.
# A module missing here still works (found by `load_commands()`), only not lazily.
COMMANDS = {
    "init": "init", "nodes": "nodes", "pull": "pull", "log": "log", "show": "show",
    "tag": "tag", "diff": "diff", "status": "status", "verify": "verify", "patch": "patch", "push": "push",
    "rollback": "push", "ps": "ps", "env": "env", "import": "importdir", "sync": "sync", "fsck": "fsck",
}
# Modules of snapver/cli/ that register no command.
NOT_COMMANDS = {"app", "state", "render", "options", "completion"}
COMPLETE_VAR = "_SNAPVER_COMPLETE"  # set by the shell's completion script: complete, do nothing else


def load_commands(module: str | None = None) -> None:
    """Import one command module (it registers on ``app``), or with None every one of them."""
    # __import__, not importlib.import_module: `python -X importtime` shows only the former.
    if module is not None:
        __import__(f"{__package__}.{module}")
        return
    import pkgutil

    from snapver import cli

    for name in sorted(m.name for m in pkgutil.iter_modules(cli.__path__)):
        if name not in NOT_COMMANDS:
            __import__(f"{__package__}.{name}")


class LazyGroup(TyperGroup):
    """The root command: builds a subcommand the first time it is asked for."""

    def get_command(self, ctx: ClickContext, cmd_name: str) -> Command | None:
        if cmd_name not in self.commands:
            load_commands(COMMANDS.get(cmd_name))
            self._refresh()
            if cmd_name in COMMANDS and cmd_name not in self.commands:  # the table is stale
                load_commands()
                self._refresh()
        command = self.commands.get(cmd_name)
        if command is not None:
            _one_usage_style(command)
        if command is not None and os.environ.get(COMPLETE_VAR):  # completing: name what may come
            from snapver.cli.completion import attach

            attach(command)
        return command

    def list_commands(self, ctx: ClickContext) -> list[str]:
        load_commands()
        self._refresh()
        return list(self.commands)

    def _main_shell_completion(self, ctx_args: Any, prog_name: str, complete_var: str | None = None) -> None:
        if os.environ.get(COMPLETE_VAR):  # typer's bash/zsh/fish classes, registered only now
            from snapver.cli.completion import init_completion

            init_completion()
        super()._main_shell_completion(ctx_args, prog_name, complete_var)

    def _refresh(self) -> None:
        """Build what is registered by now, listed in the order of COMMANDS (not of import)."""
        built = typer.main.get_command(app).commands  # type: ignore[attr-defined]
        order = [name for name in COMMANDS if name in built] + [name for name in built if name not in COMMANDS]
        self.commands = {name: built[name] for name in order}


# Commands that print a table or fields that give way on a narrow terminal ("list": patch list).
WIDE_COMMANDS = frozenset({"nodes", "log", "status", "list", "ps", "env", "tag", "push", "rollback"})


def _set_wide(ctx: typer.Context, param: Any, value: bool) -> bool:
    STATE.wide = STATE.wide or bool(value)
    return value


def _wide_option() -> Any:
    """`-w/--wide`, for each of WIDE_COMMANDS (added here, so that their modules need not)."""
    from typer.core import TyperOption

    return TyperOption(param_decls=["wide", "-w", "--wide"], is_flag=True, default=False, expose_value=False,
                       callback=_set_wide, help="Every cell whole: nothing elided or wrapped to fit the terminal.")


def _one_usage_style(command: Any) -> None:
    """Have ``command`` (and a group's subcommands) write its usage as SnapverCommand does.

    typer builds every command as a TyperCommand; the class is swapped here, once for all,
    rather than named in each of the modules that register commands.
    """
    if type(command) is TyperCommand:
        command.__class__ = SnapverCommand
    if command.help and not getattr(command, "_help_flowed", False):
        command.help, command._help_flowed = flow_help(command.help), True
    if command.name in WIDE_COMMANDS and not any(param.name == "wide" for param in command.params):
        command.params.insert(-1 if command.params and command.params[-1].name == "help" else len(command.params),
                              _wide_option())
    for param in command.params:  # the arguments table spells them as the usage line does
        if param.param_type_name == "argument" and param.metavar is None:
            param.metavar = (param.name or "").upper()
    for sub in getattr(command, "commands", {}).values():
        _one_usage_style(sub)


def flow_help(text: str) -> str:
    """A command's help as typer's rich layout shows it well at any width.

    A paragraph's prose lines are joined into one (rich wraps it to the terminal: a line
    written for 88 columns would otherwise break twice at 80); an indented line (an
    example) stays as written. The text after the first paragraph starts with an empty
    line: typer dedents that text ignoring its first line, which took the examples'
    indent away when they came right after the first paragraph.
    """
    import inspect

    paragraphs = []
    for paragraph in inspect.cleandoc(text).split("\n\n"):
        lines: list[str] = []
        for line in paragraph.splitlines():
            if lines and line[:1] not in ("", " ") and lines[-1][:1] != " " and not lines[-1].endswith(":"):
                lines[-1] += " " + line
            else:
                lines.append(line)
        paragraphs.append("\n".join(lines))
    first, *rest = paragraphs
    return first + ("\n\n\n" + "\n\n".join(rest) if rest else "")


app = typer.Typer(
    cls=LazyGroup,
    name="snapver",
    help="Snapshots of the code deployed on GPU nodes, in git: pull, diff, patch, push, roll back.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"snapver {__version__}")
        raise typer.Exit(0)


# Commands whose output goes through a pager on a terminal when longer than the screen:
# what git pages (never status: its reader types the next command at once).
PAGED_COMMANDS = frozenset({"diff", "log", "show"})


def _show_completion(value: bool) -> None:
    if value:
        from snapver.cli.completion import show

        show()
        raise typer.Exit(0)


def _install_completion(value: bool) -> None:
    if value:
        from snapver.cli.completion import install

        install()
        raise typer.Exit(0)


@app.callback()
def main_options(
    ctx: typer.Context,
    config: Path | None = typer.Option(
        None,
        "--config",
        help="Config file (default: $SNAPVER_CONFIG, else .snapver here or in a parent).",
        show_default=False,
    ),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Show tracebacks and more detail."),
    no_color: bool = typer.Option(False, "--no-color", help="No colours (also: NO_COLOR)."),
    no_pager: bool = typer.Option(
        False, "--no-pager", help="Never page long output (also: pager = false in the config's ui table)."
    ),
    version: bool = typer.Option(
        False, "--version", "-V", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    show_completion: bool = typer.Option(
        False,
        "--show-completion",
        callback=_show_completion,
        is_eager=True,
        help="Print the completion script of your shell (bash, zsh, fish).",
    ),
    install_completion: bool = typer.Option(
        False,
        "--install-completion",
        callback=_install_completion,
        is_eager=True,
        help="Install completion for your shell (bash, zsh, fish).",
    ),
) -> None:
    """snapver: know, compare and patch the code deployed on your nodes."""
    STATE.config_path = str(config) if config else None
    STATE.verbose = verbose or os.environ.get("SNAPVER_DEBUG") == "1"
    STATE.color = not no_color and not os.environ.get("NO_COLOR")
    STATE.no_pager = no_pager
    STATE.command, STATE.auto_synced, STATE.opened = ctx.invoked_subcommand, False, None
    STATE.outcome = 0
    if ctx.invoked_subcommand in SYNC_AFTER:
        ctx.call_on_close(sync_after)
    if ctx.invoked_subcommand in PAGED_COMMANDS and not no_pager:
        from snapver.cli.render import hold_for_pager, release_to_pager

        hold_for_pager(no_pager)
        ctx.call_on_close(release_to_pager)


PATHS_KEY = "snapver.paths"


def usage_metavar(param: Any) -> str:
    """An argument as every usage line spells it: NAME required, [NAME] optional, ... repeated
    (``REF``, ``[PATH]``, ``[NODE|GROUP]...``); a metavar holding brackets or a space is kept."""
    name = param.metavar or (param.name or "").upper()
    if "[" in name or " " in name:
        return name
    if param.nargs != 1 and not name.endswith("..."):
        name += "..."
    return name if param.required else f"[{name}]"


class SnapverCommand(TyperCommand):
    """A command whose usage line spells its arguments one way (see `usage_metavar`)."""

    def collect_usage_pieces(self, ctx: ClickContext) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                pieces.append(usage_metavar(param))
        return pieces


class PathsAfterDashes(SnapverCommand):
    """A command whose words after ``--`` are paths, kept apart in ``ctx.meta[PATHS_KEY]``
    (so that refs or nodes and paths never mix); ``usage`` is what its help shows."""

    usage = "[-- PATH...]"

    def parse_args(self, ctx: ClickContext, args: list[str]) -> list[str]:
        if "--" in args:
            split = args.index("--")
            ctx.meta[PATHS_KEY] = args[split + 1:]
            args = args[:split]
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx: ClickContext) -> list[str]:
        return ["[OPTIONS]", self.usage]
