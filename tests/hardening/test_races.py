"""Another actor at the worst moment: a second real process races every write and read.

Each test starts a real racer (a separate process: a person editing the node, the
service user swapping a folder for a symlink, a second snapver with its own store, a
signal through a real terminal) against a real sshd node, and checks the outcome with
its own reads of the node and of the store (git), never with snapver's code.
"""

from __future__ import annotations

import hashlib
import json
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faultkit import git, wait_for

from snapver.config import parse_config
from snapver.errors import TransportError
from snapver.transport.connect import open_transport

REPO_ROOT = Path(__file__).resolve().parents[2]
SRT = "sglang/srt"
UTILS = f"{SRT}/utils/common.py"
A, B = f"{SRT}/a.py", f"{SRT}/b.py"
BIG = f"{SRT}/zz/big.bin"  # sorts after every other touched path: staged last
BASE = {UTILS: b"x = 1\n", A: b"a = 1\n", B: b"b = 1\n"}
SERVICE_UID = 65534  # nobody: owns the tracked tree, as a service user would

# A racer: waits until a push stages a file in WATCH (a .snapver-*.tmp appears), then acts.
RACER = r"""
import os, sys, time
watch, action = sys.argv[1], sys.argv[2]
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        staged = any(name.startswith(".snapver-") for name in os.listdir(watch))
    except OSError:
        staged = False
    if staged:
        if action == "append":
            with open(sys.argv[3], "a") as handle:
                handle.write(sys.argv[4])
        elif action == "swap":  # folder -> folder.old, and a link in its place
            os.rename(sys.argv[3], sys.argv[3] + ".old")
            os.symlink(sys.argv[4], sys.argv[3])
        elif action == "rewrite":  # in place, same size, its mtime put back: only its ctime moves
            before = os.stat(sys.argv[3])
            with open(sys.argv[3], "r+b") as handle:
                handle.write(sys.argv[4].encode())
            os.utime(sys.argv[3], ns=(before.st_atime_ns, before.st_mtime_ns))
        print("done", flush=True)
        sys.exit(0)
    time.sleep(0.001)
sys.exit(1)
"""


def env_for(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(extra or {})}


