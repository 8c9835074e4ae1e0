"""`push` says, before its plan, when the patch's checkout (made by `patch new`) holds edits
that `patch save` has not recorded: what would be pushed is the saved patch, not them."""

from __future__ import annotations

import json
from pathlib import Path

from snapver_inproc import run_inproc

SRT = "sglang/srt"
WORKER = f"{SRT}/speculative/dflash_worker.py"
NOTE = "patch fix-draft: its folder has edits not saved (snapver patch save fix-draft)"


def test_push_notes_unsaved_edits_in_the_patch_folder(make_site_packages, ssh_node, write_config) -> None:
    site = make_site_packages("ct200", files={WORKER: "draft = 1\n", f"{SRT}/a.py": "a = 1\n"})
    write_config({"ct200": ssh_node("ct200", site)})
    assert run_inproc("pull", "ct200").code == 0
    made = run_inproc("patch", "new", "fix-draft", "--base", "ct200", "--nodes", "ct200")
    assert made.code == 0, made
    folder = Path(made.out.strip())
    clean = run_inproc("push", "fix-draft", "--dry-run")
    assert NOTE not in clean.out + clean.err, clean  # a checkout as saved: nothing to say
    (folder / WORKER).write_text("draft = 2\n")
    assert run_inproc("patch", "save", "fix-draft").code == 0
    (folder / WORKER).write_text("draft = 3  # still being edited\n")
    pending = run_inproc("push", "fix-draft", "--dry-run")
    assert pending.code == 0, pending
    assert pending.err.splitlines()[0] == f"note: {NOTE}", pending
    assert "push fix-draft" in pending.out  # the plan follows, of the saved patch
    document = json.loads(run_inproc("push", "fix-draft", "--dry-run", "--json").out)
    assert document["unsaved"] == [WORKER]
    assert run_inproc("patch", "save", "fix-draft").code == 0
    saved = run_inproc("push", "fix-draft", "--dry-run")
    assert NOTE not in saved.out + saved.err, saved
