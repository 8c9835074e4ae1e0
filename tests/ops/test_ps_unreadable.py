"""Processes the node's user cannot read (another user's, one with more capabilities, as
pid 1 `process_api` on these machines): warned about only when they could run the tree.

The real case is made in a PID namespace of its own (only this test's processes in its
/proc), with `snapver ps` run without capabilities (processes that hold some cannot be read
by it): `sleep` (not a Python, unreadable) is not named; `python3` (unreadable, could
import the tree) is.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers import toml_dumps

from snapver.transport.agent.procs import may_run_tree

REPO = Path(__file__).resolve().parents[2]
SITE = "/opt/venv/lib/python3.12/site-packages"


@pytest.mark.parametrize(("argv", "expected"), [
    (["/process_api", "--firecracker-init", "--addr", "0.0.0.0:2024"], False),  # a program, not a Python
    (["sleep", "60"], False),  # found on PATH: not a Python
    (["python3", "-c", "import time"], True),
    (["/opt/venv/bin/python", "-m", "sglang.launch_server"], True),
    (["sglang::scheduler_TP0"], True),  # renamed by setproctitle: may be a Python
    (["/usr/bin/env", f"PYTHONPATH={SITE}", "thing"], True),  # names site-packages
    ([sys.executable, "-m", "snapver.ops.compact"], False),  # snapver's own
])
def test_which_unreadable_processes_could_run_the_tree(argv: list[str], expected: bool) -> None:
    assert may_run_tree(argv, SITE, "/opt/venv", ["/usr/bin", "/bin"]) is expected


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv"),
                    reason="needs root (a PID namespace), unshare and setpriv")
def test_an_unreadable_process_that_cannot_run_the_tree_is_not_warned_about(make_site_packages) -> None:
    """`pid 1 (process_api) could not be read` came on every push, rollback and ps."""
    shared = Path(tempfile.mkdtemp(prefix="snapver-ps-unreadable-"))
    try:
        site = shared / "site-packages"
        (site / "sglang" / "srt").mkdir(parents=True)
        (site / "sglang" / "srt" / "a.py").write_text("a = 1\n")
        config = shared / "snapver.toml"
        config.write_text(toml_dumps({"store": {"path": "snapshots"},
                                      "nodes": {"laptop": {"local": True, "site_packages": str(site)}}}))
        script = (
            "sleep 60 & echo sleep=$!; python3 -c 'import time; time.sleep(60)' & echo python=$!; "
            # snapver without capabilities: a process holding some is unreadable to it, as pid 1 is here.
            f"setpriv --bounding-set=-all --inh-caps=-all env HOME={shared} PYTHONPATH={REPO} "
            f"{sys.executable} -m snapver --config {config} ps --json; kill %1 %2"
        )
        done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", script],
                              capture_output=True, text=True, timeout=60, cwd=shared)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    assert "{" in done.stdout, (done.stdout, done.stderr)
    pids = dict(line.split("=") for line in done.stdout.splitlines() if line.startswith(("sleep=", "python=")))
    document = json.loads(done.stdout[done.stdout.index("{"):])
    node = document["nodes"][0]
    named = {entry["pid"]: entry["name"] for entry in node["unreadable_named"]}
    assert int(pids["python"]) in named, (named, done.stderr)  # could import the tree: said
    assert int(pids["sleep"]) not in named and 1 not in named, named  # `sleep`, `sh`: not Pythons
    assert node["unreadable"] == len(named) == 1, node
