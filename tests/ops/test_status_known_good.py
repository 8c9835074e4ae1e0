"""snapver status against known-good code, on real sshd nodes holding the sglang wheel's tree.

Known-good is the wheel's RECORD (sha256 per file, checked here with hashlib) or a ref
(``--against``); a node with neither has none (its state is unknown, exit 1). The fleet
matrix (``--files``) gives each node's content of a file a letter.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import subprocess
from pathlib import Path

import pytest
from helpers import toml_dumps
from snapver_inproc import run_inproc

DFLASH = "sglang/srt/speculative/dflash_worker_v2.py"
RUNNER = "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py"
SERVER_ARGS = "sglang/srt/server_args.py"


def write_config(tmp_path: Path, nodes: dict) -> Path:
    config = tmp_path / "snapver.toml"
    config.write_text(toml_dumps({"store": {"path": "snapshots"}, "nodes": nodes}))
    return config


def status_json(config: Path, *args: str) -> tuple[int, dict]:
    result = run_inproc("--config", config, "status", "--json", *args)
    assert result.out, result
    return result.code, json.loads(result.out)


def patch_diff(path: str, old: str, new: str) -> str:
    """A unified diff (git style prefixes) turning ``old`` into ``new`` at ``path``."""
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{path}", f"b/{path}"))


def git(store: Path, *args: str, input: str | None = None) -> str:
    return subprocess.run(["git", "--git-dir", str(store), *args], capture_output=True, text=True,
                          input=input, check=True).stdout


@pytest.fixture
def one_node(make_site_packages, ssh_node, sglang_site_template: Path, tmp_path: Path) -> dict:
    site = make_site_packages("ct200", template=sglang_site_template)
    config = write_config(tmp_path, {"ct200": ssh_node("ct200", site)})
    assert run_inproc("--config", config, "pull").code == 0
    return {"site": site, "config": config, "store": tmp_path / "snapshots"}


def test_a_hot_fix_stays_a_hot_fix_after_a_pull(one_node: dict, tmp_path: Path) -> None:
    site, config = one_node["site"], one_node["config"]
    code, document = status_json(config)
    row = document["nodes"][0]
    assert code == 0 and row["known_good"]["kind"] == "record" and row["known_good"]["name"] == "sglang 0.5.23"
    assert row["known_good"]["files"] == [] and row["since_snapshot"] == 0
    pristine = (site / DFLASH).read_text()
    fixed = pristine + "# hot-fix: guard graph capture\n"
    (site / DFLASH).write_text(fixed)
    assert run_inproc("--config", config, "pull", "-m", "nightly").code == 0  # the pull records the hot-fix
    code, document = status_json(config)
    row = document["nodes"][0]
    assert code == 1, document
    assert row["since_snapshot"] == 0 and row["identical"] is True  # nothing changed since the pull
    assert row["known_good"]["files"] == [{"path": DFLASH, "status": "M", "label": "hot-fix", "patches": []}]
    assert row["known_good"]["hot_fixed"] == 1 and row["exit_code"] == 1
    table = run_inproc("--config", config, "status")
    assert table.code == 1
    assert "RECORD sglang 0.5.23  1 hot-fixed" in table.out.splitlines()[1]
    assert f"  M  {DFLASH}  hot-fix" in table.out.splitlines()
    # The same edit, made a known patch: patched, no longer a hot-fix, exit 0.
    diff_file = tmp_path / "guard.diff"
    diff_file.write_text(patch_diff(DFLASH, pristine, fixed))
    assert run_inproc("--config", config, "patch", "import", "guard", diff_file, "--base", "ct200~1").code == 0
    code, document = status_json(config)
    row = document["nodes"][0]
    assert code == 0, document
    assert row["known_good"]["files"] == [{"path": DFLASH, "status": "M", "label": "patch", "patches": ["guard"]}]
    assert row["known_good"]["patched_by"] == {"guard": 1} and row["known_good"]["hot_fixed"] == 0
    assert "1 patched (guard)" in run_inproc("--config", config, "status").out


def test_record_hashes_kept_in_the_store_are_the_contents_sha256(one_node: dict) -> None:
    """The RECORD comparison looks blob ids up in a cache the store keeps: each line must be
    the sha256 of that blob's content (checked here with git cat-file and hashlib)."""
    code, _document = status_json(one_node["config"])
    assert code == 0
    lines = (one_node["store"] / "snapver" / "digests-sha256").read_text().splitlines()
    assert len(lines) > 2000  # every tracked file RECORD lists, hashed once from the store
    kept = dict(line.split(" ") for line in lines)
    sizes = dict(
        line.split(" ")
        for line in git(
            one_node["store"],
            "cat-file",
            "--batch-check=%(objectname) %(objectsize)",
            input="".join(f"{oid}\n" for oid in kept),
        ).splitlines()
    )
    large = [oid for oid in kept if int(sizes[oid]) > 1 << 20]  # hashed in pieces, never whole
    assert len(large) >= 3  # the wheel's .so files (the largest: 24 MB)
    for oid in large + sorted(kept)[::250]:
        content = subprocess.run(["git", "--git-dir", str(one_node["store"]), "cat-file", "blob", oid],
                                 capture_output=True, check=True).stdout
        assert hashlib.sha256(content).hexdigest() == kept[oid]
    # A status that finds them all there agrees, and adds nothing.
    assert status_json(one_node["config"])[0] == 0
    assert len((one_node["store"] / "snapver" / "digests-sha256").read_text().splitlines()) == len(lines)


