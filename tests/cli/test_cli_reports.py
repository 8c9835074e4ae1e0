"""What the CLI says of itself: fsck's counts named (and as --json), init --json, the pull
progress bar naming its nodes, and a background compaction said once on a terminal."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

from terminal import run_in_terminal

SRT = "sglang/srt"


def test_fsck_names_what_it_counts_and_speaks_json(make_site_packages, write_config, local_node,
                                                    run_snapver) -> None:
    sites = {name: make_site_packages(name, files={f"{SRT}/a.py": f"{name} = 1\n"}) for name in ("laptop", "lab")}
    write_config({name: local_node(site) for name, site in sites.items()})
    assert run_snapver("pull", "--all").code == 0
    (sites["lab"] / SRT / "a.py").write_text("lab = 2\n")
    assert run_snapver("pull", "lab").code == 0
    assert run_snapver("patch", "new", "fix-a", "--base", "laptop").code == 0
    logged = run_snapver("log").out.count("\n")
    assert logged == 3

    checked = run_snapver("fsck")
    assert checked.code == 0, checked
    assert re.fullmatch(r"store ok: 3 snapshots \(as log lists them\), 1 patch commit, \d+ blobs verified\n",
                        checked.out), checked.out
    document = json.loads(run_snapver("fsck", "--json").out)
    assert {key: document[key] for key in ("ok", "snapshots", "patch_commits", "push_records", "commits",
                                           "problems", "exit_code")} == {
        "ok": True, "snapshots": 3, "patch_commits": 1, "push_records": 0, "commits": 4, "problems": [],
        "exit_code": 0}
    assert document["blobs"] >= 3


def test_init_json(run_snapver, isolated_env: Path) -> None:
    done = run_snapver("init", "--json")
    assert done.code == 0 and done.err == "", done
    document = json.loads(done.out)
    writer = document.pop("writer")  # the store's writer id for `sync`: user@host by default
    assert document == {"config": str(isolated_env / ".snapver"), "config_created": True,
                        "store": str(isolated_env / "snapshots"), "local": False, "exit_code": 0}
    assert "@" in writer and writer == subprocess.run(
        ["git", "--git-dir", str(isolated_env / "snapshots"), "config", "snapver.writer"],
        capture_output=True, text=True).stdout.strip()
    assert json.loads(run_snapver("init", "--json").out)["config_created"] is False


def _gone(pid: int, seconds: float = 60) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]:
            return True
        time.sleep(0.1)
    return False


def test_pull_bar_names_nodes_and_compaction_is_said_on_a_terminal(make_site_packages, write_config, local_node,
                                                                    run_snapver, isolated_env: Path) -> None:
    files = {f"{SRT}/m{index}.py": "x = 1\n" * 20000 for index in range(40)}
    site = make_site_packages("laptop", files=files)
    write_config({"laptop": local_node(site)})
    shown = run_in_terminal("pull", env={"SNAPVER_AUTO_GC": "0"})
    assert shown.code == 0, shown
    assert "pulling laptop: " in shown.text, shown.text  # the bar names the node (then goes away)

    # Enough raw bytes recorded to start a compaction: said once on stderr, with its pid.
    state = isolated_env / "snapshots" / "snapver" / "compact.json"
    state.write_text(json.dumps({"raw_bytes": 1 << 40}))
    (site / SRT / "m0.py").write_text("y = 2\n")
    shown = run_in_terminal("pull", env={"SNAPVER_AUTO_GC": "1"})
    said = re.findall(r"compacting the store in the background \(pid (\d+)\)", shown.text)
    assert shown.code == 0 and len(said) == 1, shown
    assert _gone(int(said[0]))

    # Piped: nothing said (a script reads stdout and stderr).
    state.write_text(json.dumps({"raw_bytes": 1 << 40}))
    (site / SRT / "m0.py").write_text("y = 3\n")
    piped = run_snapver("pull", env={"SNAPVER_AUTO_GC": "1"})
    assert piped.code == 0 and "compacting" not in piped.out + piped.err, piped
    time.sleep(0.2)
    for proc in Path("/proc").iterdir():  # let the piped run's compaction end too
        if proc.name.isdigit():
            try:
                if str(isolated_env / "snapshots") in (proc / "cmdline").read_text():
                    _gone(int(proc.name))
            except OSError:
                pass


def test_every_json_document_says_its_exit_code(make_site_packages, write_config, local_node, run_snapver,
                                                isolated_env: Path) -> None:
    """`exit_code` in every --json document, as nodes, pull, diff, status… had it and log, show,
    tag, patch list/show, init did not (a script had to know which)."""
    site = make_site_packages("n1", files={"sglang/srt/a.py": "a = 1\n", "sglang/srt/big.bin": b"\0" * (2 << 20)})
    write_config({"n1": local_node(site)})
    assert run_snapver("pull", "n1").code == 0
    folder = run_snapver("patch", "new", "p", "--base", "n1").out.strip()
    Path(folder, "sglang/srt/a.py").write_text("a = 2\n")
    assert run_snapver("patch", "save", "p").code == 0
    for args in (["init"], ["log"], ["show", "n1"], ["show", "n1", "sglang/srt/a.py"],
                 ["show", "n1", "sglang/srt/big.bin"], ["tag", "t1", "n1"], ["tag", "--list"], ["tag", "-d", "t1"],
                 ["patch", "list"], ["patch", "show", "p"], ["nodes"], ["diff", "n1"]):
        result = run_snapver(*args, "--json")
        assert result.code == 0 and json.loads(result.out)["exit_code"] == 0, (args, result)
