"""`snapver sync`: share the store through `[store] remote` (parse, call store.team.sync, render)."""

from __future__ import annotations

import typer

from snapver.cli.app import app
from snapver.cli.options import JsonOpt
from snapver.cli.render import console, emit_json, escape, show_path
from snapver.cli.state import STATE


@app.command()
def sync(
    json_out: JsonOpt = False,
    reclaim: bool = typer.Option(False, "--reclaim", help="Replace refs under this store's writer id that "
                                 "another store published (one that used the same id and is gone)."),
) -> int:
    """Fetch every writer's snapshots, tags, patches and push records from \\[store] remote,
    then publish this store's own under its writer id.

    Exit 0 when done, 1 when a tag names different snapshots for two writers (shown; fix
    it with `tag --force`), 3 when the remote cannot be reached or refuses, 4 when the
    store is locked.

    Examples:
      snapver sync
      snapver sync --json
      snapver sync --reclaim
    """
    from snapver.errors import ConfigError
    from snapver.store.team import sync as run_sync

    config = STATE.config()
    if not config.remote:
        where = config.path or ".snapver"
        raise ConfigError(f"{where}: store.remote: not set, so there is nothing to sync with",
                          hint='add remote = "git@host:team/snapshots.git" (or a path) to the [store] table')
    result = run_sync(STATE.store(config, create=True), config.remote, reclaim=reclaim)
    code = 1 if result.tag_conflicts else 0
    if json_out:
        emit_json({**result.to_json(), "exit_code": code})
        return code
    out = console()
    if result.unchanged:
        out.print(f"up to date with {escape(result.remote)} (writer {show_path(result.writer)})")
    else:
        got = f"fetched from {escape(', '.join(result.fetched))}" if result.fetched else "nothing new from others"
        sent = f"published {result.pushed} ref(s)" if result.pushed else "nothing to publish"
        out.print(f"synced with {escape(result.remote)} as {show_path(result.writer)}: {got}; {sent}"
                  + (f", removed {result.deleted}" if result.deleted else "")
                  + (f"; reclaimed {len(result.reclaimed)} ref(s) another store had published as "
                     f"{escape(repr(result.writer))}" if result.reclaimed else ""))
    for move in result.tag_moves:
        by = f" by {', '.join(escape(repr(writer)) for writer in move['by'])}" if move["by"] else ""
        out.print(f"tag {escape(move['tag'])} moved {move['old'][:10]} → {move['new'][:10]}{by}")
    err = console(stderr=True)
    for dated in result.future:
        err.print(f"warning: {escape(repr(dated['writer']))}'s {escape(dated['ref'])} {dated['commit'][:10]} is dated "
                  f"{_span(dated['ahead_seconds'])} in the future (a clock set ahead?): snapshots are ordered by "
                  "what each writer saw, not by that time")
    for name, values in sorted(result.tag_conflicts.items()):
        shown = " and ".join(f"{commit[:10]} ({show_path(writer)})" for writer, commit in sorted(values.items()))
        err.print(f"conflict: tag {escape(name)} names {shown}; pick one with `snapver tag --force {escape(name)} REF`")
    for name, versions in sorted(result.diverged_patches.items()):
        shown = ", ".join(f"{show_path(writer)} {commit[:10]}" for writer, commit in sorted(versions.items()))
        err.print(f"note: patch {escape(name)} has diverged versions ({shown}): see "
                  f"`snapver patch show {escape(name)} --history`")
    return code


def _span(seconds: int) -> str:
    """``1 day``, ``3 hours``, ``12 minutes``: how far ahead, roughly."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            count = round(seconds / size)
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds} seconds"
