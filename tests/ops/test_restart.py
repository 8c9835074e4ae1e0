"""Patches that reach the running server (issue 16): `snapver ps`, restart-needed lines after
push, restart and health hooks, canary waves, on real long-running processes.

Each node is a real venv. The key tests (``real=True``) use a venv made once per module
with ``python -m venv`` and ``pip install --no-deps --no-index`` of the fixture sglang wheel,
copied (``cp -a``) to each node; the others a small sglang-like tree in a bare venv (fast).
A node's server is a real HTTP server started from the venv's python that imports a module
of the tree (``sglang.srt.environ`` in the real tree: standard library only) and serves
``/health``. The servers are started by ``serve.sh`` (the same script the restart hook
runs) and killed at teardown.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import tree_hashes
from wheelkit import make_venv, pip_install

from snapver.config import load_config
from snapver.ops.patch import import_patch
from snapver.ops.pull import pull as pull_nodes
from snapver.store.repo import Store

SYNTHETIC_MODULE = "sglang/srt/app_mod.py"
REAL_MODULE = "sglang/srt/environ.py"  # imports nothing but the standard library
SERVER = '''\
import importlib
import os
import sys
import sysconfig
import types
from http.server import BaseHTTPRequestHandler, HTTPServer

# sglang/__init__.py imports numpy and torch, which the venv lacks: the server imports one
# module of the tree through the import system, under an empty parent package.
package = types.ModuleType("sglang")
package.__path__ = [os.path.join(sysconfig.get_paths()["purelib"], "sglang")]
sys.modules["sglang"] = package
module = importlib.import_module(sys.argv[2])  # the tree's code: a broken module fails the start


class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        code = {"/health": 200, "/fail": 500}.get(self.path, 404)
        body = ("value %s" % getattr(module, "VALUE", 1)).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
'''
# serve.sh PORT PIDFILE MODULE: stop the server of PIDFILE (if any), start a new one in its own session.
SERVE = '''\
port=$1; pidfile=$2; module=$3; here=$(dirname "$0")
if [ -f "$pidfile" ]; then
  old=$(cat "$pidfile"); kill "$old" 2>/dev/null
  # (a killed server is reparented to pid 1, which may leave it a zombie a while: that is gone)
  while [ -d "/proc/$old" ] && [ "$(cut -d' ' -f3 "/proc/$old/stat" 2>/dev/null)" != Z ]; do sleep 0.05; done
fi
setsid "$here/venv/bin/python" "$here/server.py" "$port" "$module" </dev/null >>"$here/server-$port.log" 2>&1 &
echo $! > "$pidfile"
'''


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def health(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
            return reply.read().decode()
    except OSError:
        return None


def wait_health(port: int, want: str | None = None, seconds: float = 15) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = health(port)
        if got is not None and (want is None or got == want):
            return got
        time.sleep(0.05)
    raise AssertionError(f"no healthy server on {port} (want {want!r})")


@pytest.fixture(scope="module")
def sglang_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real venv with the fixture sglang wheel pip-installed (no dependencies, no index,
    no network, no bytecode: the nodes' servers compile what they import). Made once per
    module (5-25 s here, with the load) and linked into each node (see ``VenvNode``)."""
    wheels = sorted((Path(__file__).resolve().parents[3] / "shared" / "fixtures").glob("sglang-*.whl"))
    if not wheels:
        pytest.fail("no sglang wheel in ../shared/fixtures beside the repo")
    venv = tmp_path_factory.mktemp("sglang-venv") / "venv"
    python, _ = make_venv(venv)
    pip_install(python, wheels[-1])
    return venv


