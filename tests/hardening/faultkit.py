"""Tools to make faults for real and to check the store afterwards, without snapver's code.

- ``start_snapver`` runs the CLI as a subprocess that a test can kill;
- ``wait_for`` polls a condition (the store's pack folder filling, a process appearing);
- ``new_session_pids`` finds the ``sshd: root@notty`` processes serving a connection;
- ``CuttingProxy`` is a TCP relay on loopback that resets both sides after N bytes;
- ``hostile_python`` writes a node-side ``python`` that runs a tampered agent;
- ``assert_store_sound`` is what must hold after every fault: git and snapver fsck clean,
  no snapshot half-made, nothing left locked.
"""

from __future__ import annotations

import hashlib
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from helpers import Result

REPO_ROOT = Path(__file__).resolve().parents[2]
NODE_REF = "refs/heads/nodes/"


def snapver_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def start_snapver(*args: str, env: dict[str, str] | None = None, **popen: object) -> subprocess.Popen[bytes]:
    """``python -m snapver ARGS`` in the background (stdout/stderr piped)."""
    return subprocess.Popen([sys.executable, "-m", "snapver", *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=snapver_env(env), **popen)


def run_process(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> Result:
    """``python -m snapver ARGS`` to completion, in a process of its own."""
    from helpers import Result

    done = subprocess.run([sys.executable, "-m", "snapver", *args], stdin=subprocess.DEVNULL, capture_output=True,
                          env=snapver_env(env), timeout=timeout)
    return Result(done.returncode, done.stdout.decode("utf-8", "surrogateescape"),
                  done.stderr.decode("utf-8", "surrogateescape"))


def wait_for(condition: Callable[[], object], timeout: float, what: str, interval: float = 0.005) -> object:
    """Poll ``condition`` until it returns something true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def git(store: Path, *args: str, input: bytes | None = None, check: bool = True) -> bytes:  # noqa: A002
    done = subprocess.run(["git", "--git-dir", str(store), *args], input=input, capture_output=True)
    if check and done.returncode != 0:
        raise AssertionError(f"git {' '.join(args)}: {done.stderr.decode(errors='replace')}")
    return done.stdout


def all_refs(store: Path) -> dict[str, str]:
    """Every ref of the store (``{name: oid}``); {} when there is no store yet."""
    if not (store / "HEAD").exists():
        return {}
    out = git(store, "for-each-ref", "--format=%(refname) %(objectname)").decode()
    return dict(line.split(" ", 1) for line in out.splitlines())


def pack_bytes(store: Path) -> int:
    """Bytes written in the store's pack folder so far (finished and temporary packs)."""
    folder = store / "objects" / "pack"
    total = 0
    try:
        for entry in os.scandir(folder):
            try:
                total += entry.stat().st_size
            except FileNotFoundError:
                pass
    except FileNotFoundError:
        return 0
    return total


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def live_blob_ids(site: Path, tracked: str = "sglang/srt") -> dict[str, str]:
    """``{path: git blob id}`` of the live files and links (``__pycache__``/``*.pyc`` left out)."""
    root = os.fsencode(site)
    found = {}
    for folder, dirs, files in os.walk(os.path.join(root, os.fsencode(tracked))):
        dirs[:] = [d for d in dirs if d != b"__pycache__" and not os.path.islink(os.path.join(folder, d))]
        names = files + [d for d in os.listdir(folder) if os.path.islink(os.path.join(folder, d))
                         and d not in files]
        for name in names:
            if name.endswith(b".pyc"):
                continue
            full = os.path.join(folder, name)
            if os.path.islink(full):
                data = os.readlink(full)
            else:
                with open(full, "rb") as handle:
                    data = handle.read()
            found[os.fsdecode(os.path.relpath(full, root))] = blob_id(data)
    return found


def snapshot_blob_ids(store: Path, rev: str) -> dict[str, str]:
    """``{path: blob id}`` of a snapshot's tree, read with git (manifest left out)."""
    out = git(store, "ls-tree", "-r", "-z", "--full-tree", rev)
    found = {}
    for record in out.split(b"\0"):
        if record:
            meta, _, path = record.partition(b"\t")
            found[os.fsdecode(path)] = meta.split()[2].decode()
    found.pop(".snapver/manifest", None)
    found.pop(".snapver/record", None)
    found.pop(".snapver/env", None)
    return found


def assert_store_sound(store: Path, run_snapver: Callable[..., object], refs_before: dict[str, str]) -> None:
    """After a fault: refs exactly as before (no partial snapshot), git fsck and snapver fsck
    clean, and the lock free (fsck would not tell; a zero-wait lock attempt does)."""
    assert all_refs(store) == refs_before, "a ref moved although the command failed"
    if (store / "HEAD").exists():
        check = subprocess.run(["git", "--git-dir", str(store), "fsck", "--full", "--no-dangling"],
                               capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
    result = run_snapver("fsck")
    assert result.code == 0, str(result)
    assert "Traceback" not in result.err


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def sshd_session_pids(sshd_dir: Path) -> set[int]:
    """The ``sshd: root@notty`` processes below the test sshd (one per open session)."""
    servers = []
    for pid_file in sshd_dir.glob("sshd.*.pid"):
        servers.append(int(pid_file.read_text().split()[0]))
    return {pid for server in servers for pid in descendants(server) if cmdline(pid).startswith("sshd: root@notty")}


def sshd_sessions_on(sshd_dir: Path, address: str) -> set[int]:
    """The ``sshd: root@notty`` sessions whose TCP connection came in on ``address`` (one
    node's, as each node has its own loopback address): matched through the socket inodes
    in ``/proc/PID/fd`` and the local addresses in ``/proc/net/tcp``."""
    local = {}
    with open("/proc/net/tcp") as handle:
        for row in list(handle)[1:]:
            fields = row.split()
            local[fields[9]] = socket.inet_ntoa(struct.pack("<I", int(fields[1].split(":")[0], 16)))
    found = set()
    for pid in sshd_session_pids(sshd_dir):
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        if any(local.get(link[len("socket:["):-1]) == address for link in links if link.startswith("socket:[")):
            found.add(pid)
    return found


def io_bytes(pid: int, field: str) -> int:
    """``rchar``/``wchar`` of a process (/proc/PID/io): bytes it has read/written, sockets included."""
    try:
        with open(f"/proc/{pid}/io") as handle:
            for line in handle:
                name, _, value = line.partition(":")
                if name == field:
                    return int(value)
    except OSError:
        pass
    return 0


def kill_sessions_once(sshd_dir: Path, existing: set[int], field: str, threshold: int) -> set[int]:
    """SIGKILL the new sshd sessions once one has moved ``threshold`` bytes (``field``); the
    set killed, or an empty set if none has yet. Counting at the server means data is
    really still in flight: a client can hold megabytes it has received but not yet used."""
    sessions = sshd_session_pids(sshd_dir) - existing
    if not any(io_bytes(pid, field) >= threshold for pid in sessions):
        return set()
    for pid in sessions:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return sessions


class CuttingProxy:
    """A TCP relay ``listen_address:port`` → ``target``; once ``cut_after`` bytes have flowed
    from the target to the client (``upload``: from the client to the target) it resets
    both connections (SO_LINGER 0: an RST, as a dropped link or a killed middlebox would).
    Connections made after the cut are relayed, unless ``stay_down``: then they are reset
    as soon as they are accepted. ``silent``: the cut drops nothing, the relay just stops
    (packets lost in a partition: no RST, no FIN ever arrives).

    One thread per connection relays both directions (select), so the thread that cuts
    is the only one holding the sockets: their close really sends the RST.
    """

    def __init__(self, listen_address: str, target: tuple[str, int], cut_after: int | None,
                 upload: bool = False, stay_down: bool = False, silent: bool = False) -> None:
        self.target = target
        self.cut_after = cut_after
        self.upload = upload
        self.stay_down = stay_down
        self.silent = silent  # at the cut, stop relaying but close nothing: a silent partition
        self.relayed = 0
        self.cut = threading.Event()
        self._closing = threading.Event()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((listen_address, 0))
        self._listener.listen(8)
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.stay_down and self.cut.is_set():
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._relay, args=(client, upstream, not self.cut.is_set()), daemon=True).start()

    def _relay(self, client: socket.socket, upstream: socket.socket, may_cut: bool) -> None:
        peer = {client: upstream, upstream: client}
        try:
            while not self._closing.is_set():
                ready, _, _ = select.select([client, upstream], [], [], 0.05)
                for source in ready:
                    data = source.recv(1 << 16)
                    if not data:
                        return
                    peer[source].sendall(data)
                    counted = client if self.upload else upstream
                    if source is counted and may_cut and self.cut_after is not None:
                        self.relayed += len(data)
                        if self.relayed >= self.cut_after:
                            self.cut.set()
                            if self.silent:
                                self._closing.wait()
                                return
                            for sock in (client, upstream):
                                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                            return
        except OSError:
            pass
        finally:
            client.close()
            upstream.close()

    def close(self) -> None:
        self._closing.set()
        self._listener.close()


AGENT_WRAPPER = '''#!{python}
"""A compromised node's python: runs the agent snapver sends, with {payload} spliced in."""
import re, sys, zlib
code = sys.argv[sys.argv.index("-c") + 1]
source = sys.stdin.buffer.read(int(re.search(r"read\\((\\d+)\\)", code).group(1)))
bytecode = re.search(r"b=i\\.read\\((\\d+)\\)", code)  # the agent as bytecode, after its source: not used here
sys.stdin.buffer.read(int(bytecode.group(1)) if bytecode else 0)
source = (zlib.decompress(source) if "zlib.decompress" in code else source).decode()
with open({payload!r}) as handle:
    payload = handle.read()
marker = '\\nif __name__ == "__main__"'
assert marker in source
source = source.replace(marker, "\\n" + payload + marker)
exec(compile(source, "snapver-agent", "exec"), {{"__name__": "__main__"}})
'''


def hostile_python(folder: Path, payload: str) -> Path:
    """A node-side ``python`` (point the node's ``python`` key at it) that runs the agent
    it is sent with ``payload`` added just before the agent starts serving: the payload can
    replace entries of the agent's ``OPS`` table to send whatever replies it likes."""
    folder.mkdir(parents=True, exist_ok=True)
    payload_file = folder / "payload.py"
    payload_file.write_text(payload)
    wrapper = folder / "python"
    wrapper.write_text(AGENT_WRAPPER.format(python=sys.executable, payload=str(payload_file)))
    wrapper.chmod(0o755)
    return wrapper


def cli(*args: str, env: dict[str, str] | None = None, **_ignored: object) -> Result:
    """Run the snapver CLI in this process (``snapver.cli.main``): the same parsing, error
    mapping and exit codes as the command, without a second of interpreter start-up."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from helpers import Result

    from snapver.cli import main

    out, err = io.BytesIO(), io.BytesIO()
    text_out = io.TextIOWrapper(out, encoding="utf-8", errors="surrogateescape", write_through=True)
    text_err = io.TextIOWrapper(err, encoding="utf-8", errors="surrogateescape", write_through=True)
    saved = {key: os.environ.get(key) for key in (env or {})}
    os.environ.update(env or {})
    try:
        with redirect_stdout(text_out), redirect_stderr(text_err):
            try:
                main(list(args))
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return Result(code, out.getvalue().decode("utf-8", "surrogateescape"),
                  err.getvalue().decode("utf-8", "surrogateescape"))


def loosen_objects(store: Path) -> None:
    """Unpack every pack into loose objects (git refuses to unpack objects it has: each pack
    is moved aside first), so that a test can damage one object file."""
    for pack in list((store / "objects" / "pack").glob("pack-*.pack")):
        moved = pack.with_name("moved.pack")
        pack.rename(moved)
        pack.with_suffix(".idx").unlink()
        git(store, "unpack-objects", "-q", input=moved.read_bytes())
        moved.unlink()
