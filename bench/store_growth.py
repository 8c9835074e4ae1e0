"""Store growth: 16 nodes x 10 pulls with small changes, against one tree packed by git.

    python3 bench/store_growth.py [--nodes 16] [--rounds 10]

Nodes are local folders (the store's growth does not depend on the transport), made as
hard-link copies of one unpacked wheel; each round edits one file on every node (a
different file per node, as hot-fixes are) and pulls them all. After the rounds the
store is compacted as a pull would trigger it (``snapver.store.gc.compact``), and its
size is compared with one tree committed by plain git and packed by ``git gc``.
The bar: at most 1.2x.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO_ROOT, find_wheel, run  # noqa: E402

sys.path.insert(0, str(REPO_ROOT))


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    from snapver.store.gc import compact
    from tests.conftest import _unpack_wheel  # the fixture's own unpacking (modes kept)

    work = Path(tempfile.mkdtemp(prefix="snapver-growth-"))
    env = dict(os.environ, SNAPVER_AUTO_GC="0", HOME=str(work))
    try:
        template = work / "template"
        _unpack_wheel(find_wheel(), template)
        tree = template / "sglang" / "srt"
        py_files = sorted(p for p in tree.rglob("*.py") if p.stat().st_size > 2000)
        nodes = {}
        for i in range(args.nodes):
            site = work / "nodes" / f"n{i:02d}"
            site.parent.mkdir(parents=True, exist_ok=True)
            run(["cp", "-al", str(template), str(site)])
            nodes[f"n{i:02d}"] = site
        config = work / ".snapver"
        lines = ['[store]\npath = "store"\n']
        for name, site in nodes.items():
            lines.append(f'[nodes.{name}]\nlocal = true\nsite_packages = "{site}"\n')
        config.write_text("\n".join(lines))
        snapver = [sys.executable, "-m", "snapver", "--config", str(config)]
        began = time.monotonic()
        run([*snapver, "pull", "--all"], env=env)
        for round_ in range(args.rounds):
            for i, site in enumerate(nodes.values()):
                target = site / py_files[(i * 7 + round_) % len(py_files)].relative_to(template)
                data = target.read_bytes()
                target.unlink()  # break the hard link, as a real edit on its own node would
                target.write_bytes(data + f"\n# hot-fix {round_} on node {i}\n".encode())
            run([*snapver, "pull", "--all"], env=env)
        pulls = time.monotonic() - began
        store = work / "store"
        raw = folder_size(store / "objects")
        compact(store)
        compacted = folder_size(store / "objects")
        snapshots = subprocess.run(["git", "--git-dir", str(store), "rev-list", "--count", "--branches=nodes/*"],
                                   capture_output=True, text=True).stdout.strip()
        # One tree, committed by plain git and packed by git gc: the reference.
        reference = work / "reference"
        shutil.copytree(tree, reference / "sglang" / "srt", symlinks=True)
        git = ["git", "-C", str(reference), "-c", "user.name=b", "-c", "user.email=b@b"]
        run([*git, "init", "-q"])
        run([*git, "add", "-A"])
        run([*git, "commit", "-q", "-m", "one tree"])
        run([*git, "gc", "-q"])
        one_tree = folder_size(reference / ".git" / "objects")
        ratio = compacted / one_tree
        print(f"store growth: {args.nodes} nodes x {args.rounds} rounds of small changes "
              f"({snapshots} snapshots, {args.nodes * (args.rounds + 1)} pulls, {pulls:.0f} s)")
        print(f"  store before compaction  {raw / 1e6:8.1f} MB")
        print(f"  store after compaction   {compacted / 1e6:8.1f} MB")
        print(f"  one tree, git gc         {one_tree / 1e6:8.1f} MB")
        print(f"  ratio                    {ratio:8.2f}x  (bar <= 1.2: {'met' if ratio <= 1.2 else 'NOT MET'})")
        return 0 if ratio <= 1.2 else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