class VenvNode:
    """A venv on disk (site-packages = its own), its serve.sh and the servers started from it:
    a copy of ``template`` (the real sglang venv), else a bare venv with a small tree."""

    def __init__(self, root: Path, template: Path | None = None) -> None:
        self.root = root
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        self.site = root / "venv" / "lib" / version / "site-packages"
        if template is not None:
            root.mkdir(parents=True)
            # Hard links: a full copy costs seconds per node under load. Pushes replace files
            # (a new inode, renamed in), never write one in place; the module the tests patch
            # gets an inode of its own, so that replacing it on one node leaves the others'
            # ctime alone (ps reads ctimes).
            subprocess.run(["cp", "-al", str(template), str(root / "venv")], check=True)
            own = self.site / REAL_MODULE
            subprocess.run(["cp", "-p", str(own), f"{own}.copy"], check=True)
            os.replace(f"{own}.copy", own)
            self.module = REAL_MODULE
        else:
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
            for rel, text in {"sglang/__init__.py": "", "sglang/srt/__init__.py": "",
                              SYNTHETIC_MODULE: "VALUE = 1\n", "sglang/srt/other.py": "X = 1\n"}.items():
                (self.site / rel).parent.mkdir(parents=True, exist_ok=True)
                (self.site / rel).write_text(text)
            self.module = SYNTHETIC_MODULE
        (root / "server.py").write_text(SERVER)
        (root / "serve.sh").write_text(SERVE)
        self.pidfiles: list[Path] = []

    def restart_command(self, port: int, name: str = "server") -> str:
        pidfile = self.root / f"{name}.pid"
        if pidfile not in self.pidfiles:
            self.pidfiles.append(pidfile)
        dotted = self.module[:-len(".py")].replace("/", ".")
        return f"sh {self.root}/serve.sh {port} {pidfile} {dotted}"

    def start(self, port: int, name: str = "server") -> int:
        subprocess.run(self.restart_command(port, name), shell=True, check=True)
        wait_health(port)
        return int((self.root / f"{name}.pid").read_text())

    def stop(self) -> None:
        for pidfile in self.pidfiles:
            try:
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
            except (OSError, ValueError):
                pass


def appended(path: str, before: str, line: str) -> bytes:
    """A unified diff adding ``line`` at the end of ``path`` (content ``before``)."""
    after = before + line
    return "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True),
                                        f"a/{path}", f"b/{path}")).encode()


@pytest.fixture
def venv_nodes(tmp_path, write_config, ssh_node, isolated_env, request):
    """``make(names, real=False, **node_extra)`` → (nodes, config path, store): snapshotted venv
    nodes (``real``: copies of the pip-installed sglang venv) and patches `bump` (VALUE = 2
    at the end of the server's module) and `breaks` (an ImportError there) for all of them."""
    made: list[VenvNode] = []

    def make(names: list[str], diffs: dict[str, bytes] | None = None, defaults: dict | None = None,
             per_node: Callable[[VenvNode], dict] | None = None, real: bool = False, where: Path | None = None,
             **extra: object):
        template = request.getfixturevalue("sglang_venv") if real else None
        nodes = {}
        for name in names:
            node = VenvNode((where or tmp_path / "nodes") / name, template)
            made.append(node)
            nodes[name] = node
        config_path = write_config({n: ssh_node(n, v.site, **extra, **(per_node(v) if per_node else {}))
                                    for n, v in nodes.items()}, groups={"all": list(names)}, defaults=defaults)
        config = load_config(str(config_path))
        store = Store.open_or_create(config.store_path)
        assert pull_nodes(store, config.select(["all"])).exit_code == 0
        first = nodes[names[0]]
        source = (first.site / first.module).read_text()
        patches = {"bump": appended(first.module, source, "VALUE = 2\n"),
                   "breaks": appended(first.module, source, "raise ImportError('broken')\n"), **(diffs or {})}
        for patch, diff in patches.items():
            import_patch(store, config, patch, diff, f"{patch}.diff", names[0], ("all",))
        return nodes, config_path, isolated_env / "snapshots"

    yield make
    for node in made:
        node.stop()


