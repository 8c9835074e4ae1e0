"""`snapver diff REF [REF] [-- PATH...]`: parse, call ops.diff, render."""

from __future__ import annotations

import sys
from typing import Any

import typer

from snapver.cli.app import PATHS_KEY, PathsAfterDashes, app
from snapver.cli.options import JsonOpt
from snapver.cli.render import console, emit_json, escape, outcome, show_path
from snapver.cli.state import STATE


class RefsThenPathsCommand(PathsAfterDashes):
    usage = "REF [REF] [-- PATH...]"


@app.command(cls=RefsThenPathsCommand)
def diff(
    ctx: typer.Context,
    refs: list[str] = typer.Argument(..., metavar="REF [REF]", show_default=False,
                                     help="Two trees (node = live, node@latest, tag, may22, id, patch, ./folder); "
                                     "one: a node's newest snapshot against its live tree. Paths go after `--`: "
                                     "relative to site-packages or a tracked path, file names, or globs."),
    name_status: bool = typer.Option(False, "--name-status", help="One line per changed file: M/A/D/T, tab, path."),
    stat: bool = typer.Option(False, "--stat", help="A diffstat."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="Print nothing (git's --quiet); the exit code says "
                               "(0 same, 1 differ). For GNU diff -q's lines: --brief."),
    brief: bool = typer.Option(False, "--brief", help="One line per differing file, as GNU diff -q says it: "
                               "`Files A/path and B/path differ`, `Only in A/dir: name`."),
    # A metavar and no `min=`: typer's `<int range> [x>=0]` widened the column of types
    # until the long option names were cut at 80 columns.
    unified: int = typer.Option(3, "-U", "--unified", metavar="N", help="Lines of context (0 or more)."),
    json_out: JsonOpt = False,
    checksum: bool = typer.Option(False, "-c", "--checksum",
                                  help="Hash every live file, even those whose stat is unchanged since the last pull."),
    same: bool = typer.Option(False, "-s", "--report-identical-files",
                              help="Also list the files compared that are identical, as `=  path`."),
    root: str | None = typer.Option(None, "--root", metavar="PREFIX",
                                       help="A folder ref is site-packages/PREFIX (e.g. sglang/srt; `.`: a "
                                       "site-packages), instead of the matched layout."),
    env: bool = typer.Option(False, "--env", help="Compare the environments under the trees instead: "
                             "distributions, Python, torch's CUDA, GPU, driver, kernel."),
) -> int:
    """Compare two trees by content: exit 0 identical, 1 different.

    Prints a unified diff; or --stat, --name-status, --brief (GNU diff -q's
    lines), -q (nothing).

    Examples:
      snapver diff ct200              # live tree against its newest snapshot
      snapver diff ct200 ct129 -- sglang/srt/layers/attention
      snapver diff may22 ct200 --env  # what changed under the tree since a tag
    """
    from snapver.errors import UsageError
    from snapver.transport.connect import Starting

    paths = ctx.meta.get(PATHS_KEY, [])
    if len(refs) > 2:
        raise UsageError(f"diff takes one or two trees, got {len(refs)}: {' '.join(refs)}",
                         hint="put paths after `--`: snapver diff A B -- sglang/srt/x.py")
    if unified < 0:
        raise UsageError(f"-U/--unified takes 0 or more lines of context, not {unified}", hint="e.g. -U 10")
    if sum((name_status, stat, quiet, brief, json_out)) > 1:
        raise UsageError("choose one of --name-status, --stat, --brief, -q and --json")
    config = STATE.config()
    if env:
        return _env_diff(config, refs, paths, json_out, quiet or name_status or stat)
    from snapver.ops.diff_group import group_nodes, names_nodes

    group = refs[0] if len(refs) == 1 and names_nodes(config, refs[0]) else None
    # Connecting to the nodes the refs name live begins now, while the diff's modules load
    # and the store is read (the resolver decides; a connection it does not use is closed).
    named = group_nodes(config, group) if group else [_live_node_named(ref) for ref in refs]
    live = dict.fromkeys(node for node in named if node in config.nodes)
    contents = not (quiet or name_status or brief or json_out)
    with Starting([config.node(node) for node in live]) as starting:
        store = _store_if_any(config)
        if group is not None:
            from snapver.ops.diff_group import diff_group

            grouped = diff_group(store, config, group, paths, contents=contents, context=unified,
                                 checksum=checksum, starting=starting)
            return _render_group(grouped, json_out=json_out, quiet=quiet, same=same,
                                 mode=_mode(name_status, stat, brief))
        from snapver.ops.diff import diff as run_diff

        result = run_diff(store, config, refs[0], refs[1] if len(refs) > 1 else None, paths, contents=contents,
                          context=unified, checksum=checksum, root=root, starting=starting)
    code = outcome(result.exit_code)
    if json_out:
        emit_json(result.to_json())
    elif not quiet:
        _report_selection(result)
        _report_environment(result, refs)
        _render(result, _mode(name_status, stat, brief), same)
    return code