def test_a_hot_fix_made_before_the_first_pull_is_found(make_site_packages, ssh_node, sglang_site_template,
                                                          tmp_path: Path) -> None:
    """Blobs the store lacks (no pull yet, no store at all) are hashed on the node."""
    site = make_site_packages("ct200", template=sglang_site_template)
    with open(site / SERVER_ARGS, "a") as handle:
        handle.write("# edited by hand\n")
    (site / RUNNER).unlink()
    config = write_config(tmp_path, {"ct200": ssh_node("ct200", site)})
    code, document = status_json(config)
    row = document["nodes"][0]
    assert code == 1 and row["snapshot"] is None and row["drift"] is None
    assert [(f["path"], f["status"], f["label"]) for f in row["known_good"]["files"]] == [
        (RUNNER, "D", "hot-fix"), (SERVER_ARGS, "M", "hot-fix")]


def test_against_a_folder(one_node: dict, tmp_path: Path) -> None:
    """The known-good copy is a plain folder (the inside of sglang/srt): the node is held
    against it; a file the node has otherwise is a hot-fix (exit 1); an exact copy agrees."""
    import shutil

    site, config = one_node["site"], one_node["config"]
    folder = tmp_path / "known_good"
    shutil.copytree(site / "sglang" / "srt", folder, symlinks=True)
    code, document = status_json(config, "--against", str(folder))
    assert code == 0, document
    with open(folder / SERVER_ARGS.split("sglang/srt/", 1)[1], "a") as handle:
        handle.write("# the known-good copy has this line\n")
    code, document = status_json(config, "--against", str(folder))
    row = document["nodes"][0]
    # The node's file differs from the folder, but is as its RECORD: pristine, not a hot-fix.
    assert code == 0 and row["known_good"]["kind"] == "ref" and row["known_good"]["commit"] is None
    assert [(f["path"], f["label"]) for f in row["known_good"]["files"]] == [(SERVER_ARGS, "pristine")]
    with open(site / SERVER_ARGS, "a") as handle:
        handle.write("# and the node another\n")
    code, document = status_json(config, "--against", str(folder))
    files = document["nodes"][0]["known_good"]["files"]
    assert code == 1 and [(f["path"], f["label"]) for f in files] == [(SERVER_ARGS, "hot-fix")], files


