"""`snapver nodes`: parse, call one operation, render."""

from __future__ import annotations

import typer

from snapver.cli.app import app
from snapver.cli.options import JsonOpt
from snapver.cli.render import console, emit_json, escape, outcome, print_table, show_path
from snapver.cli.state import STATE


@app.command()
def nodes(
    check: bool = typer.Option(False, "--check", help="Connect and report python, site-packages, version."),
    json_out: JsonOpt = False,
) -> int:
    """List nodes and groups; --check connects to each.

    Examples:
      snapver nodes
      snapver nodes --check   # connect: python, site-packages, version
    """
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
