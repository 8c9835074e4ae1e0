"""An editable source install as the official SGLang image has one, built for tests.

The image clones sglang at a tag into /sgl-workspace/sglang and runs ``pip install -e
python``: the code is ``/sgl-workspace/sglang/python/sglang``, a git checkout, and
site-packages holds only ``__editable__.sglang-VERSION.pth`` (the checkout's path) and a
``sglang-VERSION.dist-info`` whose RECORD lists no source file and whose
``direct_url.json`` says editable. A subset of the fixture wheel's tree keeps it quick.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

VERSION = "0.5.23"
TAG = f"v{VERSION}"
# The wheel's package files kept (sglang/srt's top files and its utils/ folder).
SUBSET_DIRS = ("sglang/srt/utils",)


def git(folder: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@example.invalid",
                           *args], check=True, capture_output=True, text=True, stdin=subprocess.DEVNULL).stdout


def build_checkout(template: Path, workspace: Path, marker: str) -> Path:
    """``workspace/sglang``: a git repo holding the wheel's sglang subset at
    ``python/sglang``, committed and tagged TAG. Returns its ``python/`` folder. Its
    ``sglang/__init__.py`` writes the file ``marker`` (a path on the node) when imported:
    finding the package must never import it."""
    python = workspace / "sglang" / "python"
    package = python / "sglang"
    package.mkdir(parents=True)
    for name in ("version.py", "_version.py"):
        shutil.copy2(template / "sglang" / name, package / name)
    (package / "__init__.py").write_text(f"open({marker!r}, 'w').write('imported')\n")
    srt = template / "sglang" / "srt"
    (package / "srt").mkdir()
    for item in srt.iterdir():
        if item.is_file():
            shutil.copy2(item, package / "srt" / item.name)
    for rel in SUBSET_DIRS:
        shutil.copytree(template / rel, python / rel, symlinks=True)
    (python / "pyproject.toml").write_text(f'[project]\nname = "sglang"\nversion = "{VERSION}"\n')
    top = workspace / "sglang"
    git(top, "init", "-q")
    git(top, "add", "-A")
    git(top, "commit", "-q", "-m", f"sglang {VERSION}")
    git(top, "tag", TAG)
    return python


def install_editable(site_packages: Path, node_root: str) -> None:
    """Write into ``site_packages`` what ``pip install -e`` leaves there for a checkout whose
    ``python/`` is ``node_root`` on the node: the .pth and the dist-info (RECORD without the sources)."""
    site_packages.mkdir(parents=True, exist_ok=True)
    pth = f"__editable__.sglang-{VERSION}.pth"
    (site_packages / pth).write_text(node_root + "\n")
    dist = site_packages / f"sglang-{VERSION}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {VERSION}\n\n")
    (dist / "INSTALLER").write_text("pip\n")
    (dist / "top_level.txt").write_text("sglang\n")
    (dist / "direct_url.json").write_text(json.dumps({"dir_info": {"editable": True}, "url": f"file://{node_root}"}))
    names = [pth] + [f"{dist.name}/{n}" for n in ("METADATA", "INSTALLER", "top_level.txt", "direct_url.json")]
    (dist / "RECORD").write_text("".join(f"{n},,\n" for n in names) + f"{dist.name}/RECORD,,\n")


def head(python: Path) -> str:
    """The checkout's commit at HEAD."""
    return git(python.parent, "rev-parse", "HEAD").strip()
