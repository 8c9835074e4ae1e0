"""Which Python starts the agent when none is configured: the one that owns site-packages
by its layout (``<prefix>/lib/pythonX.Y/site-packages`` → ``<prefix>/bin/pythonX.Y``), else
``python3`` from PATH. Real sshd; the node's shell decides, as on a real node."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from snapver.config import parse_config
from snapver.transport.base import deployment_pythons
from snapver.transport.connect import open_transport

VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"


@pytest.mark.parametrize(("site_packages", "expected"), [
    ("/root/venv_sglang211/lib/python3.12/site-packages",
     ["/root/venv_sglang211/bin/python3.12", "/root/venv_sglang211/bin/python3", "/root/venv_sglang211/bin/python"]),
    ("/opt/conda/envs/x/lib/python3.10/site-packages/",
     ["/opt/conda/envs/x/bin/python3.10", "/opt/conda/envs/x/bin/python3", "/opt/conda/envs/x/bin/python"]),
    ("/usr/lib64/python3.9/site-packages", ["/usr/bin/python3.9", "/usr/bin/python3", "/usr/bin/python"]),
    ("/usr/lib/python3/dist-packages", ["/usr/bin/python3", "/usr/bin/python"]),
    ("/srv/app/site-packages", []),
    ("relative/lib/python3.12/site-packages", []),
    ("/a b/lib/python3.12/site-packages", ["/a b/bin/python3.12", "/a b/bin/python3", "/a b/bin/python"]),
    (None, []),
])
def test_deployment_pythons_by_layout(site_packages: str | None, expected: list[str]) -> None:
    assert deployment_pythons(site_packages) == expected


def _venv(root: Path, with_python: bool) -> Path:
    """A venv-shaped prefix holding the tracked tree; its bin/pythonX.Y links to this Python."""
    site = root / "lib" / f"python{VERSION}" / "site-packages"
    (site / "sglang" / "srt").mkdir(parents=True)
    (site / "sglang" / "srt" / "a.py").write_text("a = 1\n")
    if with_python:
        (root / "bin").mkdir()
        os.symlink(os.path.realpath(sys.executable), root / "bin" / f"python{VERSION}")
    return site


def _open(ssh_node, site: Path, tmp_path: Path):
    spec = parse_config({"nodes": {"n": ssh_node("ct200", str(site))}}, tmp_path / ".snapver").nodes["n"]
    return open_transport(spec)


def test_the_venv_python_starts_the_agent(sshd, ssh_node, tmp_path: Path) -> None:
    venv = tmp_path / "venv with space"
    site = _venv(venv, with_python=True)
    with _open(ssh_node, site, tmp_path) as transport:
        assert transport.info is not None
        assert transport.info.python == str(venv / "bin" / f"python{VERSION}")
        assert [e.path for e in transport.list_tree().entries] == ["sglang/srt/a.py"]


def test_without_the_layout_python_path_python3_starts_it(sshd, ssh_node, tmp_path: Path) -> None:
    site = _venv(tmp_path / "venv", with_python=False)
    with _open(ssh_node, site, tmp_path) as transport:
        assert transport.info is not None
        assert not transport.info.python.startswith(str(tmp_path))
        assert [e.path for e in transport.list_tree().entries] == ["sglang/srt/a.py"]
