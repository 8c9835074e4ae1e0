"""The suite's container scenarios: the same sglang tree in a Docker container on this
machine and on a loopback SSH node, the same snapver commands against each.

  container-pull      snapver pull into a fresh store: the container (`docker exec -i`)
                      vs the SSH node; vs `docker cp` of the tree into a fresh folder
  container-re-pull   snapver pull, nothing changed: the container vs the SSH node
  container-diff      one file changed, snapver diff -q: the container vs the SSH node;
                      vs `docker cp` + `diff -rq` against a copy (the manual workflow)

The container is the test image (`snapver-test:bookworm`, tests/containers/dockerkit.py:
Debian's python3, no network) holding a copy of the SSH node's site-packages (sglang and
its dist-info, the bytes of the same wheel); it runs on loopback only. The goal: a
container costs at most 1.2x the SSH node (`CONTAINER_BARS`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from common import run, run_measured, run_measured_all

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "containers"))

import dockerkit  # noqa: E402
from helpers import toml_dumps  # noqa: E402

SCENARIOS = ("container-pull", "container-re-pull", "container-diff")
BOX = "box"  # the container node
SITE = "/opt/sglang-site"  # the site-packages inside the container
IN_BOX = "snapver (container)"
OVER_SSH = "snapver (ssh)"
# (scenario, network, numerator, denominator, op, limit), as suite.BARS
CONTAINER_BARS = [(scenario, "loopback", IN_BOX, OVER_SSH, "<=", 1.2) for scenario in SCENARIOS]


class Box:
    """The container and two projects (.snapver and store each): the container node, the SSH node."""

    def __init__(self, suite: Any, net: Any, node: str, changed: str) -> None:
        self.suite, self.net = suite, net  # suite.Suite and suite.Network (not imported: suite imports this)
        self.changed = changed  # the file a diff finds changed, relative to site-packages
        self.name = ""
        self.root = net.project.parent / "container"
        self.projects = {IN_BOX: self.root / "box-project", OVER_SSH: self.root / "ssh-project"}
        self.nodes = {IN_BOX: BOX, OVER_SSH: node}

    def start(self) -> None:
        """Run the container and copy the SSH node's site-packages into it (untimed)."""
        self.name = dockerkit.run_container(dockerkit.ensure_image(), "bench")
        site = self.suite.sites[self.nodes[OVER_SSH]]
        dockerkit.exec_in(self.name, f"mkdir -p {SITE}")
        dockerkit.docker("cp", f"{site}/.", f"{self.name}:{SITE}", timeout=600)
        ssh_table = {**self.suite.env.node_table(self.nodes[OVER_SSH], site),
                     "host": self.net.endpoints[self.nodes[OVER_SSH]][0],
                     "port": self.net.endpoints[self.nodes[OVER_SSH]][1]}
        tables = {IN_BOX: {BOX: {"container": self.name, "site_packages": SITE}},
                  OVER_SSH: {self.nodes[OVER_SSH]: ssh_table}}
        for tool, project in self.projects.items():
            project.mkdir(parents=True, exist_ok=True)
            (project / ".snapver").write_text(toml_dumps({"store": {"path": "snapshots"}, "nodes": tables[tool]}),
                                              encoding="utf-8")

    def stop(self) -> None:
        if self.name:
            dockerkit.remove_container(self.name)

    def snapver(self, tool: str, *args: str, codes: Sequence[int] = (0,)) -> tuple[subprocess.CompletedProcess[bytes],
                                                                                   int]:
        project = self.projects[tool]
        env = {**self.suite.env.env(), "SNAPVER_AUTO_GC": "0"}
        done, peak = run_measured([*self.suite.env.snapver_argv, "--config", str(project / ".snapver"), *args],
                                  check=False, cwd=project, env=env)
        if done.returncode not in codes:
            raise RuntimeError(f"snapver {' '.join(args)} ({tool}) exited {done.returncode}:\n"
                               f"{done.stdout.decode(errors='replace')}{done.stderr.decode(errors='replace')}")
        return done, peak

    def pull(self, tool: str) -> dict[str, Any]:
        done, _peak = self.snapver(tool, "pull", "--json", self.nodes[tool])
        document = json.loads(done.stdout)
        if document["exit_code"] != 0:
            raise RuntimeError(f"snapver pull ({tool}) failed: {document}")
        node: dict[str, Any] = document["nodes"][0]
        return node

    def fresh_store(self, tool: str) -> Callable[[int], None]:
        return lambda _round: shutil.rmtree(self.projects[tool] / "snapshots", ignore_errors=True)

    def docker_cp(self, into: Path) -> int:
        """`docker cp` of the container's sglang/srt into ``into`` (which must not exist); peak KiB."""
        return run_measured(["docker", "cp", f"{self.name}:{SITE}/sglang/srt", str(into)])[1]

    def change_file(self, number: int) -> None:
        """Append a line to the changed file in the container and on the SSH node alike (untimed)."""
        line = f"# benchmark hot-fix {number}"
        dockerkit.exec_in(self.name, f"echo '{line}' >> {SITE}/{self.changed}")
        with open(self.suite.sites[self.nodes[OVER_SSH]] / self.changed, "a") as handle:
            handle.write(line + "\n")


