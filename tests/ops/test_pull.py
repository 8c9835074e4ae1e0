"""Pull, end to end over both transports: the store holds the live tree byte for byte.

Every check reads the store with the git command line and the live files with
os/hashlib/blake3 — never with snapver's own code.
"""

from __future__ import annotations

import codecs
import fcntl
import hashlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import blake3
import pytest
from helpers import Result, git_ls_tree, tree_hashes

SRT = "sglang/srt"
NODE_REF = "refs/heads/nodes/"
SGLANG_FILES = 2602


# --------------------------------------------------------------------------- reading the store with git


def git(store: Path, *args: str, input: bytes | None = None, env: dict | None = None) -> bytes:  # noqa: A002
    return subprocess.run(["git", "--git-dir", str(store), *args], input=input, capture_output=True,
                          check=True, env=env).stdout


def cat_blobs(store: Path, oids: set[str]) -> dict[str, bytes]:
    """Many blobs through one `git cat-file --batch`."""
    ordered = sorted(oids)
    out = git(store, "cat-file", "--batch", input="".join(f"{oid}\n" for oid in ordered).encode())
    blobs, offset = {}, 0
    for oid in ordered:
        header_end = out.index(b"\n", offset)
        name, kind, size = out[offset:header_end].decode().split()
        assert (name, kind) == (oid, "blob")
        start = header_end + 1
        blobs[oid] = out[start:start + int(size)]
        offset = start + int(size) + 1
    return blobs


def store_tree(store: Path, rev: str) -> dict[str, tuple[str, int, str]]:
    """A snapshot's tree in tree_hashes' shape: path → (kind, 0o755/0o644/0, sha256)."""
    listing = git_ls_tree(store, rev)
    listing.pop(".snapver/manifest")
    listing.pop(".snapver/record", None)  # the distribution's RECORD rows, when it has one
    listing.pop(".snapver/env", None)  # the environment under the tree
    blobs = cat_blobs(store, {oid for _, oid in listing.values()})
    tree = {}
    for path, (mode, oid) in listing.items():
        kind, perm = {"120000": ("l", 0), "100755": ("f", 0o755), "100644": ("f", 0o644)}[mode]
        tree[path] = (kind, perm, hashlib.sha256(blobs[oid]).hexdigest())
    return tree


def git_view(live: dict[str, tuple[str, int, str]]) -> dict[str, tuple[str, int, str]]:
    """What git can keep of a live tree: links, and files as executable or not."""
    return {path: (kind, 0 if kind == "l" else (0o755 if mode & 0o111 else 0o644), digest)
            for path, (kind, mode, digest) in live.items()}


def read_manifest(store: Path, rev: str) -> dict[str, tuple[str, int, int, str, str]]:
    """``.snapver/manifest`` parsed here: path → (kind, st_mode, size, blake3, git oid)."""
    rows = {}
    for line in git(store, "cat-file", "blob", f"{rev}:.snapver/manifest").split(b"\n"):
        if not line:
            continue
        head, _, quoted = line.partition(b"\t")
        if quoted.startswith(b'"'):
            quoted = codecs.escape_decode(quoted[1:-1])[0]
        kind, mode, size, digest, oid = head.decode().split(" ")
        rows[os.fsdecode(quoted)] = (kind, int(mode, 8), int(size), digest, oid)
    return rows


def live_manifest(site: Path, paths: list[str]) -> dict[str, tuple[str, int, int, str, str]]:
    """The manifest rows the live files call for (paths as tree_hashes lists them)."""
    rows = {}
    for path in paths:
        full = os.path.join(os.fsencode(site), os.fsencode(path))
        info = os.lstat(full)
        if stat.S_ISLNK(info.st_mode):
            data = os.readlink(full)
        else:
            with open(full, "rb") as handle:
                data = handle.read()
        oid = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        rows[path] = ("l" if stat.S_ISLNK(info.st_mode) else "f", info.st_mode, len(data),
                      blake3.blake3(data).hexdigest(), oid)
    return rows


def meta(store: Path, rev: str) -> dict:
    (line,) = [ln for ln in git(store, "log", "-1", "--format=%B", rev).decode().splitlines()
               if ln.startswith("snapver-meta: ")]
    return json.loads(line[len("snapver-meta: "):])


