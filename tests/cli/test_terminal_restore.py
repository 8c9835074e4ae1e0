"""Ctrl-C gives the terminal back cleanly: the progress bar shows the cursor again and
leaves no half line; a prompt is left on its own line before `snapver: interrupted`."""

from __future__ import annotations

import re
from pathlib import Path

from terminal import run_in_terminal

SRT = "sglang/srt"


def test_ctrl_c_during_a_pull_restores_the_cursor(make_site_packages, write_config, local_node) -> None:
    files = {f"{SRT}/m{index}.py": f"x = {index}\n" * 20000 for index in range(600)}
    write_config({"laptop": local_node(make_site_packages("laptop", files=files))})
    shown = run_in_terminal("pull", interrupt_on=b"pulling laptop: ", env={"SNAPVER_AUTO_GC": "0"})
    assert shown.code == 130, shown
    text = shown.text
    assert "\x1b[?25l" in text and text.rindex("\x1b[?25h") > text.rindex("\x1b[?25l"), text[-300:]  # cursor back
    # The bar's line is erased (or ended) before the message: it starts a clean line.
    assert re.search(r"(\n|\x1b\[2K)snapver: interrupted\n$", text), repr(text[-300:])


def test_ctrl_c_at_a_prompt_leaves_its_line(make_site_packages, write_config, local_node, run_snapver) -> None:
    site = make_site_packages("laptop", files={f"{SRT}/a.py": "a = 1\n"})
    write_config({"laptop": local_node(site)})
    assert run_snapver("pull").code == 0
    folder = Path(run_snapver("patch", "new", "fix", "--base", "laptop").out.splitlines()[-1])
    (folder / SRT / "a.py").write_text("a = 2\n")
    assert run_snapver("patch", "save", "fix").code == 0
    shown = run_in_terminal("push", "fix", "laptop", interrupt_on=b"[y/N]: ", settle=0.5)
    assert shown.code == 130, shown
    assert re.search(r"\[y/N\]: \nsnapver: interrupted\n$", shown.text), repr(shown.text[-200:])
    assert (site / SRT / "a.py").read_text() == "a = 1\n"  # nothing written
