"""Fixtures of the hardening suite (faults and attacks); helpers live in ``faultkit.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

SRT = "sglang/srt"


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
