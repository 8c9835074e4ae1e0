"""Push: every safety rule of the issue, on a real sshd and the real sglang tree.

Nodes of the real tree are hard-linked copies of the shared template (``cp -al``), the
way uv links a venv's files into its cache: a push that wrote in place would change
the template, which this test and the template fixture's teardown both check.
Expected trees are computed independently: `patch` applied by the test to copies of
the touched files, hashed with hashlib.

Test hook: ``SNAPVER_TEST_PAUSE_AFTER_FILES=N`` makes a push sleep after sending N
files to a node, so that a test can SIGKILL it half-way (see ``snapver/testhooks.py``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pty
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import blake3
import pytest
from helpers import git_blob, git_ls_tree, tree_hashes

from snapver.config import load_config
from snapver.errors import ConflictError, TransportError, UsageError
from snapver.ops.patch import export_patch
from snapver.ops.push import apply_push, plan_push, push_state
from snapver.store.repo import Store
from snapver.transport.connect import open_transport

REPO_ROOT = Path(__file__).resolve().parents[2]
RUNNER = "sglang/srt/model_executor/runner/base_cuda_graph_runner.py"
UTILS = "sglang/srt/speculative/dflash_utils.py"
GONE = "sglang/srt/speculative/dflash_disaggregation.py"
ADDED = "sglang/srt/speculative/dflash_hotfix.py"
TOUCHED = [RUNNER, UTILS, GONE, ADDED]
PUSHES = "refs/heads/pushes/"
# The health check parses the changed module with the node's python (no bytecode written).
HEALTH = ("python -c \"import ast, os; ast.parse(open(os.path.join(os.environ['SNAPVER_SITE_PACKAGES'], "
          f"'{RUNNER}')).read())\"")


def git(store: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(store), *args], capture_output=True, check=True,
                          text=True).stdout


def records(store: Path, node: str) -> list[dict]:
    """The push records of a node, newest first (their snapver-meta), read with git."""
    out = git(store, "log", "--format=%B%x00", PUSHES + node)
    return [json.loads(line[len("snapver-meta: "):]) for body in out.split("\0")
            for line in body.splitlines() if line.startswith("snapver-meta: ")]


def prepare(config_path: Path, pull: tuple[str, ...], patch: tuple[str, Path, str, tuple[str, ...]] | None = None
            ) -> Store:
    """Set-up steps run in this process (the CLI is what the tests exercise after): pull
    ``pull`` and import ``patch`` = (name, diff file, base, target nodes).

    The first snapshot is taken through the local transport (the same folder, the same
    files; what is under test here is writing, over ssh, not a first pull).
    """
    from snapver.ops.patch import import_patch
    from snapver.ops.pull import pull as pull_nodes

    config = load_config(str(config_path))
    store = Store.open_or_create(config.store_path)
    local = [dataclasses.replace(spec, local=True, host=None) for spec in config.select(list(pull))]
    assert pull_nodes(store, local).exit_code == 0
    if patch is not None:
        name, diff, base, targets = patch
        import_patch(store, config, name, diff.read_bytes(), str(diff), base, targets)
    return store


def linked_copy(template: Path, dest: Path) -> Path:
    """A node whose files are hard links into the template (as uv links into its cache)."""
    dest.mkdir(parents=True)
    subprocess.run(["cp", "-al", f"{template}/.", str(dest)], check=True)
    return dest


def replace_file(path: Path, data: bytes) -> None:
    """Change a file without touching its inode (it may be a hard link into the template)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_fix(template: Path, scratch: Path) -> Path:
    """`git diff --no-index old new` of a CUDA-graph fix (two leading folders: needs -p2)."""
    old, new = scratch / "old", scratch / "new"
    for folder in (old, new):
        for rel in (RUNNER, UTILS, GONE):
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(template / rel, folder / rel)
    text = (new / RUNNER).read_bytes().replace(b"\nimport ", b"\n# snapver: fixed CUDA graph capture\nimport ", 1)
    (new / RUNNER).write_bytes(text + b"\n# end of fix\n")
    (new / UTILS).write_bytes((new / UTILS).read_bytes() + b"\nHOTFIX = True\n")
    os.chmod(new / UTILS, 0o755)
    (new / GONE).unlink()
    (new / ADDED).write_bytes(b"VALUE = 42\n")
    done = subprocess.run(["git", "diff", "--no-index", "old", "new"], cwd=scratch, capture_output=True)
    assert done.returncode == 1, done.stderr
    path = scratch / "fix.diff"
    path.write_bytes(done.stdout)
    return path


