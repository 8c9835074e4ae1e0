"""`snapver status [NODE|GROUP...]`: parse, call ops.status, render the fleet table."""

from __future__ import annotations

from typing import Any, List

import typer

from snapver.cli.app import STATE, app
from snapver.cli.render import console, emit_json, escape, print_error, print_table, show_path


@app.command()
def status(
    targets: List[str] = typer.Argument(None, metavar="[NODE|GROUP]...", show_default=False,
                                        help="Nodes or groups (default: every node)."),
    json_out: bool = typer.Option(False, "--json", help="One JSON document on stdout."),
    checksum: bool = typer.Option(False, "-c", "--checksum",
                                  help="Hash every live file, even those whose stat is unchanged since the last pull."),
) -> int:
    """The fleet at a glance: reachable?, newest snapshot, live drift, patches; exit 1 on drift."""
    from snapver.ops.status import status as run_status

    config = STATE.config()
    specs = config.select(targets or [], all_nodes=not targets)
    store = STATE.store(config) if (config.store_path / "HEAD").exists() else None
    result = run_status(store, specs, checksum)
    if json_out:
        emit_json({"nodes": [n.to_json() for n in result.nodes], "exit_code": result.exit_code})
        return result.exit_code
    render_status(result)
    return result.exit_code


def render_status(result: Any) -> None:
    out = console()
    print_table(out, ("node", "reachable", "snapshot", "drift", "distribution", "patches"), [
        (escape(row.node), _reachable(row), _snapshot(row), _drift(row), escape(row.dist or "-"),
         escape(", ".join(p.name if p.applied else f"{p.name} ({p.matched}/{p.total})" for p in row.patches) or "-"))
        for row in result.nodes])
    for row in result.nodes:
        if row.error is not None:
            print_error(row.error)
        if row.push:
            push = row.push
            what = f"{push['action']} {push.get('patch') or ''}".strip()
            when = str(push.get("time", ""))[:16].replace("T", " ")
            if push.get("interrupted"):
                out.print(f"[red]{escape(row.node)}: INTERRUPTED {escape(what)} ({when})[/red]: "
                          f"run `snapver rollback {escape(row.node)}` to repair it")
            else:
                out.print(f"{escape(row.node)}: last {escape(what)} {escape(push['state'])} ({when})")
        if not row.drift:
            continue
        count = len(row.drift)
        out.print(f"\n{escape(row.node)}: {count} file{'s differ' if count != 1 else ' differs'} "
                  f"from {row.snapshot[:10] if row.snapshot else '?'}")
        for item in row.drift:
            label = {"pristine": "[green]pristine[/green]", "hot-fix": "[red]hot-fix[/red]"}.get(
                item.label, f"[yellow]patch {escape(', '.join(item.patches))}[/yellow]")
            out.print(f"  {item.status}  {show_path(item.path)}  {label}")
        if row.record_missing:
            out.print(f"  (pristine not checked: {escape(row.record_missing)})")


def _reachable(row: Any) -> str:
    if row.reachable:
        return "[green]yes[/green]"
    return "[red]no[/red]" if row.error is not None and row.error.exit_code == 3 else "[red]error[/red]"


def _snapshot(row: Any) -> str:
    if not row.snapshot:
        return "none (snapver pull)"
    tags = f" ({escape(', '.join(row.tags))})" if row.tags else ""
    return f"{row.snapshot[:10]} {row.snapshot_time:%Y-%m-%d %H:%M}{tags}"


def _drift(row: Any) -> str:
    if row.error is not None:
        return "?"
    if row.drift is None:
        return "-"
    if not row.drift:
        return "[green]identical[/green]"
    return f"[red]{len(row.drift)} file{'s' if len(row.drift) != 1 else ''}[/red]"
