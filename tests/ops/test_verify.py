"""snapver verify: live files against the wheel's RECORD, on the real sglang tree.

The pristine node is the session's wheel template itself (verify never writes); the
patched node is one copy of it. What "modified" should be is worked out here with
csv + hashlib from RECORD, independently of snapver.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import toml_dumps, tree_hashes
from snapver_inproc import run_inproc

TRANSPORTS = ["local", "ssh"]
RECORD = "sglang-0.5.23.dist-info/RECORD"
EDITED = "sglang/srt/server_args.py"
EXTRA = "sglang/srt/speculative/hotfix_extra.py"
NO_HASH = "sglang/srt/listed_without_hash.py"


def record_modified(site: Path) -> list[str]:
    """Tracked RECORD rows whose file's sha256 differs (or that is gone): by csv and hashlib."""
    live = tree_hashes(site)
    found = []
    with open(site / RECORD, newline="", encoding="utf-8") as handle:
        for path, digest, _size in csv.reader(handle):
            if not path.startswith("sglang/srt/") or not digest.startswith("sha256="):
                continue
            expected = base64.urlsafe_b64decode(digest[7:] + "=" * (-len(digest[7:]) % 4)).hex()
            if path not in live or live[path][2] != expected:
                found.append(path)
    return sorted(found)


@pytest.fixture
def config_for(ssh_node, tmp_path: Path):
    """Factory: ``config_for(transport, site)`` → a config naming node ct200 on that site-packages."""

    def write(transport: str, site: Path) -> Path:
        node = {"local": True, "site_packages": str(site)} if transport == "local" else ssh_node("ct200", site)
        path = tmp_path / f"{transport}-{site.parent.name}.toml"
        path.write_text(toml_dumps({"nodes": {"ct200": node}}))
        return path

    return write


@pytest.fixture(scope="module")
def patched(tmp_path_factory: pytest.TempPathFactory, sglang_site_template: Path) -> dict:
    root = tmp_path_factory.mktemp("verify")
    site = root / "patched" / "site-packages"
    site.parent.mkdir()
    subprocess.run(["cp", "-a", str(sglang_site_template), str(site)], check=True)
    missing = sorted(p for p in tree_hashes(site) if p.startswith("sglang/srt/lora/"))[0]
    with open(site / EDITED, "ab") as handle:
        handle.write(b"# hot-fix\n")
    (site / missing).unlink()
    (site / EXTRA).write_text("EXTRA = 1\n")
    (site / NO_HASH).write_text("unverifiable = True\n")
    pycache = site / "sglang/srt/__pycache__"
    pycache.mkdir(exist_ok=True)
    (pycache / "server_args.cpython-311.pyc").write_bytes(b"\0bytecode")
    with open(site / RECORD, "a", encoding="utf-8") as handle:
        handle.write(f"{NO_HASH},,\nsglang/srt/__pycache__/server_args.cpython-311.pyc,,\n")
    assert record_modified(site) == sorted([EDITED, missing])
    return {"root": root, "site": site, "missing": missing}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_pristine_node_verifies_clean(transport: str, sglang_site_template: Path, config_for) -> None:
    assert record_modified(sglang_site_template) == []
    config = config_for(transport, sglang_site_template)
    result = run_inproc("--config", config, "verify", "ct200")
    assert result.code == 0, result
    assert result.out.strip() == "ct200: 2602 files checked against the RECORD of sglang 0.5.23: pristine"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_patched_node_reports_modified_missing_extra_and_unverifiable(transport: str, patched: dict,
                                                                      config_for) -> None:
    config = config_for(transport, patched["site"])
    result = run_inproc("--config", config, "verify", "ct200")
    assert result.code == 1, result
    assert result.out.splitlines()[:3] == [f"M\t{EDITED}", f"D\t{patched['missing']}", f"A\t{EXTRA}"]
    assert "1 file(s) RECORD lists without a hash (unverifiable)" in result.out
    assert result.out.splitlines()[-1] == (
        "ct200: 2601 files checked against the RECORD of sglang 0.5.23: 1 modified, 1 missing, 1 extra")
    document = json.loads(run_inproc("--config", config, "verify", "--json", "ct200").out)
    node = document["nodes"][0]
    assert document["exit_code"] == 1 and node["exit_code"] == 1
    assert sorted(node["modified"] + node["missing"]) == record_modified(patched["site"])
    assert node["modified"] == [EDITED] and node["missing"] == [patched["missing"]]
    assert node["extra"] == [EXTRA] and node["unverifiable"] == [NO_HASH]
    assert node["dists"] == ["sglang 0.5.23"] and node["checked"] == 2601


def test_a_node_without_a_distribution_cannot_be_verified(make_site_packages, config_for) -> None:
    site = make_site_packages("bare", files={"sglang/srt/a.py": "a = 1\n"})
    for transport in TRANSPORTS:
        result = run_inproc("--config", config_for(transport, site), "verify", "ct200")
        assert result.code == 3, result
        assert result.err.startswith("snapver: error: ct200: no installed distribution")
        assert "Traceback" not in result.err


def test_a_group_verifies_every_node_and_exits_with_the_worst(patched: dict, sglang_site_template: Path,
                                                              tmp_path: Path) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text(toml_dumps({
        "nodes": {"clean": {"local": True, "site_packages": str(sglang_site_template)},
                  "dirty": {"local": True, "site_packages": str(patched["site"])}},
        "groups": {"tp8": ["clean", "dirty"]}}))
    document = json.loads(run_inproc("--config", config, "verify", "--json", "tp8").out)
    assert [(n["node"], n["exit_code"]) for n in document["nodes"]] == [("clean", 0), ("dirty", 1)]
    assert document["exit_code"] == 1


def _record_digest(data: bytes) -> str:
    """A RECORD hash field's value: urlsafe base64 of the sha256, unpadded (PEP 376)."""
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def test_an_edit_that_keeps_size_and_mtime_is_found_over_ssh(make_site_packages, config_for) -> None:
    """Same length, other bytes, the old mtime put back: only the content hash can tell (a
    verify that compared RECORD's sizes, or trusted a stat, would call the node pristine)."""
    shipped = {f"sglang/srt/m{i}.py": f"import os\nvalue = {i}\n" for i in range(5)}
    rows = "".join(f"{path},sha256={_record_digest(text.encode())},{len(text)}\n" for path, text in shipped.items())
    site = make_site_packages("same-size", files={
        **shipped, "sglang-0.5.23.dist-info/METADATA": "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n\n",
        RECORD: rows + f"{RECORD},,\n"})
    target = site / "sglang/srt/m3.py"
    before = target.stat()
    edited = target.read_bytes().replace(b"import os", b"import io")  # a hand edit of the same length
    target.write_bytes(edited)
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = target.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert record_modified(site) == ["sglang/srt/m3.py"]  # RECORD's size still matches; its sha256 does not
    result = run_inproc("--config", config_for("ssh", site), "verify", "ct200")
    assert result.code == 1, result
    assert result.out.splitlines() == [
        "M\tsglang/srt/m3.py",
        "ct200: 5 files checked against the RECORD of sglang 0.5.23: 1 modified, 0 missing, 0 extra"]