def ps_json(run_snapver, *targets: str) -> dict:
    result = run_snapver("ps", *targets, "--json")
    assert result.code in (0, 1) and result.code == json.loads(result.out)["exit_code"], result
    return {n["node"]: n for n in json.loads(result.out)["nodes"]}


def test_ps_flags_a_server_started_before_the_push_and_not_one_started_after(venv_nodes, run_snapver):
    nodes, _, _ = venv_nodes(["ct200"], real=True)
    node = nodes["ct200"]
    old_port, new_port = free_port(), free_port()
    old_pid = node.start(old_port, "old")

    found = ps_json(run_snapver, "ct200")["ct200"]
    assert [p["pid"] for p in found["processes"]] == [old_pid], found
    listed = found["processes"][0]
    assert listed["restart_needed"] is False and listed["files"] == []
    assert listed["user"] == "root" and f"{node.root}/server.py {old_port}" in listed["command"]
    assert "deployment's python" in listed["reasons"][0]

    result = run_snapver("push", "bump", "--yes")
    assert result.code == 0, result
    stale = [line for line in result.out.splitlines() if line.startswith(f"ct200: pid {old_pid} ")]
    assert len(stale) == 1 and f"{node.root}/venv/bin/python" in stale[0], result
    assert stale[0].endswith("runs code older than this push: restart it") and re.search(
        r" started \d\d:\d\d", stale[0]
    ), result
    assert wait_health(old_port) == "value 1"  # the old server still runs the old code

    status = run_snapver("status", "ct200", "--json")
    assert json.loads(status.out)["nodes"][0]["restart_needed"] == 1, status
    table = run_snapver("status", "ct200")
    header = table.out.splitlines()[0].split()
    assert header[-1] == "restart" and table.out.splitlines()[1].split()[-1] == "1", table
    assert "ct200: 1 process(es) run code older than the tree" in table.out

    new_pid = node.start(new_port, "new")
    assert wait_health(new_port) == "value 2"
    found = ps_json(run_snapver, "ct200")["ct200"]
    by_pid = {p["pid"]: p for p in found["processes"]}
    assert set(by_pid) == {old_pid, new_pid}, found
    assert by_pid[old_pid]["restart_needed"] is True and by_pid[old_pid]["files"] == [node.module]
    assert by_pid[new_pid]["restart_needed"] is False and by_pid[new_pid]["files"] == []
    assert found["restart_needed"] == 1

    text = run_snapver("ps", "ct200")
    assert text.code == 1 and "1 need a restart" in text.out and f"{node.module}: may run old code" in text.out, text


def test_secret_looking_values_are_masked_on_the_node():
    from snapver.transport.agent.procs import mask_command

    argv = ["python", "-m", "sglang.launch_server", "--api-key", "sk-1", "--tokenizer-path", "/t", "HF_TOKEN=hf_2",
            "--password=pw3", "--auth-token", "tok4", "--model-path", "/m", "MY_SECRET=s5", "--key", "k"]
    assert mask_command(argv) == ("python -m sglang.launch_server --api-key *** --tokenizer-path /t HF_TOKEN=*** "
                                  "--password=*** --auth-token *** --model-path /m MY_SECRET=*** --key k")


def records(store: Path, node: str) -> list[dict]:
    """The push records of a node, newest first (their snapver-meta), read with git."""
    out = subprocess.run(["git", "--git-dir", str(store), "log", "--format=%B%x00", f"refs/heads/pushes/{node}"],
                         capture_output=True, check=True, text=True).stdout
    return [json.loads(line[len("snapver-meta: "):]) for body in out.split("\0")
            for line in body.splitlines() if line.startswith("snapver-meta: ")]


