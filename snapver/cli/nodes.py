"""`snapver nodes [--check]`, `nodes add`, `nodes rm`: parse, call one operation, render."""

from __future__ import annotations

import typer

from snapver.cli.app import app
from snapver.cli.options import JsonOpt
from snapver.cli.render import console, emit_json, escape, outcome, print_table, show_path
from snapver.cli.state import STATE

NODES_HELP = """List nodes and groups; --check connects to each; add and rm edit .snapver.

add and rm keep the file's comments, check the result as every command reads it
before writing, and replace the file only if nobody changed it meanwhile.

Examples:
  snapver nodes --check   # connect: python, site-packages, version
  snapver nodes add ct129 --host 10.1.2.129 --python /root/venv/bin/python
  snapver nodes rm ct129
"""
nodes_app = typer.Typer(help=NODES_HELP, invoke_without_command=True, no_args_is_help=False,
                        context_settings={"help_option_names": ["-h", "--help"]})
app.add_typer(nodes_app, name="nodes")


@nodes_app.callback()
def nodes(
    ctx: typer.Context,
    check: bool = typer.Option(False, "--check", help="Connect and report python, site-packages, version."),
    json_out: JsonOpt = False,
) -> int:
    """List nodes and groups; --check connects to each."""
    if ctx.invoked_subcommand is not None:
        return 0
    from snapver.ops.nodes import list_nodes

    config = STATE.config()
    checks = list_nodes(config, check)
    code = outcome(max((c.exit_code for c in checks), default=0))
    if json_out:
        emit_json({"nodes": [c.to_json() for c in checks],
                   "groups": {name: list(members) for name, members in config.groups.items()},
                   "exit_code": code})
        return code
    columns = ("node", "address") + (("reachable", "python", "site-packages", "version")
                                      if check else ("site-packages",))
    rows: list[tuple[str, ...]]  # a row has as many cells as the columns asked for
    rows = [(escape(c.node), escape(c.address), "[green]yes[/green]" if c.reachable else "[red]no[/red]",
             show_path(c.python) or "?", show_path(c.site_packages) or "?", show_path(c.dists) or "?") if check else
            (escape(c.node), escape(c.address), escape(c.site_packages)) for c in checks]
    out = console()
    if out.is_terminal:  # a record per node when too wide: the paths it checked stay whole
        from snapver.cli.fit import print_fitted

        print_fitted(out, columns, rows)
    else:
        print_table(out, columns, rows)
    for name, members in config.groups.items():
        out.print(f"group {escape(name)}: {escape(', '.join(members))}")
    for c in checks:
        if c.error:
            console(stderr=True).print(f"snapver: error: {escape(c.error)}")
    return code


def _edit_hooks() -> object:
    """Say so when another snapver is editing the file; where a test holds the write."""
    from snapver import testhooks
    from snapver.ops.nodes_edit import EditHooks

    def waiting() -> None:
        console(stderr=True).print("waiting for another snapver editing the config…")

    return EditHooks(waiting=waiting, before_write=testhooks.pause_before_config_write())


def _report_edit(edit: object, json_out: bool) -> int:
    from snapver.ops.nodes_edit import ConfigEdit

    assert isinstance(edit, ConfigEdit)
    if json_out:
        emit_json(edit.to_json())
        return 0
    out = console()
    out.print(f"{edit.action} node {escape(edit.node)} {'to' if edit.action == 'added' else 'from'} "
              f"{show_path(str(edit.path))}")
    if edit.groups_left:
        out.print(f"taken out of group(s) {escape(', '.join(edit.groups_left))}"
                  + (f"; removed, left empty: {escape(', '.join(edit.groups_dropped))}" if edit.groups_dropped else ""))
    return 0


@nodes_app.command("add")
def add(
    name: str = typer.Argument(..., metavar="NAME", help="The new node's name."),
    host: str | None = typer.Option(None, "--host", help="IP, name or ~/.ssh/config alias."),
    port: int | None = typer.Option(None, "--port", help="SSH port."),
    user: str | None = typer.Option(None, "--user", help="SSH user."),
    python: str | None = typer.Option(None, "--python", help="The deployment's Python (finds site-packages)."),
    site_packages: str | None = typer.Option(None, "--site-packages", help="The node's site-packages folder."),
    local: bool = typer.Option(False, "--local", help="A folder on this machine, no SSH."),
    container: str | None = typer.Option(None, "--container", help="A container on the host (docker exec)."),
    identity_file: str | None = typer.Option(None, "--identity-file", help="SSH private key."),
    json_out: JsonOpt = False,
) -> int:
    """Add \\[nodes.NAME] to .snapver, keeping its comments.

    Examples:
      snapver nodes add ct129 --host 10.1.2.129 --python /root/venv/bin/python
      snapver nodes add laptop --local --site-packages /opt/venv/lib/site-packages
    """
    from snapver.ops.nodes_edit import add_node, config_file

    given = {"host": host, "port": port, "user": user, "local": local or None, "container": container,
             "site_packages": site_packages, "python": python, "identity_file": identity_file}
    table = {key: value for key, value in given.items() if value is not None}
    edit = add_node(config_file(STATE.config_path), name, table, _edit_hooks())  # type: ignore[arg-type]
    return _report_edit(edit, json_out)


@nodes_app.command("rm")
def rm(
    name: str = typer.Argument(..., metavar="NAME", help="The node to remove."),
    from_groups: bool = typer.Option(False, "--from-groups", help="Also take it out of the groups naming it "
                                     "(a group left empty is removed)."),
    json_out: JsonOpt = False,
) -> int:
    """Remove \\[nodes.NAME] from .snapver, keeping its comments; its snapshots stay in the store.

    A node that a group names is refused (naming the group) unless --from-groups.

    Examples:
      snapver nodes rm ct129
      snapver nodes rm ct129 --from-groups
    """
    from snapver.ops.nodes_edit import config_file, remove_node

    edit = remove_node(config_file(STATE.config_path), name, from_groups, _edit_hooks())  # type: ignore[arg-type]
    return _report_edit(edit, json_out)
