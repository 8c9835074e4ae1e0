"""Nodes with a real environment: venvs with distributions the real pip installed from
wheels built here, an editable install written as pip writes one, and a stand-in
``nvidia-smi`` on the PATH of the node's Python (there is no GPU here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from wheelkit import build_named_wheel, build_wheel, make_venv, pip_install

SMI_ANSWER = "NVIDIA H100 80GB HBM3, {driver}, 81559 MiB\n"


def venv_node(root: Path, packages: dict[str, str], sglang: str | None = "0.5.0",
              srt: dict[str, str] | None = None) -> tuple[Path, Path]:
    """A venv at ``root`` with each ``{name: version}`` pip-installed (and sglang with
    ``srt`` files): (its python, its site-packages)."""
    python, site = make_venv(root)
    wheels = root.parent / f"{root.name}-wheels"
    for name, version in packages.items():
        pip_install(python, build_named_wheel(wheels, name, version, {f"{name}/__init__.py": f"V = {version!r}\n"}))
    if sglang is not None:
        pip_install(python, build_wheel(wheels, sglang, srt or {"sglang/srt/a.py": "a = 1\n"}))
    return python, site


def upgrade(python: Path, name: str, version: str) -> None:
    """``pip install NAME==VERSION`` over what is there (a wheel built here)."""
    wheel = build_named_wheel(python.parent.parent.parent / "upgrades", name, version,
                              {f"{name}/__init__.py": f"V = {version!r}\n"})
    pip_install(python, wheel, "--upgrade")


def editable_install(site: Path, name: str, version: str, project: Path) -> None:
    """What ``pip install -e PROJECT`` leaves in site-packages (PEP 660): a dist-info with
    ``direct_url.json`` saying editable, and a ``.pth`` naming the project folder."""
    (project / name).mkdir(parents=True, exist_ok=True)
    (project / name / "__init__.py").write_text("")
    dist_info = site / f"{name}-{version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n")
    (dist_info / "INSTALLER").write_text("pip\n")
    (dist_info / "direct_url.json").write_text(json.dumps({"url": project.as_uri(), "dir_info": {"editable": True}}))
    (dist_info / "RECORD").write_text(f"{name}-{version}.dist-info/METADATA,,\n")
    (site / f"__editable__.{name}-{version}.pth").write_text(f"{project}\n")


def python_with_path(folder: Path, python: Path | str, bin_dir: Path) -> Path:
    """A script that runs ``python`` with ``bin_dir`` first on PATH: a node's ``python``
    key, so that its agent finds the stand-in ``nvidia-smi``."""
    folder.mkdir(parents=True, exist_ok=True)
    wrapper = folder / "python-with-path"
    wrapper.write_text(f'#!/bin/sh\nPATH="{bin_dir}:$PATH" exec "{python}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def stand_in_smi(bin_dir: Path, driver: str = "580.95.05", gpus: int = 8, hang: bool = False) -> Path:
    """An ``nvidia-smi`` answering the agent's query for ``gpus`` H100s on ``driver``; with
    ``hang``, one that never answers, its child's process id in ``bin_dir/smi.pid``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    if hang:
        body = f'sleep 600 &\necho $! > "{bin_dir}/smi.pid"\nwait\n'
    else:
        body = "cat <<'EOF'\n" + SMI_ANSWER.format(driver=driver) * gpus + "EOF\n"
    smi.write_text("#!/bin/sh\n" + body)
    smi.chmod(0o755)
    return smi


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def uninstall(python: Path, name: str) -> None:
    """``pip uninstall NAME`` from the venv of ``python``."""
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "uninstall", "-y", name],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
