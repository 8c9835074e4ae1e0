"""`init`, `nodes`, `log`, `show`, `fsck`: parse, call one operation, render."""

from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional

import typer

from snapver.cli.app import app
from snapver.cli.render import (HeldOutput, console, emit_json, escape, fields_line, human_bytes, outcome,
                                 print_table, show_list, show_path)
from snapver.cli.state import STATE

if TYPE_CHECKING:
    from snapver.model import Entry


@app.command()
def init(
    local: bool = typer.Option(False, "--local", help="Add node `local`: this Python's site-packages, no SSH."),
    writer: Optional[str] = typer.Option(None, "--writer", metavar="NAME",
                                         help="This store's writer id for `snapver sync` (default: user@host); "
                                              "on an existing store, changes it."),
    json_out: bool = typer.Option(False, "--json", help="One JSON document on stdout."),
) -> int:
    """Create `.snapver` (from the example) and an empty store here; it names no node unless --local.

    With --config (or $SNAPVER_CONFIG), that file is the one written (or kept) and its store made.

    Examples:
      snapver init            # then add your nodes to .snapver
      snapver init --local    # this machine's site-packages as node `local`
      snapver init --writer alice@lab   # its name on a team remote
    """
    from snapver.config import ENV_CONFIG
    from snapver.ops.init import init as run_init

    # The config named by --config or $SNAPVER_CONFIG is the one made (or kept) and whose
    # store is created, as every other command would read it; else `.snapver` here.
    named = STATE.config_path or os.environ.get(ENV_CONFIG)
    result = run_init(Path.cwd(), local=local, writer=writer, config_path=Path(named) if named else None)
    if json_out:
        emit_json({"config": str(result.config_path), "config_created": result.config_created,
                   "store": str(result.store_path), "local": local, "writer": result.writer, "exit_code": 0})
        return 0
    out = console()
    if result.config_created:
        out.print(f"wrote {escape(str(result.config_path))} "
                  + ("(node `local`: this Python's site-packages)" if local else "(edit it to add your nodes)"))
    else:
        out.print(f"kept the existing {escape(str(result.config_path))}")
    out.print(f"store ready at {escape(str(result.store_path))}"
              + (f" (writer {escape(result.writer)})" if writer is not None else ""))
    return 0


