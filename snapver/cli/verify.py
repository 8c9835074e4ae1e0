"""`snapver verify NODE...`: parse, call ops.verify, render."""

from __future__ import annotations

import sys
from typing import Annotated

from snapver.cli.app import app
from snapver.cli.options import JsonOpt, node_args
from snapver.cli.render import console, emit_json, escape, outcome, print_error, show_list, show_path
from snapver.cli.state import STATE


@app.command()
def verify(
    targets: Annotated[list[str], node_args("Nodes (or groups) to check.", required=True)],
    json_out: JsonOpt = False,
) -> int:
    """Live files against the installed distribution's RECORD: what changed since `pip install`.

    Examples:
      snapver verify ct200
      snapver verify tp8 --json
    """
    from snapver.ops.verify import verify as run_verify

    config = STATE.config()
    results = run_verify(config.select(targets))
    code = outcome(max((r.exit_code for r in results), default=0))
    if json_out:
        emit_json({"nodes": [r.to_json() for r in results], "exit_code": code})
        return code
    out = console()
    for result in results:
        name = escape(result.node)
        if result.error is not None:
            print_error(result.error)
            continue
        for label, paths in (("M", result.modified), ("D", result.missing), ("A", result.extra)):
            for path in paths:  # as `diff --name-status` prints them (rich would expand the tab)
                sys.stdout.buffer.write(
                    f"{label}\t{show_path(path, markup=False)}\n".encode("utf-8", "surrogateescape")
                )
        sys.stdout.flush()
        against = show_list(result.dists)
        for leftover in result.leftovers:
            out.print(f"{name}: leftover {show_path(leftover)}: Python imports {against}; "
                      f"{len(result.leftover_files)} file(s) only it lists are left over too (not changes)")
        if result.remove_leftovers:
            out.print(f"{name}: remove the leftover with: {escape(result.remove_leftovers)}")
        if result.unverifiable:
            out.print(f"{name}: {len(result.unverifiable)} file(s) RECORD lists without a hash (unverifiable)")
        verdict = "[green]pristine[/green]" if result.clean else (
            f"[red]{len(result.modified)} modified, {len(result.missing)} missing, "
            f"{len(result.extra)} extra[/red]")
        against = show_path(result.against) if result.against else f"the RECORD of {against}"
        out.print(f"{name}: {result.checked} files checked against {against}: {verdict}")
    return code
