"""Team sync: `snapver sync` of a 16 nodes x 10 pulls store, against `git push --mirror`.

    python3 bench/sync.py [--nodes 16] [--rounds 10] [--files 300] [--runs 3] [--ssh]

The store is built fast: each node is a small synthetic tree (``--files`` Python files
of ~4 KiB, distinct per node in one file), pulled once, then ``--rounds`` times after a
one-file edit on every node (the changes of store_growth.py, without the wheel), so it
holds nodes x (rounds + 1) snapshots. Timed, interleaved, ``--runs`` times each:

- ``sync (first)``: `snapver sync` into an empty bare repository (every object and ref);
- ``git push --mirror (first)``: the same store pushed by git itself into another one;
- ``sync (unchanged)`` and ``git push --mirror (unchanged)``: the same again, nothing new
  (a sync is then one ``git ls-remote``; ``snapver --version`` is timed beside it: the
  interpreter's start-up that every snapver command pays).

The remote is a path, or with ``--ssh`` the bench's own loopback sshd (``ssh://``, the
user's GIT_SSH_COMMAND set to its key and known_hosts), as a team would reach it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO_ROOT, client_python, run  # noqa: E402

sys.path.insert(0, str(REPO_ROOT))


def build_store(work: Path, nodes: int, rounds: int, files: int, env: dict[str, str]) -> Path:
    """A config whose store holds ``nodes`` x (``rounds`` + 1) snapshots of small trees."""
    lines = ['[store]\npath = "store"\nremote = "REMOTE"\n']
    sites = []
    for index in range(nodes):
        site = work / "nodes" / f"n{index:02d}"
        tree = site / "sglang" / "srt"
        tree.mkdir(parents=True)
        for number in range(files):
            # Shared content (a fleet runs one release), one file per node its own.
            body = f"# module {number}\n" + "x = 1\n" * 650 + (f"# node {index}\n" if number == 0 else "")
            (tree / f"m{number:04d}.py").write_text(body)
        sites.append(tree)
        lines.append(f'[nodes.n{index:02d}]\nlocal = true\nsite_packages = "{site}"\n')
    config = work / ".snapver"
    config.write_text("\n".join(lines))
    snapver = [sys.executable, "-m", "snapver", "--config", str(config)]
    run([*snapver, "pull", "--all"], env=env)
    for round_ in range(rounds):
        for index, tree in enumerate(sites):
            target = tree / f"m{(index * 7 + round_) % files:04d}.py"
            target.write_text(target.read_text() + f"# hot-fix {round_} on node {index}\n")
        run([*snapver, "pull", "--all"], env=env)
    return config


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--files", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ssh", action="store_true", help="reach the remote over the bench's loopback sshd")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="snapver-sync-"))
    env = dict(os.environ, SNAPVER_AUTO_GC="0", HOME=str(work), PYTHONPATH=str(REPO_ROOT))
    python = client_python(work)  # the timed commands run as installed (see common.client_python)
    sshd_context = None
    try:
        began = time.monotonic()
        config = build_store(work, args.nodes, args.rounds, args.files, env)
        store = work / "store"
        built = time.monotonic() - began
        address = None
        if args.ssh:
            from common import bench_env

            sshd_context = bench_env()
            bench = sshd_context.__enter__()
            sshd = bench.sshd
            address = f"ssh://root@{sshd.addresses['ct200']}:{sshd.port}"
            env["GIT_SSH_COMMAND"] = (f"ssh -i {sshd.identity_file} -o UserKnownHostsFile={sshd.known_hosts} "
                                      "-o StrictHostKeyChecking=yes -o IdentitiesOnly=yes -o BatchMode=yes")
        template = config.read_text()
        timings: dict[str, list[float]] = {}

        def timed(name: str, command: list[str]) -> None:
            start = time.monotonic()
            run(command, env=env)
            timings.setdefault(name, []).append(time.monotonic() - start)

        for round_ in range(args.runs):
            remotes = {kind: work / f"remote-{kind}-{round_}.git" for kind in ("sync", "mirror")}
            for remote in remotes.values():
                run(["git", "init", "-q", "--bare", str(remote)])
            urls = {kind: f"{address}{path}" if address else str(path) for kind, path in remotes.items()}
            config.write_text(template.replace("REMOTE", urls["sync"]))
            # The remote is new each round: the store forgets the last one (never synced, no mirror refs).
            subprocess.run(["git", "--git-dir", str(store), "config", "--unset", "snapver.synced"], env=env)
            leftovers = subprocess.run(["git", "--git-dir", str(store), "for-each-ref", "--format=delete %(refname)",
                                        "refs/remotes/team/"], capture_output=True, text=True).stdout
            subprocess.run(["git", "--git-dir", str(store), "update-ref", "--stdin"], input=leftovers, text=True)
            snapver = [python, "-m", "snapver", "--config", str(config), "sync"]
            mirror = ["git", "--git-dir", str(store), "push", "--quiet", "--mirror", urls["mirror"]]
            timed("sync (first)", snapver)
            timed("git push --mirror (first)", mirror)
            timed("sync (unchanged)", snapver)
            timed("git push --mirror (unchanged)", mirror)
            # What any snapver command costs before it does anything (Python and its imports).
            timed("snapver --version (start-up)", [python, "-m", "snapver", "--version"])
        snapshots = subprocess.run(["git", "--git-dir", str(store), "rev-list", "--count", "--branches=nodes/*"],
                                   capture_output=True, text=True).stdout.strip()
        refs = subprocess.run(["git", "--git-dir", str(store), "for-each-ref", "refs/heads/", "refs/tags/"],
                              capture_output=True, text=True).stdout.count("\n")
        where = "ssh:// over loopback sshd" if args.ssh else "a path"
        print(f"sync: {args.nodes} nodes x {args.rounds + 1} pulls ({snapshots} snapshots, {refs} refs, "
              f"{args.files} files a node, built in {built:.0f} s), remote: {where}, median of {args.runs}")
        medians = {name: statistics.median(values) for name, values in timings.items()}
        for name, value in medians.items():
            print(f"  {name:<32} {value:7.3f} s")
        for case in ("first", "unchanged"):
            ratio = medians[f"sync ({case})"] / medians[f"git push --mirror ({case})"]
            print(f"  ratio sync / push --mirror ({case}): {ratio:5.2f}x")
        return 0
    finally:
        if sshd_context is not None:
            sshd_context.__exit__(None, None, None)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