def test_restart_and_health_url_from_the_config(venv_nodes, run_snapver):
    ports = {}

    def hooks(node: VenvNode) -> dict:
        ports[node.root.name] = port = free_port()
        return {"restart": node.restart_command(port), "health_url": f"http://127.0.0.1:{port}/health",
                "health_timeout": 5}

    nodes, _, store = venv_nodes(["ct200"], per_node=hooks)
    node, port = nodes["ct200"], ports["ct200"]
    old_pid = node.start(port)
    # A restart that leaves a process holding its output open (`cmd &`, no redirection) ends
    # when its shell does, not when that process does.
    began = time.monotonic()
    result = run_snapver("push", "bump", "--yes", "--restart",
                         f"{node.restart_command(port)}; echo restarting; (setsid sleep 30 &)")
    assert result.code == 0, result
    assert time.monotonic() - began < 20
    assert (f"ct200: restarted, http://127.0.0.1:{port}/health answered 200: healthy" in result.out), result
    assert "runs code older" not in result.out  # the restart ran the new code
    assert health(port) == "value 2"
    new_pid = int((node.root / "server.pid").read_text())
    assert new_pid != old_pid
    found = ps_json(run_snapver, "ct200")["ct200"]
    assert [(p["pid"], p["restart_needed"]) for p in found["processes"]] == [(new_pid, False)], found
    assert records(store, "ct200")[0]["hooks"]["ct200"]["health_url"] == f"http://127.0.0.1:{port}/health"

    # rollback restarts too: the server runs the restored code
    result = run_snapver("rollback", "ct200", "--yes")
    assert result.code == 0, result
    assert f"ct200: restarted, http://127.0.0.1:{port}/health answered 200: healthy" in result.out, result
    assert health(port) == "value 1"


def test_a_patch_that_breaks_the_import_fails_health_and_is_rolled_back_and_restarted(venv_nodes, run_snapver):
    ports = {}

    def hooks(node: VenvNode) -> dict:
        ports[node.root.name] = port = free_port()
        return {"restart": node.restart_command(port), "health_url": f"http://127.0.0.1:{port}/health",
                "health_timeout": 3}

    nodes, _, store = venv_nodes(["ct200"], per_node=hooks, real=True)
    node, port = nodes["ct200"], ports["ct200"]
    node.start(port)
    original = tree_hashes(node.site)
    result = run_snapver("push", "breaks", "--yes")
    assert result.code == 3, result
    assert (f"ct200: rolled back: ct200: health URL http://127.0.0.1:{port}/health not healthy within 3 s: "
            "Connection refused" in result.err), result
    assert f"ct200: on the restored code: restarted, http://127.0.0.1:{port}/health answered 200: healthy" \
        in result.err, result
    assert "ImportError: broken" in (node.root / f"server-{port}.log").read_text()  # the restart met the break
    assert tree_hashes(node.site) == original
    assert health(port) == "value 1"
    record = records(store, "ct200")[0]
    assert record["state"] == "rolled-back" and "not healthy" in record["error"]


NEVER_ANSWERS = "never-answers"


@pytest.mark.parametrize("case", ["restart exits 7", "restart hangs", "restart kills the session",
                                  "health URL 500", "health URL refused", "health URL never answers"])
def test_bad_hooks_roll_the_node_back(case, venv_nodes, run_snapver):
    nodes, _, store = venv_nodes(["ct200"])
    node = nodes["ct200"]
    port = free_port()
    node.start(port)
    original = tree_hashes(node.site)
    good_restart, good_url = node.restart_command(port), f"http://127.0.0.1:{port}/health"
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections (the kernel does) and never answers
    restart, url, expected = {
        "restart exits 7": ("echo failing >&2; exit 7", good_url, "restart failed (exit 7): failing"),
        "restart hangs": ("sleep 30", good_url, "restart failed (timed out after 1 s)"),
        "restart kills the session": ("kill -9 $PPID", good_url, "ct200: rolled back: "),
        "health URL 500": (good_restart, f"http://127.0.0.1:{port}/fail", "answered 500 Internal Server Error"),
        "health URL refused": (good_restart, f"http://127.0.0.1:{free_port()}/health", "Connection refused"),
        "health URL never answers": (good_restart, f"http://127.0.0.1:{silent.getsockname()[1]}/health",
                                     "no answer within"),
    }[case]
    began = time.monotonic()
    with silent:
        result = run_snapver("push", "bump", "--yes", "--restart", restart, "--health-url", url,
                             "--health-timeout", "1")
    assert time.monotonic() - began < 40
    assert result.code == 3, result
    assert expected in result.err and "Traceback" not in result.err, result
    assert tree_hashes(node.site) == original  # rolled back, nothing half-written
    assert records(store, "ct200")[0]["state"] == "rolled-back"
    if restart == good_restart:
        # The restart ran the patched code, so it runs again on the restored code; the URL
        # still fails, and that is said too.
        assert "ct200: restart on the restored code failed" in result.err, result
        assert wait_health(port) == "value 1"
    else:
        assert "ct200: restart on the restored code failed" in result.err, result
        assert wait_health(port) == "value 1"  # the server started before the push was never stopped