def node_heads(store: Path) -> dict[str, str]:
    if not store.exists():
        return {}
    out = git(store, "for-each-ref", "--format=%(refname) %(objectname)", NODE_REF).decode()
    return {name[len(NODE_REF):]: oid for name, oid in (line.split() for line in out.splitlines())}


def history(store: Path, node: str) -> list[str]:
    return git(store, "rev-list", NODE_REF + node).decode().split()


def live_tree(site: Path, **hash_args) -> dict[str, tuple[str, int, str]]:
    """tree_hashes without `.git` folders and files, which a git tree cannot hold."""
    return {path: value for path, value in tree_hashes(site, **hash_args).items()
            if ".git" not in path.lower().split("/")}


def assert_store_holds_live(store: Path, node: str, site: Path, **hash_args) -> None:
    """The node's newest snapshot is the live tree: git tree, and manifest with full modes and blake3."""
    live = live_tree(site, **hash_args)
    assert store_tree(store, NODE_REF + node) == git_view(live)
    assert read_manifest(store, NODE_REF + node) == live_manifest(site, list(live))


def total_size(site: Path) -> int:
    return sum(size for _, _, size, _, _ in live_manifest(site, list(live_tree(site))).values())


def distinct_content(site: Path) -> tuple[int, int]:
    """(number, total size) of distinct blobs in the live tree (what a first pull must fetch)."""
    rows = live_manifest(site, list(live_tree(site)))
    sizes = {oid: size for _, _, size, _, oid in rows.values()}
    return len(sizes), sum(sizes.values())


# --------------------------------------------------------------------------- running pull


@pytest.fixture(params=["local", "ssh"])
def make_node(request: pytest.FixtureRequest, local_node):
    """``make_node(name, site_packages, **keys)`` → a node table over the parametrised transport."""

    def make(name: str, site_packages: Path, **extra):
        if request.param == "local":
            return local_node(site_packages, **extra)
        return request.getfixturevalue("ssh_node")(name, site_packages, **extra)

    return make


def pull_json(run_snapver, *args: str, env: dict | None = None, expect: int = 0) -> tuple[dict, Result]:
    result = run_snapver("pull", "--json", *args, env=env)
    assert result.code == expect, str(result)
    assert "Traceback" not in result.err
    document = json.loads(result.out)
    assert document["exit_code"] == expect
    return document, result


def by_node(document: dict) -> dict[str, dict]:
    return {node["node"]: node for node in document["nodes"]}


@pytest.fixture
def store() -> Path:
    return Path.cwd() / "snapshots"


