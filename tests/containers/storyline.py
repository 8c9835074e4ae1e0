"""The whole story on a node in a container, shared by the local and the SSH tests:
pull, a hot-fix inside the container, diff, patch capture, push, ps, rollback. Every
result is checked inside the container with its own tools (sha256sum, cat), not snapver's."""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dockerkit

FILE = "sglang/srt/utils/aiter.py"  # a file of the fixture wheel's tree
HOTFIX = "sglang/srt/utils/auth.py"


def in_container_path(rel: str) -> str:
    return f"{dockerkit.SGLANG_PYTHON}/{rel}"


def container_bytes(name: str, rel: str) -> bytes:
    return dockerkit.docker("exec", name, "cat", in_container_path(rel)).stdout


def container_sha256(name: str, rel: str) -> str:
    return dockerkit.docker("exec", name, "sha256sum", in_container_path(rel)).stdout.split()[0].decode()


def write_patch(template: Path, rel: str, out: Path) -> bytes:
    """A unified diff changing one line of ``rel`` (a/ b/ prefixes); returns the new content."""
    old = (template / rel).read_text()
    new = old.replace("\n", "\n# patched by the container test\n", 1)
    out.write_text("".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{rel}", f"b/{rel}")))
    return new.encode()


def story(run: Callable[..., Any], name: str, node: str, template: Path, tmp_path: Path) -> None:
    """The verbs, in order, on ``node`` (the container ``name``); asserts each outcome."""
    original = container_sha256(name, FILE)
    assert original == hashlib.sha256((template / FILE).read_bytes()).hexdigest()

    result = run("pull", node)
    assert result.code == 0, result
    result = run("diff", node, "-q")
    assert result.code == 0, result  # diff(1)'s codes: 0 the same, 1 different

    # A hot-fix by hand inside the container: diff and status see it.
    dockerkit.exec_in(name, f"echo '# hot-fix' >> {in_container_path(HOTFIX)}")
    result = run("diff", node)
    assert result.code == 1, result
    assert HOTFIX in result.out and "+# hot-fix" in result.out, result
    result = run("status", node, "--json")
    assert result.code == 1, result  # drift
    row = json.loads(result.out)["nodes"][0]
    assert row["reachable"] is True and [d["path"] for d in row["drift"]] == [HOTFIX], result.out

    # Capture the hot-fix as a patch: its diff holds exactly that line.
    result = run("patch", "capture", "hot", node, "--base", node)
    assert result.code == 0, result
    result = run("patch", "export", "hot")
    assert result.code == 0 and "+# hot-fix" in result.out and HOTFIX in result.out, result

    # Push a patch written here: the file in the container is the patched one.
    dockerkit.exec_in(name, f"sed -i '$ d' {in_container_path(HOTFIX)}")  # the hot-fix undone by hand
    diff_file = tmp_path / "fix.diff"
    patched = write_patch(template, FILE, diff_file)
    result = run("patch", "import", "fix", str(diff_file), "--base", node, "--nodes", node)
    assert result.code == 0, result
    dockerkit.docker("exec", "-d", "-w", dockerkit.SGLANG_PYTHON, name, "python3", "-c",
                     "import time; time.sleep(300)")
    result = run("push", "fix", "--yes")
    assert result.code == 0, result
    assert container_bytes(name, FILE) == patched
    leftovers = dockerkit.exec_in(name, f"find {dockerkit.SGLANG_PYTHON} -name '.snapver-*'").stdout
    assert leftovers == b"", leftovers

    # ps: the container's own python, started before the push, runs old code.
    result = run("ps", node, "--json")
    assert result.code == 1, result  # a process needs a restart
    rows = json.loads(result.out)
    processes = [p for n in rows["nodes"] for p in n["processes"]]
    assert any("time.sleep(300)" in p["command"] and p["restart_needed"] for p in processes), result.out

    # Roll back: the original file again.
    result = run("rollback", node, "--yes")
    assert result.code == 0, result
    assert container_sha256(name, FILE) == original
    dockerkit.exec_in(name, "pkill -f 'time.sleep(300)' || true", check=False)
