"""`snapver fsck`: parse, call one operation, render."""

from __future__ import annotations

from snapver.cli.app import app
from snapver.cli.options import JsonOpt
from snapver.cli.render import console, emit_json, escape
from snapver.cli.state import STATE


@app.command()
def fsck(json_out: JsonOpt = False) -> int:
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


def fsck_counts(result: object) -> str:
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