@pytest.fixture(autouse=True)
def no_background_compaction(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real-tree pull starts a detached `git repack` that would outlive the test (and its tmp_path)."""
    monkeypatch.setenv("SNAPVER_AUTO_GC", "0")


# --------------------------------------------------------------------------- the real tree


def test_real_tree_is_recorded_byte_for_byte(sglang_site_template, local_node, write_config, run_snapver,
                                             store) -> None:
    # Pull never writes on a node, so the shared template is the node (its teardown checks it).
    site = sglang_site_template
    write_config({"laptop": local_node(site)})
    document, _ = pull_json(run_snapver, "laptop")
    (node,) = document["nodes"]
    distinct, distinct_bytes = distinct_content(site)
    assert (node["ok"], node["files"], node["changed"]) == (True, SGLANG_FILES, SGLANG_FILES)
    # A first pull into an empty store has nothing to skip: duplicates inside the tree may come twice.
    assert (node["fetched_files"], node["fetched_bytes"]) in ((distinct, distinct_bytes),
                                                             (SGLANG_FILES, total_size(site)))
    assert node_heads(store) == {"laptop": node["snapshot"]}
    assert_store_holds_live(store, "laptop", site)

    info = meta(store, node["snapshot"])
    assert (info["kind"], info["node"], info["site_packages"]) == ("snapshot", "laptop", str(site))
    assert info["dists"] == [["sglang", "0.5.23"]]
    assert info["python"].startswith("3.") and info["time"][:2] == "20"

    again, _ = pull_json(run_snapver, "laptop")
    (node_again,) = again["nodes"]
    assert node_again["snapshot"] is None
    assert node_again["unchanged_since"] == node["snapshot"]
    assert (node_again["fetched_files"], node_again["fetched_bytes"]) == (0, 0)
    assert history(store, "laptop") == [node["snapshot"]]


def test_real_tree_group_over_ssh_fetches_shared_content_once(sglang_site_template, ssh_node, write_config,
                                                              run_snapver, store) -> None:
    site = sglang_site_template
    write_config({"ct200": ssh_node("ct200", site), "ct129": ssh_node("ct129", site)},
                 groups={"tp8": ["ct200", "ct129"]})
    document, _ = pull_json(run_snapver, "tp8")
    nodes = by_node(document)
    distinct, distinct_bytes = distinct_content(site)
    assert [(n["files"], n["changed"]) for n in nodes.values()] == [(SGLANG_FILES, SGLANG_FILES)] * 2
    # Into an empty store the first node up sends everything unhashed (its own duplicates too, as a
    # single node's first pull); the other sends a listing only.
    assert sorted((n["fetched_files"], n["fetched_bytes"]) for n in nodes.values()) == [
        (0, 0), (SGLANG_FILES, total_size(site))]
    heads = node_heads(store)
    assert heads == {"ct200": nodes["ct200"]["snapshot"], "ct129": nodes["ct129"]["snapshot"]}
    assert git(store, "rev-parse", f"{heads['ct200']}^{{tree}}") == git(store, "rev-parse",
                                                                      f"{heads['ct129']}^{{tree}}")
    assert_store_holds_live(store, "ct129", site)
    info = meta(store, heads["ct129"])
    assert (info["node"], info["site_packages"], info["dists"]) == ("ct129", str(site), [["sglang", "0.5.23"]])
    assert info["host"].startswith("root@127.0.0.129")

    text = run_snapver("pull", "tp8")
    assert text.code == 0, str(text)
    for name in ("ct200", "ct129"):
        assert f"{name}: unchanged since {heads[name][:10]}" in text.out, str(text)
    assert node_heads(store) == heads


def test_pull_killed_half_way_leaves_the_store_as_it_was(sglang_site_template, make_site_packages, ssh_node,
                                                         write_config, run_snapver, store) -> None:
    small = make_site_packages("small", files={f"{SRT}/a.py": "a"})
    write_config({"ct200": ssh_node("ct200", small)})
    before = by_node(pull_json(run_snapver, "ct200")[0])["ct200"]["snapshot"]
    # The node is now the real tree: ~84 MB to bring, time enough to kill the pull in the middle.
    write_config({"ct200": ssh_node("ct200", sglang_site_template)})
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    process = subprocess.Popen([sys.executable, "-m", "snapver", "pull", "ct200"], stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    objects = store / "objects"
    start_size = sum(f.stat().st_size for f in objects.rglob("*") if f.is_file())
    written = 0
    deadline = time.monotonic() + 60
    while process.poll() is None and time.monotonic() < deadline:
        written = sum(f.stat().st_size for f in objects.rglob("*") if f.is_file()) - start_size
        if written > 8 << 20:  # mid-transfer: some of the ~84 MB is in
            break
        time.sleep(0.005)
    assert process.poll() is None, f"pull ended before it could be killed: {process.communicate()}"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert written > 8 << 20

    assert node_heads(store) == {"ct200": before}
    log = run_snapver("log")
    assert log.code == 0 and len(log.out.splitlines()) == 1 and before[:10] in log.out, str(log)
    fsck = run_snapver("fsck")
    assert fsck.code == 0, str(fsck)
    # The lock died with the process; a new pull completes on top of the old snapshot.
    document, _ = pull_json(run_snapver, "ct200")
    after = by_node(document)["ct200"]
    assert after["snapshot"] and after["files"] == SGLANG_FILES
    assert history(store, "ct200") == [after["snapshot"], before]


# --------------------------------------------------------------------------- exactness on synthetic trees

ODD_NAMES = [b"sp ace.py", b'dq"uote.py', b"sq'uote.py", b"back\\slash.py", b"new\nline.py", b"tab\t.py",
             b"caf\xe9.py", b"\xff\xfe", "ünïcödé.py".encode(), "日本/語.py".encode(), b'"lead', b"ctl\x01.py",
             b"dir with space/inner.py"]


def edge_case_tree(make_site_packages, tmp_path: Path) -> Path:
    files = {f"{SRT}/__init__.py": "", f"{SRT}/mod.py": "x = 1\n", f"{SRT}/sub/deep/empty.txt": "",
             f"{SRT}/__pycache__/mod.cpython-311.pyc": b"\0pyc", f"{SRT}/stray.pyc": b"pyc",
             f"{SRT}/sub/__pycache__/x.pyc": b"pyc", f"{SRT}/lib.so": b"\x7fELF", f"{SRT}/tests/t.py": "t",
             f"{SRT}/big.bin": os.urandom(1 << 20), f"{SRT}/.git/config": "[core]\n", f"{SRT}/sub/.git": "gitdir: x"}
    site = make_site_packages("edge", files=files)
    srt = os.path.join(os.fsencode(site), os.fsencode(SRT))
    for index, name in enumerate(ODD_NAMES):
        full = os.path.join(srt, name)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as handle:
            handle.write(b"odd %d: " % index + name)
    for name, mode in {"run.sh": 0o755, "private.py": 0o600, "setuid": 0o4755, "readonly.py": 0o444}.items():
        (site / SRT / name).write_text(name)
        (site / SRT / name).chmod(mode)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "not-tracked.py").write_text("no")
    for name, target in {"link.py": "mod.py", "dirlink": "sub", "outside": str(outside), "dangling": "nope",
                         "abs": "/etc/passwd"}.items():
        os.symlink(target, site / SRT / name)
    os.symlink(b"caf\xe9.py", os.path.join(srt, b"odd-link\xff"))
    (site / SRT / "empty_dir" / "nested").mkdir(parents=True)
    return site


def test_edge_cases_are_recorded_exactly(make_node, make_site_packages, write_config, run_snapver, store,
                                         tmp_path) -> None:
    site = edge_case_tree(make_site_packages, tmp_path)
    write_config({"ct200": make_node("ct200", site)})
    document, _ = pull_json(run_snapver, "ct200")
    assert by_node(document)["ct200"]["ok"]
    assert_store_holds_live(store, "ct200", site)
    raw_paths = set(git(store, "ls-tree", "-r", "-z", "--name-only", NODE_REF + "ct200").split(b"\0"))
    for name in ODD_NAMES:
        assert os.fsencode(SRT) + b"/" + name in raw_paths  # byte for byte, not re-encoded
    tree = git_ls_tree(store, NODE_REF + "ct200")
    assert tree[f"{SRT}/dirlink"][0] == "120000" and not any(p.startswith(f"{SRT}/dirlink/") for p in tree)
    assert not any(p.startswith(f"{SRT}/outside/") for p in tree)
    assert tree[f"{SRT}/run.sh"][0] == "100755" and tree[f"{SRT}/private.py"][0] == "100644"
    assert tree[f"{SRT}/sub/deep/empty.txt"][1] == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
    assert not any("__pycache__" in p or p.endswith(".pyc") or "empty_dir" in p or ".git" in p for p in tree)
    manifest = read_manifest(store, NODE_REF + "ct200")
    assert manifest[f"{SRT}/setuid"][1] == stat.S_IFREG | 0o4755
    assert manifest[f"{SRT}/private.py"][1] == stat.S_IFREG | 0o600


def test_configured_excludes(local_node, make_site_packages, write_config, run_snapver, store, tmp_path) -> None:
    # The agent applies excludes the same way over every transport (see the contract suite).
    site = edge_case_tree(make_site_packages, tmp_path)
    write_config({"ct200": local_node(site, exclude=["__pycache__/", "*.pyc", "*.so", "tests/"])})
    pull_json(run_snapver, "ct200")
    tree = git_ls_tree(store, NODE_REF + "ct200")
    assert f"{SRT}/lib.so" not in tree and f"{SRT}/tests/t.py" not in tree and f"{SRT}/mod.py" in tree
    live = {p: v for p, v in live_tree(site).items() if p not in (f"{SRT}/lib.so", f"{SRT}/tests/t.py")}
    assert store_tree(store, NODE_REF + "ct200") == git_view(live)
    # With no excludes at all, bytecode is tracked too.
    write_config({"ct200": local_node(site, exclude=[])})
    pull_json(run_snapver, "ct200")
    assert_store_holds_live(store, "ct200", site, exclude_pycache=False)


# --------------------------------------------------------------------------- change detection


def test_changes_that_keep_size_and_mtime_are_caught(make_site_packages, ssh_node, local_node, write_config,
                                                     run_snapver, store) -> None:
    files = {f"{SRT}/{i:02d}.py": f"value = {i:02d}\n" for i in range(30)}
    sites = {"ct200": make_site_packages("ct200", files=files), "laptop": make_site_packages("laptop", files=files)}
    write_config({"ct200": ssh_node("ct200", sites["ct200"]), "laptop": local_node(sites["laptop"])})
    # Let the files age past the racy window, so the second listing trusts its stat cache.
    time.sleep(2.2)
    first = by_node(pull_json(run_snapver, "--all")[0])
    assert first["laptop"]["fetched_files"] == 0 or first["ct200"]["fetched_files"] == 0  # same content
    assert all(node["unchanged_since"] for node in pull_json(run_snapver, "--all")[0]["nodes"])

    for site in sites.values():
        same_size = site / SRT / "03.py"
        before = same_size.stat()
        same_size.write_text("value = 99\n")
        os.utime(same_size, ns=(before.st_atime_ns, before.st_mtime_ns))
        replaced = site / SRT / "04.py"
        before = replaced.stat()
        (site / SRT / "04.tmp").write_text("value = 98\n")
        os.utime(site / SRT / "04.tmp", ns=(before.st_atime_ns, before.st_mtime_ns))
        os.replace(site / SRT / "04.tmp", replaced)
        (site / SRT / "05.py").chmod(0o755)
        (site / SRT / "06.py").unlink()
        (site / SRT / "new.py").write_text("new\n")

    second = by_node(pull_json(run_snapver, "--all")[0])
    for name, site in sites.items():
        assert second[name]["snapshot"], second[name]
        assert second[name]["changed"] == 5, second[name]
        assert history(store, name) == [second[name]["snapshot"], first[name]["snapshot"]]
        assert_store_holds_live(store, name, site)
    # Both nodes made the same edits: each new content crossed the wire once.
    assert second["ct200"]["fetched_files"] + second["laptop"]["fetched_files"] == 3


def test_content_in_the_store_from_any_node_is_not_fetched_again(make_site_packages, local_node, ssh_node,
                                                                 write_config, run_snapver, store) -> None:
    shared = {f"{SRT}/a.py": "a" * 1000, f"{SRT}/b.py": "b" * 2000}
    first = make_site_packages("laptop", files=shared)
    second = make_site_packages("ct129", files={f"{SRT}/renamed_a.py": "a" * 1000, f"{SRT}/dir/b.py": "b" * 2000,
                                                f"{SRT}/own.py": "own" * 100})
    write_config({"laptop": local_node(first), "ct129": ssh_node("ct129", second)})
    laptop = by_node(pull_json(run_snapver, "laptop")[0])["laptop"]
    assert (laptop["fetched_files"], laptop["fetched_bytes"]) == (2, 3000)
    ct129 = by_node(pull_json(run_snapver, "ct129")[0])["ct129"]
    assert (ct129["files"], ct129["fetched_files"], ct129["fetched_bytes"]) == (3, 1, 300)
    assert_store_holds_live(store, "ct129", second)
    # A rename on the node is a new snapshot that brings no content.
    os.rename(second / SRT / "own.py", second / SRT / "moved.py")
    ct129 = by_node(pull_json(run_snapver, "ct129")[0])["ct129"]
    assert (ct129["changed"], ct129["fetched_files"]) == (2, 0)
    assert_store_holds_live(store, "ct129", second)


# --------------------------------------------------------------------------- groups and failures


@pytest.fixture
def silent_ports() -> Iterator[list[int]]:
    """Five loopback ports that accept TCP and never answer."""
    listeners = []
    for _ in range(5):
        listener = socket.socket()
        listener.bind(("127.0.0.200", 0))
        listener.listen(8)
        listeners.append(listener)
    yield [listener.getsockname()[1] for listener in listeners]
    for listener in listeners:
        listener.close()


def test_group_pulls_in_parallel_and_a_dead_node_stops_no_one(make_site_packages, ssh_node, write_config,
                                                              run_snapver, store, silent_ports, tmp_path) -> None:
    good = {name: make_site_packages(name, files={f"{SRT}/x.py": name}) for name in ("ct200", "ct129")}
    timeout = 3
    nodes = {name: ssh_node(name, site) for name, site in good.items()}
    for index, port in enumerate(silent_ports):
        nodes[f"fleet0{index}"] = ssh_node(f"fleet0{index}", good["ct200"], port=port, host="127.0.0.200",
                                           connect_timeout=timeout)
    nodes["nosite"] = ssh_node("fleet10", tmp_path / "no" / "site-packages")
    dead = [*(f"fleet0{index}" for index in range(len(silent_ports))), "nosite"]
    write_config(nodes, groups={"all": list(nodes)})
    began = time.monotonic()
    result = run_snapver("pull", "all")
    elapsed = time.monotonic() - began
    assert result.code == 3, str(result)
    assert "Traceback" not in result.err
    # Five nodes that each hang for the whole timeout: in series that alone is 15 s.
    assert elapsed < len(silent_ports) * timeout - 1, f"{elapsed:.1f} s: the group was not pulled in parallel"
    for name in dead:
        assert f"snapver: error: {name}" in result.err
    assert str(tmp_path / "no" / "site-packages") in result.err
    assert f"{len(dead)} of {len(nodes)} nodes failed" in result.err
    assert set(node_heads(store)) == {"ct200", "ct129"}
    for name, site in good.items():
        assert f"{name}: snapshot" in result.out
        assert_store_holds_live(store, name, site)

    document, _ = pull_json(run_snapver, "nosite", "ct200", expect=3)
    nodes_json = by_node(document)
    assert not nodes_json["nosite"]["ok"] and nodes_json["nosite"]["exit_code"] == 3
    assert str(tmp_path / "no" / "site-packages") in nodes_json["nosite"]["error"]
    assert nodes_json["ct200"]["unchanged_since"] == node_heads(store)["ct200"]


# --------------------------------------------------------------------------- the store


def test_metadata_survives_git_clone(local_node, make_site_packages, write_config, run_snapver, store,
                                     tmp_path) -> None:
    site = edge_case_tree(make_site_packages, tmp_path)
    write_config({"ct200": local_node(site)})
    result = run_snapver("pull", "ct200", "--tag", "before-fix", "-m", "baseline: ü \"quoted\"")
    assert result.code == 0, str(result)
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(store), str(clone)], check=True, capture_output=True)
    cloned = clone / ".git"
    original = node_heads(store)["ct200"]
    assert git(cloned, "rev-parse", "origin/nodes/ct200").decode().strip() == original
    assert git(cloned, "rev-parse", "before-fix^{commit}").decode().strip() == original
    assert read_manifest(cloned, "origin/nodes/ct200") == live_manifest(site, list(live_tree(site)))
    assert store_tree(cloned, "origin/nodes/ct200") == git_view(live_tree(site))
    assert run_snapver("fsck").code == 0  # nothing in the tree git itself would flag (e.g. a .git folder)
    info = meta(cloned, "origin/nodes/ct200")
    assert info["node"] == "ct200" and info["site_packages"] == str(site)
    assert info["message"] == "baseline: ü \"quoted\""
    assert {"time", "python", "dists", "host", "hostname"} <= set(info)


def test_commits_need_no_git_identity(make_site_packages, local_node, write_config, run_snapver, store,
                                      tmp_path) -> None:
    # user.useConfigOnly: git may not guess a name from the passwd entry or hostname.
    no_identity = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "user.useConfigOnly",
                   "GIT_CONFIG_VALUE_0": "true", "EMAIL": "", "GIT_AUTHOR_NAME": "", "GIT_COMMITTER_NAME": ""}
    env = {k: v for k, v in {**os.environ, **no_identity}.items() if v != ""}
    scratch = tmp_path / "scratch"
    subprocess.run(["git", "init", "-q", str(scratch)], check=True, env=env)
    refused = subprocess.run(["git", "-C", str(scratch), "commit", "-q", "--allow-empty", "-m", "x"],
                             capture_output=True, env=env)
    assert refused.returncode != 0  # the environment really has no identity

    write_config({"laptop": local_node(make_site_packages("laptop", files={f"{SRT}/a.py": "a"}))})
    result = subprocess.run([sys.executable, "-m", "snapver", "pull", "laptop"], capture_output=True, text=True,
                            env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert result.returncode == 0, result.stderr
    committer = git(store, "log", "-1", "--format=%cn <%ce>", NODE_REF + "laptop").decode().strip()
    assert committer.startswith("snapver")


def _lock_file(store: Path) -> Path:
    from snapver.store.lock import LOCK_NAME  # where a snapver writer takes its flock

    return store / LOCK_NAME


def test_second_writer_waits_then_fails_with_exit_4(make_site_packages, local_node, write_config, run_snapver,
                                                    store) -> None:
    site = make_site_packages("laptop", files={f"{SRT}/a.py": "a"})
    write_config({"laptop": local_node(site)})
    pull_json(run_snapver, "laptop")
    (site / SRT / "a.py").write_text("changed")
    before = node_heads(store)
    with open(_lock_file(store), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        began = time.monotonic()
        result = run_snapver("pull", "laptop", env={"SNAPVER_LOCK_WAIT": "1.5"})
        elapsed = time.monotonic() - began
        assert result.code == 4, str(result)
        assert "locked" in result.err and "Traceback" not in result.err
        assert elapsed >= 1.5
        assert node_heads(store) == before

        def release() -> None:
            time.sleep(1.0)
            fcntl.flock(held, fcntl.LOCK_UN)

        releaser = threading.Thread(target=release)
        releaser.start()
        result = run_snapver("pull", "laptop", env={"SNAPVER_LOCK_WAIT": "10"})
        releaser.join()
    assert result.code == 0, str(result)
    assert node_heads(store) != before


def test_concurrent_pulls_keep_the_store_consistent(make_site_packages, local_node, write_config, store,
                                                    tmp_path) -> None:
    site = make_site_packages("laptop", files={f"{SRT}/{i}.py": str(i) for i in range(50)})
    slow_python = tmp_path / "slow-python"
    slow_python.write_text(f"#!/bin/sh\nsleep 1\nexec {sys.executable} \"$@\"\n")
    slow_python.chmod(0o755)
    write_config({"laptop": local_node(site, python=str(slow_python))})
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), SNAPVER_LOCK_WAIT="20")
    pulls = [subprocess.Popen([sys.executable, "-m", "snapver", "pull", "--json", "laptop"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outputs = [process.communicate(timeout=60) for process in pulls]
    assert [process.returncode for process in pulls] == [0, 0], outputs
    nodes = [json.loads(out)["nodes"][0] for out, _ in outputs]
    assert sorted(bool(node["snapshot"]) for node in nodes) == [False, True]  # one made it, one saw no change
    assert len(history(store, "laptop")) == 1
    assert_store_holds_live(store, "laptop", site)


def test_first_node_up_sends_everything_and_the_others_only_listings(make_site_packages, local_node, write_config,
                                                                     run_snapver, store, tmp_path) -> None:
    """The node that sends everything is whichever starts first, not the first in the config:
    the others must then fetch nothing, and every snapshot must still be exactly its node."""
    files = {f"{SRT}/{i:02d}.py": f"value = {i}\n" * 50 for i in range(20)} | {f"{SRT}/copy.py": "value = 3\n" * 50}
    slow = tmp_path / "slow-python"
    slow.write_text(f"#!/bin/sh\nsleep 1.5\nexec {sys.executable} \"$@\"\n")
    slow.chmod(0o755)
    sites = {name: make_site_packages(name, files=files) for name in ("a", "b", "c")}
    write_config({"a": local_node(sites["a"], python=str(slow)), "b": local_node(sites["b"]),
                  "c": local_node(sites["c"])})
    nodes = by_node(pull_json(run_snapver, "--all")[0])
    senders = {name: n["fetched_files"] for name, n in nodes.items() if n["fetched_files"]}
    assert list(senders.values()) == [21] and "a" not in senders, senders
    for name, site in sites.items():
        assert nodes[name]["files"] == 21
        assert_store_holds_live(store, name, site)
