"""snapver diff: every pairing on the real sglang tree, every output mode, edge cases.

Expected changes are computed independently (``tree_hashes``: sha256 of every file);
unified output is checked by applying it with ``git apply`` and ``patch -p1`` and
hashing the result. Every test that reads live nodes runs over the local transport
and over the real sshd.
"""

from __future__ import annotations

import json
import os
import pty
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import toml_dumps, tree_hashes
from snapver_inproc import run_inproc

from snapver.config import load_config
from snapver.model import Change, Entry
from snapver.ops.diff import diff, file_diff, split_lines
from snapver.ops.pull import pull
from snapver.store.objects import blob_oid
from snapver.store.repo import Store

TRANSPORTS = ["local", "ssh"]
REPO_ROOT = Path(__file__).resolve().parents[2]


def expected_name_status(old: dict, new: dict) -> str:
    """`--name-status` text from two ``tree_hashes`` maps, computed without snapver."""
    lines = []
    for path in sorted(set(old) | set(new), key=os.fsencode):
        before, after = old.get(path), new.get(path)
        if before is None:
            status = "A"
        elif after is None:
            status = "D"
        elif before[0] != after[0]:
            status = "T"
        elif before[2] != after[2]:
            status = "M"
        elif before[1] != after[1]:
            status = "T"
        else:
            continue
        lines.append(f"{status}\t{path}\n")
    return "".join(lines)


def same_size_same_mtime_edit(path: Path) -> None:
    """Change one byte, keep the size, put the old atime/mtime back."""
    info = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] = ord("#") if data[len(data) // 2] != ord("#") else ord("%")
    path.write_bytes(bytes(data))
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert path.stat().st_size == info.st_size and path.stat().st_mtime_ns == info.st_mtime_ns


def node_table(transport: str, sshd, name: str, site: Path) -> dict:
    if transport == "local":
        return {"local": True, "site_packages": str(site)}
    return {"host": sshd.addresses[name], "port": sshd.port, "user": "root", "site_packages": str(site),
            "identity_file": str(sshd.identity_file), "known_hosts": str(sshd.known_hosts),
            "host_key_policy": "strict", "connect_timeout": 5}


def write_configs(folder: Path, sshd, sites: dict[str, Path], **extra_nodes: dict) -> dict[str, Path]:
    """`local.toml` and `ssh.toml` in ``folder``, naming the same nodes and sharing one store."""
    paths = {}
    for transport in TRANSPORTS:
        nodes = {name: node_table(transport, sshd, name, site) for name, site in sites.items()}
        nodes.update(extra_nodes)
        paths[transport] = folder / f"{transport}.toml"
        paths[transport].write_text(toml_dumps({"store": {"path": "snapshots"}, "nodes": nodes}))
    return paths


# -- the real sglang tree: one pristine node (the template, read only) and one changed copy ------

CHANGED_M = "sglang/srt/server_args.py"
CHANGED_SAME_SIZE = "sglang/srt/model_executor/runner/base_cuda_graph_runner.py"
CHANGED_MODE = "sglang/srt/utils/common.py"
ADDED = "sglang/srt/speculative/dflash_hotfix.py"
LIVE_ONLY = "sglang/srt/speculative/dflash_utils.py"


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory, sshd, sglang_site_template: Path) -> dict:
    """ct200 = the pristine template (never written); ct129 = a copy, changed, pulled, changed again."""
    root = tmp_path_factory.mktemp("diff-real")
    pristine = sglang_site_template
    changed = root / "ct129" / "site-packages"
    changed.parent.mkdir()
    subprocess.run(["cp", "-a", str(pristine), str(changed)], check=True)
    configs = write_configs(root, sshd, {"ct200": pristine, "ct129": changed})
    config = load_config(str(configs["ssh"]))
    store = Store.open_or_create(config.store_path)
    assert pull(store, [config.node("ct200")]).exit_code == 0
    snap_a = store.ref("refs/heads/nodes/ct200")
    deleted = sorted(p for p in tree_hashes(pristine) if p.startswith("sglang/srt/lora/"))[0]
    with open(changed / CHANGED_M, "ab") as handle:
        handle.write(b"# hot-fix\n")
    same_size_same_mtime_edit(changed / CHANGED_SAME_SIZE)
    os.chmod(changed / CHANGED_MODE, 0o755)
    (changed / ADDED).write_text("FIX = True\n")
    (changed / deleted).unlink()
    hashes_b1 = tree_hashes(changed)
    assert pull(store, [config.node("ct129")]).exit_code == 0
    snap_b1 = store.ref("refs/heads/nodes/ct129")
    with open(changed / LIVE_ONLY, "ab") as handle:
        handle.write(b"# made on the node after the last pull\n")
    store.close()
    hashes_a = tree_hashes(pristine)
    hashes_live = tree_hashes(changed)
    expected_b1 = expected_name_status(hashes_a, hashes_b1)
    # The construction, stated plainly, must agree with the independent hashing.
    assert expected_b1 == "".join(f"{s}\t{p}\n" for p, s in sorted(
        {CHANGED_M: "M", CHANGED_SAME_SIZE: "M", CHANGED_MODE: "T", ADDED: "A", deleted: "D"}.items(),
        key=lambda item: os.fsencode(item[0])))
    return {"root": root, "configs": configs, "pristine": pristine, "changed": changed, "snap_a": snap_a,
            "snap_b1": snap_b1, "expected_b1": expected_b1,
            "expected_live": expected_name_status(hashes_a, hashes_live),
            "expected_one_arg": expected_name_status(hashes_b1, hashes_live)}