def test_against_a_tag_and_nothing_known_good_without_a_record(one_node: dict) -> None:
    site, config = one_node["site"], one_node["config"]
    assert run_inproc("--config", config, "tag", "may22", "ct200").code == 0
    with open(site / SERVER_ARGS, "a") as handle:
        handle.write("# edited by hand\n")
    assert run_inproc("--config", config, "pull").code == 0
    code, document = status_json(config, "--against", "may22")
    row = document["nodes"][0]
    assert code == 1 and document["against"] == "may22"
    assert row["known_good"]["kind"] == "ref" and row["known_good"]["name"] == "may22"
    assert row["known_good"]["commit"] == git(one_node["store"], "rev-parse", "may22").strip()
    assert [(f["path"], f["label"]) for f in row["known_good"]["files"]] == [(SERVER_ARGS, "hot-fix")]
    table = run_inproc("--config", config, "status", "--against", "may22").out
    assert re.search(r"  may22 \([0-9a-f]{10}\) +1 hot-fixed", table.splitlines()[1]), table
    bad = run_inproc("--config", config, "status", "--against", "nosuch")
    assert bad.code == 2 and "unknown ref 'nosuch'" in bad.err
    live = run_inproc("--config", config, "status", "--against", "ct200")
    assert live.code == 2 and "a live node is not known-good code" in live.err
    # No RECORD: nothing is known-good (a tag is a name, not a claim; the newest snapshot holds
    # the edit): the state is unknown, exit 1, and status says how to name known-good code.
    (site / "sglang-0.5.23.dist-info" / "RECORD").unlink()
    code, document = status_json(config)
    row = document["nodes"][0]
    assert code == 1 and row["known_good"] is None and row["identical"] is True, row
    assert row["pristine_unchecked"].startswith("sglang-0.5.23.dist-info has no RECORD file: no known-good code")
    text = run_inproc("--config", config, "status").out
    assert "ct200: sglang-0.5.23.dist-info has no RECORD file: " in text and "--against REF" in text
    assert "pristine" not in text.replace("whether its tree is pristine is unknown", "")
    code, document = status_json(config, "--against", "may22")  # still held against what it names
    assert code == 1 and document["nodes"][0]["known_good"]["hot_fixed"] == 1


@pytest.fixture
def three_nodes(make_site_packages, ssh_node, sglang_site_template: Path, tmp_path: Path) -> dict:
    """ct200 pristine; ct129 carries the cudagraph-bs patch; fleet00 hot-fixed the same file
    its own way and lost dflash_worker_v2.py."""
    sites = {name: make_site_packages(name, template=sglang_site_template) for name in ("ct200", "ct129", "fleet00")}
    config = write_config(tmp_path, {name: ssh_node(name, site) for name, site in sites.items()})
    assert run_inproc("--config", config, "pull", "ct200").code == 0
    pristine = (sites["ct200"] / RUNNER).read_text()
    patched = pristine.replace("import ", "import  ", 1) + "# cudagraph-bs: larger batch sizes\n"
    diff_file = tmp_path / "cudagraph-bs.diff"
    diff_file.write_text(patch_diff(RUNNER, pristine, patched))
    assert run_inproc("--config", config, "patch", "import", "cudagraph-bs", diff_file, "--base", "ct200").code == 0
    (sites["ct129"] / RUNNER).write_text(patched)
    (sites["fleet00"] / RUNNER).write_text(pristine + "# fleet00 hand edit\n")
    (sites["fleet00"] / DFLASH).unlink()
    return {"config": config, "sites": sites, "patched": patched}


