"""snapver status: the fleet table, drift against the newest snapshot, and what each drifted file is.

Labels are checked on a small tree with a hand-written RECORD (sha256 computed here):
``pristine`` (matches RECORD), ``patch NAME`` (matches a patch imported into the store),
``hot-fix`` (neither). The real sglang tree is checked once for "identical".
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import toml_dumps
from snapver_inproc import run_inproc

PRISTINE = {
    "sglang/srt/a.py": "a = 'as shipped'\n",
    "sglang/srt/b.py": "b = 'as shipped'\n",
    "sglang/srt/c.py": "c = 'as shipped'\n",
    "sglang/srt/d.py": "d = 'as shipped'\n",
}
PATCHED_B = "b = 'fixed by the fix-b patch'\n"


def record_of(files: dict[str, str]) -> str:
    rows = []
    for path, text in sorted(files.items()):
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        rows.append(f"{path},sha256={digest},{len(text.encode())}\n")
    return "".join(rows) + "sglang-0.5.23.dist-info/RECORD,,\n"


def installed(files: dict[str, str]) -> dict[str, str]:
    """A site-packages holding ``files`` as if pip installed PRISTINE (METADATA, RECORD)."""
    return {**files, "sglang-0.5.23.dist-info/METADATA": "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n\n",
            "sglang-0.5.23.dist-info/RECORD": record_of(PRISTINE)}


@pytest.fixture(params=["local", "ssh"])
def fleet(request, make_site_packages, ssh_node, tmp_path: Path) -> dict:
    """ct200 drifted in every way, ct129 identical to its snapshot, dead unreachable."""
    at_pull = {**PRISTINE, "sglang/srt/a.py": "a = 'hot-fixed before the pull'\n",
               "sglang/srt/x.py": "x = 'not in the wheel'\n"}
    ct200 = make_site_packages("ct200", files=installed(at_pull))
    ct129 = make_site_packages("ct129", files=installed(PRISTINE))
    if request.param == "local":
        nodes = {"ct200": {"local": True, "site_packages": str(ct200)},
                 "ct129": {"local": True, "site_packages": str(ct129)}}
    else:
        nodes = {"ct200": ssh_node("ct200", ct200), "ct129": ssh_node("ct129", ct129)}
    nodes["dead"] = ssh_node("fleet00", ct129, port=1, connect_timeout=2)
    config = tmp_path / "snapver.toml"
    config.write_text(toml_dumps({"store": {"path": "snapshots"}, "nodes": nodes,
                                  "groups": {"tp8": ["ct200", "ct129"]}}))
    pulled = run_inproc("--config", config, "pull", "tp8")
    assert pulled.code == 0, pulled
    diff_file = tmp_path / "fix-b.diff"
    diff_file.write_text("--- a/sglang/srt/b.py\n+++ b/sglang/srt/b.py\n@@ -1 +1 @@\n"
                         f"-{PRISTINE['sglang/srt/b.py']}+{PATCHED_B}")
    imported = run_inproc("--config", config, "patch", "import", "fix-b", diff_file, "--base", "ct200")
    assert imported.code == 0, imported
    # Live drift on ct200 since its snapshot, one of each kind:
    (ct200 / "sglang/srt/a.py").write_text(PRISTINE["sglang/srt/a.py"])  # back to the wheel: pristine
    (ct200 / "sglang/srt/b.py").write_text(PATCHED_B)  # what fix-b makes it: patch
    (ct200 / "sglang/srt/c.py").write_text("c = 'edited by hand on the node'\n")  # hot-fix
    (ct200 / "sglang/srt/d.py").unlink()  # the wheel has it: a hot-fix deletion
    (ct200 / "sglang/srt/x.py").unlink()  # the wheel lacks it: deleting it is pristine
    (ct200 / "sglang/srt/e.py").write_text("e = 'new'\n")  # not in the wheel, no patch: hot-fix
    return {"config": config, "store": tmp_path / "snapshots", "ct200": ct200}


EXPECTED_DRIFT = [
    {"path": "sglang/srt/a.py", "status": "M", "label": "pristine", "patches": []},
    {"path": "sglang/srt/b.py", "status": "M", "label": "patch", "patches": ["fix-b"]},
    {"path": "sglang/srt/c.py", "status": "M", "label": "hot-fix", "patches": []},
    {"path": "sglang/srt/d.py", "status": "D", "label": "hot-fix", "patches": []},
    {"path": "sglang/srt/e.py", "status": "A", "label": "hot-fix", "patches": []},
    {"path": "sglang/srt/x.py", "status": "D", "label": "pristine", "patches": []},
]


def test_status_labels_every_drifted_file(fleet: dict) -> None:
    result = run_inproc("--config", fleet["config"], "status", "--json", "tp8")
    assert result.code == 1, result
    document = json.loads(result.out)
    rows = {row["node"]: row for row in document["nodes"]}
    assert list(rows) == ["ct200", "ct129"] and document["exit_code"] == 1
    ct200 = rows["ct200"]
    head = subprocess.run(["git", "--git-dir", str(fleet["store"]), "rev-parse", "refs/heads/nodes/ct200"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert ct200["reachable"] is True and ct200["snapshot"] == head and ct200["identical"] is False
    assert ct200["drift"] == EXPECTED_DRIFT
    assert ct200["dist"] == "sglang 0.5.23" and ct200["exit_code"] == 1
    assert ct200["patches"] == [{"name": "fix-b", "matched": 1, "total": 1, "applied": True}]
    assert rows["ct129"]["identical"] is True and rows["ct129"]["drift"] == [] and rows["ct129"]["exit_code"] == 0
    assert rows["ct129"]["patches"] == []


def test_status_table(fleet: dict) -> None:
    result = run_inproc("--config", fleet["config"], "status")
    assert result.code == 3, result  # the dead node
    lines = result.out.splitlines()
    assert lines[0].split() == ["node", "reachable", "snapshot", "since", "snapshot", "known-good", "state",
                                "restart"]
    restart = {line.split()[0]: line.split()[-1] for line in lines[1:4]}
    assert restart == {"ct200": "0", "ct129": "0", "dead": "-"}  # no process runs these trees; dead: unknown
    row = {line.split()[0]: line.rstrip()[:-1] for line in lines[1:4]}  # without the restart cell
    assert row["ct200"].split()[1] == "yes" and " 6 files " in row["ct200"]
    assert row["ct200"].rstrip().endswith("RECORD sglang 0.5.23  1 patched (fix-b), 3 hot-fixed")
    assert row["ct129"].split()[1] == "yes" and row["ct129"].rstrip().endswith(
        "none            RECORD sglang 0.5.23  pristine"
    )
    assert row["dead"].split()[1] == "no" and "none" in row["dead"]
    assert "ct200: 6 files changed since snapshot" in result.out
    for item in EXPECTED_DRIFT:
        label = "patch fix-b" if item["label"] == "patch" else item["label"]
        assert f"  {item['status']}  {item['path']}  {label}" in lines
    off = lines.index("ct200: 4 files not as RECORD sglang 0.5.23")
    assert lines[off + 1 : off + 5] == [
        f"  {i['status']}  {i['path']}  {'patch fix-b' if i['label'] == 'patch' else i['label']}"
        for i in EXPECTED_DRIFT
        if i["label"] != "pristine"
    ]
    assert (
        result.err.startswith("snapver: error: dead (root@")
        and "connection refused" in result.err
        and "Traceback" not in result.err
    )
    only_identical = run_inproc("--config", fleet["config"], "status", "ct129")
    assert only_identical.code == 0 and "pristine" in only_identical.out


def test_status_takes_node_at_live(fleet: dict) -> None:
    """SPEC: `ct200@live` is the live node anywhere; status refused it ("unknown node or group")."""
    result = run_inproc("--config", fleet["config"], "status", "--json", "ct200@live", "ct129@LIVE", "ct200")
    assert result.code == 1, result
    rows = {row["node"]: row for row in json.loads(result.out)["nodes"]}
    assert list(rows) == ["ct200", "ct129"]
    assert rows["ct200"]["drift"] == EXPECTED_DRIFT and rows["ct129"]["identical"] is True
    unknown = run_inproc("--config", fleet["config"], "status", "ct201@live")
    assert unknown.code == 2 and "unknown node or group 'ct201@live'" in unknown.err, unknown


def test_status_shows_an_interrupted_push(fleet: dict) -> None:
    store = str(fleet["store"])
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    meta = json.dumps({"kind": "push", "action": "push", "state": "started", "patch": "fix-b", "node": "ct200"})
    record = subprocess.run(["git", "--git-dir", store, "commit-tree", "refs/heads/nodes/ct200^{tree}", "-m",
                             f"push fix-b to ct200\n\nsnapver-meta: {meta}"], capture_output=True, text=True,
                            env=env, check=True).stdout.strip()
    subprocess.run(["git", "--git-dir", store, "update-ref", "refs/heads/pushes/ct200", record], check=True)
    result = run_inproc("--config", fleet["config"], "status", "ct200")
    assert "ct200: INTERRUPTED push fix-b" in result.out and "snapver rollback ct200" in result.out
    document = json.loads(run_inproc("--config", fleet["config"], "status", "--json", "ct200").out)
    assert document["nodes"][0]["push"]["interrupted"] is True


def test_status_without_a_store_or_snapshot(make_site_packages, tmp_path: Path) -> None:
    site = make_site_packages("ct200", files=installed(PRISTINE))
    config = tmp_path / "snapver.toml"
    config.write_text(toml_dumps({"nodes": {"ct200": {"local": True, "site_packages": str(site)}}}))
    document = json.loads(run_inproc("--config", config, "status", "--json").out)
    row = document["nodes"][0]
    assert row["reachable"] is True and row["snapshot"] is None and row["drift"] is None
    assert document["exit_code"] == 0 and row["files"] == 4
    unknown = run_inproc("--config", config, "status", "nosuch")
    assert unknown.code == 2 and "unknown node or group 'nosuch'" in unknown.err
    for folder in ("sglang/srt", "sglang-0.5.23.dist-info"):
        subprocess.run(["rm", "-r", str(site / folder)], check=True)
    gone = run_inproc("--config", config, "status")
    assert gone.code == 3 and gone.out.splitlines()[1].split()[:2] == ["ct200", "yes"]
    assert gone.err.startswith("snapver: error: ct200: ") and "sglang/srt: no such file or directory" in gone.err


def test_status_of_the_real_tree_over_ssh(sglang_site_template: Path, ssh_node, tmp_path: Path) -> None:
    config = tmp_path / "snapver.toml"
    config.write_text(toml_dumps({"store": {"path": "snapshots"},
                                  "nodes": {"ct200": ssh_node("ct200", sglang_site_template)}}))
    assert run_inproc("--config", config, "pull", "ct200").code == 0
    document = json.loads(run_inproc("--config", config, "status", "--json").out)
    row = document["nodes"][0]
    assert document["exit_code"] == 0 and row["identical"] is True and row["files"] == 2602
    assert row["dist"] == "sglang 0.5.23"


def _record_started_push(store: str, node: str, patch: str) -> None:
    """A push record left "started" (the writer died), made with git plumbing as in the test above."""
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    meta = json.dumps({"kind": "push", "action": "push", "state": "started", "patch": patch, "node": node})
    record = subprocess.run(["git", "--git-dir", store, "commit-tree", f"refs/heads/nodes/{node}^{{tree}}", "-m",
                             f"push {patch} to {node}\n\nsnapver-meta: {meta}"], capture_output=True, text=True,
                            env=env, check=True).stdout.strip()
    subprocess.run(["git", "--git-dir", store, "update-ref", f"refs/heads/pushes/{node}", record], check=True)


def test_status_of_several_nodes_shows_each_interrupted_push(fleet: dict) -> None:
    """Each node's row probes the store lock in a thread of its own: the probes must not take each
    other for a running push (they did: `status a b` said `started` where `status a` said INTERRUPTED)."""
    from snapver.ops.status import last_push
    from snapver.store.repo import Store

    store = Store(fleet["store"])
    for node in ("ct200", "ct129"):
        _record_started_push(str(fleet["store"]), node, "fix-b")
    # Many probes at once, lined up by a barrier: where a probe took the lock, most rounds overlapped.
    barrier = threading.Barrier(8)

    def probe(node: str) -> list[bool]:
        seen = []
        for _ in range(25):
            barrier.wait()
            seen.append(last_push(store, node)["interrupted"])
        return seen

    with ThreadPoolExecutor(8) as pool:
        rounds = list(pool.map(probe, ["ct200", "ct129"] * 4))
    assert all(all(seen) for seen in rounds), "a concurrent probe was taken for a running push"
    result = run_inproc("--config", fleet["config"], "status", "ct200", "ct129")
    assert "ct200: INTERRUPTED push fix-b" in result.out and "ct129: INTERRUPTED push fix-b" in result.out, result
    # While a command really holds the lock, a started push is running, not interrupted.
    with store.lock():
        assert last_push(store, "ct200")["interrupted"] is False
        assert last_push(store, "ct200")["running"] is True


@pytest.mark.parametrize("transport", ["local", "ssh"])
def test_a_node_without_a_record_is_never_called_pristine(transport: str, make_site_packages, ssh_node,
                                                          local_node, tmp_path: Path) -> None:
    """No RECORD and no --against: nothing is known-good. A hot-fix pulled into the newest
    snapshot must not make the node "pristine" (it did: exit 0 once a pull followed the edit)."""
    site = make_site_packages("ct200", files=PRISTINE)  # no dist-info
    node = ssh_node("ct200", site) if transport == "ssh" else local_node(site)
    config = tmp_path / "snapver.toml"
    config.write_text(toml_dumps({"store": {"path": "snapshots"}, "nodes": {"ct200": node}}))
    assert run_inproc("--config", config, "pull").code == 0
    (site / "sglang/srt/c.py").write_text("c = 'edited by hand on the node'\n")
    for pulled in (False, True):
        if pulled:
            assert run_inproc("--config", config, "pull").code == 0  # the pull records the hot-fix
        result = run_inproc("--config", config, "status", "--json")
        assert result.code == 1, (pulled, result)
        row = json.loads(result.out)["nodes"][0]
        assert row["known_good"] is None and row["exit_code"] == 1, row
        assert row["pristine_unchecked"].startswith("no installed distribution (*.dist-info) owns sglang/srt in ")
        assert "--against REF" in row["pristine_unchecked"]
        assert row["drift"] == ([] if pulled else [{"path": "sglang/srt/c.py", "status": "M", "label": "",
                                                   "patches": []}])
        table = run_inproc("--config", config, "status")
        assert table.code == 1, table
        lines = table.out.splitlines()
        assert "pristine" not in table.out.replace("whether its tree is pristine is unknown", ""), lines
        assert lines[1].split()[-3:] == ["none", "unknown", "0"], lines  # known-good, state, restart
        note = next(line for line in lines if line.startswith("ct200: no installed distribution"))
        assert "ct200: ct200:" not in table.out and "--against REF" in note, lines
        if not pulled:
            assert "  M  sglang/srt/c.py" in lines  # changed since the snapshot; no label: nothing to judge it by
    # Known-good named: the hot-fix is one, pulled or not.
    code = run_inproc("--config", config, "status", "--json", "--against", "ct200~1")
    row = json.loads(code.out)["nodes"][0]
    assert code.code == 1 and row["known_good"]["hot_fixed"] == 1 and row["pristine_unchecked"] is None, row
