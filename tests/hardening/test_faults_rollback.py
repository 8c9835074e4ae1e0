"""A damaged store never hangs a rollback: a manifest naming a blob that is gone from the
store (deleted for real, as a damaged disk or a bad copy would), or one whose object
breaks off half-way (found only while it streams), fails `rollback --to` with exit 4 in
time, the node untouched and its session ended, the store lock free.
"""

from __future__ import annotations

import time
import zlib
from pathlib import Path

import pytest
from faultkit import git, loosen_objects, run_process

SRT = "sglang/srt"
DEADLINE = 60  # seconds; the rollback hung for ever before


@pytest.mark.parametrize("damage", ["deleted", "cut short"])
@pytest.mark.parametrize("over", ["ssh", "local"])
def test_rollback_to_a_snapshot_whose_blob_is_missing_fails_in_time(over, damage, small_site: Path, ssh_node,
                                                                     local_node, write_config, run_snapver,
                                                                     store) -> None:
    table = ssh_node("ct200", small_site) if over == "ssh" else local_node(small_site)
    write_config({"ct200": table})
    assert run_snapver("pull", "ct200").code == 0
    (small_site / SRT / "server_args.py").write_text("port = 30001\n")
    assert run_snapver("pull", "ct200").code == 0
    old_blob = git(store, "rev-parse", f"refs/heads/nodes/ct200~1:{SRT}/server_args.py").decode().strip()
    loosen_objects(store)
    loose = store / "objects" / old_blob[:2] / old_blob[2:]
    if damage == "deleted":
        loose.unlink()
    else:  # its header reads (`cat-file --batch-check` finds it), its content breaks off
        loose.chmod(0o644)
        loose.write_bytes(zlib.compress(zlib.decompress(loose.read_bytes()))[:-6])

    began = time.monotonic()
    result = run_process("rollback", "ct200", "--to", "ct200~1", "--yes", timeout=DEADLINE)
    assert time.monotonic() - began < DEADLINE
    assert result.code == 4, str(result)
    assert "Traceback" not in result.err and f"object {old_blob}" in result.err, str(result)
    assert ("is missing" if damage == "deleted" else "is corrupt") in result.err, str(result)
    assert (small_site / SRT / "server_args.py").read_text() == "port = 30001\n"  # untouched
    # The store lock is free and the node's session ended: the next write goes through.
    assert run_snapver("tag", "after", "ct200", env={"SNAPVER_LOCK_WAIT": "0"}).code == 0
    assert run_snapver("pull", "ct200").code == 0
