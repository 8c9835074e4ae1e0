"""A node whose Python is older than the agent supports is named in one line, exit 3, not
a traceback from deep in the agent. Real interpreters (pyenv's 3.6 and 3.7 where the
machine has them), over the real sshd."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from snapver.transport.agent.wire import MIN_PYTHON

PYENV = Path("/root/.pyenv/versions")


def old_python(tmp_path: Path, version: str) -> str:
    """A real Python ``version`` if this machine has one, else a wrapper that runs this
    Python reporting ``version`` (what an old interpreter says of itself is all that counts)."""
    real = PYENV / version / "bin" / f"python{version.rsplit('.', 1)[0]}"
    if real.exists():
        return str(real)
    fake = tmp_path / f"python{version}"
    parts = ",".join(version.split("."))
    shim = f'import sys;sys.version_info=({parts},"final",0);exec(compile(sys.argv[1],"-c","exec"))'
    fake.write_text(f"#!/bin/sh\nshift $(($# - 1))\nexec {sys.executable} -S -c '{shim}' \"$1\"\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return str(fake)


@pytest.mark.parametrize("version", ["3.6.15", "3.7.16"])
def test_too_old_python_is_refused_in_one_line(version, sshd, ssh_node, make_site_packages, write_config,
                                               run_snapver, tmp_path: Path) -> None:
    site = make_site_packages("ct200", files={"sglang/srt/a.py": "a = 1\n"})
    python = old_python(tmp_path, version)
    write_config({"ct200": ssh_node("ct200", site, python=python)}, where=tmp_path)
    for command in (["pull", "ct200"], ["nodes", "--check"]):
        result = run_snapver(*command, cwd=tmp_path)
        assert f"ct200: Python {version} is too old (snapver needs ≥ 3.8)" in result.err, result.err
        assert "Traceback" not in result.err and "time_ns" not in result.err
        if command[0] == "pull":
            assert result.code == 3
            assert "set `python = ...`" in result.err


def test_the_oldest_supported_python_runs_the_agent(sshd, ssh_node, make_site_packages, write_config,
                                                     run_snapver, tmp_path: Path) -> None:
    """The documented minimum is the one that works: 3.8 pulls and verifies a tree."""
    assert MIN_PYTHON == (3, 8)
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert "Python ≥ 3.8" in readme
    python = PYENV / "3.8.18" / "bin" / "python3.8"
    site = make_site_packages("ct200", files={"sglang/srt/a.py": "a = 1\n"})
    write_config({"ct200": ssh_node("ct200", site, python=str(python if python.exists() else sys.executable))},
                 where=tmp_path)
    result = run_snapver("pull", "ct200", cwd=tmp_path)
    assert result.code == 0, result.err
    check = run_snapver("nodes", "--check", cwd=tmp_path)
    assert check.code == 0, check.err
    if python.exists():
        assert f"3.8.18 ({python})" in check.out
    assert os.path.isdir(site)
