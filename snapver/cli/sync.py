"""`snapver sync`: share the store through `[store] remote` (parse, call store.team.sync, render)."""

from __future__ import annotations

import typer

from snapver.cli.app import app
from snapver.cli.render import console, emit_json, escape, show_path
from snapver.cli.state import STATE


@app.command()
def sync(
    json_out: bool = typer.Option(False, "--json", help="One JSON document on stdout."),
) -> int:
    """Fetch every writer's snapshots, tags, patches and push records from [store] remote,
    then publish this store's own under its writer id.

    Exit 0 when done, 1 when a tag names different snapshots for two writers (shown; fix
    it with `tag --force`), 3 when the remote cannot be reached or refuses, 4 when the
    store is locked.

    Examples:
      snapver sync
      snapver sync --json
    """
    from snapver.errors import ConfigError
    from snapver.store.team import sync as run_sync

    config = STATE.config()
    if not config.remote:
        where = config.path or ".snapver"
        raise ConfigError(f"{where}: store.remote: not set, so there is nothing to sync with",
                          hint='add remote = "git@host:team/snapshots.git" (or a path) to the [store] table')
    result = run_sync(STATE.store(config, create=True), config.remote)
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
                  + (f", removed {result.deleted}" if result.deleted else ""))
    err = console(stderr=True)
    for name, values in sorted(result.tag_conflicts.items()):
        shown = " and ".join(f"{commit[:10]} ({show_path(writer)})" for writer, commit in sorted(values.items()))
        err.print(f"conflict: tag {escape(name)} names {shown}; pick one with `snapver tag --force {escape(name)} REF`")
    for name, versions in sorted(result.diverged_patches.items()):
        shown = ", ".join(f"{show_path(writer)} {commit[:10]}" for writer, commit in sorted(versions.items()))
        err.print(f"note: patch {escape(name)} has diverged versions ({shown}): see "
                  f"`snapver patch show {escape(name)} --history`")
    return code