def expected_tree(original: dict[str, tuple[str, int, str]], template: Path, diff: Path, scratch: Path,
                  strip: int) -> dict[str, tuple[str, int, str]]:
    """The original tree with `patch -pN` applied by the test to copies of the touched files."""
    site = scratch / f"expected-p{strip}"
    for rel in (RUNNER, UTILS, GONE):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(template / rel, site / rel)
    subprocess.run(["patch", f"-p{strip}", "--batch", "--quiet", "-i", str(diff)], cwd=site, check=True)
    tree = dict(original)
    for rel in TOUCHED:
        tree.pop(rel, None)
        if (site / rel).exists():
            tree[rel] = ("f", stat.S_IMODE(os.stat(site / rel).st_mode), sha((site / rel).read_bytes()))
    return tree


def add_bytecode(site: Path) -> dict[str, Path]:
    """Bytecode of a changed module, of the deleted one, and of an unrelated neighbour."""
    found = {}
    for key, rel in {"changed": "sglang/srt/model_executor/runner/__pycache__/base_cuda_graph_runner.cpython-311.pyc",
                     "changed_opt": "sglang/srt/model_executor/runner/__pycache__/"
                                    "base_cuda_graph_runner.cpython-311.opt-1.pyc",
                     "deleted": "sglang/srt/speculative/__pycache__/dflash_disaggregation.cpython-311.pyc",
                     "unrelated": "sglang/srt/model_executor/runner/__pycache__/"
                                  "decode_cuda_graph_runner.cpython-311.pyc",
                     "prefix": "sglang/srt/model_executor/runner/__pycache__/"
                               "base_cuda_graph_runner_extra.cpython-311.pyc"}.items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"stale bytecode")
        found[key] = path
    return found


