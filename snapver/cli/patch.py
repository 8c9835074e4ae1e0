"""`snapver patch …`: new, save, import, capture, list, show, export, rebase, delete."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from snapver.cli.app import app
from snapver.cli.options import JsonOpt
from snapver.cli.render import console, emit_json, escape, fields_line, show_list, show_path
from snapver.cli.state import STATE

PATCH_HELP = """Patches: named changes on top of a base snapshot.

Made from an edited checkout (new, save), a unified diff (import) or
a node's hand-made hot-fixes (capture); `snapver push` deploys one.

Examples:
  snapver patch new fix-eagle --base ct200   # prints a folder to edit
  snapver patch save fix-eagle -m "guard the draft length"
  git diff | snapver patch import fix-eagle - --base may22
"""
patch_app = typer.Typer(help=PATCH_HELP, no_args_is_help=True, context_settings={"help_option_names": ["-h", "--help"]})
app.add_typer(patch_app, name="patch")

NODES_HELP = "Default target nodes or groups of `snapver push` (repeat, or comma-separated)."


def _status_line(status: str, path: str) -> str:
    colour = {"A": "green", "D": "red", "M": "yellow", "T": "cyan"}.get(status, "white")
    return f"  [{colour}]{status}[/{colour}]  {show_path(path)}"


def _report(patch: object, how: str, files: object = None) -> None:
    """One line about a patch just written, then its files (or ``files``) with their status."""
    from snapver.ops.patch import Patch

    assert isinstance(patch, Patch)
    out = console()
    out.print(f"patch {escape(patch.name)}: {patch.commit[:10]}, {how}, {len(patch.files)} file(s) on "
              f"{patch.base[:10]} ({escape(patch.base_node)})")
    for item in patch.files if files is None else files:  # type: ignore[attr-defined]
        out.print(_status_line(item.status, item.path))
    _warn_broken(patch)


def _warn_broken(patch: object) -> None:
    """A warning per file a push would refuse (conflict markers, Python that does not compile)."""
    err = console(stderr=True)
    for broken in getattr(patch, "broken", []):
        err.print(f"warning: {escape(str(broken))} — `snapver push` refuses it until fixed")


@patch_app.command("new")
def new(
    name: str = typer.Argument(..., metavar="PATCH", help="The patch's name."),
    base: str | None = typer.Option(None, "--base", help="The snapshot it applies to (tag, node, id …); "
                                       "leave out to check out an existing patch."),
    nodes: list[str] | None = typer.Option(None, "--nodes", help=NODES_HELP),
    message: str = typer.Option("", "-m", "--message", help="What the patch is for."),
    from_folder: str | None = typer.Option(None, "--from", metavar="FOLDER",
                                              help="Make the patch the base → this folder's tree (a copy of srt, "
                                              "a source checkout …, matched as a folder ref is)."),
    root: str | None = typer.Option(None, "--root", metavar="PREFIX",
                                       help="With --from: the folder is site-packages/PREFIX, not matched."),
) -> int:
    """Start a patch: an editable checkout of the base tree; prints its folder.

    Examples:
      snapver patch new fix-attn --base may22 --nodes tp8 -m "attention fix"
      snapver patch new fix-attn --base may22 --from ~/src/sglang/python
    """
    from snapver.ops.patch import new_patch

    config = STATE.config()
    store = STATE.store(config)
    result = new_patch(store, config, name, base, nodes or [], message, from_folder, root)
    # stdout is the folder alone, so that `cd "$(snapver patch new …)"` works; the rest is for a person.
    err = console(stderr=True)
    if from_folder is not None:
        err.print(f"patch {escape(name)}: {len(result.patch.files)} file(s) from {escape(from_folder)}")
        for item in result.patch.files:
            err.print(_status_line(item.status, item.path))
    err.print(f"patch {escape(name)} on {result.patch.base[:10]} ({escape(result.patch.base_node)}): "
              f"{result.files} files checked out")
    err.print(f"edit the files under it, then run `snapver patch save {escape(name)}`:", style=None)
    print(result.folder)
    return 0


@patch_app.command("save")
def save(
    name: str = typer.Argument(..., metavar="PATCH", help="The patch's name."),
    message: str = typer.Option("", "-m", "--message", help="Replace the patch's message."),
) -> int:
    """Record the edits made in the patch's checkout folder.

    Examples:
      snapver patch save fix-attn
    """
    from snapver.ops.patch import save_patch

    config = STATE.config()
    result = save_patch(STATE.store(config), config, name, message)
    if not result.saved:
        console().print(f"patch {escape(name)}: nothing to save (the checkout equals {result.patch.commit[:10]})")
        return 0
    _report(result.patch, f"saved, {len(result.changed)} file(s) changed since the last save", result.changed)
    return 0


@patch_app.command("import")
def import_(
    name: str = typer.Argument(..., metavar="PATCH", help="The new patch's name."),
    file: str = typer.Argument(..., help="A unified diff (`diff -u`, `git diff`, `git format-patch`); - for stdin."),
    base: str = typer.Option(..., "--base", help="The snapshot the diff was made against."),
    nodes: list[str] | None = typer.Option(None, "--nodes", help=NODES_HELP),
    message: str = typer.Option("", "-m", "--message", help="What the patch is for (default: the mail subject)."),
    strip: int | None = typer.Option(None, "-p", "--strip", min=0,
                                        help="Leading path components to strip (default: guessed, like patch -pN)."),
) -> int:
    """Make a patch from a unified diff; paths relative to site-packages (a/ b/ accepted).

    Examples:
      snapver patch import fix-attn fix.diff --base may22
      git diff | snapver patch import fix-attn - --base ct200
    """
    from snapver.errors import UsageError
    from snapver.ops.patch import import_patch

    config = STATE.config()
    store = STATE.store(config)
    if file == "-":
        data, source = sys.stdin.buffer.read(), "stdin"
    else:
        try:
            data, source = Path(file).read_bytes(), file
        except OSError as exc:
            raise UsageError(f"cannot read {file}: {exc.strerror or exc}") from exc
    _report(import_patch(store, config, name, data, source, base, nodes or [], message, strip), "imported")
    return 0


@patch_app.command("capture")
def capture(
    name: str = typer.Argument(..., metavar="PATCH", help="The new patch's name."),
    node: str = typer.Argument(..., help="The live node whose drift becomes the patch."),
    base: str = typer.Option(..., "--base", help="The snapshot the node drifted from."),
    nodes: list[str] | None = typer.Option(None, "--nodes", help=NODES_HELP + " Default: NODE."),
    message: str = typer.Option("", "-m", "--message", help="What the patch is for."),
) -> int:
    """Turn a node's live drift from --base (hand-made hot-fixes) into a patch.

    Examples:
      snapver patch capture hotfix-oom ct200 --base may22
    """
    from snapver.ops.patch import capture_patch

    config = STATE.config()
    patch = capture_patch(STATE.store(config), config, name, node, base, nodes or [], message)
    if patch is None:
        console().print(f"{escape(node)} does not drift from {escape(base)}: nothing to capture, no patch made")
        return 0
    _report(patch, f"captured from {escape(node)}")
    return 0


@patch_app.command("list")
def list_(json_out: JsonOpt = False) -> int:
    """List patches: name, files, base, target nodes, date, message.

    Examples:
      snapver patch list
    """
    from snapver.ops.patch import list_patches

    config = STATE.config()
    patches = list_patches(STATE.store(config))
    if json_out:
        emit_json({"patches": [{**p.to_json(), "files": int(p.meta.get("files", 0))} for p in patches],
                   "exit_code": 0})
        return 0
    out = console()
    if not patches:
        out.print("no patches yet (make one with `snapver patch new`, `import` or `capture`)")
    for p in patches:
        nodes = ", ".join(p.nodes) or "-"
        out.print(
            fields_line(
                out,
                [
                    f"[bold]{escape(p.name)}[/bold]",
                    p.commit[:10],
                    f"{int(p.meta.get('files', 0))} file(s)",
                    f"base {p.base[:10]} ({escape(p.base_node)})",
                    f"nodes {escape(nodes)}",
                    f"{p.time:%Y-%m-%d %H:%M}",
                    *([show_path(p.message.splitlines()[0])] if p.message else []),
                ],
            )
        )
    return 0


@patch_app.command("show")
def show(
    name: str = typer.Argument(..., metavar="PATCH", help="The patch's name."),
    all_history: bool = typer.Option(False, "--history", help="List every version of the patch, with dates."),
    json_out: JsonOpt = False,
) -> int:
    """A patch's base, targets, message, history and files.

    Examples:
      snapver patch show fix-attn
    """
    from snapver.ops.patch import checkout_folder, history, load_patch

    config = STATE.config()
    store = STATE.store(config)
    patch = load_patch(store, name)
    commits = history(store, name)
    folder = checkout_folder(store, name)
    if json_out:
        emit_json({**patch.to_json(), "history": [{"id": c.id, "time": c.time.isoformat(),
                                                    "source": c.meta.get("source"), "base": c.meta.get("base"),
                                                    "writer": c.meta.get("writer")}
                                                   for c in commits],
                   "checkout": str(folder) if folder.is_dir() else None, "exit_code": 0})
        return 0
    out = console()
    out.print(f"patch {escape(name)}  ({patch.commit})")
    base_meta = store.commit(patch.base).meta
    dists = show_list(f"{n} {v}" for n, v in base_meta.get("dists", [])) or "-"
    out.print(f"base:     {patch.base[:10]}  {show_path(patch.base_node)}  {dists}")
    out.print(f"nodes:    {escape(', '.join(patch.nodes)) or '-'}")
    out.print(f"date:     {patch.time:%Y-%m-%d %H:%M:%S %z}")
    if patch.message:
        out.print(f"message:  {show_path(patch.message)}")
    if all_history:
        out.print(f"history:  {len(commits)} version(s), newest first")
        # A patch edited in several stores (a team): each version says whose it is.
        by_writer = len({c.meta.get("writer") for c in commits}) > 1
        for c in commits:
            line = str(c.meta.get("message") or "").splitlines()
            source = show_path(str(c.meta.get("source", "?")))
            out.print(f"  {c.id[:10]}  {c.time.astimezone():%Y-%m-%d %H:%M:%S %z}  {source:<7}"
                      f"  base {str(c.meta.get('base', '?'))[:10]}"
                      + (f"  by {show_path(str(c.meta.get('writer') or '?'))}" if by_writer else "")
                      + (f"  {show_path(line[0])}" if line else ""))
    else:
        out.print(f"history:  {len(commits)} commit(s): "
                  + ", ".join(f"{c.id[:10]} {show_path(str(c.meta.get('source', '?')))}" for c in commits[:5])
                  + (f" … (`snapver patch show {escape(name)} --history`)" if len(commits) > 5 else ""))
    if folder.is_dir():
        out.print(f"checkout: {escape(str(folder))}")
    out.print(f"files:    {len(patch.files)}")
    for item in patch.files:
        out.print(_status_line(item.status, item.path))
    return 0


@patch_app.command("export")
def export(
    name: str = typer.Argument(..., metavar="PATCH", help="The patch's name."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Write to this file, not stdout."),
) -> int:
    """Print the patch as a unified diff that `git apply` / `patch -p1` apply in site-packages.

    Examples:
      snapver patch export fix-attn > fix-attn.diff
    """
    from snapver.ops.patch import export_patch

    config = STATE.config()
    data = export_patch(STATE.store(config), name)
    if output is not None:
        output.write_bytes(data)
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    return 0


@patch_app.command("rebase")
def rebase(
    name: str = typer.Argument(..., metavar="PATCH", help="The patch's name."),
    onto: str = typer.Option(..., "--onto", help="The new base snapshot (e.g. the next sglang release)."),
) -> int:
    """Carry a patch onto a new base, three-way per file; conflicts are reported per file.

    Examples:
      snapver patch rebase fix-attn --onto ct200
    """
    from snapver.ops.patch import rebase_patch

    config = STATE.config()
    result = rebase_patch(STATE.store(config), config, name, onto)
    out = console()
    if not result.files and not result.rebased:
        out.print(f"patch {escape(name)} is already based on {result.onto[:10]}")
        return 0
    for item in result.files:
        colour = {"conflict": "red", "dropped": "cyan", "kept": "yellow"}.get(item.outcome, "green")
        detail = f": {escape(item.detail)}" if item.detail else ""
        out.print(f"  [{colour}]{item.outcome:<8}[/{colour}] {show_path(item.path)}{detail}")
    if result.rebased:
        out.print(f"patch {escape(name)}: rebased onto {result.onto[:10]} as {result.patch.commit[:10]}")
        _warn_broken(result.patch)
        return 0
    err = console(stderr=True)
    err.print(f"snapver: error: patch {escape(name)}: {len(result.conflicts)} file(s) conflict; nothing recorded")
    err.print(f"hint: the merge (conflict markers, or the patch's side where none can go) is checked out in "
              f"{escape(str(result.checkout))}; "
              f"resolve it, then `snapver patch save {escape(name)}`")
    return 1


@patch_app.command("delete")
def delete(name: str = typer.Argument(..., metavar="PATCH", help="The patch's name.")) -> int:
    """Delete a patch (its commits stay in the store until `git gc`).

    Examples:
      snapver patch delete fix-attn
    """
    from snapver.ops.patch import checkout_folder, delete_patch

    config = STATE.config()
    store = STATE.store(config)
    patch = delete_patch(store, name)
    out = console()
    out.print(f"deleted patch {escape(name)} (was {patch.commit[:10]})")
    folder = checkout_folder(store, name)
    if folder.is_dir():
        out.print(f"its checkout {escape(str(folder))} was left in place")
    return 0