def test_hook_settings_are_validated(venv_nodes, run_snapver, write_config, ssh_node, tmp_path):
    venv_nodes(["ct200"])
    result = run_snapver("push", "bump", "--yes", "--health-url", "ftp://127.0.0.1/health")
    assert result.code == 2 and "--health-url: expected an http:// or https:// URL" in result.err, result
    result = run_snapver("push", "bump", "--yes", "--restart", "  ")
    assert result.code == 2 and "--restart: expected a shell command" in result.err, result
    for key, value, message in [("health_url", "http://127.0.0.1:99999/x", "not a URL"),
                                ("health_timeout", 0, "expected a positive number of seconds"),
                                ("restart", "", "expected a shell command, got an empty string"),
                                ("health", 3, "expected a shell command, got int 3")]:
        config = write_config({"ct200": ssh_node("ct200", tmp_path, **{key: value})}, where=tmp_path / "bad.toml")
        result = run_snapver("--config", config, "push", "bump", "--yes")
        assert result.code == 2 and f"nodes.ct200.{key}: {message}" in result.err, (key, result)


def test_waves_stop_after_a_failed_canary(venv_nodes, run_snapver):
    ports = {}

    def hooks(node: VenvNode) -> dict:
        ports[node.root.name] = port = free_port()
        return {"restart": node.restart_command(port), "health_url": f"http://127.0.0.1:{port}/health",
                "health_timeout": 3}

    names = ["fleet00", "fleet01", "fleet02", "fleet03"]
    nodes, _, store = venv_nodes(names, per_node=hooks, real=True)
    pids = {name: nodes[name].start(ports[name]) for name in names}
    original = {name: tree_hashes(nodes[name].site) for name in names}

    result = run_snapver("push", "breaks", "--yes", "--waves", "1,100%")
    assert result.code == 3, result
    assert "wave 1: fleet00" in result.out and "wave 2" not in result.out, result
    assert "push stopped after 0 of 2 wave(s) finished; not written: fleet01, fleet02, fleet03" in result.err
    assert "fleet00: on the restored code: restarted" in result.err
    for name in names:
        assert tree_hashes(nodes[name].site) == original[name], name
        assert wait_health(ports[name]) == "value 1"
    for name in names[1:]:  # never written, never restarted
        assert int((nodes[name].root / "server.pid").read_text()) == pids[name]
    canary = records(store, "fleet00")[0]
    assert (canary["state"], canary["wave"], canary["of_waves"], canary["waves"]) == ("rolled-back", 1, 2, "1,100%")
    for name in names[1:]:
        record = records(store, name)[0]
        assert (record["state"], record["waves_finished"], record["push_id"]) == ("cancelled", 0, canary["push_id"])
    status = run_snapver("status", "fleet01")
    assert "fleet01: last push breaks cancelled" in status.out and "stopped after 0 of 2 wave(s)" in status.out

    began = time.monotonic()
    result = run_snapver("push", "bump", "--yes", "--waves", "1,100%", "--pause", "1")
    assert result.code == 0, result
    assert time.monotonic() - began >= 1 and "waiting 1 s before wave 2" in result.out
    assert "wave 1: fleet00" in result.out and "wave 2: fleet01, fleet02, fleet03" in result.out
    assert "all 2 wave(s) finished" in result.out
    for name in names:
        assert health(ports[name]) == "value 2"
        assert records(store, name)[0]["state"] == "done"