@app.command()
def nodes(
    check: bool = typer.Option(False, "--check", help="Connect and report python, site-packages, version."),
    json_out: bool = typer.Option(False, "--json", help="One JSON document on stdout."),
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
    rows = [(escape(c.node), escape(c.address), "[green]yes[/green]" if c.reachable else "[red]no[/red]",
             show_path(c.python) or "?", show_path(c.site_packages) or "?", show_path(c.dists) or "?") if check else
            (escape(c.node), escape(c.address), escape(c.site_packages)) for c in checks]
    out = console()
    print_table(out, columns, rows)
    for name, members in config.groups.items():
        out.print(f"group {escape(name)}: {escape(', '.join(members))}")
    for c in checks:
        if c.error:
            console(stderr=True).print(f"snapver: error: {escape(c.error)}")
    return code


@app.command()
def log(
    node: Optional[str] = typer.Argument(None, help="Only this node's snapshots."),
    limit: Optional[int] = typer.Option(None, "-n", help="At most N snapshots.", min=1),
    since: Optional[str] = typer.Option(None, "--since", metavar="DATE",
                                        help="Only snapshots taken on or after DATE (2026-05-22, may22, ISO time)."),
    oneline: bool = typer.Option(False, "--oneline", help="One short line per snapshot: id, date, node, event."),
    json_out: bool = typer.Option(False, "--json", help="One JSON document on stdout."),
) -> int:
    """Snapshots, newest first: id, date, node, what made it, files changed, tags, version.

    What made it: pull, push NAME, rollback or import; the message follows.

    Examples:
      snapver log
      snapver log ct200 -n 5
      snapver log --since may22 --oneline
    """
    from snapver.ops.log import log as read_log
    from snapver.ops.log import parse_since

    config = STATE.config()
    start = parse_since(since) if since is not None else None
    store = STATE.store(config)
    snapshots = read_log(store, config, node, limit, start)
    if json_out:
        emit_json({"snapshots": [s.to_json() for s in snapshots], "exit_code": 0})
        return 0
    out = console()
    if not snapshots:
        out.print("no snapshots yet" + (f" of {escape(node)}" if node else "")
                  + (f" since {escape(since)}" if since else "") + (" (run `snapver pull`)" if not since else ""))
    made_by = {s.id: show_path(s.made_by, markup=False) for s in snapshots}  # `push NAME`: NAME is the store's
    width = max(map(len, made_by.values()), default=0)
    # A team store's log says who took each snapshot (only when more than one store did).
    by_writer = len({s.writer for s in snapshots}) > 1
    for s in snapshots:
        tags = f" [yellow]({show_list(s.tags)})[/yellow]" if s.tags else ""
        if by_writer:
            tags += f" by {show_path(s.writer or '?')}"
        made = made_by[s.id]
        event = f"[cyan]{escape(made if oneline else f'{made:<{width}}')}[/cyan]"
        note = [show_path(s.message)] if s.message else []
        if oneline:
            out.print(fields_line(out, [f"[bold]{s.id[:10]}[/bold]", f"{s.time:%Y-%m-%d %H:%M}", show_path(s.node),
                                        f"{event}{tags}", *note], separator=" "))
            continue
        out.print(fields_line(out, [f"[bold]{s.id[:10]}[/bold]", f"{s.time:%Y-%m-%d %H:%M}",
                                    f"{show_path(s.node):<10} {event}", f"{s.files} files, {s.changed} changed",
                                    f"{show_list(s.dists) or '-'}{tags}", *note]))
    return 0


def _emit_file_json(snapshot: str, path: str, file: "Entry", pieces: "Iterator[bytes]") -> None:
    """`show REF PATH --json`: one JSON document holding the file as text (UTF-8 up to 1 MiB),
    else as base64 written as it is read (a 500 MB ``.so`` is never held whole)."""
    document = {"snapshot": snapshot, "path": path, "kind": file.kind, "mode": f"{file.mode:o}", "size": file.size}
    if file.size <= 1 << 20:
        data = b"".join(pieces)
        try:
            emit_json({**document, "encoding": "utf-8", "content": data.decode("utf-8"), "exit_code": 0})
            return
        except UnicodeDecodeError:
            pieces = iter([data])
    head = json.dumps({**document, "encoding": "base64"}, indent=2)
    out = sys.stdout
    if isinstance(out, HeldOutput):  # as emit_json: a JSON document is never paged
        out.unpaged = True
    out.write(head[:-2] + ',\n  "content": "')
    left = b""
    for piece in pieces:  # whole groups of 3 bytes per write: the base64 of the parts joins up
        piece = left + piece
        cut = len(piece) - len(piece) % 3
        out.write(base64.b64encode(piece[:cut]).decode("ascii"))
        left = piece[cut:]
    out.write(base64.b64encode(left).decode("ascii") + '",\n  "exit_code": 0\n}\n')
    out.flush()


@app.command()
def show(
    ref: str = typer.Argument(..., help="A snapshot: tag, node, node~2, node@may22, hex id …"),
    path: Optional[str] = typer.Argument(None, help="A file, relative to site-packages."),
    json_out: bool = typer.Option(False, "--json", help="Metadata as JSON."),
) -> int:
    """A snapshot's metadata, or one file's content in it.

    Examples:
      snapver show ct200      # its newest snapshot, and what it changed
      snapver show may22 sglang/srt/server_args.py
      snapver show ct200~1 --json
    """
    from snapver.ops.log import content
    from snapver.ops.log import show as run_show

    config = STATE.config()
    store = STATE.store(config)
    result = run_show(store, config, ref, path)
    info = result.snapshot
    if result.file is not None:
        if json_out:
            _emit_file_json(info.id, result.path or "", result.file, content(store, result.file))
            return 0
        for piece in content(store, result.file):
            sys.stdout.buffer.write(piece)
        sys.stdout.flush()
        return 0
    if json_out:
        emit_json({**info.to_json(), "parent": result.parent,
                   "changes": None if result.changes is None else result.changes.to_json()["changes"],
                   "manifest": [{"path": e.path, "kind": e.kind, "mode": f"{e.mode:o}", "size": e.size,
                                 "blake3": e.digest} for e in result.manifest or []], "exit_code": 0})
        return 0
    out = console()
    meta = info.meta
    date = f"{info.time:%Y-%m-%d %H:%M:%S %z}"
    if meta.get("kind") == "patch":  # a patch's tree: what it is on, not a node's snapshot
        changed = len(result.changes.changes) if result.changes is not None else 0
        out.print(f"patch {show_path(str(meta.get('name', '?')))} (commit {info.id})")
        fields = [("base", f"{show_path(str(meta.get('base_node', '?')))} {escape(str(meta.get('base', '?'))[:10])}"),
                  ("nodes", show_list(map(str, meta.get("nodes") or [])) or "-"), ("date", date),
                  ("made by", show_path(str(meta.get("source", "patch"))))]
        files = f"{len(result.manifest or [])}, {changed} changed by the patch"
    else:
        out.print(f"snapshot {info.id}")
        fields = [("node", f"{show_path(info.node)} ({show_path(str(meta.get('host', '')))})"), ("date", date),
                  ("made by", show_path(info.made_by)),
                  ("site-packages", show_path(str(meta.get("site_packages", "")))),
                  ("python", show_path(str(meta.get("python", ""))))]
        files = f"{info.files} ({human_bytes(int(meta.get('bytes', 0)))}), {info.changed} changed"
    fields += [("distribution", show_list(info.dists) or "-"),
               ("paths", show_list(map(str, meta.get("paths", []))))]
    if meta.get("kind") != "patch":  # a snapshot's scope; older ones do not say (unknown, not nothing)
        fields.append(("exclude", (show_list(map(str, meta["exclude"])) or "nothing") if "exclude" in meta
                       else "not recorded"))
    fields.append(("files", files))
    for label, value in fields:
        out.print(f"{label + ':':<15}{value}")
    if info.tags:
        out.print(f"tags:          {show_list(info.tags)}")
    if info.message:
        out.print(f"message:       {show_path(info.message)}")
    if result.changes is None:
        out.print(f"\nfirst snapshot of {show_path(info.node)}: {info.files} files")
    elif not result.changes.changes:
        out.print(f"\nno file changed from {result.parent[:10]}")
    else:
        from snapver.cli.diff import _stat

        out.print(f"\nchanged from {result.parent[:10]}:")
        _stat(result.changes)
    return 0


@app.command()
def fsck(json_out: bool = typer.Option(False, "--json", help="One JSON document on stdout.")) -> int:
    """Verify the store: every object, every manifest hash.

    Examples:
      snapver fsck
      snapver fsck --json
    """
    from snapver.errors import StoreError
    from snapver.ops.fsck import fsck as run_fsck

    config = STATE.config()
    store = STATE.store(config)
    result = run_fsck(store)
    if json_out:
        emit_json({**result.to_json(), "exit_code": 0 if result.ok else StoreError.exit_code})
    for problem in result.problems:
        console(stderr=True).print(f"[red]problem[/red]: {escape(problem)}")
    if not result.ok:
        raise StoreError(f"the store has {len(result.problems)} problem(s)", hint="see the lines above")
    if not json_out:
        console().print(f"store ok: {fsck_counts(result)} verified")
    return 0


def fsck_counts(result: "object") -> str:
    """What fsck checked, each number named: ``9 snapshots (as log lists them), 3 patch
    commits, 2 push records, 1204 blobs``."""
    kinds = result.kinds  # type: ignore[attr-defined]

    def count(number: int, what: str) -> str:
        return f"{number} {what}{'' if number == 1 else 's'}"

    parts = [count(kinds.get("snapshot", 0), "snapshot") + " (as log lists them)"]
    if kinds.get("patch"):
        parts.append(count(kinds["patch"], "patch commit"))
    if kinds.get("push"):
        parts.append(count(kinds["push"], "push record"))
    parts.append(count(result.blobs, "blob"))  # type: ignore[attr-defined]
    return ", ".join(parts)