def test_real_snapshot_to_snapshot(real: dict) -> None:
    result = run_inproc("--config", real["configs"]["local"], "diff", "--name-status",
                         real["snap_a"][:10], real["snap_b1"][:10])
    assert result.code == 1, result
    assert result.out == real["expected_b1"]
    reverse = run_inproc("--config", real["configs"]["local"], "diff", "--name-status", real["snap_b1"],
                          "ct200@latest")
    swapped = {"A": "D", "D": "A"}
    assert reverse.out == "".join(f"{swapped.get(line[0], line[0])}{line[1:]}"
                                  for line in real["expected_b1"].splitlines(keepends=True))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_real_snapshot_to_live_live_to_live_and_one_argument(real: dict, transport: str) -> None:
    config = real["configs"][transport]
    assert real["expected_live"].count("\n") == real["expected_b1"].count("\n") + 1
    for args, expected in (([real["snap_a"][:7], "ct129"], real["expected_live"]),
                           (["ct200@latest", "ct129@live"], real["expected_live"]),
                           (["ct200", "ct129"], real["expected_live"]),
                           (["ct129"], real["expected_one_arg"]),
                           (["ct200"], "")):
        result = run_inproc("--config", config, "diff", "--name-status", *args)
        assert result.out == expected, (args, result)
        assert result.code == (1 if expected else 0), (args, result)
    assert real["expected_one_arg"] == f"M\t{LIVE_ONLY}\n"


def test_real_path_filter_and_quiet(real: dict) -> None:
    config = real["configs"]["ssh"]
    filtered = run_inproc("--config", config, "diff", "--name-status", "ct200", "ct129", "--",
                           "sglang/srt/speculative", CHANGED_M)
    assert filtered.out == "".join(line for line in real["expected_live"].splitlines(keepends=True)
                                   if "speculative/" in line or CHANGED_M in line)
    assert filtered.out.count("\n") == 3 and filtered.code == 1
    same = run_inproc("--config", config, "diff", "--name-status", "ct200", "ct129", "--", "sglang/srt/lora/")
    assert same.code == 1 and same.out.startswith("D\tsglang/srt/lora/")
    untouched = run_inproc("--config", config, "diff", "-q", "ct200", "ct129", "--", "sglang/srt/layers")
    assert untouched.code == 0 and untouched.out == ""
    quiet = run_inproc("--config", config, "diff", "-q", "ct200", "ct129")
    assert quiet.code == 1 and quiet.out == "" and quiet.err == ""