def test_a_failed_second_wave_rolls_back_the_first_unless_keep_going(venv_nodes, run_snapver):
    """SPEC: the nodes already written are rolled back when a node fails, the finished
    canary wave too (a recorded rollback, restarted on the restored code); --keep-going
    keeps it patched and says so; --rollback-all (the old opt-in) is still accepted."""
    ports = {}

    def hooks(node: VenvNode) -> dict:
        ports[node.root.name] = port = free_port()
        path = "/fail" if node.root.name == "fleet01" else "/health"  # the second wave's node never gets healthy
        return {"restart": node.restart_command(port), "health_url": f"http://127.0.0.1:{port}{path}",
                "health_timeout": 2}

    names = ["fleet00", "fleet01", "fleet02"]
    nodes, _, store = venv_nodes(names, per_node=hooks)
    for name in names:
        nodes[name].start(ports[name])
    original = {name: tree_hashes(nodes[name].site) for name in names}

    for flags in ([], ["--rollback-all"]):
        result = run_snapver("push", "bump", "--yes", "--waves", "1,2,100%", *flags)
        assert result.code == 3, result
        assert "push stopped after 1 of 3 wave(s) finished; not written: fleet02" in result.err, result
        assert "fleet00: rolled back as well (its wave finished before the failure):" in result.err, result
        assert "still patched" not in result.err, result
        for name in names:
            assert tree_hashes(nodes[name].site) == original[name], name
        assert wait_health(ports["fleet00"]) == "value 1"  # restarted on the restored code
        assert records(store, "fleet00")[0]["action"] == "rollback"
        assert records(store, "fleet01")[0]["state"] == "rolled-back"

    result = run_snapver("push", "bump", "--yes", "--waves", "1,2,100%", "--keep-going")
    assert result.code == 3, result
    assert "still patched: fleet00 (`snapver rollback fleet00` undoes it)" in result.err, result
    assert health(ports["fleet00"]) == "value 2"  # the finished canary wave stays patched
    assert (records(store, "fleet00")[0]["state"], records(store, "fleet01")[0]["state"]) == ("done", "rolled-back")
    assert tree_hashes(nodes["fleet01"].site) == original["fleet01"]
    assert tree_hashes(nodes["fleet02"].site) == original["fleet02"]
    assert run_snapver("rollback", "fleet00", "--yes").code == 0
    assert health(ports["fleet00"]) == "value 1"
    assert run_snapver("push", "bump", "--yes", "--rollback-all").code == 2


@pytest.mark.parametrize("spec", ["0", "150%", "a,b", "", "2,1"])
def test_bad_wave_specs_exit_2_with_nothing_written(spec, venv_nodes, run_snapver):
    nodes, _, store = venv_nodes(["ct200", "ct129"])
    before = {name: tree_hashes(node.site) for name, node in nodes.items()}
    result = run_snapver("push", "bump", "--yes", "--waves", spec)
    assert result.code == 2 and result.err.startswith("snapver: error: --waves: "), result
    assert {name: tree_hashes(node.site) for name, node in nodes.items()} == before
    no_record = subprocess.run(
        ["git", "--git-dir", str(store), "show-ref", "--verify", "-q", "refs/heads/pushes/ct200"]
    )
    assert no_record.returncode != 0  # no push record: nothing was started


