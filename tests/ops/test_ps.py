"""`snapver ps` is exact (issue 32): real processes on real sshd nodes.

Each node is a real venv (``python -m venv``) holding a small tree; the processes are real
Pythons started from it that import modules of the tree, then wait (killed at teardown).
Every process is started after the node's first snapshot, so the node's history knows the
tree each one imported.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from wheelkit import make_venv

REPO_ROOT = Path(__file__).resolve().parents[2]
WHEELS = REPO_ROOT / ".test-wheels"  # scripts/test.sh downloads setproctitle there (PyPI)
MODULE = "sglang/srt/mod_a.py"
TREE = {"sglang/__init__.py": "", "sglang/srt/__init__.py": "", MODULE: "VALUE = 1\n",
        "sglang/srt/mod_b.py": "X = 1\n"}
# The process: puts the venv's site-packages on its path when told (``exec -a`` hides the
# venv from the interpreter, as a launcher would), renames itself when told, imports the
# modules named, says it is ready, and waits.
PROCESS = '''\
import ctypes, importlib, os, site, sys, time
if os.environ.get("ADD_SITE"):
    site.addsitedir(os.environ["ADD_SITE"])
if os.environ.get("EXTENSION"):
    import setproctitle
    if os.environ.get("TITLE"):
        setproctitle.setproctitle(os.environ["TITLE"])
for name in filter(None, os.environ.get("IMPORT", "").split(",")):
    importlib.import_module(name)
for path in filter(None, os.environ.get("LOAD", "").split(",")):
    ctypes.CDLL(path)
held = [open(path, "rb") for path in filter(None, os.environ.get("HOLD", "").split(","))]
open(os.environ["READY"], "w").close()
time.sleep(600)
'''


class Node:
    """A venv node with its tree, and the processes started from it."""

    def __init__(self, root: Path, system_site: bool = False) -> None:
        self.root = root
        if system_site:
            subprocess.run(
                [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(root / "venv")],
                check=True,
            )
            version = f"python{sys.version_info.major}.{sys.version_info.minor}"
            self.python, self.site = root / "venv" / "bin" / "python", root / "venv" / "lib" / version / "site-packages"
        else:
            self.python, self.site = make_venv(root / "venv")
        for rel, text in TREE.items():
            (self.site / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.site / rel).write_text(text)
        (root / "process.py").write_text(PROCESS)
        self.processes: list[subprocess.Popen] = []

    def start(self, imports: str = "sglang.srt.mod_a,sglang.srt.mod_b", argv0: str | None = None,
              **env: str) -> int:
        """A process of the venv's python that imported ``imports``; its pid once ready.
        No VIRTUAL_ENV, no PYTHONPATH: it is found by what it runs."""
        ready = self.root / f"ready-{len(self.processes)}"
        environ = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        environ.update(IMPORT=imports, READY=str(ready), **env)
        if argv0 is None:
            command = [str(self.python), str(self.root / "process.py")]
        else:
            command = ["bash", "-c", 'exec -a "$0" "$@"', argv0, str(self.python), str(self.root / "process.py")]
        process = subprocess.Popen(command, env=environ, cwd=self.root, start_new_session=True,
                                   stdin=subprocess.DEVNULL)
        self.processes.append(process)
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert process.poll() is None, f"the process ended ({process.returncode})"
            assert time.monotonic() < deadline, "the process never got ready"
            time.sleep(0.02)
        return process.pid

    def stop(self) -> None:
        for process in self.processes:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except OSError:
                pass
            process.wait()


def appended(path: str, before: str, line: str) -> str:
    after = before + line
    return "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{path}", f"b/{path}"))


@pytest.fixture
def make_node(tmp_path, write_config, ssh_node, run_snapver) -> Iterator[Callable[..., Node]]:
    """``make_node(**node_keys)`` → a venv node ct200, configured, pulled, with patch `bump`
    (VALUE = 2 at the end of mod_a.py) imported."""
    made: list[Node] = []

    def make(system_site: bool = False, before_pull: Callable[[Node], None] | None = None) -> Node:
        node = Node(tmp_path / "ct200", system_site)
        made.append(node)
        if before_pull is not None:
            before_pull(node)
        write_config({"ct200": ssh_node("ct200", node.site)})
        assert run_snapver("pull", "ct200").code == 0
        diff = tmp_path / "bump.diff"
        diff.write_text(appended(MODULE, TREE[MODULE], "VALUE = 2\n"))
        result = run_snapver("patch", "import", "bump", str(diff), "--base", "ct200")
        assert result.code == 0, result
        return node

    yield make
    for node in made:
        node.stop()


def ps_of(run_snapver, want_code: int | None = None) -> dict[int, dict]:
    """``snapver ps ct200 --json``: its processes by pid."""
    result = run_snapver("ps", "ct200", "--json")
    assert result.code in (0, 1) and "Traceback" not in result.err, result
    document = json.loads(result.out)
    assert document["exit_code"] == result.code
    if want_code is not None:
        assert result.code == want_code, result
    return {p["pid"]: p for p in document["nodes"][0]["processes"]}


def test_ps_exits_1_when_a_process_needs_a_restart_and_0_otherwise(make_node, run_snapver):
    node = make_node()
    pid = node.start()
    assert ps_of(run_snapver, 0)[pid]["restart_needed"] is False
    text = run_snapver("ps", "ct200")
    assert text.code == 0 and "current" in text.out, text

    assert run_snapver("push", "bump", "ct200", "--yes").code == 0
    found = ps_of(run_snapver, 1)[pid]
    assert found["restart_needed"] is True and found["files"] == [MODULE], found
    text = run_snapver("ps", "ct200")
    assert text.code == 1 and "1 need a restart" in text.out, text


def test_push_then_rollback_to_what_the_process_imported_is_no_restart(make_node, run_snapver):
    node = make_node()
    pid = node.start()
    assert run_snapver("push", "bump", "ct200", "--yes").code == 0
    assert ps_of(run_snapver, 1)[pid]["restart_needed"] is True
    result = run_snapver("rollback", "ct200", "--yes")
    assert result.code == 0 and "runs code older" not in result.out, result
    assert (node.site / MODULE).read_text() == TREE[MODULE]  # byte for byte what the process imported
    found = ps_of(run_snapver, 0)[pid]
    assert found["restart_needed"] is False and found["files"] == [], found
    status = run_snapver("status", "ct200", "--json")
    assert json.loads(status.out)["nodes"][0]["restart_needed"] == 0, status


def test_a_rollback_that_deletes_an_imported_module_flags_the_process(make_node, run_snapver, tmp_path):
    node = make_node()
    added = "sglang/srt/mod_new.py"
    diff = tmp_path / "add.diff"
    diff.write_text(f"--- /dev/null\n+++ b/{added}\n@@ -0,0 +1 @@\n+NEW = 1\n")
    assert run_snapver("patch", "import", "add", str(diff), "--base", "ct200").code == 0
    assert run_snapver("push", "add", "ct200", "--yes").code == 0
    pid = node.start("sglang.srt.mod_new")  # started on the pushed tree
    assert ps_of(run_snapver, 0)[pid]["restart_needed"] is False

    assert run_snapver("rollback", "ct200", "--yes").code == 0
    assert not (node.site / added).exists()
    found = ps_of(run_snapver, 1)[pid]
    assert found["restart_needed"] is True and found["files"] == [added], found
    assert "removed" in found["files_detail"][0]["why"], found


def test_a_push_that_keeps_mtimes_still_flags_the_process(make_node, run_snapver, tmp_path):
    node = make_node()
    reference = tmp_path / "mtime-reference"
    shutil.copy2(node.site / MODULE, reference)
    pid = node.start()
    assert run_snapver("push", "bump", "ct200", "--yes").code == 0
    subprocess.run(["touch", "-r", str(reference), str(node.site / MODULE)], check=True)  # as cp -p, rsync -t
    assert os.stat(node.site / MODULE).st_mtime_ns == os.stat(reference).st_mtime_ns
    found = ps_of(run_snapver, 1)[pid]
    assert found["restart_needed"] is True and found["files"] == [MODULE], found


def _with_setproctitle(node: Node) -> None:
    """pip-installs the real setproctitle wheel into the node's venv (no index)."""
    wheels = sorted(WHEELS.glob("setproctitle-*.whl"))
    if not wheels:
        WHEELS.mkdir(exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:", "--no-deps",
                        "-d", str(WHEELS), "setproctitle"], check=True, timeout=300)
        wheels = sorted(WHEELS.glob("setproctitle-*.whl"))
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(node.python), "install", "--no-index",
                           "--no-deps", "-q", str(wheels[-1])], capture_output=True, text=True,
                          env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert done.returncode == 0, done.stderr


