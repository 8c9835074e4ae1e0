"""The remaining tables and result lines at 80 columns, on real data (see test_fit_80.py):
`log`, `patch list`, `ps`, the push and rollback plans and results, `tag --list` and `env`,
run in a real pseudo-terminal on one two-node SSH fleet made once for the module, with
the widest real values (a long patch name, a long path, long site-packages). No line wider
than 80 unless it is one value longer than the screen, nothing cut; off a terminal and
with `-w`, the lines as they were."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import Result, toml_dumps
from terminal import run_in_terminal

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
REPO_ROOT = Path(__file__).resolve().parents[2]
RUNNER = "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py"
DFLASH = "sglang/srt/speculative/dflash_worker_v2.py"
PATCH = "patch-cudagraph-bs-fix-for-deepseek-v3-tp8-nodes"
SECOND = "patch-dflash-worker-v2-spec-decoding-fix"
COMMAND = "-c import time; time.sleep(300)"  # the server's arguments, as ps shows them
TAG = "may22-before-cudagraph-bs-fix-rollout-on-tp8-nodes"


class Fleet:
    """Two SSH nodes (ct200, ct129, group tp8) and a store, run from ``work`` with a HOME of their own."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.work = root / "work"
        self.env = {"HOME": str(root / "home"), "XDG_CONFIG_HOME": str(root / "home/.config"),
                    "GIT_CONFIG_NOSYSTEM": "1", "SNAPVER_AUTO_GC": "0", "SNAPVER_PAGER": "cat"}
        self.sites = {name: root / name / "root/venv_sglang211/lib/python3.12/site-packages"
                      for name in ("ct200", "ct129")}

    def run(self, *args: str) -> Result:
        """snapver off a terminal (stdout and stderr to pipes)."""
        env = {name: value for name, value in os.environ.items() if not name.startswith(("GIT_", "SNAPVER_"))}
        env.update(self.env, NO_COLOR="1", COLUMNS="200",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
        done = subprocess.run([sys.executable, "-m", "snapver", *args], cwd=self.work, env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        return Result(done.returncode, done.stdout, done.stderr)

    def screen(self, *args: str, codes: tuple[int, ...] = (0, 1)) -> list[str]:
        """The lines snapver leaves on an 80-column terminal (stdout and stderr both)."""
        shown = run_in_terminal(*args, columns=80, env=self.env, cwd=self.work)
        assert shown.code in codes, shown
        return [line.rsplit("\r", 1)[-1] for line in ANSI.sub("", shown.text).splitlines()]


@pytest.fixture(scope="module")
def fleet(sglang_site_template: Path, sshd) -> Iterator[Fleet]:
    made = Fleet(Path(tempfile.mkdtemp(prefix="sv-")))  # /tmp/sv-xxxxxxxx: real-length paths below it
    (made.root / "home").mkdir()
    made.work.mkdir()
    for site in made.sites.values():
        shutil.copytree(sglang_site_template, site, symlinks=True)
    nodes = {name: {"host": sshd.addresses[name], "port": sshd.port, "user": "root", "site_packages": str(site),
                    "identity_file": str(sshd.identity_file), "known_hosts": str(sshd.known_hosts),
                    "host_key_policy": "strict", "connect_timeout": 5} for name, site in made.sites.items()}
    (made.work / ".snapver").write_text(toml_dumps({"store": {"path": "snapshots"}, "nodes": nodes,
                                                    "groups": {"tp8": {"nodes": ["ct200", "ct129"], "serving": True}}}))
    assert made.run("pull", "tp8").code == 0
    assert made.run("tag", TAG, "ct200").code == 0
    for name, path, line in ((PATCH, RUNNER, "# skip capture above bs 256\n"),
                             (SECOND, DFLASH, "# spec decoding: keep the draft's kv\n")):
        new = made.run("patch", "new", name, "--base", "ct200", "--nodes", "tp8")
        assert new.code == 0, new
        with open(Path(new.out.strip()) / path, "a") as handle:
            handle.write(line)
        saved = made.run("patch", "save", name, "-m", "skip capture above bs 256 on the decode path of tp8")
        assert saved.code == 0, saved
    # A process of ct200's deployment, started before the push: it needs a restart after it.
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                              env={**os.environ, "PYTHONPATH": str(made.sites["ct200"])})
    time.sleep(0.05)
    pushed = made.run("push", PATCH, "--yes")
    assert pushed.code == 0, pushed
    try:
        yield made
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(made.root, ignore_errors=True)


def assert_fits(lines: list[str], *whole: str, single: str = COMMAND) -> None:
    """No line over 80 columns but one that is a single value (no space inside, or the
    ``single`` command line alone on its line); nothing cut; each of ``whole`` (a path, a name)
    on one line, uncut."""
    over = [line for line in lines if len(line) > 80 and len(line.strip().split()) > 1
            and not (line.strip().endswith(single) and " " not in line.strip()[:-len(single)].strip())]
    assert not over, "\n".join(over)
    text = "\n".join(lines)
    assert "…" not in text, text
    for word in whole:
        assert word in text, (word, text)


def test_log_fits_80_columns(fleet: Fleet) -> None:
    assert_fits(fleet.screen("log"), f"push {PATCH}", TAG)
    assert_fits(fleet.screen("log", "--oneline"), f"push {PATCH}", TAG)


def test_patch_list_fits_80_columns(fleet: Fleet) -> None:
    listed = fleet.screen("patch", "list")
    assert_fits(listed, PATCH, SECOND, "skip capture above bs 256 on the decode path of tp8")


def test_tag_list_fits_80_columns(fleet: Fleet) -> None:
    assert_fits(fleet.screen("tag", "--list"), TAG)
    for whole in (fleet.run("tag", "--list").out.splitlines(), fleet.screen("tag", "--list", "-w")):
        assert any(line.startswith(f"{TAG} ") and line.rstrip().endswith("ct200") for line in whole), whole


def test_ps_fits_80_columns(fleet: Fleet) -> None:
    shown = fleet.screen("ps", "ct200")
    assert_fits(shown, RUNNER, "restart needed")
    # Off a terminal and with -w: a process on one line, a file and its verdict on one line.
    for whole in (fleet.run("ps", "ct200").out.splitlines(), fleet.screen("ps", "ct200", "-w")):
        assert any("restart needed" in line and line.endswith(COMMAND) for line in whole), whole
        assert any(line.strip() == f"{RUNNER}: may run old code" for line in whole), whole


def test_env_fits_80_columns(fleet: Fleet) -> None:
    shown = fleet.screen("env", "tp8", "--all")
    assert_fits(shown, "sglang")
    kernel = next(line for line in fleet.run("env", "tp8", "--all").out.splitlines() if line.startswith("Linux"))
    assert "…" not in kernel, kernel  # off a terminal too: whole values
    assert len([line for line in fleet.screen("env", "tp8", "--all", "-w") if "ct200" in line]) == 1


def test_push_and_rollback_plans_and_results_fit_80_columns(fleet: Fleet) -> None:
    planned = fleet.screen("push", SECOND, "--dry-run", "--max-fail", "1")
    assert any(line.startswith("serving group tp8") for line in planned), planned
    assert any(line.startswith("failure budget") for line in planned), planned
    pushed = fleet.screen("push", SECOND, "--yes")
    unplanned = fleet.screen("rollback", "tp8", "--dry-run")
    rolled = fleet.screen("rollback", "tp8", "--yes")
    assert_fits(planned + pushed + unplanned + rolled, SECOND, DFLASH)
    assert any(line.startswith(f"push {SECOND} (") and line.endswith("— dry run")
               for line in fleet.screen("push", SECOND, "--dry-run", "-w")), "push -w: the plan's line whole"
    for done in (pushed, rolled):
        assert sum(line.startswith(("ct200: done", "ct129: done")) for line in done) == 2, done