def test_fleet_matrix_letters_and_legend(three_nodes: dict) -> None:
    config = three_nodes["config"]
    result = run_inproc("--config", config, "status", "--files", "--json")
    assert result.code == 1, result
    document = json.loads(result.out)
    assert document["nodes"] == ["ct200", "ct129", "fleet00"]
    rows = {row["path"]: row for row in document["files"]}
    assert sorted(rows) == [RUNNER, DFLASH]  # every other file agrees
    runner = rows[RUNNER]
    assert runner["nodes"] == {"ct200": "A", "ct129": "B", "fleet00": "C"} and runner["agrees"] is False
    assert runner["legend"]["A"]["is"] == "pristine sglang 0.5.23"
    assert runner["legend"]["B"]["is"] == "patch cudagraph-bs"
    assert runner["legend"]["B"]["oid"] == git_hash(three_nodes["patched"].encode())
    assert runner["legend"]["C"]["is"] == "hot-fix"
    assert rows[DFLASH]["nodes"] == {"ct200": "A", "ct129": "A", "fleet00": "-"}
    assert rows[DFLASH]["legend"]["A"]["is"] == "pristine sglang 0.5.23"
    text = run_inproc("--config", config, "status", "--files")
    assert text.code == 1
    lines = text.out.splitlines()
    assert lines[:4] == ["ct200", "| ct129", "| | fleet00", "| | |"]
    assert f"A B C  {RUNNER}" in lines
    assert f"A A -  {DFLASH}" in lines
    legend = lines[lines.index(f"A B C  {RUNNER}") + 1]
    assert legend.startswith("       A pristine sglang 0.5.23  B patch cudagraph-bs  C hot-fix ")
    assert all(len(line) <= 80 for line in lines), lines
    # Files named after `--` are rows whether or not they agree; all agreeing: exit 0.
    named = run_inproc("--config", config, "status", "--files", "--json", "--", SERVER_ARGS)
    assert named.code == 0, named
    only = json.loads(named.out)["files"]
    assert [(r["path"], r["nodes"], r["agrees"]) for r in only] == [
        (SERVER_ARGS, {"ct200": "A", "ct129": "A", "fleet00": "A"}, True)]
    assert run_inproc("--config", config, "status", "--files", "ct200", "ct129", "--", DFLASH).code == 0
    missing = run_inproc("--config", config, "status", "--files", "--", "sglang/srt/nosuch.py")
    assert missing.code == 2 and "matches no file" in missing.err
    no_files = run_inproc("--config", config, "status", "--", SERVER_ARGS)
    assert no_files.code == 2 and "--files" in no_files.err