@pytest.mark.parametrize("answer", ["n", "y"])
def test_a_terminal_is_asked_between_waves(answer, venv_nodes):
    """On a terminal without --yes, each wave after the first waits for a yes: 'n' stops the
    push with the first wave kept patched, 'y' goes on."""
    from terminal import run_in_terminal

    nodes, _, store = venv_nodes(["ct200", "ct129"])
    original = tree_hashes(nodes["ct129"].site)
    shown = run_in_terminal("--no-color", "push", "bump", "--waves", "1,100%",
                            replies=[(b"[y/N]: ", b"y\n"), (b"start wave 2 (ct129)? [y/N]: ", answer.encode() + b"\n")],
                            timeout=60)
    assert "wave 1: ct200" in shown.text and "start wave 2 (ct129)? [y/N]: " in shown.text, shown
    assert (nodes["ct200"].site / nodes["ct200"].module).read_text().endswith("VALUE = 2\n")
    if answer == "n":
        assert shown.code == 1, shown
        assert "push stopped after 1 of 2 wave(s) finished; not written: ct129" in shown.text, shown
        assert tree_hashes(nodes["ct129"].site) == original
        assert [records(store, name)[0]["state"] for name in ("ct200", "ct129")] == ["done", "cancelled"]
    else:
        assert shown.code == 0 and "wave 2: ct129" in shown.text and "all 2 wave(s) finished" in shown.text, shown
        assert (nodes["ct129"].site / nodes["ct129"].module).read_text().endswith("VALUE = 2\n")


def test_rollback_in_waves_stops_at_a_failed_wave(venv_nodes, run_snapver):
    """`rollback all --waves 1,100%`: each wave restored, restarted and healthy before the
    next; a node whose restart fails stops the rollback, later waves stay as they were and
    their records (and `status`) say where it stopped."""
    ports = {}

    def hooks(node: VenvNode) -> dict:
        ports[node.root.name] = port = free_port()
        # The restart fails (after starting the server) while the node's fail-next file exists.
        return {"restart": f"{node.restart_command(port)} && [ ! -e {node.root}/fail-next ]",
                "health_url": f"http://127.0.0.1:{port}/health", "health_timeout": 3}

    names = ["fleet00", "fleet01", "fleet02"]
    nodes, _, store = venv_nodes(names, per_node=hooks)
    for name in names:
        nodes[name].start(ports[name])
    original = {name: tree_hashes(nodes[name].site) for name in names}
    assert run_snapver("push", "bump", "--yes").code == 0
    assert {name: health(ports[name]) for name in names} == dict.fromkeys(names, "value 2")

    (nodes["fleet00"].root / "fail-next").touch()
    result = run_snapver("rollback", "all", "--waves", "1,100%", "--yes")
    assert result.code == 3, result
    assert "wave 1: fleet00" in result.out and "wave 2" not in result.out, result
    assert "rollback stopped after 0 of 2 wave(s) finished; not written: fleet01, fleet02" in result.err, result
    assert tree_hashes(nodes["fleet00"].site) == original["fleet00"]  # restored: a rollback is never undone
    for name in names[1:]:
        assert tree_hashes(nodes[name].site) != original[name] and health(ports[name]) == "value 2", name
        record = records(store, name)[0]
        assert (record["action"], record["state"], record["waves_finished"]) == ("rollback", "cancelled", 0)
    assert records(store, "fleet00")[0]["state"] == "failed"
    status = run_snapver("status", "fleet01")
    assert "fleet01: last rollback cancelled" in status.out and "the rollback stopped after 0 of 2 wave(s)" \
        in status.out, status

    (nodes["fleet00"].root / "fail-next").unlink()
    result = run_snapver("rollback", "fleet01", "fleet02", "--waves", "1,100%", "--yes", "--json")
    assert result.code == 0, result
    document = json.loads(result.out)
    assert (document["waves"], document["waves_finished"], document["stopped"]) == ([["fleet01"], ["fleet02"]], 2,
                                                                                     False)
    assert [node["result"]["state"] for node in document["nodes"]] == ["done", "done"]
    for name in names:
        assert tree_hashes(nodes[name].site) == original[name], name
        assert wait_health(ports[name]) == "value 1"
    waves = [(records(store, name)[0]["wave"], records(store, name)[0]["push_id"]) for name in names[1:]]
    assert [wave for wave, _ in waves] == [1, 2] and waves[0][1] == waves[1][1], waves  # one rollback, two waves


