"""`snapver pull`: parse, call ops.pull, render."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from snapver.cli.app import app
from snapver.cli.options import AllNodesOpt, JsonOpt, NoteOpt, node_args
from snapver.cli.render import PlainConsole, console, emit_json, escape, fields_line, human_bytes
from snapver.cli.state import STATE
from snapver.model import quote_controls

if TYPE_CHECKING:
    from rich.console import Console

    from snapver.config import Config, NodeSpec
    from snapver.transport.connect import Starting


@app.command()
def pull(
    targets: Annotated[list[str] | None, node_args("Nodes or groups to snapshot.")] = None,
    all_nodes: AllNodesOpt = False,
    tag: str | None = typer.Option(None, "--tag", help="Tag the new snapshot (one node)."),
    message: NoteOpt = "",
    json_out: JsonOpt = False,
) -> int:
    """Snapshot live nodes; only changed content crosses the wire.

    Examples:
      snapver pull ct200
      snapver pull tp8 -m "before the attention fix"
      snapver pull --all
    """
    from snapver.errors import UsageError
    from snapver.transport.connect import Starting

    config = STATE.config()
    specs = config.select(targets or [], all_nodes)
    if tag is not None:
        from snapver.store.refs import check_name

        check_name("tag", tag)
        if len(specs) != 1:
            raise UsageError("--tag names one snapshot: pull one node with it",
                             hint="tag the others with `snapver tag NAME NODE`")
    # Connecting begins now (or began before the command line was read: transport.prestart);
    # the pull's own modules load and the store opens meanwhile.
    from snapver.transport.prestart import adopt

    with adopt(specs) or Starting(specs) as starting:
        return _pull(config, specs, tag, message, json_out, starting)


def _pull(config: Config, specs: list[NodeSpec], tag: str | None, message: str, json_out: bool,
          starting: Starting) -> int:
    """The pull itself, while ``starting`` connects to ``specs``."""
    from snapver.errors import RefError
    from snapver.ops.pull import pull as pull_nodes
    from snapver.ops.snapshot import NodePull
    from snapver.store.refs import tag_ref

    store = STATE.store(config, create=True)
    if tag is not None:
        # As `snapver tag`: a tag never moves silently, nor one another writer of a team
        # store holds (the pull writes it only where none is: see ops/pull.py _tag).
        from snapver.ops.tag import check_not_a_patch
        from snapver.store.team import TeamView

        view = TeamView(store)
        check_not_a_patch(view, tag)
        values, conflicts = view.tags()
        existing = store.ref(tag_ref(tag)) or values.get(tag) or next(iter(conflicts.get(tag, {}).values()), None)
        if existing:
            raise RefError(f"tag {tag!r} already names {existing[:10]}",
                           hint=f"pick another name, or move it with `snapver tag --force {tag} {specs[0].name}` "
                           "after pulling")
    out = console()
    err = console(stderr=True)
    show_bar = not json_out and err.is_terminal

    live: list = []  # the progress bar while it is shown

    def done(result: NodePull) -> None:
        if json_out:
            return
        target = err if result.error else out
        if live and target.is_terminal:
            # Through the bar's console, which clears the bar first (a console of its own would
            # write past rich's stdout proxy, glued to the bar): the same screen.
            target = live[0].console
        if not target.is_terminal:
            target.print(summary_line(result))
            return
        from snapver.cli.fit import print_wrapped

        print_wrapped(target, summary_line(result, target))

    if show_bar:
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

        assert not isinstance(err, PlainConsole)  # is_terminal: rich's console
        label = "pulling {task.fields[nodes]}: {task.fields[files]}/{task.fields[total_files]} files"
        with Progress(
            TextColumn(label), BarColumn(), DownloadColumn(), TimeRemainingColumn(), console=err, transient=True
        ) as bar:
            task = bar.add_task("pull", total=None, files=0, total_files="?", nodes=escape(bar_names(specs)))
            live.append(bar)

            def plan(files: int, size: int) -> None:
                bar.update(task, total=size, total_files=files)

            def progress(files: int, size: int) -> None:
                bar.update(task, advance=size, files=bar.tasks[0].fields["files"] + files)

            result = pull_nodes(store, specs, tag, message, on_plan=plan, on_progress=progress,
                                on_node_done=done, starting=starting)
    else:
        result = pull_nodes(store, specs, tag, message, on_node_done=done, starting=starting)
    if json_out:
        emit_json({"nodes": [n.to_json() for n in result.nodes], "exit_code": result.exit_code})
    if result.compacting and err.is_terminal:  # a lock held for minutes: say who holds it
        err.print(f"compacting the store in the background (pid {result.compacting})")
    failed = [n.node for n in result.nodes if n.error]
    if failed and len(result.nodes) > 1 and not json_out:
        err.print(f"snapver: error: {len(failed)} of {len(result.nodes)} nodes failed: {escape(', '.join(failed))}")
    return result.exit_code


def bar_names(specs: list[NodeSpec], most: int = 3) -> str:
    """The nodes a progress bar names: ``ct200``, ``ct200, ct129``, ``ct200, ct129, ct130 +5``."""
    names = [spec.name for spec in specs]
    shown = ", ".join(names[:most])
    return shown + (f" +{len(names) - most}" if len(names) > most else "")


def summary_line(result: object, out: Console | PlainConsole | None = None) -> str:
    """One line per node: files, changed, bytes transferred, seconds — or the error; on a
    terminal (``out``) too narrow for it, broken between its fields."""
    from snapver.ops.snapshot import NodePull

    assert isinstance(result, NodePull)
    name = escape(result.node)
    if result.error:
        message = result.error.message
        if not message.startswith((f"{result.node}:", f"{result.node} (")):
            message = f"{result.node}: {message}"
        hint = result.error.shown_hint
        return f"[red]snapver: error:[/red] {escape(message)}" + (f"\nhint: {escape(hint)}" if hint else "")
    if result.unchanged_since:
        head = f"{name}: unchanged since {result.unchanged_since[:10]}"
    else:
        head = f"{name}: snapshot [bold]{result.snapshot[:10] if result.snapshot else '?'}[/bold]"
    fields = [f"{head} — {result.files} files", f"{result.changed} changed",
              f"{human_bytes(result.fetched_bytes)} transferred ({human_bytes(result.wire_bytes)} on the wire)",
              f"{result.seconds:.1f} s"]
    if result.env_changed and not result.unchanged_since:
        fields.append("environment changed")
    note = f"\n{name}: {escape(quote_controls(result.env_note))}" if result.env_note else ""
    return (fields_line(out, fields, ", ") if out is not None else ", ".join(fields)) + note
