"""A snapshot's RECORD rows (``.snapver/record``) when the RECORD did not change.

A hot-fix's pull reuses the rows of the node's last snapshot, by id, when the node's
RECORD files hash as those rows were made from and the tracked paths are the same: the
RECORD does not cross the wire again. Any other RECORD (same size, one digest changed)
or other tracked paths make the rows afresh. Real sshd, real store, read with git.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
from pathlib import Path

SRT = "sglang/srt"
RECORD = "sglang-0.5.23.dist-info/RECORD"
NODE_REF = "refs/heads/nodes/ct200"


def _digest(text: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()


def _git(store: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(store), *args], capture_output=True, check=True,
                          text=True).stdout.strip()


def _rows(store: Path) -> dict[str, str]:
    """The newest snapshot's RECORD rows, ``{path: "algo digest"}``."""
    text = _git(store, "cat-file", "blob", f"{NODE_REF}:.snapver/record")
    return {line.split(" ", 2)[2]: " ".join(line.split(" ", 2)[:2]) for line in text.splitlines()}


def _pull(run_snapver, cwd: Path) -> dict:
    result = run_snapver("pull", "--json", "ct200", cwd=cwd)
    assert result.code == 0, result
    (node,) = json.loads(result.out)["nodes"]
    return node


def test_a_hot_fix_pull_reuses_the_record_rows_only_while_the_record_and_tracked_paths_are_the_same(
        make_site_packages, ssh_node, write_config, run_snapver, tmp_path: Path) -> None:
    shipped = {f"{SRT}/m{i}.py": f"value = {i}\n" for i in range(40)}
    # Rows of files not tracked make the RECORD as big as real ones are (sglang's: 682 kB).
    others = "".join(f"sglang/lang/pad{i:05}.py,sha256={_digest(str(i))},{i}\n" for i in range(4000))
    record = "".join(f"{p},sha256={_digest(t)},{len(t)}\n" for p, t in shipped.items()) + others + f"{RECORD},,\n"
    site = make_site_packages("ct200", files={
        **shipped, RECORD: record,
        "sglang-0.5.23.dist-info/METADATA": "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n\n"})
    record_size = len(record.encode())
    assert record_size > 200_000
    write_config({"ct200": ssh_node("ct200", site, paths=[SRT])}, where=tmp_path)
    store = tmp_path / "snapshots"

    first = _pull(run_snapver, tmp_path)
    assert first["wire_bytes"] > record_size  # the RECORD was read
    rows = _rows(store)
    assert rows[f"{SRT}/m1.py"] == f"sha256 {hashlib.sha256(b'value = 1' + bytes([10])).hexdigest()}"
    assert len(rows) == 40
    rows_id = _git(store, "rev-parse", f"{NODE_REF}:.snapver/record")

    (site / SRT / "m1.py").write_text("value = 'hot-fixed'\n")
    fix = _pull(run_snapver, tmp_path)
    assert fix["changed"] == 1
    assert fix["wire_bytes"] < record_size / 4, fix  # the RECORD did not come again
    assert _git(store, "rev-parse", f"{NODE_REF}:.snapver/record") == rows_id
    assert _git(store, "rev-parse", f"{NODE_REF}~1:.snapver/record") == rows_id

    # Same size, one digest changed (as a reinstall of another build could leave it):
    # the rows are made again from the RECORD as it is now.
    changed = record.replace(f"sha256={_digest('value = 2' + chr(10))}", f"sha256={_digest('value = 9' + chr(10))}")
    assert changed != record and len(changed) == len(record)
    (site / RECORD).write_text(changed)
    (site / SRT / "m3.py").write_text("value = 'another fix'\n")
    afresh = _pull(run_snapver, tmp_path)
    assert afresh["changed"] == 1 and afresh["wire_bytes"] > record_size
    assert _rows(store)[f"{SRT}/m2.py"] == f"sha256 {hashlib.sha256(b'value = 9' + bytes([10])).hexdigest()}"

    # Other tracked paths, same RECORD: rows for what is tracked now.
    write_config({"ct200": ssh_node("ct200", site, paths=[SRT], exclude=["m4*"])}, where=tmp_path)
    narrowed = _pull(run_snapver, tmp_path)
    assert narrowed["changed"] == 1  # m4.py is no longer tracked
    rows = _rows(store)
    assert f"{SRT}/m4.py" not in rows and f"{SRT}/m5.py" in rows


def test_a_fleet_moves_one_record_per_content(make_site_packages, ssh_node, write_config, run_snapver,
                                              tmp_path: Path) -> None:
    """Nodes installed from one wheel: one sends its RECORD, the others only its sha256; a
    node whose RECORD differs (same size) sends its own, and its rows are its own."""
    shipped = {f"{SRT}/m{i}.py": f"value = {i}\n" for i in range(20)}
    others = "".join(f"sglang/lang/pad{i:05}.py,sha256={_digest(str(i))},{i}\n" for i in range(3000))
    record = "".join(f"{p},sha256={_digest(t)},{len(t)}\n" for p, t in shipped.items()) + others + f"{RECORD},,\n"
    metadata = {"sglang-0.5.23.dist-info/METADATA": "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n\n"}
    sites = {name: make_site_packages(name, files={**shipped, RECORD: record, **metadata})
             for name in ("ct200", "ct129", "fleet00")}
    odd = record.replace(f"sha256={_digest('value = 2' + chr(10))}", f"sha256={_digest('value = 7' + chr(10))}")
    assert len(odd) == len(record) != odd
    (sites["fleet00"] / RECORD).write_text(odd)
    write_config({name: ssh_node(name, site, paths=[SRT]) for name, site in sites.items()}, where=tmp_path)
    result = run_snapver("pull", "--json", "ct200", "ct129", "fleet00", cwd=tmp_path)
    assert result.code == 0, result
    wire = {node["node"]: node["wire_bytes"] for node in json.loads(result.out)["nodes"]}
    size = len(record.encode())
    assert wire["fleet00"] > size  # its own RECORD
    assert sorted(w > size for name, w in wire.items() if name != "fleet00") == [False, True], wire  # one of two
    store = tmp_path / "snapshots"
    rows = {name: _git(store, "rev-parse", f"refs/heads/nodes/{name}:.snapver/record") for name in sites}
    assert rows["ct200"] == rows["ct129"] != rows["fleet00"]
    seven = f"sha256 {hashlib.sha256(b'value = 7' + bytes([10])).hexdigest()}"
    odd_rows = _git(store, "cat-file", "blob", rows["fleet00"]).splitlines()
    assert f"{seven} {SRT}/m2.py" in odd_rows