def test_push_real_tree_over_ssh(sglang_site_template, write_config, ssh_node, run_snapver, tmp_path,
                                 isolated_env):
    template = sglang_site_template
    nodes = {name: linked_copy(template, tmp_path / "nodes" / name / "site-packages") for name in ("ct200", "ct129")}
    bytecode = {name: add_bytecode(site) for name, site in nodes.items()}
    config_path = write_config({name: ssh_node(name, site) for name, site in nodes.items()},
                               groups={"tp8": ["ct200", "ct129"]})
    diff = make_fix(template, tmp_path / "fix")
    snapver_store = prepare(config_path, ("tp8",), ("cuda-fix", diff, "ct200", ("tp8",)))
    config = load_config(str(config_path))
    store = isolated_env / "snapshots"
    original = tree_hashes(template)
    template_runner = (template / RUNNER).read_bytes()

    # A hand-made hot-fix on ct129 is a conflict: the whole push is refused, no node changed.
    replace_file(nodes["ct129"] / RUNNER, b"# a hand-made hot-fix\n")
    with plan_push(snapver_store, config, "cuda-fix") as plan:
        assert [(node, step.path, step.note) for node, step in plan.conflicts] == [
            ("ct129", RUNNER, "modified on the node (neither the base nor the patch)")]
        with pytest.raises(ConflictError, match="no node was changed"):
            apply_push(snapver_store, plan)
    assert tree_hashes(nodes["ct200"]) == original
    assert (nodes["ct129"] / RUNNER).read_bytes() == b"# a hand-made hot-fix\n"
    assert git(store, "for-each-ref", PUSHES) == ""
    os.unlink(nodes["ct129"] / RUNNER)
    os.link(template / RUNNER, nodes["ct129"] / RUNNER)

    # --dry-run shows the plan and changes nothing.
    result = run_snapver("push", "cuda-fix", "--dry-run")
    assert result.code == 0, result
    assert result.out.count(RUNNER) == 2 and "dry run: nothing written" in result.out
    for name, site in nodes.items():
        assert tree_hashes(site) == original
        assert all(path.exists() for path in bytecode[name].values())
    assert git(store, "for-each-ref", PUSHES) == ""

    result = run_snapver("push", "cuda-fix", "--yes", "--health", HEALTH)
    assert result.code == 0, result
    expected = expected_tree(original, template, diff, tmp_path, strip=2)
    assert expected[UTILS][1] == 0o755 and GONE not in expected and ADDED in expected
    for name, site in nodes.items():
        assert tree_hashes(site) == expected, name
        # Stale bytecode of the changed and deleted modules is gone; the rest is kept.
        pyc = bytecode[name]
        assert not pyc["changed"].exists() and not pyc["changed_opt"].exists() and not pyc["deleted"].exists()
        assert pyc["unrelated"].exists() and pyc["prefix"].exists()
        # Written by rename: a new inode; the template ("the uv cache") keeps the old content.
        assert os.stat(site / RUNNER).st_ino != os.stat(template / RUNNER).st_ino
        assert os.stat(site / RUNNER).st_nlink == 1
        assert (
            os.stat(site / "sglang/srt/server_args.py").st_ino == os.stat(template / "sglang/srt/server_args.py").st_ino
        )
        assert not [p for p in site.rglob(".snapver-*")], "temporary files left behind"
    assert (template / RUNNER).read_bytes() == template_runner

    # The store: a push record (started, then done) around before/after snapshots.
    for name, site in nodes.items():
        rows = records(store, name)
        assert [r["state"] for r in rows] == ["done", "started"]
        done = rows[0]
        assert done["patch"] == "cuda-fix" and done["before"] == rows[1]["before"]
        head = git(store, "rev-parse", f"refs/heads/nodes/{name}").strip()
        assert done["after"] == head and git(store, "rev-parse", head + "^").strip() == done["before"]
        after_tree = git_ls_tree(store, done["after"])
        assert sha(git_blob(store, after_tree[RUNNER][1])) == expected[RUNNER][2]
        assert (
            git_ls_tree(store, done["before"])[RUNNER][1] == git(store, "hash-object", str(template / RUNNER)).strip()
        )
        assert done["files"]["write"] == [RUNNER, ADDED, UTILS] and done["files"]["delete"] == [GONE]
        # The after-snapshot takes the written files' digests from the patch, not the store.
        after = snapver_store.manifest(done["after"])
        for path in (RUNNER, ADDED, UTILS):
            assert after.entries[path].digest == blake3.blake3((site / path).read_bytes()).hexdigest(), path
    result = run_snapver("fsck")
    assert result.code == 0, result

    # The exported patch applies with patch -p1 and gives the same files.
    exported = tmp_path / "export.diff"
    exported.write_bytes(export_patch(snapver_store, "cuda-fix"))
    assert expected_tree(original, template, exported, tmp_path, strip=1) == expected

    # Pushing again: nothing to do (every file already patched), nothing recorded.
    refs_before = git(store, "for-each-ref")
    with plan_push(snapver_store, config, "cuda-fix") as plan:
        assert plan.nothing_to_do and {s.action for n in plan.nodes for s in n.steps} == {"skip"}
        assert apply_push(snapver_store, plan).nodes == []
    assert git(store, "for-each-ref") == refs_before

    # Roll ct200 back: exactly the original tree (content, modes, the deleted file, no added one).
    result = run_snapver("rollback", "ct200", "--yes")
    assert result.code == 0, result
    assert tree_hashes(nodes["ct200"]) == original
    assert tree_hashes(nodes["ct129"]) == expected
    assert [r["action"] for r in records(store, "ct200")][:2] == ["rollback", "rollback"]


