"""Every table and summary line at 80 columns, on real data: two SSH nodes holding the
sglang wheel's tree at long site-packages paths, a pushed patch with a long name, a
hot-fix of a long path, and a process that needs a restart. Run in a real pseudo-terminal:
no line wider than 80, nothing cut, nothing broken inside a word."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from terminal import run_in_terminal

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
RUNNER = "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py"
DFLASH = "sglang/srt/speculative/dflash_worker_v2.py"
PATCH = "patch-cudagraph-bs-fix"


def screen(*args: str, columns: int = 80) -> list[str]:
    shown = run_in_terminal(*args, columns=columns, env={"SNAPVER_PAGER": "cat"})
    assert shown.code in (0, 1), shown
    # What stays on the screen: a carriage return starts the line again (a progress bar
    # redrawn); text written after a bar without one is glued to it.
    return [line.rsplit("\r", 1)[-1] for line in ANSI.sub("", shown.text).splitlines()]


def assert_fits(lines: list[str], *whole: str) -> None:
    """No line over 80 columns; each of ``whole`` (a path, a name, an id) on one line, uncut."""
    assert all(len(line) <= 80 for line in lines), "\n".join(line for line in lines if len(line) > 80)
    text = "\n".join(lines)
    assert "…" not in text, text
    for word in whole:
        assert word in text, (word, text)


@pytest.fixture
def fleet(sglang_site_template: Path, ssh_node, write_config, run_snapver) -> Iterator[dict]:
    root = Path(tempfile.mkdtemp(prefix="sv-"))  # /tmp/sv-xxxxxxxx: real-length paths below it
    sites = {name: root / name / "root/venv_sglang211/lib/python3.12/site-packages" for name in ("ct200", "ct129")}
    for site in sites.values():
        shutil.copytree(sglang_site_template, site, symlinks=True)
    write_config({name: ssh_node(name, site) for name, site in sites.items()}, groups={"tp8": ["ct200", "ct129"]})
    assert run_snapver("pull", "tp8").code == 0
    made = run_snapver("patch", "new", PATCH, "--base", "ct200", "--nodes", "tp8")
    assert made.code == 0, made
    checkout = Path(made.out.strip())
    with open(checkout / RUNNER, "a") as handle:
        handle.write("# skip capture above bs 256\n")
    assert run_snapver("patch", "save", PATCH, "-m", "skip capture above bs 256").code == 0
    # A process of ct200's deployment, started before the push: it needs a restart after it.
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                              env={**os.environ, "PYTHONPATH": str(sites["ct200"])})
    time.sleep(0.05)
    pushed = run_snapver("push", PATCH, "--yes")
    assert pushed.code == 0, pushed
    with open(sites["ct129"] / DFLASH, "a") as handle:
        handle.write("# hot-fix by hand\n")
    try:
        yield {"sites": {name: str(site) for name, site in sites.items()}, "server": server}
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(root, ignore_errors=True)


def test_status_nodes_and_pull_fit_80_columns(fleet: dict, run_snapver) -> None:
    import json

    document = json.loads(run_snapver("status", "--json").out)
    rows = {row["node"]: row for row in document["nodes"]}
    assert rows["ct200"]["restart_needed"] == 1 and rows["ct129"]["known_good"]["hot_fixed"] == 1, rows
    status = screen("status")
    assert_fits(status, PATCH, RUNNER, DFLASH, rows["ct200"]["snapshot"][:7], rows["ct129"]["snapshot"][:7])
    for name in ("ct200", "ct129"):
        assert any(line.startswith(name) for line in status), status
    assert "restart" in "\n".join(status)  # the restart column stays, its count said
    wide = screen("status", "-w")  # every cell whole, each row on one line
    assert sum(1 for line in wide if line.startswith(("ct200 ", "ct129 "))) == 2, wide

    nodes = screen("nodes", "--check")
    checked = json.loads(run_snapver("nodes", "--check", "--json").out)["nodes"][0]["python"]
    python = checked[checked.index("(") + 1:-1]  # "3.11.7 (/path/to/python3)": the node's, not the tests'
    assert_fits(nodes, *fleet["sites"].values(), python)

    pulled = screen("pull", "tp8")
    assert_fits(pulled)
    result_lines = [line for line in pulled if line.startswith(("ct200", "ct129"))]
    assert len(result_lines) == 2 and all("unchanged" in line or "snapshot" in line for line in result_lines), pulled
    assert not any("bytes" in line and ("unchanged" in line or "snapshot" in line) for line in pulled), pulled
