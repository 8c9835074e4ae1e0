"""The agent's ``env`` op on real nodes: venvs whose distributions the real pip installed,
an editable install, a stand-in ``nvidia-smi`` (one that answers, one that hangs, none),
and hostile site-packages (metadata that is huge, binary, lying or a link out)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from envkit import alive, editable_install, python_with_path, stand_in_smi, venv_node
from helpers import toml_dumps

from snapver.config import load_config
from snapver.environment import DRIVER, GPU, KERNEL, PYTHON, Environment
from snapver.transport.agent.environ import MAX_DISTS
from snapver.transport.connect import open_transport


def node_env(tmp_path: Path, node: dict[str, object], name: str = "ct200") -> Environment:
    config = tmp_path / f"{name}.toml"
    config.write_text(toml_dumps({"store": {"path": str(tmp_path / "store")}, "nodes": {name: node}}))
    with open_transport(load_config(str(config)).node(name)) as transport:
        return transport.request_environment()()


def by_name(env: Environment) -> dict[str, object]:
    return {d.name: d for d in env.dists}


def test_env_over_ssh_reads_pip_installs_editable_and_gpu(sshd, ssh_node, tmp_path: Path) -> None:
    python, site = venv_node(tmp_path / "venv", {"tinypkg": "1.2.0", "flash_stub": "0.5.0"})
    editable_install(site, "tinyed", "0.3.0", tmp_path / "tinyed-src")
    wrapper = python_with_path(tmp_path / "bin", python, tmp_path / "fakebin")
    stand_in_smi(tmp_path / "fakebin", driver="580.95.05", gpus=8)
    env = node_env(tmp_path, ssh_node("ct200", site, python=str(wrapper), paths=["sglang/srt"]))
    dists = by_name(env)
    assert dists["tinypkg"].version == "1.2.0" and dists["tinypkg"].installer == "pip"
    assert dists["flash_stub"].version == "0.5.0"
    assert dists["sglang"].version == "0.5.0"
    assert dists["tinyed"].editable and dists["tinyed"].url == (tmp_path / "tinyed-src").as_uri()
    assert env.python_version == ".".join(map(str, sys.version_info[:3]))
    items = env.items()
    assert items[GPU] == "8 \u00d7 NVIDIA H100 80GB HBM3" and items[DRIVER] == "580.95.05"
    assert items[KERNEL] == os.uname().release and items[PYTHON] == env.python_version
    assert items["tinyed"] == "0.3.0 (editable)"


def test_hanging_nvidia_smi_is_stopped_within_its_deadline(sshd, ssh_node, make_site_packages,
                                                         tmp_path: Path) -> None:
    site = make_site_packages("ct200", files={"sglang/srt/a.py": "a = 1\n"})
    wrapper = python_with_path(tmp_path / "bin", sys.executable, tmp_path / "fakebin")
    stand_in_smi(tmp_path / "fakebin", hang=True)
    began = time.monotonic()
    env = node_env(tmp_path, ssh_node("ct200", site, python=str(wrapper)))
    assert time.monotonic() - began < 10
    assert any("did not answer within 3 s" in note for note in env.notes), env.notes
    assert GPU not in env.items()
    child = int((tmp_path / "fakebin" / "smi.pid").read_text())
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child), "the stand-in's child outlived the agent's deadline"


def test_no_nvidia_smi_no_gpu_rows(local_node, make_site_packages, tmp_path: Path) -> None:
    site = make_site_packages("ct200", files={"sglang/srt/a.py": "a = 1\n"})
    wrapper = python_with_path(tmp_path / "bin", sys.executable, tmp_path / "empty-bin")
    env = node_env(tmp_path, local_node(site, python=str(wrapper)))
    assert GPU not in env.items()
    if not os.path.exists("/proc/driver/nvidia/version"):
        assert DRIVER not in env.items()


def write_dist(site: Path, folder: str, metadata: bytes | None) -> Path:
    dist_info = site / folder
    dist_info.mkdir(parents=True)
    if metadata is not None:
        (dist_info / "METADATA").write_bytes(metadata)
    return dist_info


def test_hostile_metadata_is_bounded_quoted_data_never_a_failure(local_node, make_site_packages,
                                                                tmp_path: Path) -> None:
    site = make_site_packages("ct200", files={"sglang/srt/a.py": "a = 1\n"})
    write_dist(site, "huge-1.0.dist-info", b"Name: huge\nVersion: 1.0\nLicense: " + b"x" * (50 << 20) + b"\n\n")
    write_dist(site, "binary-2.0.dist-info", os.urandom(4096).replace(b"\n", b"\x00"))
    write_dist(site, "liar-3.0.dist-info", b"Name: liar\nVersion: 3.0\x1b[31m\x07" + b"9" * 1000 + b"\n\n")
    dist_info = write_dist(site, "fifo-4.0.dist-info", None)
    os.mkfifo(dist_info / "METADATA")
    write_dist(site, "folder-5.0.dist-info", None)
    (site / "folder-5.0.dist-info" / "METADATA").mkdir()
    outside = write_dist(tmp_path / "outside", "evil-6.0.dist-info", b"Name: evil\nVersion: 6.0\n\n")
    (site / "evil-6.0.dist-info").symlink_to(outside)
    began = time.monotonic()
    env = node_env(tmp_path, local_node(site))
    assert time.monotonic() - began < 10
    dists = by_name(env)
    assert dists["huge"].version == "1.0"
    assert dists["binary"].version == "2.0"  # named after its folder, with a note
    assert dists["liar"].version.startswith("3.0\x1b[31m\x07") and len(dists["liar"].version) <= 200
    assert dists["fifo"].version == "4.0" and dists["folder"].version == "5.0"
    assert "evil" not in dists
    notes = "\n".join(env.notes)
    assert "evil-6.0.dist-info: a link, not followed" in notes
    assert "binary-2.0.dist-info: no Name or Version" in notes
    assert "fifo-4.0.dist-info: no readable metadata" in notes


def test_five_thousand_distributions_are_capped_and_counted(local_node, make_site_packages,
                                                            tmp_path: Path) -> None:
    site = make_site_packages("ct200", files={"sglang/srt/a.py": "a = 1\n"})
    for number in range(5000):
        write_dist(site, f"pkg{number:04d}-1.{number}.dist-info",
                   f"Name: pkg{number:04d}\nVersion: 1.{number}\n\n".encode())
    env = node_env(tmp_path, local_node(site))
    assert len(env.dists) == MAX_DISTS
    assert any(f"more distributions not read (at most {MAX_DISTS})" in note for note in env.notes)
