"""Push and rollback of a huge file in bounded client memory, over a real sshd (issue 15).

The node holds a 300 MB extension module; the patch replaces it with another 300 MB
version. Both the push and the rollback that puts the old one back must stream the
blob from the store to the node in pieces: the client's peak resident memory (GNU
``time -f %M``: the command and the children it waited for, git included) stays within
100 MiB, and the node ends with exactly the bytes expected (hashed here with hashlib).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from snapver.config import load_config
from snapver.ops.patch import capture_patch
from snapver.ops.pull import pull as pull_nodes
from snapver.store.repo import Store

REPO_ROOT = Path(__file__).resolve().parents[2]
BIG = "sglang/srt/lib/libbig.so"
SIZE = 300 * 1000 * 1000
PEAK_LIMIT_MIB = 100


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while piece := handle.read(1 << 20):
            digest.update(piece)
    return digest.hexdigest()


def _snapver_peak(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run the CLI under GNU time; returns the result and its peak resident MiB."""
    report = tmp_path / "peak.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", str(report), sys.executable, "-m", "snapver", *args],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=300)
    return done, int(report.read_text().split()[-1]) / 1024


def test_push_and_rollback_of_a_300_mb_file_stream_in_bounded_memory(make_site_packages, write_config, ssh_node,
                                                                      tmp_path: Path) -> None:
    old = os.urandom(SIZE)
    site = make_site_packages("ct200", files={"sglang/srt/__init__.py": "", BIG: old})
    old_sha = hashlib.sha256(old).hexdigest()
    new = bytearray(old)
    new[SIZE // 2:SIZE // 2 + 16] = b"patched version!"
    new_sha = hashlib.sha256(new).hexdigest()
    config_path = write_config({"ct200": ssh_node("ct200", site)})
    config = load_config(str(config_path))
    store = Store.open_or_create(config.store_path)
    # Set-up in this process, through the local transport (what is under test is writing):
    # a snapshot holding the old file, then a patch captured from the node holding the new one.
    local = [dataclasses.replace(spec, local=True, host=None) for spec in config.select(["ct200"])]
    assert pull_nodes(store, local).exit_code == 0
    os.replace(site / BIG, tmp_path / "old.so")
    (site / BIG).write_bytes(new)
    del old, new
    local_config = dataclasses.replace(config, nodes={"ct200": local[0]})
    assert capture_patch(store, local_config, "bigfix", "ct200", "ct200") is not None
    os.replace(tmp_path / "old.so", site / BIG)

    pushed, push_peak = _snapver_peak(tmp_path, "push", "bigfix", "ct200", "--yes", "--json")
    assert pushed.returncode == 0, pushed.stderr
    assert json.loads(pushed.stdout)["results"][0]["written"] == [BIG]
    assert _sha256(site / BIG) == new_sha


    rolled, rollback_peak = _snapver_peak(tmp_path, "rollback", "ct200", "--yes")
    assert rolled.returncode == 0, rolled.stderr
    assert _sha256(site / BIG) == old_sha
    peaks = {"push": round(push_peak), "rollback": round(rollback_peak)}
    print(f"peak MiB: {peaks}")
    assert max(peaks.values()) <= PEAK_LIMIT_MIB, f"peak MiB: {peaks}"