def _mode(name_status: bool, stat: bool, brief: bool) -> str:
    return "name-status" if name_status else "stat" if stat else "brief" if brief else "unified"


def _render(result: Any, mode: str, same: bool) -> None:
    """One diff's text on stdout, in ``mode``; ``same``: the identical files after it."""
    if mode == "name-status":
        _name_status(result)
    elif mode == "stat":
        print_stat(result)
    elif mode == "brief":
        _write_lines(brief_lines(result))
    else:
        print_unified(result)
    if same:
        _identical(result)


def _render_group(grouped: Any, json_out: bool, quiet: bool, same: bool, mode: str) -> int:
    """`diff GROUP`: each node's diff after a `NODE:` line (none for a node with no
    difference; none in --brief, whose lines name the node)."""
    code = outcome(grouped.exit_code)
    if json_out:
        emit_json(grouped.to_json())
        return code
    if quiet:
        return code
    for result in grouped.results:
        _report_selection(result)
        if result.identical and not same:
            continue
        if mode != "brief":
            _write_lines([f"{show_path(result.b.node or '?', markup=False)}:"])
        _render(result, mode, same)
    return code


def _env_diff(config: Any, refs: list[str], paths: list[str], json_out: bool, quiet: bool) -> int:
    """`diff --env`: what changed under the trees, one line per item."""
    from snapver.errors import UsageError
    from snapver.ops.diff import env_diff

    if paths:
        raise UsageError("--env compares environments: it takes no paths", hint="snapver diff A B --env")
    result = env_diff(_store_if_any(config), config, refs[0], refs[1] if len(refs) > 1 else None)
    code = outcome(result.exit_code)
    if json_out:
        emit_json(result.to_json())
    elif not quiet:
        out = console()
        for change in result.changes:
            out.print(escape(env_change_line(change)))
    return code


def env_change_line(change: Any) -> str:
    """``torch 2.9.0+cu128 → 2.9.1+cu128``, ``+ name 0.5.0``, ``- name 0.4.0`` (quoted)."""
    from snapver.model import quote_controls

    item = quote_controls(change.item)
    if change.old is None:
        return f"+ {item} {quote_controls(change.new)}"
    if change.new is None:
        return f"- {item} {quote_controls(change.old)}"
    return f"{item} {quote_controls(change.old)} \u2192 {quote_controls(change.new)}"


def _report_environment(result: Any, refs: list[str]) -> None:
    """On stderr, one line when the ground under the trees moved: a code diff alone would not say."""
    import shlex

    from snapver.environment import changes_summary
    from snapver.model import quote_controls

    if result.env_changes:
        command = quote_controls(shlex.join(["snapver", "diff", *refs, "--env"]))
        console(stderr=True).print(escape(f"environment differs: {changes_summary(result.env_changes)} ({command})"))


def _live_node_named(ref: str) -> str:
    """The node a ref may read live, by its text alone: NODE of ``NODE@live``, else the ref
    itself (kept if it names a node). A guess: the resolver decides (a tag or patch of
    the same name, a folder), and a connection begun for nothing is closed unused."""
    node, at, rest = ref.rpartition("@")
    return node if at and rest.lower() == "live" else ref


COMPARED_LISTED = 10  # up to this many files compared are named on stderr


def _report_selection(result: Any) -> None:
    """On stderr: how each folder was read, what was left out of the comparison (outside a
    side's scope), and which files the path operands matched."""
    err = console(stderr=True)
    for folder in result.folders:
        err.print(escape(folder.describe()))
    for note in result.notes:
        err.print(escape(note))
    compared = result.compared
    if not result.matched:
        return
    count = f"{len(compared)} file{'s' if len(compared) != 1 else ''} compared"
    if len(compared) <= COMPARED_LISTED:
        err.print(escape(f"{count}: {', '.join(compared)}"))
    else:
        per_operand = ", ".join(f"{operand}: {len(found)}" for operand, found in result.matched.items())
        err.print(escape(f"{count} ({per_operand})"))


def _identical(result: Any) -> None:
    from snapver.model import quote_path

    out = sys.stdout.buffer
    for path in result.same:
        out.write(f"=  {quote_path(path)}\n".encode("utf-8", "surrogateescape"))
    out.flush()