def test_real_unified_diff_applies_with_git_apply_and_patch(real: dict, run_snapver, tmp_path: Path) -> None:
    result = run_snapver("--config", real["configs"]["ssh"], "diff", "ct200", "ct129")
    assert result.code == 1, result
    patch_file = tmp_path / "change.diff"
    patch_file.write_bytes(result.out.encode("utf-8", "surrogateescape"))
    assert result.out.count("diff --git ") == real["expected_live"].count("\n")
    assert "old mode 100644\nnew mode 100755\n" in result.out
    target = tmp_path / "site-packages"
    subprocess.run(["cp", "-a", str(real["pristine"]), str(target)], check=True)
    expected = tree_hashes(real["changed"])
    applied = subprocess.run(["git", "apply", str(patch_file)], cwd=target, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr
    assert tree_hashes(target) == expected
    reverted = subprocess.run(["git", "apply", "-R", str(patch_file)], cwd=target, capture_output=True, text=True)
    assert reverted.returncode == 0, reverted.stderr
    assert tree_hashes(target) == tree_hashes(real["pristine"])
    patched = subprocess.run(["patch", "-p1", "-s", "-i", str(patch_file)], cwd=target, capture_output=True,
                             text=True)
    assert patched.returncode == 0, patched.stdout + patched.stderr
    assert tree_hashes(target) == expected


def test_real_diff_records_nothing_in_the_store(real: dict) -> None:
    store = real["root"] / "snapshots"
    before = subprocess.run(["git", "--git-dir", str(store), "for-each-ref"], capture_output=True).stdout
    assert run_inproc("--config", real["configs"]["ssh"], "diff", "--stat", "ct129").code == 1
    after = subprocess.run(["git", "--git-dir", str(store), "for-each-ref"], capture_output=True).stdout
    assert before == after


# -- synthetic trees ----------------------------------------------------------------------------

@pytest.fixture(params=TRANSPORTS)
def pair(request, sshd, make_site_packages, tmp_path: Path):
    """Factory: two nodes (ct200, ct129) from file maps; returns (config path, site a, site b)."""

    def make(files_a: dict, files_b: dict | None = None):
        site_a = make_site_packages("ct200", files=files_a)
        site_b = make_site_packages("ct129", files=files_a if files_b is None else files_b)
        nodes = {name: node_table(request.param, sshd, name, site)
                 for name, site in (("ct200", site_a), ("ct129", site_b))}
        config = tmp_path / "snapver.toml"
        config.write_text(toml_dumps({"store": {"path": "snapshots"}, "nodes": nodes}))
        return config, site_a, site_b

    make.transport = request.param
    return make


BASE = {"sglang/srt/a.py": "one\ntwo\nthree\n", "sglang/srt/sub/b.py": "x = 1\n"}


def test_same_size_same_mtime_edit_is_a_difference(pair) -> None:
    config, site_a, site_b = pair(BASE)
    shutil.copystat(site_a / "sglang/srt/a.py", site_b / "sglang/srt/a.py")
    assert run_inproc("--config", config, "diff", "-q", "ct200", "ct129").code == 0
    assert run_inproc("--config", config, "pull", "ct129").code == 0
    same_size_same_mtime_edit(site_b / "sglang/srt/a.py")
    for args in (["ct200", "ct129"], ["ct129"], ["ct129@latest", "ct129"]):
        result = run_inproc("--config", config, "diff", "--name-status", *args)
        assert (result.code, result.out) == (1, "M\tsglang/srt/a.py\n"), (args, result)


def test_identical_trees_exit_0_with_no_output_in_every_mode(pair) -> None:
    config, _, _ = pair(BASE)
    for mode in ([], ["--name-status"]):
        result = run_inproc("--config", config, "diff", *mode, "ct200", "ct129")
        assert (result.code, result.out, result.err) == (0, "", ""), (mode, result)
    result = run_inproc("--config", config, "diff", "--json", "ct200", "ct129")
    document = json.loads(result.out)
    assert result.code == 0 and document["identical"] is True and document["changes"] == []
    assert document["a"]["kind"] == document["b"]["kind"] == "live" and document["b"]["files"] == 2


def test_output_modes_stat_json_and_unified(pair) -> None:
    changed = {**BASE, "sglang/srt/a.py": "one\nTWO\nthree\nfour\n", "sglang/srt/c.py": "new\n"}
    del changed["sglang/srt/sub/b.py"]
    config, site_a, site_b = pair(BASE, changed)
    unified = run_inproc("--config", config, "diff", "ct200", "ct129")
    assert unified.code == 1
    assert unified.out == (
        "diff --git a/sglang/srt/a.py b/sglang/srt/a.py\n"
        f"index {blob_oid(b'one' + bytes([10]) + b'two' + bytes([10]) + b'three' + bytes([10]))[:7]}.."
        f"{blob_oid(changed['sglang/srt/a.py'].encode())[:7]} 100644\n"
        "--- a/sglang/srt/a.py\n+++ b/sglang/srt/a.py\n"
        "@@ -1,3 +1,4 @@\n one\n-two\n+TWO\n three\n+four\n"
        "diff --git a/sglang/srt/c.py b/sglang/srt/c.py\nnew file mode 100644\n"
        f"index 0000000..{blob_oid(b'new' + bytes([10]))[:7]}\n"
        "--- /dev/null\n+++ b/sglang/srt/c.py\n@@ -0,0 +1 @@\n+new\n"
        "diff --git a/sglang/srt/sub/b.py b/sglang/srt/sub/b.py\ndeleted file mode 100644\n"
        f"index {blob_oid(b'x = 1' + bytes([10]))[:7]}..0000000\n"
        "--- a/sglang/srt/sub/b.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x = 1\n")
    stat = run_inproc("--config", config, "diff", "--stat", "ct200", "ct129")
    assert stat.code == 1
    assert stat.out.splitlines() == [" sglang/srt/a.py     | 3 ++-", " sglang/srt/c.py     | 1 +",
                                     " sglang/srt/sub/b.py | 1 -",
                                     " 3 files changed, 3 insertions(+), 2 deletions(-)"]
    document = json.loads(run_inproc("--config", config, "diff", "--json", "ct200", "ct129").out)
    assert document["exit_code"] == 1 and document["identical"] is False
    assert [(c["path"], c["status"]) for c in document["changes"]] == [
        ("sglang/srt/a.py", "M"), ("sglang/srt/c.py", "A"), ("sglang/srt/sub/b.py", "D")]
    assert document["changes"][1]["new"]["oid"] == blob_oid(b"new\n") and document["changes"][1]["old"] is None
    conflicting = run_inproc("--config", config, "diff", "-q", "--stat", "ct200", "ct129")
    assert conflicting.code == 2 and "choose one" in conflicting.err


def test_binary_files(pair, tmp_path: Path) -> None:
    old = bytes(range(256)) * 40
    new = old[:5000] + b"\0\1\2" + old[5003:]
    config, site_a, site_b = pair({**BASE, "sglang/srt/kernel.so": old}, {**BASE, "sglang/srt/kernel.so": new})
    result = run_inproc("--config", config, "diff", "ct200", "ct129")
    assert result.code == 1
    assert result.out.endswith("Binary files a/sglang/srt/kernel.so and b/sglang/srt/kernel.so differ\n")
    assert "@@" not in result.out
    stat = run_inproc("--config", config, "diff", "--stat", "ct200", "ct129")
    assert f"Bin {len(old)} -> {len(new)} bytes" in stat.out
    ns = run_inproc("--config", config, "diff", "--name-status", "ct200", "ct129")
    assert ns.out == "M\tsglang/srt/kernel.so\n"


ODD = {
    "sglang/srt/with space.py": ("sglang/srt/with space.py", "a/sglang/srt/with space.py"),
    'sglang/srt/quote"d.py': ('"sglang/srt/quote\\"d.py"', '"a/sglang/srt/quote\\"d.py"'),
    "sglang/srt/new\nline.py": ('"sglang/srt/new\\nline.py"', '"a/sglang/srt/new\\nline.py"'),
    "sglang/srt/tab\there.py": ('"sglang/srt/tab\\there.py"', '"a/sglang/srt/tab\\there.py"'),
    "sglang/srt/ünïcode.py": ("sglang/srt/ünïcode.py", "a/sglang/srt/ünïcode.py"),
    os.fsdecode(b"sglang/srt/bad\xff.py"): ('"sglang/srt/bad\\377.py"', '"a/sglang/srt/bad\\377.py"'),
}


def test_odd_names_are_listed_quoted_and_survive_git_apply(pair, make_site_packages,
                                                           tmp_path: Path) -> None:
    files_a = {name: f"old {index}\n" for index, name in enumerate(ODD)}
    files_b = {name: f"new {index}\n" for index, name in enumerate(ODD)}
    files_b["sglang/srt/added name.py"] = "added\n"
    config, site_a, site_b = pair(files_a, files_b)
    ns = run_inproc("--config", config, "diff", "--name-status", "ct200", "ct129")
    assert ns.code == 1
    expected = sorted([(os.fsencode(name), f"M\t{quoted}") for name, (quoted, _) in ODD.items()]
                      + [(b"sglang/srt/added name.py", "A\tsglang/srt/added name.py")])
    assert ns.out.splitlines() == [line for _, line in expected]
    unified = run_inproc("--config", config, "diff", "ct200", "ct129")
    for _, header in ODD.values():
        assert f"diff --git {header} " in unified.out
    assert "--- a/sglang/srt/with space.py\t\n" in unified.out
    patch_file = tmp_path / "odd.diff"
    patch_file.write_bytes(unified.out.encode("utf-8", "surrogateescape"))
    target = make_site_packages("target", files=files_a)
    applied = subprocess.run(["git", "apply", str(patch_file)], cwd=target, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr
    assert tree_hashes(target) == tree_hashes(site_b)


def test_symlinks_modes_empty_files_and_missing_newlines_round_trip(pair, make_site_packages,
                                                                    tmp_path: Path) -> None:
    files_a = {**BASE, "sglang/srt/no_eol.py": "last line", "sglang/srt/gone_empty.py": "",
               "sglang/srt/to_link.py": "I become a link\n", "sglang/srt/tool.py": "run()\n"}
    files_b = {**BASE, "sglang/srt/no_eol.py": "last line changed", "sglang/srt/new_empty.py": "",
               "sglang/srt/tool.py": "run()\n"}
    config, site_a, site_b = pair(files_a, files_b)
    for site, target in ((site_a, "a.py"), (site_b, "sub/b.py")):
        (site / "sglang/srt/link").symlink_to(target)
    (site_b / "sglang/srt/to_link.py").symlink_to("a.py")
    os.chmod(site_b / "sglang/srt/tool.py", 0o755)
    ns = run_inproc("--config", config, "diff", "--name-status", "ct200", "ct129")
    assert ns.out == expected_name_status(tree_hashes(site_a), tree_hashes(site_b))
    assert ns.out == ("D\tsglang/srt/gone_empty.py\nM\tsglang/srt/link\nA\tsglang/srt/new_empty.py\n"
                      "M\tsglang/srt/no_eol.py\nT\tsglang/srt/to_link.py\nT\tsglang/srt/tool.py\n")
    unified = run_inproc("--config", config, "diff", "ct200", "ct129")
    assert "-a.py\n\\ No newline at end of file\n+sub/b.py\n\\ No newline at end of file\n" in unified.out
    assert "old mode 100644\nnew mode 100755\n" in unified.out
    assert "deleted file mode 100644\n" in unified.out and "new file mode 120000\n" in unified.out
    patch_file = tmp_path / "links.diff"
    patch_file.write_text(unified.out)
    for tool in (["git", "apply"], ["patch", "-p1", "-s", "-i"]):
        target = make_site_packages(f"target-{tool[0]}", files=files_a)
        (target / "sglang/srt/link").symlink_to("a.py")
        done = subprocess.run([*tool, str(patch_file)], cwd=target, capture_output=True, text=True)
        assert done.returncode == 0, (tool, done.stdout, done.stderr)
        assert tree_hashes(target) == tree_hashes(site_b), tool


def test_contents_cross_the_wire_only_when_the_output_shows_them(pair) -> None:
    big_a = os.urandom(3 << 20).hex()
    big_b = big_a[:-10] + "0123456789"
    config_path, _, _ = pair({**BASE, "sglang/srt/big.txt": big_a}, {**BASE, "sglang/srt/big.txt": big_b})
    config = load_config(str(config_path))
    hashes_only = diff(None, config, "ct200", "ct129")
    assert [c.path for c in hashes_only.changes] == ["sglang/srt/big.txt"] and hashes_only.files is None
    received = hashes_only.a.transport.bytes_received + hashes_only.b.transport.bytes_received
    assert received < 100_000, received
    with_text = diff(None, config, "ct200", "ct129", contents=True)
    received = with_text.a.transport.bytes_received + with_text.b.transport.bytes_received
    assert received > 2 * len(big_a), received
    assert with_text.files[0].added == with_text.files[0].removed == 1


def test_colour_on_a_terminal_only(make_site_packages, tmp_path: Path) -> None:
    sites = {name: make_site_packages(name, files=files) for name, files in (
        ("ct200", BASE), ("ct129", {**BASE, "sglang/srt/a.py": "one\n2\nthree\n"}))}
    config = tmp_path / "snapver.toml"
    config.write_text(toml_dumps({"nodes": {name: {"local": True, "site_packages": str(site)}
                                            for name, site in sites.items()}}))
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env["PYTHONPATH"] = str(REPO_ROOT)

    def run_on_tty(*extra: str) -> bytes:
        leader, follower = pty.openpty()
        process = subprocess.Popen([sys.executable, "-m", "snapver", *extra, "--config", str(config), "diff",
                                    "ct200", "ct129"], stdout=follower, stderr=follower,
                                   stdin=subprocess.DEVNULL, env=env)
        os.close(follower)
        output = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                break
            if not chunk:
                break
            output += chunk
        process.wait(timeout=60)
        os.close(leader)
        return output

    coloured = run_on_tty()
    assert b"\x1b[31m-two\x1b[0m" in coloured and b"\x1b[32m+2\x1b[0m" in coloured
    plain = run_on_tty("--no-color")
    assert b"\x1b[" not in plain and b"-two\r\n+2\r\n" in plain  # (the terminal turns \n into \r\n)


def test_bad_input_is_one_line_with_the_right_exit_code(pair, sshd, tmp_path: Path) -> None:
    config, site_a, _ = pair(BASE)
    store_missing = run_inproc("--config", config, "diff", "ct200@latest", "ct129")
    assert store_missing.code == 2 and "no store yet" in store_missing.err
    assert run_inproc("--config", config, "pull", "ct200").code == 0
    cases = [
        (["diff", "nosuch", "ct129"], 2, "unknown ref 'nosuch'"),
        (["diff", "ct200", "ct129", "extra"], 2, "one or two trees"),
        (["diff", "ct200", "ct129", "--", "../etc"], 2, "bad path"),
        (["diff", "ct200", "ct129", "--", "sglang/srt/nope.py"], 2, "matches no file"),
        (["diff", "ct200@tuesday"], 2, "after '@'"),
    ]
    for args, code, message in cases:
        result = run_inproc("--config", config, *args)
        assert result.code == code and message in result.err, (args, result)
        assert result.err.startswith("snapver: error: ") and "Traceback" not in result.err, result
    shutil.rmtree(site_a / "sglang")
    no_tree = run_inproc("--config", config, "diff", "ct200")
    assert no_tree.code == 3 and "site-packages/sglang: no such file or directory" in no_tree.err, no_tree
    assert "Traceback" not in no_tree.err


def test_unreachable_node_exit_3(sshd, make_site_packages, tmp_path: Path) -> None:
    site = make_site_packages("ct200", files=BASE)
    dead = {**node_table("ssh", sshd, "ct200", site), "port": 1, "connect_timeout": 2}
    config = tmp_path / "snapver.toml"
    config.write_text(toml_dumps({"nodes": {"ct200": {"local": True, "site_packages": str(site)},
                                            "dead": dead}}))
    result = run_inproc("--config", config, "diff", "ct200", "dead")
    assert result.code == 3, result
    assert (
        result.err.startswith("snapver: error: dead (root@127.0.0.200:1): connection refused")
        and "Traceback" not in result.err
    )
    assert len(result.err.strip().splitlines()) <= 2


def test_file_diff_is_reusable_on_bytes() -> None:
    """The generator patch export relies on: bytes in, git-style text out."""
    old = Entry("sglang/srt/x.py", "f", 0o100644, 4, "", blob_oid(b"a\nb\n"))
    new = Entry("sglang/srt/x.py", "f", 0o100644, 4, "", blob_oid(b"a\nc\n"))
    text = file_diff(Change(old.path, "M", old, new), b"a\nb\n", b"a\nc\n", context=0).text
    assert text.endswith(b"@@ -2 +2 @@\n-b\n+c\n")
    assert split_lines(b"a\r\nb\rc") == [b"a\r\n", b"b\rc"]
    assert split_lines(b"") == [] and split_lines(b"\n") == [b"\n"]


def test_connections_begun_early_serve_each_live_side_once(pair) -> None:
    """`diff` begins connecting to the nodes its refs name live before it reads the store:
    a node read live on both sides gets a second connection of its own; a ref that turns
    out not to be live (a tag that is also a node's name: ambiguous) fails as before, and
    the connection begun for it is closed."""
    config, site_a, _ = pair(BASE)
    for args in (["ct200", "ct200@live"], ["ct200@LIVE", "ct200"]):
        result = run_inproc("--config", config, "diff", "--name-status", *args)
        assert (result.code, result.out, result.err) == (0, "", ""), (args, result)
    assert run_inproc("--config", config, "pull", "ct200").code == 0
    (site_a / "sglang/srt/a.py").write_text("one\n")
    result = run_inproc("--config", config, "diff", "--name-status", "ct200@latest", "ct200")
    assert (result.code, result.out) == (1, "M\tsglang/srt/a.py\n"), result
    assert run_inproc("--config", config, "tag", "ct129", "ct200@latest").code == 0
    ambiguous = run_inproc("--config", config, "diff", "ct200", "ct129")
    assert ambiguous.code == 2 and "ct129" in ambiguous.err and "Traceback" not in ambiguous.err, ambiguous
