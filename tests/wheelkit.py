"""Small real wheels of a distribution called ``sglang``, installed by the real pip into a
real venv (``python -m venv --without-pip``; this Python's pip drives it with ``--python``).
No network: ``--no-index`` from a local folder."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path


def build_wheel(folder: Path, version: str, files: dict[str, str]) -> Path:
    """``sglang-VERSION-py3-none-any.whl`` holding ``files`` plus sglang/version.py."""
    members = {**files, "sglang/__init__.py": "from sglang.version import __version__\n",
               "sglang/version.py": f'__version__ = "{version}"\n'}
    return build_named_wheel(folder, "sglang", version, members)


def build_named_wheel(folder: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """``NAME-VERSION-py3-none-any.whl`` holding ``files`` (top-level package: NAME)."""
    folder.mkdir(parents=True, exist_ok=True)
    dist_info = f"{name}-{version}.dist-info"
    members = dict(files)
    members[f"{dist_info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n"
    members[f"{dist_info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: wheelkit\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    members[f"{dist_info}/top_level.txt"] = f"{name}\n"
    rows = []
    for path, text in members.items():
        data = text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{path},sha256={digest},{len(data)}")
    rows.append(f"{dist_info}/RECORD,,")
    members[f"{dist_info}/RECORD"] = "\n".join(rows) + "\n"
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in members.items():
            archive.writestr(path, text)
    return wheel


def make_venv(root: Path) -> tuple[Path, Path]:
    """A real venv without pip: (its python, its site-packages)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return root / "bin" / "python", root / "lib" / version / "site-packages"


def pip_install(python: Path, wheel: Path, *flags: str) -> None:
    """The real pip, installing ``wheel`` into the venv of ``python``."""
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index",
                           "--no-deps", "--no-compile", *flags, str(wheel)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
