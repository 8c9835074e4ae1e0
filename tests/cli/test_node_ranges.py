"""Node ranges on the command line (issue 32): `pull 'fleet[00-02]'`, `patch --nodes
'fleet[00-01]'` then `push`, and bad ranges refused with exit 2, on real sshd nodes."""

from __future__ import annotations

import json
import subprocess

SRT = "sglang/srt"


def test_ranges_select_nodes_and_bad_ones_exit_2(make_site_packages, write_config, ssh_node, run_snapver,
                                                  isolated_env, tmp_path):
    names = ["fleet00", "fleet01", "fleet02", "fleet10"]
    sites = {name: make_site_packages(name, files={f"{SRT}/a.py": "a = 1\n"}) for name in names}
    write_config({name: ssh_node(name, site) for name, site in sites.items()}, groups={"some": ["fleet[01-02]"]})
    store = isolated_env / "snapshots"

    result = run_snapver("pull", "fleet[00-01,10]", "--json")
    assert result.code == 0, result
    assert sorted(n["node"] for n in json.loads(result.out)["nodes"]) == ["fleet00", "fleet01", "fleet10"]
    heads = subprocess.run(["git", "--git-dir", str(store), "for-each-ref", "--format=%(refname:short)",
                            "refs/heads/nodes/"], capture_output=True, text=True, check=True).stdout.split()
    assert heads == ["nodes/fleet00", "nodes/fleet01", "nodes/fleet10"]  # read with git: fleet02 not pulled

    diff = tmp_path / "fix.diff"
    diff.write_text(f"--- a/{SRT}/a.py\n+++ b/{SRT}/a.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n")
    result = run_snapver("patch", "import", "fix", str(diff), "--base", "fleet00", "--nodes", "fleet[00-01]")
    assert result.code == 0, result
    assert run_snapver("push", "fix", "--yes").code == 0  # the patch's --nodes: the range
    assert [(sites[n] / SRT / "a.py").read_text() for n in names] == ["a = 2\n", "a = 2\n", "a = 1\n", "a = 1\n"]

    result = run_snapver("pull", "some", "--json")  # a group whose member is a range
    assert result.code == 0 and sorted(n["node"] for n in json.loads(result.out)["nodes"]) == ["fleet01", "fleet02"]

    for text, message in [("fleet[7-2]", "bad node range: 'fleet[7-2]': the span '7-2' runs backwards"),
                          ("fleet[a-b]", "bad node range: 'fleet[a-b]': 'a-b' is not a number"),
                          ("fleet[1-100000]", "bad node range: 'fleet[1-100000]' names more than 10,000 nodes"),
                          ("fleet[00-03]", "'fleet[00-03]' names 1 unknown node(s): fleet03")]:
        for command in (["pull", text], ["status", text], ["ps", text], ["push", "fix", text, "--yes"]):
            result = run_snapver(*command)
            assert result.code == 2 and result.err.startswith(f"snapver: error: {message}"), (command, result)
            assert "Traceback" not in result.err and result.out == "", (command, result)
    assert (sites["fleet02"] / SRT / "a.py").read_text() == "a = 1\n"  # nothing written
