"""Fixtures of the hardening suite (faults and attacks); helpers live in ``faultkit.py``.

Here ``run_snapver`` runs the CLI *in this process* (``faultkit.cli``: the real
``snapver.cli.main``, its parsing, error mapping and exit codes) because interpreter
start-up would be most of the suite's time; a fault that needs a process of its own
to kill, a umask or a memory limit starts one (``faultkit.start_snapver``,
``snapver_process``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from helpers import tmpfs  # noqa: E402 - tests/ is on sys.path (tests/conftest.py)

SRT = "sglang/srt"


@pytest.fixture(autouse=True)
def no_background_compaction(monkeypatch: pytest.MonkeyPatch) -> None:
    """No `git repack` started behind a test's back: it would race the checks of the pack folder."""
    monkeypatch.setenv("SNAPVER_AUTO_GC", "0")


@pytest.fixture
def run_snapver():
    """``run_snapver(*args, env=None, cwd=None, timeout=None)`` → Result, in this process."""
    from faultkit import cli

    return cli


@pytest.fixture
def snapver_process():
    """``snapver_process(*args, env=None, timeout=120)`` → Result, a real ``python -m snapver``."""
    from faultkit import run_process

    return run_process


@pytest.fixture
def store() -> Path:
    """Where the configs written by these tests keep the store (``[store] path``)."""
    return Path.cwd() / "snapshots"


@pytest.fixture
def small_site(make_site_packages) -> Path:
    """A small synthetic node tree (a dozen files, one executable, one link)."""
    files = {f"{SRT}/__init__.py": "", f"{SRT}/server_args.py": "port = 30000\n",
             **{f"{SRT}/layers/l{i}.py": f"layer = {i}\n" * (i + 1) for i in range(10)}}
    site = make_site_packages("small", files=files)
    (site / SRT / "run.sh").write_text("#!/bin/sh\n")
    (site / SRT / "run.sh").chmod(0o755)
    (site / SRT / "link.py").symlink_to("server_args.py")
    return site


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MB tmpfs; unmounted afterwards, whatever happened."""
    with tmpfs(tmp_path / "disk", "3m") as mount_point:
        yield mount_point
