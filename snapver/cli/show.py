"""`snapver show`: parse, call one operation, render."""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import typer

from snapver.cli.app import app
from snapver.cli.render import HeldOutput, console, emit_json, escape, human_bytes, show_list, show_path
from snapver.cli.state import STATE

if TYPE_CHECKING:
    from snapver.model import Entry


def _emit_file_json(snapshot: str, path: str, file: Entry, pieces: Iterator[bytes]) -> None:
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


def _container_line(container: dict) -> str:
    """A snapshot's container, as recorded: engine and name, container id, image id."""
    from snapver.ops.layer import short_id

    if "exec" in container:
        return (f"not known (reached through exec {show_path(str(container['exec']))} …: "
                "its runtime is not asked for ids)")
    where = show_path(f"{container.get('engine', '?')}:{container.get('name', '?')}")
    if not container.get("id"):
        return f"{where} (ids not known: its engine did not answer)"
    return f"{where} {escape(short_id(container['id']))}, image {escape(short_id(container.get('image')))}"


def _live_node(config: object, ref: str | None) -> str | None:
    """The node of a ``NODE@live`` ref, else None."""
    from snapver.config import Config

    assert isinstance(config, Config)
    if ref is None:
        return None
    node = config.live_name(ref)
    return node if node != ref else None


def _show_live(config: object, node: str, ref: str, path: str | None, json_out: bool) -> int:
    """`show NODE@live PATH`: the live file, written as it arrives."""
    from snapver.errors import UsageError
    from snapver.ops.show_live import show_live

    if path is None:
        raise UsageError(f"{ref!r} is a live tree: only a snapshot fits here, or a file of the live tree",
                         hint=f"snapver show {ref} PATH (or `snapver show {node}` for its newest snapshot)")
    if json_out:
        raise UsageError("--json shows a snapshot's file, not a live one",
                         hint=f"snapver show {node}@latest {path} --json")
    live = show_live(config, node, path)  # type: ignore[arg-type]
    try:
        out = sys.stdout.buffer
        for piece in live.pieces:
            out.write(piece)
        out.flush()
    finally:
        live.close()
    return 0


@app.command()
def show(
    ref: str | None = typer.Argument(None, help="A snapshot: tag, node, node~2, node@may22, hex id … "
                                     "(default: the newest); NODE@live with a PATH: the live file."),
    path: str | None = typer.Argument(None, help="A file as after `diff --`: relative to site-packages "
                                      "or a tracked path, a file name, or a glob naming one file."),
    json_out: bool = typer.Option(False, "--json", help="Metadata as JSON."),
) -> int:
    """A snapshot's metadata, or one file's content in it.

    With no REF, the newest snapshot of any node (as `git show`).

    Examples:
      snapver show ct200      # its newest snapshot, and what it changed
      snapver show may22 server_args.py
      snapver show ct200@live dflash_worker.py   # the live file
    """
    from snapver.ops.log import content
    from snapver.ops.log import show as run_show

    config = STATE.config()
    live_node = _live_node(config, ref)
    if live_node is not None:
        return _show_live(config, live_node, ref or "", path, json_out)
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
                                 "blake3": e.digest} for e in result.manifest or []],
                   "environment": result.environment.to_json() if result.environment else None, "exit_code": 0})
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
        install = meta.get("install")
        if isinstance(install, dict):  # an editable or source install: what the node's Python found
            checkout = f" (checkout {install['checkout']})" if install.get("checkout") else ""
            fields.append(("install", show_path(f"{install.get('how', '?')} at {install.get('root', '?')}{checkout}")))
        if isinstance(meta.get("container"), dict):
            fields.append(("container", _container_line(meta["container"])))
        files = f"{info.files} ({human_bytes(int(meta.get('bytes', 0)))}), {info.changed} changed"
    fields += [("distribution", show_list(info.dists) or "-"),
               ("paths", show_list(map(str, meta.get("paths", []))))]
    if meta.get("kind") != "patch":  # a snapshot's scope; older ones do not say (unknown, not nothing)
        fields.append(("exclude", (show_list(map(str, meta["exclude"])) or "nothing") if "exclude" in meta
                       else "not recorded"))
    fields.append(("files", files))
    if meta.get("kind") != "patch":
        fields.append(("environment", show_path(result.environment.summary()) if result.environment
                       else "not recorded"))
    for label, value in fields:
        out.print(f"{label + ':':<15}{value}")
    if info.tags:
        out.print(f"tags:          {show_list(info.tags)}")
    if info.message:
        out.print(f"message:       {show_path(info.message)}")
    if result.changes is None:
        out.print(f"\nfirst snapshot of {show_path(info.node)}: {info.files} files")
    elif not result.changes.changes:
        out.print(f"\nno file changed from {(result.parent or '')[:10]}")
    else:
        from snapver.cli.diff import print_stat

        out.print(f"\nchanged from {(result.parent or '')[:10]}:")
        print_stat(result.changes)
    return 0