@pytest.mark.parametrize("moment", ["mid-stream", "after-write"])
def test_killed_push_is_shown_and_repaired(sglang_site_template, write_config, ssh_node, run_snapver, tmp_path,
                                           isolated_env, moment):
    """SIGKILL while the files stream (staged only: the node is untouched, no temporary file
    is left) or once the node is written (every file new): either way the push record says
    started, status shows it interrupted, and rollback leaves the original tree."""
    template = sglang_site_template
    site = linked_copy(template, tmp_path / "nodes" / "ct200" / "site-packages")
    config_path = write_config({"ct200": ssh_node("ct200", site)})
    diff = make_fix(template, tmp_path / "fix")
    store = prepare(config_path, ("ct200",), ("cuda-fix", diff, "ct200", ("ct200",)))
    original = tree_hashes(site)
    hook = {"mid-stream": {"SNAPVER_TEST_PAUSE_AFTER_FILES": "1"},
            "after-write": {"SNAPVER_TEST_PAUSE_AFTER_WRITE": "3600"}}[moment]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **hook}
    process = subprocess.Popen([sys.executable, "-m", "snapver", "push", "cuda-fix", "--yes"], env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    folder = site / RUNNER.rsplit("/", 1)[0]
    try:
        deadline = time.monotonic() + 90
        if moment == "mid-stream":  # the first file in path order, the runner, is staged beside it
            while not any(p.name.startswith(".snapver-") for p in folder.iterdir()):
                assert process.poll() is None, process.stderr.read() if process.stderr else ""
                assert time.monotonic() < deadline, "the push never staged its first file"
                time.sleep(0.01)
            time.sleep(0.3)
        else:
            while sha((site / UTILS).read_bytes()) == original[UTILS][2]:
                assert process.poll() is None, process.stderr.read() if process.stderr else ""
                assert time.monotonic() < deadline, "the push never wrote the node"
                time.sleep(0.05)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    deadline = time.monotonic() + 10  # the node's agent sees its session end and removes what it staged
    while any(p.name.startswith(".snapver-") for p in (site / "sglang").rglob("*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    half = tree_hashes(site)
    if moment == "mid-stream":
        assert half == original  # nothing committed, nothing left behind
    else:
        assert half[RUNNER] != original[RUNNER] and ADDED in half and GONE not in half

    state = push_state(store, "ct200")
    assert state is not None and state.interrupted and state.patch == "cuda-fix"
    status = run_snapver("status", "ct200")
    assert "ct200: INTERRUPTED push cuda-fix" in status.out and "snapver rollback ct200" in status.out, status
    with plan_push(store, load_config(str(config_path)), "cuda-fix") as plan:
        assert "interrupted push" in plan.nodes[0].notes[0] and "snapver rollback ct200" in plan.nodes[0].notes[0]
    assert tree_hashes(site) == half

    result = run_snapver("rollback", "ct200", "--yes")
    assert result.code == 0, result
    assert "repairs the interrupted push of cuda-fix" in result.out
    assert tree_hashes(site) == original
    state = push_state(store, "ct200")
    assert state is not None and not state.interrupted and state.action == "rollback" and state.state == "done"
    assert load_config(str(config_path)).nodes["ct200"].site_packages == str(site)


@pytest.fixture
def fleet(make_site_packages, write_config, ssh_node, run_snapver, isolated_env):
    """Three small ssh nodes (fleet00-02), snapshotted, with patch `fix` for all of them."""
    files = {"sglang/srt/a.py": "a = 1\n", "sglang/srt/b.py": "b = 1\n"}
    sites = {f"fleet0{n}": make_site_packages(f"fleet0{n}", files=files) for n in range(3)}
    config = write_config({name: ssh_node(name, site) for name, site in sites.items()},
                          groups={"all3": sorted(sites)})
    Path("fix.diff").write_bytes(b"--- a/sglang/srt/a.py\n+++ b/sglang/srt/a.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n"
                                 b"--- /dev/null\n+++ b/sglang/srt/c.py\n@@ -0,0 +1 @@\n+c = 1\n")
    prepare(config, ("all3",), ("fix", Path("fix.diff"), "fleet00", ("all3",)))
    return sites, isolated_env / "snapshots", config


def test_failure_mid_fleet_rolls_back(fleet, run_snapver):
    sites, store, config = fleet
    original = {name: tree_hashes(site) for name, site in sites.items()}
    failing = "case $SNAPVER_SITE_PACKAGES in */fleet01/*) echo 'ImportError: broken' >&2; exit 1;; esac"
    result = run_snapver("push", "fix", "--yes", "--health", failing)
    assert result.code == 3, result
    assert "fleet01" in result.err and "health check failed (exit 1): ImportError: broken" in result.err
    for name, site in sites.items():
        assert tree_hashes(site) == original[name], name
        assert records(store, name)[0]["state"] == "rolled-back"
    # --keep-going: the failed node is rolled back, the others keep the patch.
    snapver_store = Store(store)
    with plan_push(snapver_store, load_config(str(config)), "fix") as plan:
        result = apply_push(snapver_store, plan, health=failing, keep_going=True)
    assert result.exit_code == 3
    assert [run.state for run in result.nodes] == ["done", "rolled-back", "done"]
    assert tree_hashes(sites["fleet01"]) == original["fleet01"]
    for name in ("fleet00", "fleet02"):
        assert (sites[name] / "sglang/srt/a.py").read_text() == "a = 2\n"
        assert (sites[name] / "sglang/srt/c.py").read_text() == "c = 1\n"
        assert records(store, name)[0]["state"] == "done"


def test_failure_in_a_later_wave_rolls_back_the_earlier_waves(fleet, run_snapver):
    """SPEC: a node that fails mid-push rolls back every node already written, the finished
    waves' too; --keep-going leaves them patched, and the output names them."""
    sites, store, _ = fleet
    original = {name: tree_hashes(site) for name, site in sites.items()}
    failing = "case $SNAPVER_SITE_PACKAGES in */fleet02/*) echo 'ImportError: broken' >&2; exit 1;; esac"
    result = run_snapver("push", "fix", "--yes", "--waves", "1,2,100%", "--health", failing)
    assert result.code == 3, result
    assert "wave 3: fleet02" in result.out and "push stopped after 2 of 3 wave(s) finished" in result.err, result
    for name in ("fleet00", "fleet01"):
        assert f"{name}: rolled back as well (its wave finished before the failure):" in result.err, result
    assert "still patched" not in result.err, result
    for name, site in sites.items():
        assert tree_hashes(site) == original[name], name
    assert [records(store, name)[0]["action"] for name in sites] == ["rollback", "rollback", "push"]
    assert [records(store, name)[0]["state"] for name in sites] == ["done", "done", "rolled-back"]

    result = run_snapver("push", "fix", "--yes", "--waves", "1,2,100%", "--health", failing, "--keep-going")
    assert result.code == 3, result
    assert "still patched: fleet00, fleet01 (`snapver rollback fleet00 fleet01` undoes it)" in result.err, result
    assert "rolled back as well" not in result.err, result
    for name in ("fleet00", "fleet01"):
        assert (sites[name] / "sglang/srt/a.py").read_text() == "a = 2\n"
        assert records(store, name)[0]["state"] == "done"
    assert tree_hashes(sites["fleet02"]) == original["fleet02"]
    assert run_snapver("rollback", "fleet00", "fleet01", "--yes").code == 0

    # Without waves, --keep-going names the nodes it leaves patched too.
    failing = failing.replace("fleet02", "fleet01")
    result = run_snapver("push", "fix", "--yes", "--health", failing, "--keep-going", "--json")
    assert result.code == 3 and json.loads(result.out)["patched"] == ["fleet00", "fleet02"], result
    assert run_snapver("rollback", "fleet00", "fleet02", "--yes").code == 0
    result = run_snapver("push", "fix", "--yes", "--health", failing, "--keep-going")
    assert result.code == 3 and "still patched: fleet00, fleet02" in result.err, result


def test_unreachable_or_untracked_target_refuses_the_push(fleet, write_config, ssh_node, make_site_packages,
                                                          run_snapver):
    sites, store, _ = fleet
    original = {name: tree_hashes(site) for name, site in sites.items()}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    nodes = {name: ssh_node(name, site) for name, site in sites.items()}
    empty = make_site_packages("empty", files={"other/x.py": "x\n"})
    nodes["fleet03"] = ssh_node("fleet03", sites["fleet00"], port=closed_port)
    nodes["fleet04"] = ssh_node("fleet04", empty)
    nodes["fleet05"] = ssh_node("fleet05", sites["fleet00"], paths=["sglang/srt/other"])
    config_path = write_config(nodes, groups={"all3": ["fleet00", "fleet01", "fleet02"]})
    result = run_snapver("push", "fix", "all3", "fleet04", "--yes")
    assert result.code == 3, result
    assert "push refused, no node was changed" in result.err and "site-packages/sglang: no such file" in result.err
    assert "Traceback" not in result.err
    config, snapver_store = load_config(str(config_path)), Store(store)
    for target, error, text in [("fleet03", TransportError, "fleet03 (root@127.0.0.13:"),
                                ("fleet05", UsageError, "outside the node's tracked paths")]:
        with plan_push(snapver_store, config, "fix", ["all3", target]) as plan:
            with pytest.raises(error, match="push refused, no node was changed") as caught:
                apply_push(snapver_store, plan)
            assert text in str(caught.value)
    assert {name: tree_hashes(site) for name, site in sites.items()} == original
    assert git(store, "for-each-ref", PUSHES) == ""


def imports(site: Path, module: str) -> str:
    """What importing ``module`` on the node's python (cwd: its site-packages) finds: the
    file it loaded from, or the error."""
    done = subprocess.run([sys.executable, "-B", "-c", f"import {module} as m; print(m.__file__)"], cwd=site,
                          capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("transport", ["local", "ssh"])
def test_legacy_bytecode_beside_a_changed_or_deleted_module_is_removed(transport, make_site_packages, write_config,
                                                                      local_node, ssh_node, run_snapver):
    """SPEC: push removes stale bytecode of the modules it changes, a Python-2-style
    ``x.pyc`` beside ``x.py`` too (with the source deleted, a sourceless import loads it).
    One beside a module the push adds is no bytecode of a module it changes: it stays. The
    rollback needs none of it back (snapshots exclude ``*.pyc``)."""
    import py_compile

    srt = "sglang/srt"
    site = make_site_packages("ct200", files={f"{srt}/speculative/dflash_worker.py": "def f():\n    return 1\n",
                                              f"{srt}/a.py": "X = 1\n", f"{srt}/keep.py": "K = 1\n"})
    (site / f"{srt}/sourceless.py").write_text("S = 1\n")
    for module in ("speculative/dflash_worker", "a", "keep", "sourceless"):
        py_compile.compile(str(site / f"{srt}/{module}.py"), cfile=str(site / f"{srt}/{module}.pyc"), doraise=True)
    (site / f"{srt}/sourceless.py").unlink()  # installed as bytecode only
    assert imports(site, "sglang.srt.sourceless").endswith("sourceless.pyc")
    config = write_config({"ct200": local_node(site) if transport == "local" else ssh_node("ct200", site)})
    Path("p.diff").write_bytes(
        b"--- a/sglang/srt/speculative/dflash_worker.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-def f():\n-    return 1\n"
        b"--- a/sglang/srt/a.py\n+++ b/sglang/srt/a.py\n@@ -1 +1 @@\n-X = 1\n+X = 2\n"
        b"--- /dev/null\n+++ b/sglang/srt/sourceless.py\n@@ -0,0 +1 @@\n+S = 2\n")
    prepare(config, ("ct200",), ("p", Path("p.diff"), "ct200", ("ct200",)))
    original = tree_hashes(site, exclude_pycache=False)

    result = run_snapver("push", "p", "--yes", "--json")
    assert result.code == 0, result
    assert sorted(json.loads(result.out)["results"][0]["bytecode_removed"]) == [
        f"{srt}/a.pyc", f"{srt}/speculative/dflash_worker.pyc"]
    assert imports(site, "sglang.srt.speculative.dflash_worker") == \
        "ModuleNotFoundError: No module named 'sglang.srt.speculative'"  # the emptied folder is gone too
    assert not (site / f"{srt}/a.pyc").exists() and imports(site, "sglang.srt.a").endswith("a.py")
    assert (site / f"{srt}/keep.pyc").exists() and (site / f"{srt}/sourceless.pyc").exists()
    assert imports(site, "sglang.srt.sourceless").endswith("sourceless.py")

    result = run_snapver("rollback", "ct200", "--yes")
    assert result.code == 0, result
    assert tree_hashes(site) == {path: entry for path, entry in original.items() if not path.endswith(".pyc")}
    assert imports(site, "sglang.srt.speculative.dflash_worker").endswith("dflash_worker.py")
    assert (site / f"{srt}/keep.pyc").exists()


def test_node_side_refuses_unsafe_paths(make_site_packages, ssh_node, sshd, tmp_path):
    site = make_site_packages("ct200", files={"sglang/srt/a.py": "a\n"})
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "a.py").write_text("outside\n")
    os.symlink(outside, site / "sglang/srt/linked")
    from snapver.config import NodeSpec

    table = ssh_node("ct200", site)
    spec = NodeSpec(name="ct200", site_packages=str(site), host=table["host"], port=table["port"], user="root",
                    identity_file=table["identity_file"], known_hosts=table["known_hosts"])
    with open_transport(spec) as transport:
        for path, why in [("../escape.py", "unsafe path"), ("/etc/evil", "unsafe path"),
                          ("sglang/srt/../../escape.py", "unsafe path"),
                          ("sglang/srt/linked/a.py", "passes through the symlink"),
                          ("sglang/other.py", "outside the tracked paths")]:
            reply = transport.call("write", tracked=["sglang/srt"], files=[[path, "f", None, None, "0" * 40, 1]])
            assert why in reply["unsafe"][path], reply
            assert "ok" not in reply
            checked = transport.call("check", tracked=["sglang/srt"], files=[path])
            assert why in checked["unsafe"][path]
        assert transport.call("ping")["pong"]  # the protocol is still in step
    assert (outside / "a.py").read_text() == "outside\n"
    assert not (tmp_path / "nodes" / "ct200" / "escape.py").exists()
    assert sorted(p.name for p in (site / "sglang").iterdir()) == ["srt"]


def test_push_refuses_a_symlinked_folder_on_the_node(make_site_packages, write_config, local_node, run_snapver,
                                                     tmp_path):
    good = make_site_packages("good", files={"sglang/srt/sub/m.py": "m = 1\n"})
    bad = make_site_packages("bad", files={"sglang/srt/x.py": "x\n"})
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "m.py").write_text("m = 1\n")
    os.symlink(outside, bad / "sglang/srt/sub")
    config = write_config({"good": local_node(good), "bad": local_node(bad)})
    Path("m.diff").write_bytes(b"--- a/sglang/srt/sub/m.py\n+++ b/sglang/srt/sub/m.py\n@@ -1 +1 @@\n-m = 1\n+m = 2\n")
    prepare(config, ("good",), ("m", Path("m.diff"), "good", ()))
    result = run_snapver("push", "m", "good", "bad", "--yes")
    # A refusal like a conflict's (SPEC: exit 1), not an unreachable node's (3).
    assert result.code == 1, result
    assert "push refused, no node was changed: bad: refused:" in result.err, result
    assert "passes through the symlink" in result.err
    assert (outside / "m.py").read_text() == "m = 1\n" and (good / "sglang/srt/sub/m.py").read_text() == "m = 1\n"


def test_mode_and_owner_kept_force_and_json(make_site_packages, write_config, local_node, run_snapver,
                                            isolated_env):
    site = make_site_packages("n1", files={"sglang/srt/a.py": "a = 1\n", "sglang/srt/b.py": "b = 1\n",
                                           "sglang/srt/x.py": "x = 1\n"})
    os.chmod(site / "sglang/srt/a.py", 0o750)
    os.chown(site / "sglang/srt/a.py", 4321, 4322)
    config = write_config({"n1": local_node(site)})
    Path("p.diff").write_bytes(
        b"diff --git a/sglang/srt/a.py b/sglang/srt/a.py\n--- a/sglang/srt/a.py\n+++ b/sglang/srt/a.py\n"
        b"@@ -1 +1 @@\n-a = 1\n+a = 2\n"
        b"diff --git a/sglang/srt/b.py b/sglang/srt/b.py\nold mode 100644\nnew mode 100755\n"
        b"diff --git a/sglang/srt/x.py b/sglang/srt/x.py\n--- a/sglang/srt/x.py\n+++ b/sglang/srt/x.py\n"
        b"@@ -1 +1 @@\n-x = 1\n+x = 2\n")
    prepare(config, ("n1",), ("p", Path("p.diff"), "n1", ("n1",)))
    (site / "sglang/srt/x.py").write_text("x = 'hand-made'\n")  # a conflict

    dry = run_snapver("push", "p", "--json", "--dry-run")
    assert dry.code == 1, dry
    document = json.loads(dry.out)
    assert document["exit_code"] == 1 and document["results"] == []
    actions = {f["path"]: f["action"] for f in document["nodes"][0]["files"]}
    assert actions == {"sglang/srt/a.py": "write", "sglang/srt/b.py": "write", "sglang/srt/x.py": "conflict"}

    pushed = run_snapver("push", "p", "--json", "--yes", "--force")
    assert pushed.code == 0, pushed
    document = json.loads(pushed.out)
    assert document["results"][0]["state"] == "done"
    assert [f["forced"] for f in document["nodes"][0]["files"]] == [False, False, True]
    a = os.stat(site / "sglang/srt/a.py")
    assert (stat.S_IMODE(a.st_mode), a.st_uid, a.st_gid) == (0o750, 4321, 4322)
    assert (site / "sglang/srt/a.py").read_text() == "a = 2\n"
    assert stat.S_IMODE(os.stat(site / "sglang/srt/b.py").st_mode) == 0o755
    assert (site / "sglang/srt/x.py").read_text() == "x = 2\n"
    # The forced file's hand-made content was snapshotted first: rollback brings it back.
    assert run_snapver("rollback", "n1", "--yes").code == 0
    assert (site / "sglang/srt/x.py").read_text() == "x = 'hand-made'\n"
    assert stat.S_IMODE(os.stat(site / "sglang/srt/b.py").st_mode) == 0o644
    a = os.stat(site / "sglang/srt/a.py")
    assert (stat.S_IMODE(a.st_mode), a.st_uid, a.st_gid, (site / "sglang/srt/a.py").read_text()) == \
        (0o750, 4321, 4322, "a = 1\n")


def test_node_changed_after_the_plan_is_refused_and_others_rolled_back(make_site_packages, write_config,
                                                                       local_node, run_snapver, isolated_env):
    sites = {name: make_site_packages(name, files={"sglang/srt/a.py": "a = 1\n"}) for name in ("n1", "n2")}
    config_path = write_config({name: local_node(site) for name, site in sites.items()})
    Path("p.diff").write_bytes(b"--- a/sglang/srt/a.py\n+++ b/sglang/srt/a.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n")
    store = prepare(config_path, ("n1", "n2"), ("p", Path("p.diff"), "n1", ("n1", "n2")))
    config = load_config(str(config_path))
    with plan_push(store, config, "p") as plan:
        assert [len(n.writes) for n in plan.nodes] == [1, 1]
        (sites["n2"] / "sglang/srt/a.py").write_text("a = 'changed meanwhile'\n")
        result = apply_push(store, plan)
    states = {run.node: run.state for run in result.nodes}
    # n1 was written and then undone (or, had n2 failed first, never started).
    assert states["n2"] == "rolled-back" and states["n1"] in ("rolled-back", "cancelled"), states
    assert isinstance(result.nodes[1].error, ConflictError) and "changed since the plan" in str(result.nodes[1].error)
    assert result.exit_code == 1
    assert (sites["n1"] / "sglang/srt/a.py").read_text() == "a = 1\n"
    assert (sites["n2"] / "sglang/srt/a.py").read_text() == "a = 'changed meanwhile'\n"


def test_terminal_confirmation(make_site_packages, write_config, local_node, isolated_env):
    site = make_site_packages("n1", files={"sglang/srt/a.py": "a = 1\n"})
    config = write_config({"n1": local_node(site)})
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}

    def run_on_terminal(*args: str, answer: bytes, stdout: Any = None) -> tuple[int, bytes]:
        leader, follower = pty.openpty()
        process = subprocess.Popen([sys.executable, "-m", "snapver", *args], stdin=follower,
                                   stdout=follower if stdout is None else stdout,
                                   stderr=follower, env=env, cwd=isolated_env)
        os.close(follower)
        output = b""
        answered = False
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                ready, _, _ = select.select([leader], [], [], 0.5)
                if not ready:
                    continue
                try:
                    chunk = os.read(leader, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                output += chunk
                if not answered and b"[y/N]" in output:
                    os.write(leader, answer)
                    answered = True
        finally:
            os.close(leader)
            if process.poll() is None:
                process.kill()
        return process.wait(timeout=10), output

    Path("p.diff").write_bytes(b"--- a/sglang/srt/a.py\n+++ b/sglang/srt/a.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n")
    prepare(config, ("n1",), ("p", Path("p.diff"), "n1", ("n1",)))
    without = subprocess.run([sys.executable, "-m", "snapver", "push", "p"], stdin=subprocess.DEVNULL, env=env,
                             cwd=isolated_env, capture_output=True, text=True)
    assert without.returncode == 2 and "without a terminal" in without.stderr and "--yes" in without.stderr
    code, output = run_on_terminal("push", "p", answer=b"n\n")
    assert code == 1 and b"write 1 file(s) on n1?" in output and b"nothing written" in output
    assert (site / "sglang/srt/a.py").read_text() == "a = 1\n"
    code, output = run_on_terminal("push", "p", answer=b"y\n")
    assert code == 0, output
    assert (site / "sglang/srt/a.py").read_text() == "a = 2\n"
    # With --json the question goes to the terminal (stderr), the document alone to stdout
    # (the question was written into it, ahead of the JSON, unseen).
    with open(isolated_env / "rollback.json", "wb") as document:
        code, output = run_on_terminal("rollback", "n1", "--json", answer=b"y\n", stdout=document)
    assert code == 0 and b"[y/N]" in output, output
    assert json.loads((isolated_env / "rollback.json").read_text())["exit_code"] == 0
    assert (site / "sglang/srt/a.py").read_text() == "a = 1\n"