def start(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "snapver", *args], cwd=cwd, env=env_for(env),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def start_racer(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", RACER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def leftovers(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.name.startswith(".snapver-")]


def run_in(run_snapver, folder: Path | None, *args: str):
    """``run_snapver`` (in this process) with ``folder`` as the working folder."""
    if folder is None:
        return run_snapver(*args)
    here = os.getcwd()
    os.chdir(folder)
    try:
        return run_snapver(*args)
    finally:
        os.chdir(here)


def make_patch(run_snapver, name: str, edits: dict[str, bytes | None], base: str = "ct200",
               cwd: Path | None = None) -> None:
    made = run_in(run_snapver, cwd, "patch", "new", name, "--base", base, "--nodes", "ct200")
    assert made.code == 0, made
    folder = Path(made.out.strip().splitlines()[-1])
    for path, data in edits.items():
        if data is None:
            (folder / path).unlink()
        else:
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            (folder / path).write_bytes(data)
    saved = run_in(run_snapver, cwd, "patch", "save", name)
    assert saved.code == 0, saved


def records(store: Path, node: str) -> list[dict]:
    out = git(store, "log", "--format=%B%x00", f"refs/heads/pushes/{node}").decode()
    return [json.loads(line[len("snapver-meta: "):]) for body in out.split("\0")
            for line in body.splitlines() if line.startswith("snapver-meta: ")]


@pytest.fixture
def node(make_site_packages, write_config, ssh_node, run_snapver, isolated_env):
    """Node `ct200` (ssh) with a small tree owned by the service user, pulled into the store."""
    site = make_site_packages("ct200", files=BASE)
    subprocess.run(["chown", "-R", f"{SERVICE_UID}:{SERVICE_UID}", str(site / "sglang")], check=True)
    write_config({"ct200": ssh_node("ct200", site)})
    assert run_snapver("pull", "ct200").code == 0
    return site


def test_a_hand_edit_made_while_a_push_streams_is_never_erased(node, run_snapver, isolated_env):
    """The hot-fix lands while a 40 MB file streams: the push's compare-and-swap at the rename
    sees it, stops, writes nothing, and says which file changed, with both contents' ids."""
    make_patch(run_snapver, "big", {UTILS: b"x = 2\n", BIG: os.urandom(40 << 20)})
    racer = start_racer(str(node / f"{SRT}/zz"), "append", str(node / UTILS), "# HOT-FIX\n")
    result = run_snapver("push", "big", "ct200", "--yes")
    assert racer.wait(timeout=60) == 0, racer.communicate()
    assert result.code == 1, result
    assert "changed while the push was writing" in result.err and UTILS in result.err, result
    hot = hashlib.sha1(b"blob 16\0x = 1\n# HOT-FIX\n").hexdigest()
    assert f"found {hot[:10]}" in result.err, result
    assert (node / UTILS).read_bytes() == b"x = 1\n# HOT-FIX\n"
    assert not (node / BIG).exists() and not leftovers(node)
    assert records(isolated_env / "snapshots", "ct200")[0]["state"] == "rolled-back"


def test_an_edit_keeping_size_and_mtime_made_while_a_push_streams_is_never_erased(node, run_snapver, isolated_env):
    """The hot-fix rewrites the file in place with as many bytes and puts its mtime back
    (as `cp -p` or an editor that keeps times would) while a 40 MB file streams: only its
    ctime moved, which the compare-and-swap at the rename sees; the push writes nothing."""
    make_patch(run_snapver, "big", {UTILS: b"x = 2\n", BIG: os.urandom(40 << 20)})
    racer = start_racer(str(node / f"{SRT}/zz"), "rewrite", str(node / UTILS), "x = 9\n")
    result = run_snapver("push", "big", "ct200", "--yes")
    assert racer.wait(timeout=60) == 0, racer.communicate()
    assert result.code == 1, result
    assert "changed while the push was writing" in result.err and UTILS in result.err, result
    assert (node / UTILS).read_bytes() == b"x = 9\n"
    assert not (node / BIG).exists() and not leftovers(node)


def test_a_conflict_met_at_the_rename_stops_the_rest_of_the_node_commit(node, run_snapver, isolated_env):
    """a.py is hand-edited while the push streams; it is the first path the node commits:
    the push stops there and never renames b.py or the big file into place (b.py keeps its
    inode and times: it was not written and then undone), and says which file changed."""
    make_patch(run_snapver, "three", {A: b"a = 2\n", B: b"b = 2\n", BIG: os.urandom(40 << 20)})
    untouched = os.lstat(node / B)
    racer = start_racer(str(node / f"{SRT}/zz"), "append", str(node / A), "# HOT-FIX\n")
    result = run_snapver("push", "three", "ct200", "--yes")
    assert racer.wait(timeout=60) == 0, racer.communicate()
    assert result.code == 1, result
    assert "changed while the push was writing" in result.err and A in result.err, result
    assert (node / A).read_bytes() == b"a = 1\n# HOT-FIX\n"
    now = os.lstat(node / B)
    assert (now.st_ino, now.st_mtime_ns, now.st_ctime_ns) == (
        untouched.st_ino, untouched.st_mtime_ns, untouched.st_ctime_ns), "b.py was written after the conflict"
    assert (node / B).read_bytes() == BASE[B]
    assert not (node / BIG).exists() and not leftovers(node)


def test_two_stores_pushing_to_one_node_at_once_never_lose_a_patch(make_site_packages, write_config, ssh_node,
                                                                   run_snapver, tmp_path):
    """Two engineers, two stores, two patches of the same file, pushed at the same moment:
    the node's write lock and the compare-and-swap let exactly one through; the other is a
    conflict (exit 1) and the node holds the winner's files, whole."""
    site = make_site_packages("ct200", files=BASE)
    patches = {}
    for who in ("alice", "bob"):
        folder = tmp_path / who
        write_config({"ct200": ssh_node("ct200", site)}, where=folder)
        assert run_in(run_snapver, folder, "pull", "ct200").code == 0
        patches[who] = {UTILS: f"x = '{who}'\n".encode(), BIG: os.urandom(30 << 20)}
        make_patch(run_snapver, "fix", patches[who], cwd=folder)
    pushes = {who: start("push", "fix", "ct200", "--yes", cwd=tmp_path / who) for who in ("alice", "bob")}
    codes = {who: push.wait(timeout=120) for who, push in pushes.items()}
    outputs = {who: push.communicate()[1].decode() for who, push in pushes.items()}
    assert sorted(codes.values()) == [0, 1], (codes, outputs)
    winner = min(codes, key=codes.__getitem__)
    loser = max(codes, key=codes.__getitem__)
    assert "changed since the plan was made" in outputs[loser] or "changed while" in outputs[loser], outputs
    assert (site / UTILS).read_bytes() == patches[winner][UTILS]
    assert (site / BIG).read_bytes() == patches[winner][BIG]
    assert not leftovers(site)


def test_an_undo_never_erases_an_edit_made_after_the_write(node, run_snapver, isolated_env):
    """The health check edits a patched file, then fails: the undo restores the file nobody
    touched and leaves the edited one as it is, saying so, exit non-zero."""
    make_patch(run_snapver, "two", {A: b"a = 2\n", B: b"b = 2\n"})
    health = f"printf '# later\\n' >> \"$SNAPVER_SITE_PACKAGES/{A}\"; exit 1"
    result = run_snapver("push", "two", "ct200", "--yes", "--health", health)
    assert result.code != 0, result
    assert (node / A).read_bytes() == b"a = 2\n# later\n"  # left alone
    assert (node / B).read_bytes() == BASE[B]  # undone
    assert "left alone" in result.err and A in result.err, result
    assert records(isolated_env / "snapshots", "ct200")[0]["state"] == "failed"


@pytest.mark.parametrize("big", [BIG, f"{SRT}/aa/big.bin"], ids=["swap after common.py was staged",
                                                            "swap before common.py is staged"])
def test_a_folder_swapped_for_a_link_mid_push_is_never_written_through(node, run_snapver, tmp_path, big):
    """`utils` is swapped for a link to a root-only folder while the push streams a big file
    (what the service user who owns the tree could do) — after `utils/common.py` was staged,
    or before: snapver (root) writes nothing in the root-only folder nor in the moved one,
    and fails."""
    outside = tmp_path / "root-only"
    outside.mkdir(mode=0o700)
    (outside / "common.py").write_bytes(b"root's own\n")
    make_patch(run_snapver, "big", {UTILS: b"x = 2\n", big: os.urandom(40 << 20)})
    racer = start_racer(str(node / big.rsplit("/", 1)[0]), "swap", str(node / f"{SRT}/utils"), str(outside))
    result = run_snapver("push", "big", "ct200", "--yes")
    assert racer.wait(timeout=60) == 0, racer.communicate()
    assert result.code != 0, result
    assert (outside / "common.py").read_bytes() == b"root's own\n" and sorted(os.listdir(outside)) == ["common.py"]
    assert (node / f"{SRT}/utils.old/common.py").read_bytes() == BASE[UTILS]
    assert not (node / big).exists() and not leftovers(node)


def test_a_folder_swapped_for_a_link_mid_pull_is_never_read(make_site_packages, write_config, ssh_node,
                                                            run_snapver, tmp_path, isolated_env):
    """A racer flips `sub` between a folder and a link to a root-only folder, again and again,
    while pulls run: each pull records the real file or fails; the root-only content never
    reaches the store."""
    files = {f"{SRT}/d{d:02d}/m{m:02d}.py": f"m = {d * 100 + m}\n" for d in range(30) for m in range(40)}
    site = make_site_packages("ct200", files={**files, f"{SRT}/sub/x.py": "public = 1\n"})
    secret = tmp_path / "root-only"
    secret.mkdir(mode=0o700)
    secret_data = b"root's secret " + os.urandom(16).hex().encode() + b"\n"
    (secret / "x.py").write_bytes(secret_data)
    secret_id = hashlib.sha1(b"blob %d\0" % len(secret_data) + secret_data).hexdigest()
    write_config({"ct200": ssh_node("ct200", site)})
    flipper = subprocess.Popen([sys.executable, "-c", r"""
import os, sys, time
sub, real, link_to, stop = sys.argv[1:5]
while not os.path.exists(stop):
    os.rename(sub, real); os.symlink(link_to, sub); time.sleep(0.0005)
    os.unlink(sub); os.rename(real, sub); time.sleep(0.0005)
""", str(site / SRT / "sub"), str(site / SRT / "sub.real"), str(secret), str(tmp_path / "stop")])
    codes = []
    try:
        for _ in range(8):
            (site / SRT / "d00/m00.py").write_text(f"m = {time.time()}\n")  # something to record
            result = run_snapver("pull", "ct200")
            assert result.code in (0, 3), result
            codes.append(result.code)
    finally:
        alive = flipper.poll() is None
        (tmp_path / "stop").touch()
        flipper.wait(timeout=10)
    assert alive, f"the racer died: {flipper.returncode}"
    store = isolated_env / "snapshots"
    present = subprocess.run(["git", "--git-dir", str(store), "cat-file", "-e", secret_id], capture_output=True)
    assert present.returncode != 0, f"the root-only file reached the store (pull codes {codes})"
    assert 0 in codes or 3 in codes


def test_a_file_swapped_for_a_link_while_it_streams_is_never_followed(make_site_packages, write_config, ssh_node,
                                                                    tmp_path, isolated_env):
    """A 6 MiB file is swapped for a link to a root-only file while the node's agent (paused
    by its test hook after the first piece) streams it: the agent sees the file change and
    opens the path again, which is a link now; it is never followed. The pull fails naming
    the file or records what the path is; the root-only content never reaches the store."""
    big = f"{SRT}/lib/big.so"
    site = make_site_packages("ct200", files={f"{SRT}/a.py": "a = 1\n"})
    (site / big).parent.mkdir(parents=True)
    (site / big).write_bytes(os.urandom(6 << 20))
    os.utime(site / big, (time.time() - 60,) * 2)  # settled: streamed at once
    secret = tmp_path / "root-only"
    secret.mkdir(mode=0o700)
    secret_data = b"root's secret " + os.urandom(16).hex().encode() + b"\n"
    (secret / "big.so").write_bytes(secret_data)
    secret_id = hashlib.sha1(b"blob %d\0" % len(secret_data) + secret_data).hexdigest()
    hook = tmp_path / "hook"
    hook.mkdir()
    python = tmp_path / "python"  # the node's python, with the agent's streaming hook turned on
    python.write_text(f"#!/bin/sh\nSNAPVER_TEST_STREAMED_HOOK='{hook}' exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    write_config({"ct200": ssh_node("ct200", site, python=str(python))})
    pull = start("pull", "ct200")
    try:
        wait_for(lambda: (hook / "streamed-1").exists() or pull.poll() is not None, 60, "the big file to stream")
        os.rename(site / big, site / f"{big}.real")
        os.symlink(secret / "big.so", site / big)
        while pull.poll() is None:  # let every further read of it go on
            for started in hook.glob("streamed-*"):
                (hook / started.name.replace("streamed", "go")).touch()
            time.sleep(0.01)
        _, err = pull.communicate(timeout=60)
    finally:
        pull.kill()
        pull.wait()
    err_text = err.decode(errors="replace")
    assert pull.returncode in (0, 3) and "Traceback" not in err_text, err_text
    if pull.returncode == 3:
        assert big in err_text, err_text
    present = subprocess.run(["git", "--git-dir", str(isolated_env / "snapshots"), "cat-file", "-e", secret_id],
                             capture_output=True)
    assert present.returncode != 0, f"the root-only file reached the store: {err_text}"


@pytest.mark.parametrize("how", ["local", "ssh"])
def test_a_folder_swapped_for_a_link_after_listing_is_never_read(make_site_packages, local_node, ssh_node, tmp_path,
                                                                 how):
    """The same swap at the one moment that matters, made deterministic: listed as a folder,
    a link by the time it is read (or hashed for verify). The read fails that file, naming
    the link; the hash finds nothing; a new listing shows the link as a link."""
    site = make_site_packages("ct200", files={f"{SRT}/sub/x.py": "public = 1\n"})
    secret = tmp_path / "root-only"
    secret.mkdir(mode=0o700)
    (secret / "x.py").write_bytes(b"root's secret\n")
    table = local_node(site) if how == "local" else ssh_node("ct200", site)
    spec = parse_config({"nodes": {"n": table}}, tmp_path / ".snapver").nodes["n"]
    with open_transport(spec) as transport:
        assert {e.path for e in transport.list_tree().entries} == {f"{SRT}/sub/x.py"}
        os.rename(site / SRT / "sub", site / SRT / "sub.real")
        os.symlink(secret, site / SRT / "sub")
        with pytest.raises(TransportError, match="symlink"):
            list(transport.read_files([f"{SRT}/sub/x.py"]))
    with open_transport(spec) as transport:
        assert transport.hash_files([f"{SRT}/sub/x.py"]) == {f"{SRT}/sub/x.py": None}
        assert {(e.path, e.kind) for e in transport.list_tree().entries} == {
            (f"{SRT}/sub", "l"), (f"{SRT}/sub.real/x.py", "f")}


def test_rollback_undoes_only_its_push_and_never_a_later_change(make_site_packages, write_config, ssh_node,
                                                                 run_snapver, tmp_path):
    """Alice pushes p1 (a.py); Bob, from his own store, pushes p2 (b.py). Alice's rollback
    restores a.py only. After a hand edit of a file her push wrote, her rollback refuses
    (exit 1, the file named, nothing written) unless --force."""
    site = make_site_packages("ct200", files=BASE)
    for who in ("alice", "bob"):
        write_config({"ct200": ssh_node("ct200", site)}, where=tmp_path / who)
        assert run_in(run_snapver, tmp_path / who, "pull", "ct200").code == 0
    alice, bob = tmp_path / "alice", tmp_path / "bob"
    make_patch(run_snapver, "p1", {A: b"a = 'p1'\n", UTILS: b"x = 'p1'\n"}, cwd=alice)
    assert run_in(run_snapver, alice, "push", "p1", "ct200", "--yes").code == 0
    assert run_in(run_snapver, bob, "pull", "ct200").code == 0
    make_patch(run_snapver, "p2", {B: b"b = 'p2'\n"}, cwd=bob)
    assert run_in(run_snapver, bob, "push", "p2", "ct200", "--yes").code == 0

    result = run_in(run_snapver, alice, "rollback", "ct200", "--yes")
    assert result.code == 0, result
    assert (site / A).read_bytes() == BASE[A] and (site / UTILS).read_bytes() == BASE[UTILS]
    assert (site / B).read_bytes() == b"b = 'p2'\n"  # Bob's later push stays

    assert run_in(run_snapver, alice, "push", "p1", "ct200", "--yes").code == 0
    (site / A).write_bytes(b"a = 'hand edit'\n")
    refused = run_in(run_snapver, alice, "rollback", "ct200", "--yes")
    assert refused.code == 1, refused
    assert "rollback refused" in refused.err and A in refused.err, refused
    assert (site / A).read_bytes() == b"a = 'hand edit'\n" and (site / UTILS).read_bytes() == b"x = 'p1'\n"
    forced = run_in(run_snapver, alice, "rollback", "ct200", "--yes", "--force")
    assert forced.code == 0, forced
    assert (site / A).read_bytes() == BASE[A] and (site / UTILS).read_bytes() == BASE[UTILS]
    assert (site / B).read_bytes() == b"b = 'p2'\n"


def test_special_files_are_shown_and_rolled_back(make_site_packages, write_config, ssh_node, run_snapver,
                                                 isolated_env):
    """A .py replaced by a FIFO (a device, a socket): never opened, shown by diff and status,
    and rollback puts the regular file back."""
    site = make_site_packages("ct200", files=BASE)
    write_config({"ct200": ssh_node("ct200", site)})
    assert run_snapver("pull", "ct200", "--tag", "good").code == 0
    (site / A).unlink()
    os.mkfifo(site / A)
    os.mknod(site / f"{SRT}/dev", 0o600 | 0o020000, os.makedev(1, 3))
    quiet = run_snapver("diff", "-q", "ct200")
    assert quiet.code == 1, quiet
    names = run_snapver("diff", "--name-status", "ct200")
    assert names.code == 1 and f"T\t{A}" in names.out and f"A\t{SRT}/dev" in names.out, names
    status = run_snapver("status", "ct200")
    assert status.code == 1, status
    result = run_snapver("rollback", "ct200", "--to", "good", "--yes")
    assert result.code == 0, result
    assert (site / A).is_file() and (site / A).read_bytes() == BASE[A] and not (site / f"{SRT}/dev").exists()


# -- signals through a real terminal ---------------------------------------------------------

def in_terminal(*args: str, env: dict[str, str]) -> tuple[int, int]:
    """Start ``snapver ARGS`` as the foreground process of a new pseudo-terminal."""
    pid, master = pty.fork()
    if pid == 0:  # the child: session leader, the pty its controlling terminal
        os.execve(sys.executable, [sys.executable, "-m", "snapver", *args], env)
    return pid, master


def finish(pid: int, master: int, timeout: float) -> tuple[int, str]:
    """Read the terminal until the process ends; its exit code (128+N for a signal) and output."""
    output = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.05)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                chunk = b""
            output += chunk
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            os.close(master)
            code = os.waitstatus_to_exitcode(status)
            return (128 - code if code < 0 else code), output.decode("utf-8", "replace")
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"still running after {timeout} s: {output.decode('utf-8', 'replace')}")