def _cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def test_renamed_processes_are_listed_and_flagged(make_node, run_snapver):
    """SGLang's scheduler renames itself with setproctitle (cmdline rewritten, environ
    emptied); a process started with ``exec -a NAME`` has a made-up argv[0]. Neither has
    VIRTUAL_ENV or PYTHONPATH: both are found by the extension modules they map from
    site-packages."""
    node = make_node(before_pull=_with_setproctitle)
    renamed = node.start(EXTENSION="1", TITLE="sglang::scheduler_TP0")
    assert _cmdline(renamed).rstrip(b"\0") == b"sglang::scheduler_TP0"
    disguised = node.start(argv0="sglang::detokenizer", EXTENSION="1", ADD_SITE=str(node.site))
    assert _cmdline(disguised).startswith(b"sglang::detokenizer\0")
    found = ps_of(run_snapver, 0)
    assert {renamed, disguised} <= set(found), found

    assert run_snapver("push", "bump", "ct200", "--yes").code == 0
    found = ps_of(run_snapver, 1)
    for pid in (renamed, disguised):
        assert found[pid]["restart_needed"] is True and found[pid]["files"] == [MODULE], found[pid]
    assert found[renamed]["command"] == "sglang::scheduler_TP0"


def test_a_python_holding_a_tree_file_open_is_listed(make_node, run_snapver):
    """Renamed, no venv, nothing mapped from site-packages: the file of the tree it holds
    open says it runs the tree."""
    node = make_node()
    pid = node.start("", argv0="sglang::loader", HOLD=str(node.site / MODULE))
    found = ps_of(run_snapver, 0)
    assert pid in found and "has 1 file(s) of the tree open" in found[pid]["reasons"], found