def _files(tree: Path) -> int:
    return sum(1 for p in tree.rglob("*") if not p.is_dir())


def _expect(what: str, got: Any, wanted: Any) -> None:
    if got != wanted:
        raise RuntimeError(f"{what}: got {got!r}, wanted {wanted!r}")


def first_pull(box: Box) -> list[tuple[str, Callable[[int], int], Callable[[int], Any] | None, bool]]:
    files = _files(box.suite.tree(box.nodes[OVER_SSH]))
    copy = box.root / "docker-cp"

    def pull(tool: str) -> Callable[[int], int]:
        def body(_round: int) -> int:
            done, peak = box.snapver(tool, "pull", "--json", box.nodes[tool])
            _expect(f"first pull ({tool}) fetched", json.loads(done.stdout)["nodes"][0]["fetched_files"], files)
            return peak
        return body

    def docker_cp(_round: int) -> int:
        peak = box.docker_cp(copy)
        _expect("docker cp copied", _files(copy), files)
        return peak

    return [(IN_BOX, pull(IN_BOX), box.fresh_store(IN_BOX), False),
            (OVER_SSH, pull(OVER_SSH), box.fresh_store(OVER_SSH), False),
            ("docker cp", docker_cp, lambda _round: shutil.rmtree(copy, ignore_errors=True), False)]


def re_pull(box: Box) -> list[tuple[str, Callable[[int], int], Callable[[int], Any] | None, bool]]:
    for tool in (IN_BOX, OVER_SSH):
        box.pull(tool)

    def pull(tool: str) -> Callable[[int], int]:
        def body(_round: int) -> int:
            done, peak = box.snapver(tool, "pull", "--json", box.nodes[tool])
            node = json.loads(done.stdout)["nodes"][0]
            _expect(f"re-pull ({tool}) fetched", (node["fetched_files"], bool(node["unchanged_since"])), (0, True))
            return peak
        return body

    return [(IN_BOX, pull(IN_BOX), None, False), (OVER_SSH, pull(OVER_SSH), None, False)]


def diff(box: Box) -> list[tuple[str, Callable[[int], int], Callable[[int], Any] | None, bool]]:
    copy, fetched = box.root / "before", box.root / "diff-cp"
    shutil.rmtree(copy, ignore_errors=True)
    for tool in (IN_BOX, OVER_SSH):
        box.pull(tool)
    box.docker_cp(copy)
    box.change_file(1)
    changed = box.changed.rsplit("/", 1)[-1]

    def snapver_diff(tool: str) -> Callable[[int], int]:
        def body(_round: int) -> int:
            done, peak = box.snapver(tool, "diff", "-q", box.nodes[tool], codes=(1,))
            _expect(f"snapver diff -q ({tool}) printed", done.stdout, b"")
            return peak
        return body

    def manual(_round: int) -> int:
        peak = box.docker_cp(fetched)
        ((done, diff_peak),) = run_measured_all([["diff", "-rq", str(copy), str(fetched)]], check=False)
        found = [line.split()[1].rsplit("/", 1)[-1] for line in done.stdout.decode().splitlines()]
        _expect("docker cp + diff -rq found", found, [changed])
        return max(peak, diff_peak)

    return [(IN_BOX, snapver_diff(IN_BOX), None, False), (OVER_SSH, snapver_diff(OVER_SSH), None, False),
            ("docker cp + diff -rq", manual, lambda _round: shutil.rmtree(fetched, ignore_errors=True), False)]


_CASES = {"container-pull": first_pull, "container-re-pull": re_pull, "container-diff": diff}
_REFERENCES = {IN_BOX: OVER_SSH, "docker cp": IN_BOX, "docker cp + diff -rq": IN_BOX}


def runner(scenario: str, node: str, changed: str) -> Callable[[Any, Any], None]:
    """The suite's runner of ``scenario`` (``node``: the SSH node to compare with; ``changed``:
    the file to change for a diff): loopback only, the container is on this machine."""

    def run_scenario(suite: Any, net: Any) -> None:
        if net.name != "loopback":
            return
        problem = dockerkit.daemon_problem()
        if problem:
            raise RuntimeError(problem)
        box = Box(suite, net, node, changed)
        try:
            box.start()
            suite.measure(scenario, net, _CASES[scenario](box), _REFERENCES)
        finally:
            box.stop()
            run(["rm", "-rf", str(box.root)], check=False)

    return run_scenario