@pytest.mark.parametrize("moment", ["while streaming", "after writing"])
def test_ctrl_c_in_a_push_ends_it_promptly_and_undoes_it(node, run_snapver, isolated_env, moment):
    """Ctrl-C early (the node has only staged files: nothing is committed) or late (the node
    is written: it is undone) ends the push with `snapver: interrupted`, exit 130, the store
    lock released and the outcome recorded — never a hang holding the lock."""
    make_patch(run_snapver, "two", {A: b"a = 2\n", B: b"b = 2\n", BIG: os.urandom(8 << 20)})
    hook = {"while streaming": {"SNAPVER_TEST_PAUSE_AFTER_FILES": "1"},
            "after writing": {"SNAPVER_TEST_PAUSE_AFTER_WRITE": "3600"}}[moment]
    pid, master = in_terminal("push", "two", "ct200", "--yes", env=env_for(hook))
    if moment == "while streaming":
        wait_for(lambda: leftovers(node), 60, "a staged file")
    else:
        wait_for(lambda: (node / B).read_bytes() == b"b = 2\n", 60, "the node to be written")
    time.sleep(0.2)
    os.write(master, b"\x03")
    began = time.monotonic()
    code, output = finish(pid, master, 30)
    took = time.monotonic() - began
    print(f"{moment}: Ctrl-C to exit {took:.3f} s")
    assert code == 130, output
    assert "snapver: interrupted" in output and "Traceback" not in output, output
    assert took < 5, took
    assert {p: (node / p).read_bytes() for p in BASE} == BASE and not (node / BIG).exists(), output
    wait_for(lambda: not leftovers(node), 10, "staged files removed")
    state = records(isolated_env / "snapshots", "ct200")[0]
    assert state["state"] == ("cancelled" if moment == "while streaming" else "rolled-back") and state["interrupted"]
    tagged = run_snapver("tag", "after-interrupt", "ct200")  # the store lock is free
    assert tagged.code == 0, tagged