def git_hash(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def test_a_wide_fleet_matrix_wraps_node_columns_into_blocks(make_site_packages, tmp_path: Path) -> None:
    """Ten local nodes (small trees, no RECORD): blocks of 8 and 2 columns, 80 columns wide."""
    nodes = {}
    for index in range(10):
        name = f"node-with-a-long-name-{index:02d}"
        body = "x = 1\n" if index % 3 else f"x = {index}\n"
        site = make_site_packages(name, files={"sglang/srt/a.py": body, "sglang/srt/b.py": "same\n"})
        nodes[name] = {"local": True, "site_packages": str(site)}
    config = write_config(tmp_path, nodes)
    result = run_inproc("--config", config, "status", "--files")
    assert result.code == 1, result
    lines = result.out.splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    first, second = lines.index("node-with-a-long-name-00"), lines.index("node-with-a-long-name-08")
    assert lines[first + 8] == "| " * 7 + "|" and lines[second + 2] == "| |"
    rows = [line for line in lines if line.endswith("sglang/srt/a.py")]
    oid = {i: git_hash(("x = 1\n" if i % 3 else f"x = {i}\n").encode()) for i in range(10)}
    assert rows == ["A B B C B B D B  sglang/srt/a.py", "B E  sglang/srt/a.py"]
    assert f"A {oid[0][:10]}" in lines[lines.index(rows[0]) + 1]  # no RECORD, no snapshot: blob ids
    assert "b.py" not in result.out  # agrees everywhere


def test_an_unchanged_node_reuses_how_its_snapshot_stood_against_its_record(one_node: dict) -> None:
    """Once worked out for a snapshot, the RECORD comparison is kept in the store: while the
    node's tree is that snapshot's, status does not read RECORD again (-c reads it afresh)."""
    site, config, store = one_node["site"], one_node["config"], one_node["store"]
    with open(site / SERVER_ARGS, "a") as handle:
        handle.write("# edited by hand\n")
    assert run_inproc("--config", config, "pull").code == 0
    code, document = status_json(config)
    assert code == 1 and document["nodes"][0]["known_good"]["hot_fixed"] == 1
    kept = json.loads((store / "snapver" / "record-check" / "ct200.json").read_text())
    head = git(store, "rev-parse", "refs/heads/nodes/ct200").strip()
    assert kept["key"]["snapshot"] == head and kept["differing"] == [[SERVER_ARGS, "M"]]
    # RECORD gone: the kept answer stands for the unchanged snapshot...
    record = site / "sglang-0.5.23.dist-info" / "RECORD"
    saved = record.read_bytes()
    record.unlink()
    code, document = status_json(config)
    row = document["nodes"][0]
    assert code == 1 and row["known_good"]["kind"] == "record" and row["known_good"]["hot_fixed"] == 1
    # ... -c hashes every file and reads RECORD again: none, so nothing is known-good.
    code, document = status_json(config, "-c")
    assert code == 1 and document["nodes"][0]["known_good"] is None
    # A change since the snapshot: RECORD is read again.
    record.write_bytes(saved)
    with open(site / SERVER_ARGS, "a") as handle:
        handle.write("# edited again\n")
    record.unlink()
    code, document = status_json(config)
    assert code == 1 and document["nodes"][0]["known_good"] is None


def test_nodes_with_different_records_are_each_held_against_their_own(make_site_packages, ssh_node,
                                                                        tmp_path: Path) -> None:
    """RECORDs are read once per content: a node whose RECORD differs is not judged by another's."""
    import base64

    def installed(text: str) -> dict[str, str]:
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        return {"sglang/srt/a.py": text,
                "sglang-0.5.23.dist-info/METADATA": "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n\n",
                "sglang-0.5.23.dist-info/RECORD": f"sglang/srt/a.py,sha256={digest},{len(text)}\n"}

    sites = {"ct200": make_site_packages("ct200", files=installed("a = 1\n")),
             "ct129": make_site_packages("ct129", files=installed("a = 2\n")),
             "fleet00": make_site_packages("fleet00", files=installed("a = 1\n"))}
    (sites["fleet00"] / "sglang/srt/a.py").write_text("a = 2\n")  # ct129's content, not fleet00's RECORD's
    config = write_config(tmp_path, {name: ssh_node(name, site) for name, site in sites.items()})
    code, document = status_json(config)
    hot = {row["node"]: [f["path"] for f in row["known_good"]["files"]] for row in document["nodes"]}
    assert hot == {"ct200": [], "ct129": [], "fleet00": ["sglang/srt/a.py"]} and code == 1


def installed_tree(files: dict[str, str]) -> dict[str, str]:
    """``files`` as pip would have installed them: METADATA, and a RECORD of their sha256."""
    import base64

    def sha256(text: str) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()

    rows = "".join(f"{path},sha256={sha256(text)},{len(text.encode())}\n" for path, text in sorted(files.items()))
    return {**files, "sglang-0.5.23.dist-info/METADATA": "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n\n",
            "sglang-0.5.23.dist-info/RECORD": rows}


SMALL = {"sglang/srt/a.py": "a = 1\n", "sglang/srt/b.py": "b.py.orig", "sglang/srt/c.py": "c = 1\n"}


@pytest.fixture(params=["local", "ssh"])
def small_fleet(request, make_site_packages, ssh_node, local_node, tmp_path: Path) -> dict:
    """Three nodes as installed (RECORD) with SMALL; the test makes them differ."""
    sites = {name: make_site_packages(name, files=installed_tree(SMALL)) for name in ("ct200", "ct129", "fleet00")}
    config = write_config(tmp_path, {name: ssh_node(name, site) if request.param == "ssh" else local_node(site)
                                     for name, site in sites.items()})
    return {"config": config, "sites": sites}


def test_fleet_matrix_tells_a_mode_or_a_link_from_the_same_bytes(small_fleet: dict) -> None:
    """Same bytes, another mode (or a symlink whose target is those bytes) is not identical:
    `diff` says T; the matrix gave them one letter and said every file agreed (exit 0)."""
    config, sites = small_fleet["config"], small_fleet["sites"]
    (sites["ct129"] / "sglang/srt/a.py").chmod(0o755)
    (sites["fleet00"] / "sglang/srt/b.py").unlink()
    (sites["fleet00"] / "sglang/srt/b.py").symlink_to("b.py.orig")  # its target: b.py's bytes on the others
    result = run_inproc("--config", config, "status", "--files", "--json")
    assert result.code == 1, result
    document = json.loads(result.out)
    rows = {row["path"]: row for row in document["files"]}
    assert sorted(rows) == ["sglang/srt/a.py", "sglang/srt/b.py"]
    a, b = rows["sglang/srt/a.py"], rows["sglang/srt/b.py"]
    assert a["nodes"] == {"ct200": "A", "ct129": "B", "fleet00": "A"} and a["agrees"] is False
    assert a["legend"]["A"]["oid"] == a["legend"]["B"]["oid"] == git_hash(SMALL["sglang/srt/a.py"].encode())
    assert (a["legend"]["A"]["mode"], a["legend"]["B"]["mode"]) == ("100644", "100755")
    assert a["legend"]["A"]["is"] == a["legend"]["B"]["is"] == "pristine sglang 0.5.23"  # RECORD: content only
    assert b["nodes"] == {"ct200": "A", "ct129": "A", "fleet00": "B"} and b["legend"]["B"]["mode"] == "120777"
    assert b["legend"]["A"]["oid"] == b["legend"]["B"]["oid"]
    text = run_inproc("--config", config, "status", "--files")
    assert text.code == 1, text
    lines = text.out.splitlines()
    row = lines.index("A B A  sglang/srt/a.py")  # the legend wraps at 80 columns
    assert lines[row + 1:row + 3] == ["       A pristine sglang 0.5.23 mode 100644",
                                      "       B pristine sglang 0.5.23 mode 100755"]
    row = lines.index("A A B  sglang/srt/b.py")
    assert lines[row + 1].startswith("       A pristine sglang 0.5.23 mode 100644  B ")
    assert lines[row + 1].endswith(" link")
    assert lines[-1] == "2 files differ across 3 nodes"


def test_fleet_matrix_names_the_nodes_it_could_not_read(small_fleet: dict, tmp_path: Path) -> None:
    """A node that could not be read is not compared, and the matrix says so: it said
    "all files agree on 2 nodes" with one of the two unread."""
    config, sites = small_fleet["config"], small_fleet["sites"]
    (sites["ct200"] / "sglang/srt/c.py").write_text("c = 'hot-fixed'\n")
    sites["fleet00"].rename(sites["fleet00"].with_name("gone"))
    # Two nodes, one unread: nothing to compare, and no claim that anything agrees.
    result = run_inproc("--config", config, "status", "--files", "ct200", "fleet00")
    assert result.code == 3 and "agree" not in result.out, result
    assert result.out.splitlines() == ["nothing compared: only ct200 was read; not compared: fleet00"]
    document = json.loads(run_inproc("--config", config, "status", "--files", "--json", "ct200", "fleet00").out)
    assert document["compared"] == ["ct200"] and document["not_compared"] == ["fleet00"] and document["files"] == []
    # Three nodes, one unread: ct200's difference from ct129 is still a row; fleet00 is '?'.
    result = run_inproc("--config", config, "status", "--files", "--json")
    assert result.code == 3, result
    document = json.loads(result.out)
    assert document["compared"] == ["ct200", "ct129"] and document["not_compared"] == ["fleet00"]
    assert [(r["path"], r["nodes"], r["agrees"]) for r in document["files"]] == [
        ("sglang/srt/c.py", {"ct200": "A", "ct129": "B", "fleet00": "?"}, False)]
    assert document["files"][0]["legend"]["A"]["is"] == "hot-fix"
    text = run_inproc("--config", config, "status", "--files")
    assert text.code == 3 and "fleet00" in text.err, text
    assert text.out.splitlines()[-1] == "1 file differs across the 2 nodes read; not compared: fleet00", text
    # Named files that agree on the nodes read: no claim about the node not read.
    named = run_inproc("--config", config, "status", "--files", "--json", "--", "sglang/srt/a.py")
    assert named.code == 3
    assert [(r["nodes"], r["agrees"]) for r in json.loads(named.out)["files"]] == [
        ({"ct200": "A", "ct129": "A", "fleet00": "?"}, None)]
    named = run_inproc("--config", config, "status", "--files", "--", "sglang/srt/a.py")
    assert named.out.splitlines()[-1] == ("the 1 file(s) named agree on the 2 nodes read; not compared: fleet00")


def test_fleet_matrix_quotes_a_path_as_diff_does(small_fleet: dict) -> None:
    config, sites = small_fleet["config"], small_fleet["sites"]
    (sites["ct129"] / "sglang/srt/new\nline.py").write_text("x = 1\n")
    text = run_inproc("--config", config, "status", "--files")
    assert text.code == 1, text
    assert '- A -  "sglang/srt/new\\nline.py"' in text.out.splitlines(), text
    names = run_inproc("--config", config, "diff", "--name-status", "ct200", "ct129")
    assert names.out == 'A\t"sglang/srt/new\\nline.py"\n', names


def test_against_a_ref_labels_a_file_by_its_known_source(one_node: dict, tmp_path: Path) -> None:
    """A folder imported as may22 has a local edit of DFLASH; on ct200 that file is pristine
    per the RECORD. `status --against may22` said `hot-fix`, `1 hot-fixed`: differing from
    the reference and having no known source are two facts, and only the second is a hot-fix."""
    config = one_node["config"]
    folder = tmp_path / "may22-copy" / "srt"
    folder.parent.mkdir()
    subprocess.run(["cp", "-a", str(one_node["site"] / "sglang" / "srt"), str(folder)], check=True)
    edited = folder / "speculative" / "dflash_worker_v2.py"
    edited.write_text(edited.read_text() + "# local edit in the May 22 copy\n")
    imported = run_inproc("--config", config, "import", str(folder), "--node", "ct200", "--date", "2026-05-22",
                          "--tag", "may22")
    assert imported.code == 0, imported

    code, document = status_json(config, "--against", "may22", "ct200")
    row = document["nodes"][0]
    files = {item["path"]: item for item in row["known_good"]["files"]}
    assert set(files) == {DFLASH}, files  # it differs from may22: said
    assert files[DFLASH]["label"] == "pristine" and files[DFLASH]["source"] == "RECORD", files
    assert row["known_good"]["hot_fixed"] == 0 and code == 0, row

    table = run_inproc("--config", config, "status", "--against", "may22", "ct200")
    assert "hot-fix" not in table.out and f"M  {DFLASH}  pristine (RECORD)" in table.out, table.out

    # A file with no known source is still a hot-fix against the ref.
    live = one_node["site"] / RUNNER
    live.write_text(live.read_text() + "# by hand\n")
    code, document = status_json(config, "--against", "may22", "ct200")
    labels = {item["path"]: item["label"] for item in document["nodes"][0]["known_good"]["files"]}
    assert labels == {DFLASH: "pristine", RUNNER: "hot-fix"} and code == 1, labels


def test_a_down_node_keeps_its_last_seen_state(one_node: dict, tmp_path: Path, ssh_node) -> None:
    """ct200 unreachable (pointed at a closed port) after a pull: its row read `no  none
    (snapver pull)` and --json `"snapshot": null`, while `log` lists its snapshots."""
    config, store = one_node["config"], one_node["store"]
    live = one_node["site"] / DFLASH
    live.write_text(live.read_text() + "# hot-fix by hand\n")
    assert run_inproc("--config", config, "pull", "ct200").code == 0
    head = git(store, "rev-parse", "refs/heads/nodes/ct200").strip()
    write_config(tmp_path, {"ct200": ssh_node("ct200", one_node["site"], port=1, connect_timeout=2)})

    code, document = status_json(config)
    row = document["nodes"][0]
    assert code == 3 and row["reachable"] is False and row["live"] is False, row
    assert row["snapshot"] == head and row["age_seconds"] is not None, row
    seen = row["known_good"]
    assert seen["kind"] == "record" and seen["hot_fixed"] == 1 and seen["files"][0]["path"] == DFLASH, seen

    table = run_inproc("--config", config, "status")
    line = next(text for text in table.out.splitlines() if text.startswith("ct200"))
    assert head[:7] in line and "no" in line.split() and "was 1 hot-fixed" in line, table.out
    assert f"ct200: down: as last seen in snapshot {head[:10]}" in table.out, table.out