def test_hidepid_mounts_are_read_from_the_last_proc_mount():
    from snapver.transport.agent.procs import hidepid_of

    plain = "proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0\n"
    assert hidepid_of(plain) == ""
    assert hidepid_of("sysfs /sys sysfs rw 0 0\nproc /proc proc rw,relatime,hidepid=2 0 0\n") == "hidepid=2"
    assert hidepid_of("proc /proc proc rw,hidepid=0 0 0\n") == ""
    # Stacked mounts (a container's /proc over the host's): the last one is in effect.
    assert hidepid_of(plain + "proc /proc proc rw,relatime,hidepid=invisible 0 0\n") == "hidepid=invisible"
    assert hidepid_of("proc /proc proc rw,relatime,hidepid=invisible 0 0\n" + plain) == ""
    assert hidepid_of("proc /mnt/proc proc rw,hidepid=2 0 0\n" + plain) == ""


# The SSH user's python, run as nobody in a mount namespace whose /proc is a new proc mount
# with hidepid=2 (the machine's processes, but only its own visible): what a node with a
# hardened /proc shows a non-root SSH user.
HIDDEN_PYTHON = """#!/bin/sh
exec unshare --mount sh -c 'mount -t proc -o hidepid=2 proc /proc && exec setpriv --reuid=65534 --regid=65534 \\
  --clear-groups /usr/bin/python3 "$@"' sh "$@"
"""


@pytest.fixture
def world_readable_dir():
    """A folder nobody can reach (pytest's own are root's alone), removed afterwards."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="snapver-hidepid-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_node_whose_proc_hides_other_users_processes(world_readable_dir, venv_nodes, run_snapver):
    """For real: the agent runs as nobody over SSH with /proc mounted hidepid=2, the server as
    root. ps lists nothing and says why; push writes and warns; status shows '?' with why."""
    # world_readable_dir first: torn down last, after venv_nodes has read its pid files and
    # stopped the server (the other way round the files were gone and the server lived on)
    wrapper = world_readable_dir / "python"
    wrapper.write_text(HIDDEN_PYTHON)
    wrapper.chmod(0o755)
    check = subprocess.run([str(wrapper), "-c", "import os; print(os.getuid())"], capture_output=True, text=True)
    assert check.stdout.strip() == "65534", check  # the machine lets root make such a mount

    nodes, _, store = venv_nodes(["ct200"], where=world_readable_dir, python=str(wrapper))
    node = nodes["ct200"]
    subprocess.run(["chown", "-R", "65534:65534", str(node.site / "sglang")], check=True)  # nobody deploys
    port = free_port()
    pid = node.start(port)  # as root

    found = ps_json(run_snapver, "ct200")["ct200"]
    assert found["processes"] == [] and found["hidepid"].startswith("hidepid="), found  # the server is hidden
    text = run_snapver("ps", "ct200")
    assert text.code == 0 and f"ct200: /proc is mounted with {found['hidepid']}: processes of other users are " \
        "hidden from the SSH user and not listed" in text.err, text

    result = run_snapver("push", "bump", "--yes")
    assert result.code == 0 and "ct200: /proc is mounted with hidepid=" in result.err, result
    assert (node.site / node.module).read_text() == "VALUE = 1\nVALUE = 2\n"
    assert records(store, "ct200")[0]["state"] == "done"
    status = run_snapver("status", "ct200", "--json")
    row = json.loads(status.out)["nodes"][0]
    assert row["restart_needed"] is None and "hidden from the SSH user" in row["restart_error"], row
    assert os.path.exists(f"/proc/{pid}")  # the server it could not see still runs