def _store_if_any(config: Any) -> Any:
    """The store, or None when none exists yet (live nodes can still be compared)."""
    if not (config.store_path / "HEAD").exists():
        return None
    return STATE.store(config)


def _name_status(result: Any) -> None:
    out = sys.stdout.buffer
    for change in result.changes:
        out.write(f"{change.status}\t{show_path(change.path, markup=False)}\n".encode("utf-8", "surrogateescape"))
    out.flush()


def _write_lines(lines: list[str]) -> None:
    out = sys.stdout.buffer
    for line in lines:
        out.write(f"{line}\n".encode("utf-8", "surrogateescape"))
    out.flush()


def brief_lines(result: Any) -> list[str]:
    """One line per change in GNU ``diff -rq``'s words, each side named by its ref
    (``Files ct200/x and ct129/x differ``, ``Only in ct129/dir: name``); a mode change,
    which GNU diff does not see, is said in the same form."""
    from snapver.model import ADDED, DELETED, LINK, quote_path
    from snapver.ops.diff import git_mode

    a_name, b_name = (side.ref.text.rstrip("/") or "/" for side in (result.a, result.b))
    lines = []
    for change in result.changes:
        path = change.path
        if change.status in (DELETED, ADDED):
            folder, _, name = path.rpartition("/")
            side = a_name if change.status == DELETED else b_name
            lines.append(f"Only in {quote_path(f'{side}/{folder}' if folder else side)}: {quote_path(name)}")
            continue
        old, new = quote_path(f"{a_name}/{path}"), quote_path(f"{b_name}/{path}")
        if change.old.kind != change.new.kind:
            kinds = ["a symbolic link" if e.kind == LINK else "a regular file" for e in (change.old, change.new)]
            lines.append(f"File {old} is {kinds[0]} while file {new} is {kinds[1]}")
        elif change.old.oid == change.new.oid:
            lines.append(f"Files {old} and {new} differ in mode ({git_mode(change.old)} -> {git_mode(change.new)})")
        else:
            lines.append(f"Files {old} and {new} differ")
    return lines


def print_stat(result: Any) -> None:
    """The diffstat of a diff result (`diff --stat`, and what `show` says a snapshot changed)."""
    files = result.files or []
    if not files:
        return
    names = [show_path(f.change.path, markup=False) for f in files]
    width = max(len(name) for name in names)
    most = max((f.added + f.removed for f in files), default=0)
    bar_room = max(10, min(50, console().width - width - 12))
    scale = min(1.0, bar_room / most) if most else 1.0
    digits = len(str(most))
    out = console()
    for name, f in zip(names, files, strict=False):
        if f.binary:
            counts = f"Bin {f.old_size} -> {f.new_size} bytes"
        else:
            plus = max(1, round(f.added * scale)) if f.added else 0
            minus = max(1, round(f.removed * scale)) if f.removed else 0
            counts = f"{f.added + f.removed:>{digits}} [green]{'+' * plus}[/green][red]{'-' * minus}[/red]"
        out.print(f" {escape(name):<{width}} | {counts}")
    added = sum(f.added for f in files)
    removed = sum(f.removed for f in files)
    out.print(f" {len(files)} file{'s' if len(files) != 1 else ''} changed, "
              f"{added} insertion{'s' if added != 1 else ''}(+), {removed} deletion{'s' if removed != 1 else ''}(-)")


_COLOURS = ((b"diff --git ", b"\033[1m"), (b"index ", b"\033[1m"), (b"--- ", b"\033[1m"), (b"+++ ", b"\033[1m"),
            (b"old mode ", b"\033[1m"), (b"new mode ", b"\033[1m"), (b"new file mode ", b"\033[1m"),
            (b"deleted file mode ", b"\033[1m"), (b"@@", b"\033[36m"), (b"+", b"\033[32m"), (b"-", b"\033[31m"))


def print_unified(result: Any) -> None:
    """The unified diff text of a diff result (coloured on a terminal)."""
    out = sys.stdout.buffer
    colour = STATE.color and sys.stdout.isatty()
    for file in result.files or []:
        if not colour:
            out.write(file.text)
            continue
        for line in file.text.splitlines(keepends=True):
            out.write(_colour_line(line))
    out.flush()


def _colour_line(line: bytes) -> bytes:
    for prefix, code in _COLOURS:
        if line.startswith(prefix):
            body = line.rstrip(b"\n")
            return code + body + b"\033[0m" + line[len(body):]
    return line