def test_ctrl_c_and_sigterm_in_a_pull_end_it_promptly(sglang_site_template, make_site_packages, write_config,
                                                       ssh_node, run_snapver, isolated_env):
    """A first pull of the real tree, interrupted mid-stream: exit 130 (SIGINT, through the
    terminal) or 143 (SIGTERM) at once, nothing recorded, and the next pull succeeds."""
    site = make_site_packages("ct200", template=sglang_site_template)
    write_config({"ct200": ssh_node("ct200", site)})
    store = isolated_env / "snapshots"
    packs = store / "objects" / "pack"

    def temporary_packs() -> set[str]:
        return {p.name for p in packs.iterdir() if p.name.startswith("tmp_pack")} if packs.is_dir() else set()

    for how, expected in (("ctrl-c", 130), ("sigterm", 143)):
        # A temporary pack the interrupted pull before left is not this pull streaming: a
        # signal sent then lands before the process has its handlers (exit 143, no message).
        left = temporary_packs()
        pid, master = in_terminal("pull", "ct200", env=env_for())
        wait_for(lambda left=left: bool(temporary_packs() - left), 60, "the pull to stream")
        if how == "ctrl-c":
            os.write(master, b"\x03")
        else:
            os.kill(pid, signal.SIGTERM)
        began = time.monotonic()
        code, output = finish(pid, master, 30)
        took = time.monotonic() - began
        print(f"{how}: to exit {took:.3f} s")
        assert code == expected and "snapver: interrupted" in output, output
        assert took < 3, took
        assert git(store, "for-each-ref", "refs/heads/nodes/").strip() == b""
    assert run_snapver("pull", "ct200").code == 0
    shutil.rmtree(site)
