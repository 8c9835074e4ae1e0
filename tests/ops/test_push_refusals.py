"""A push refused for a symlink on the node names that symlink — the one on the file's way,
not its folder, the tracked root or another link — over ssh, where the user must go and look."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

DEEP = "sglang/srt/layers/deep/more/x.py"


@pytest.mark.parametrize("linked", ["sglang/srt/layers", "sglang/srt/layers/deep", "sglang/srt/layers/deep/more"])
def test_a_refused_push_names_the_symlink_on_the_way(make_site_packages, ssh_node, write_config, run_snapver,
                                                    tmp_path: Path, linked: str) -> None:
    site = make_site_packages("ct200", files={DEEP: "x = 1\n", "sglang/srt/b.py": "b = 1\n"})
    write_config({"ct200": ssh_node("ct200", site)})
    assert run_snapver("pull", "ct200").code == 0
    diff = tmp_path / "x.diff"
    diff.write_text(f"--- a/{DEEP}\n+++ b/{DEEP}\n@@ -1 +1 @@\n-x = 1\n+x = 2\n")
    assert run_snapver("patch", "import", "fix", str(diff), "--base", "ct200").code == 0
    # Move the folder away and leave a link to it: the file reads the same through it.
    moved = tmp_path / "elsewhere" / Path(linked).name
    moved.parent.mkdir()
    os.rename(site / linked, moved)
    os.symlink(moved, site / linked)
    result = run_snapver("push", "fix", "ct200", "--yes")
    assert result.code == 1, result
    line = next(line for line in result.err.splitlines() if line.startswith("snapver: error: "))
    assert line.endswith(f"{DEEP}: passes through the symlink {site / linked}"), result
    assert (moved / DEEP[len(linked) + 1:]).read_text() == "x = 1\n"  # nothing written through it