C_SOURCE = "int snapver_value(void) { return %d; }\n"


def _build_so(folder: Path, value: int) -> Path:
    source = folder / f"tiny{value}.c"
    source.write_text(C_SOURCE % value)
    built = folder / f"tiny{value}.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(built), str(source)], check=True)
    return built


def test_a_mapped_extension_replaced_by_a_push_is_certain_and_by_the_same_bytes_is_not(make_node, run_snapver,
                                                                                        tmp_path):
    rel = "sglang/srt/_tiny.so"
    first, second = _build_so(tmp_path, 1), _build_so(tmp_path, 2)
    node = make_node(before_pull=lambda n: shutil.copy(first, n.site / rel))
    folder = run_snapver("patch", "new", "newso", "--base", "ct200")
    assert folder.code == 0, folder
    shutil.copy(second, Path(folder.out.strip()) / rel)
    assert run_snapver("patch", "save", "newso").code == 0
    pid = node.start("", LOAD=str(node.site / rel))
    assert rel in ps_of(run_snapver, 0)[pid]["mapped"]

    assert run_snapver("push", "newso", "ct200", "--yes").code == 0
    found = ps_of(run_snapver, 1)[pid]
    assert found["restart_needed"] is True and found["certain"] is True and found["files"] == [rel], found

    # Rolled back: a new inode with the bytes the process mapped.
    assert run_snapver("rollback", "ct200", "--yes").code == 0
    assert (node.site / rel).read_bytes() == first.read_bytes()
    found = ps_of(run_snapver, 0)[pid]
    assert found["restart_needed"] is False and found["certain"] is False, found
    assert [(f["path"], f["same_content"]) for f in found["files_detail"]] == [(rel, True)], found
    text = run_snapver("ps", "ct200")
    assert "replaced by the same bytes" in text.out, text


GIT_WRAPPER = '''#!/bin/sh
# git, except that a repack waits (at most a minute) until the test releases it
for arg in "$@"; do
  if [ "$arg" = repack ]; then
    i=0; while [ ! -e "{release}" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
  fi
done
exec {git} "$@"
'''


def _processes_running(marker: bytes) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if marker in _cmdline(int(name)):
                    found.append(int(name))
            except OSError:
                pass
    return found


def test_the_background_compaction_pull_starts_is_not_listed(make_node, run_snapver, tmp_path, isolated_env):
    """snapver runs from the deployment's venv (its own dependencies from the system's
    site-packages); a pull with enough raw bytes behind it starts the compaction, held in
    its repack while ps looks."""
    node = make_node(system_site=True)
    store = isolated_env / "snapshots"
    (store / "snapver" / "compact.json").write_text(json.dumps({"raw_bytes": 64 << 20}))
    tools, release = tmp_path / "tools", tmp_path / "release"
    tools.mkdir()
    (tools / "git").write_text(GIT_WRAPPER.format(release=release, git=shutil.which("git")))
    (tools / "git").chmod(0o755)
    (node.site / "sglang/srt/mod_b.py").write_text("X = 2\n")  # something to pull
    env = {**os.environ, "SNAPVER_AUTO_GC": "1", "PATH": f"{tools}:{os.environ['PATH']}",
           "PYTHONPATH": str(REPO_ROOT)}
    env.pop("VIRTUAL_ENV", None)
    pulled = subprocess.run([str(node.python), "-m", "snapver", "pull", "ct200"], env=env, capture_output=True,
                            text=True, timeout=120)
    try:
        assert pulled.returncode == 0, pulled
        compaction = _processes_running(b"snapver.store.gc\0" + str(store).encode())
        assert len(compaction) == 1, compaction
        assert _cmdline(compaction[0]).startswith(str(node.python).encode() + b"\0")
        found = ps_of(run_snapver)
        assert compaction[0] not in found, found[compaction[0]]
    finally:
        release.touch()
        deadline = time.monotonic() + 60
        while _processes_running(b"snapver.store.gc\0" + str(store).encode()) and time.monotonic() < deadline:
            time.sleep(0.1)


def test_snapvers_own_agents_are_recognised_by_their_command_line():
    """Pure: the agent's bootstrap, the compaction and the persistent connection's command
    lines are snapver's; a user's process named like them is not."""
    from snapver.transport.agent.procs import is_snapvers
    from snapver.transport.base import agent_command

    bootstrap = agent_command("/venv/bin/python", no_site=True)
    code = bootstrap.split(" -S -c ", 1)[1]
    import shlex

    assert is_snapvers(["/venv/bin/python", "-S", "-c", shlex.split(code)[0]])
    assert is_snapvers(["/venv/bin/python", "-m", "snapver.store.gc", "/store"])
    assert is_snapvers(["/usr/bin/python3", "-m", "snapver.transport.mux", "/sock", "60"])
    assert is_snapvers(["/venv/bin/python", "-m", "snapver", "pull"])
    assert not is_snapvers(["/venv/bin/python", "-m", "sglang.launch_server", "--served-model-name", "snapver"])
    assert not is_snapvers(["snapver-agent"])
    assert not is_snapvers(["/venv/bin/python", "-c", "print('snapver-agent')"])
    assert not is_snapvers(["/venv/bin/python", "server.py", "-m", "snapver.store.gc"])
