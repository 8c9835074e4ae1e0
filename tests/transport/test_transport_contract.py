"""One contract for every transport: each test runs over `local` (a subprocess) and `ssh` (the real sshd).

Every answer is checked against the live files read here with os/hashlib, never with snapver's code.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from snapver.config import parse_config
from snapver.errors import RemotePathError, TransportError
from snapver.model import DistInfo
from snapver.transport.agent import PARTS, assemble
from snapver.transport.base import StreamedFile, Transport
from snapver.transport.connect import open_transport
from snapver.transport.mux import spec_socket_path

SRT = "sglang/srt"
EMPTY_BLOB = "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"

# Raw names (bytes) a node may really have: spaces, quotes, newlines, controls, non-UTF-8, unicode.
ODD_NAMES = [
    b"sp ace.py", b'dq"uote.py', b"sq'uote.py", b"back\\slash.py", b"new\nline.py", b"tab\t.py",
    b"caf\xe9.py", b"\xff\xfe\xfd", "ünïcödé.py".encode(), "日本語/名前.py".encode(), b"-dash.py",
    b'"starts-with-quote', b" lead", b"trail ", b"ctrl\x01\x1f.py", b"dir with space/x.py",
]


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def raw(path: Path | str) -> bytes:
    return os.fsencode(path)


def write_raw(root: Path, relative: bytes, data: bytes = b"", mode: int | None = None) -> bytes:
    """Write ``root/relative`` with a bytes path (parents made); returns ``relative``."""
    full = os.path.join(raw(root), relative)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "wb") as handle:
        handle.write(data)
    if mode is not None:
        os.chmod(full, mode)
    return relative


def live_entries(site: Path) -> dict[bytes, tuple[str, int, int, str]]:
    """Every file/link below site/sglang/srt, minus the default excludes: raw path → (kind, st_mode, size, oid)."""
    found = {}
    top = os.path.join(raw(site), raw(SRT))
    for folder, dirnames, filenames in os.walk(top):
        dirnames[:] = [d for d in dirnames if d != b"__pycache__" and not os.path.islink(os.path.join(folder, d))]
        links = [d for d in os.listdir(folder) if os.path.islink(os.path.join(folder, d))]
        for name in set(filenames) | set(links):
            full = os.path.join(folder, name)
            info = os.lstat(full)
            rel = os.path.relpath(full, raw(site))
            if stat.S_ISLNK(info.st_mode):
                target = os.readlink(full)
                found[rel] = ("l", info.st_mode, len(target), blob_id(target))
            elif stat.S_ISREG(info.st_mode) and not name.endswith(b".pyc"):
                with open(full, "rb") as handle:
                    data = handle.read()
                found[rel] = ("f", info.st_mode, len(data), blob_id(data))
    return found


def listed(transport: Transport, **kwargs) -> dict[bytes, tuple[str, int, int, str]]:
    listing = transport.list_tree(**kwargs)
    return {raw(e.path): (e.kind, e.mode, e.size, e.oid) for e in listing.entries}


# --------------------------------------------------------------------------- the agent itself


def test_agent_is_stdlib_only_python_3_8() -> None:
    """What a node needs is its own Python: the agent must parse as 3.8 and import only the stdlib."""
    import ast

    source = assemble().decode()  # the one script that ships
    tree = ast.parse(source, feature_version=(3, 8))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and not node.level}
    assert imported and imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def test_the_assembled_agent_holds_every_part() -> None:
    """Each part's own names are the script's (no import between parts is left to fail on a
    node), defined in the order the parts run."""
    import ast
    import importlib

    namespace: dict[str, object] = {"__name__": "agent_under_test"}  # not "snapver_agent": that serves
    exec(compile(assemble(), "snapver-agent", "exec"), namespace)
    for part in PARTS:
        module = importlib.import_module(f"snapver.transport.agent.{part}")
        source = Path(module.__file__ or "").read_text()
        own = {node.name for node in ast.parse(source).body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
        assert own and own <= set(namespace), (part, own - set(namespace))
        for name in own:  # the same code as the part's
            assert getattr(namespace[name], "__qualname__", None) == getattr(module, name).__qualname__
    assert b"from ." not in assemble() and b"snapver.transport" not in assemble()


@pytest.mark.parametrize("python", [sys.executable, "/root/.pyenv/versions/3.8.18/bin/python3.8"])
def test_the_assembled_agent_runs_alone_in_a_bare_python(python: str) -> None:
    """The script, as it ships, run by a Python without site-packages (-S -I): it greets and serves."""
    if not os.access(python, os.X_OK):
        pytest.skip(f"no {python}")
    ping = json.dumps({"op": "ping"}).encode()
    request = struct.pack(">I", len(ping)) + ping + struct.pack(">I", 0)  # ping, then the end
    done = subprocess.run([python, "-S", "-I", "-c", assemble().decode()], input=request, capture_output=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    greeting = b"\x00snapver-agent/1\n"
    assert done.stdout[:len(greeting)] == greeting
    size = struct.unpack(">I", done.stdout[len(greeting):len(greeting) + 4])[0]
    assert json.loads(done.stdout[len(greeting) + 4:len(greeting) + 4 + size]) == {"pong": True}


# --------------------------------------------------------------------------- the two transports


@pytest.fixture(params=["local", "ssh", "mux"])
def transport_kind(request: pytest.FixtureRequest) -> str:
    return request.param


def mux_daemons(socket_path: Path) -> list[int]:
    """The pids of the mux daemons serving ``socket_path`` (found in /proc, not by snapver)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:  # gone, or not ours to read
            continue
        if b"snapver.transport.mux" in argv and os.fsencode(socket_path) in argv:
            pids.append(int(entry.name))
    return pids


@pytest.fixture
def connect(request: pytest.FixtureRequest, transport_kind: str, local_node, tmp_path: Path
            ) -> Iterator[Callable[..., Transport]]:
    """``connect(site_packages, open=True, **node_keys)`` → a Transport to that folder, closed at teardown.

    ``mux``: SSH through a persistent connection, its daemon this test's own (a key of its
    own names its socket), checked to have served and ended at teardown."""
    made: list[Transport] = []
    sockets: set[Path] = set()

    def make(site_packages: Path | str | None, open: bool = True, **extra) -> Transport:  # noqa: A002
        if transport_kind == "local":
            table = local_node(site_packages or "", **extra)
        elif transport_kind == "mux":
            key = tmp_path / "mux-key"
            if not key.exists():
                shutil.copy(request.getfixturevalue("sshd").identity_file, key)
                key.chmod(0o600)
            table = request.getfixturevalue("ssh_node")("ct200", site_packages or "", identity_file=str(key),
                                                        control_persist=30, **extra)
        else:
            table = request.getfixturevalue("ssh_node")("ct200", site_packages or "", **extra)
        if site_packages is None:
            del table["site_packages"]
        spec = parse_config({"nodes": {"n": table}}, tmp_path / ".snapver").nodes["n"]
        if transport_kind == "mux":
            sockets.add(spec_socket_path(spec))
        transport = open_transport(spec)
        made.append(transport)
        if open:
            transport.open()
        return transport

    yield make
    for transport in made:
        transport.close()
    for socket_path in sockets:
        daemons = mux_daemons(socket_path)
        for pid in daemons:
            os.kill(pid, signal.SIGTERM)
        assert daemons, "the mux daemon never served: the test ran over a direct connection"


# --------------------------------------------------------------------------- hello


def test_hello_reports_the_node(connect, make_site_packages) -> None:
    site = make_site_packages("n", files={
        f"{SRT}/__init__.py": "",
        "sglang-0.5.23.dist-info/METADATA": "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n\nbody\n",
        "numpy-2.0.0.dist-info/METADATA": "Name: numpy\nVersion: 2.0.0\n",
    })
    transport = connect(site)
    info = transport.info
    assert info is not None
    assert info.site_packages == str(site)
    assert info.hostname == socket.gethostname()
    assert re.fullmatch(r"3\.\d+\.\d+", info.python_version)
    assert info.dists == (DistInfo("sglang", "0.5.23", "sglang-0.5.23.dist-info"),)
    assert transport.ping() < 5


def test_site_packages_found_from_python(connect) -> None:
    purelib = subprocess.run([SYSTEM_PYTHON, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    transport = connect(None, python=SYSTEM_PYTHON)
    assert transport.info is not None
    assert transport.info.site_packages == purelib
    assert transport.info.python == SYSTEM_PYTHON or os.path.realpath(transport.info.python) == \
        os.path.realpath(SYSTEM_PYTHON)


# --------------------------------------------------------------------------- list


def test_list_keeps_odd_names_byte_for_byte(connect, make_site_packages) -> None:
    site = make_site_packages("n")
    for index, name in enumerate(ODD_NAMES):
        write_raw(site, raw(SRT) + b"/" + name, b"content %d " % index + name)
    got = listed(connect(site))
    assert set(got) == {raw(SRT) + b"/" + name for name in ODD_NAMES}
    assert got == live_entries(site)


def test_list_records_symlinks_without_following_them(connect, make_site_packages, tmp_path: Path) -> None:
    site = make_site_packages("n", files={f"{SRT}/real.py": "real\n", f"{SRT}/sub/inner.py": "inner\n"})
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.py").write_text("not tracked\n")
    links = {
        b"to_file": b"real.py", b"to_dir": b"sub", b"to_outside_dir": raw(outside), b"dangling": b"no/such",
        b"abs_etc": b"/etc", b"odd target": b"caf\xe9 \n\"x\"", b"loop": b"loop",
    }
    for name, target in links.items():
        os.symlink(target, os.path.join(raw(site), raw(SRT), name))
    got = listed(connect(site))
    for name, target in links.items():
        assert got[raw(SRT) + b"/" + name] == ("l", os.lstat(os.path.join(raw(site), raw(SRT), name)).st_mode,
                                               len(target), blob_id(target))
    assert not any(path.startswith((raw(SRT) + b"/to_dir/", raw(SRT) + b"/to_outside_dir/")) for path in got)
    assert got == live_entries(site)
    listing = connect(site).list_tree()
    assert {e.path: e.target for e in listing.entries if e.kind == "l"} == {
        f"{SRT}/{os.fsdecode(name)}": os.fsdecode(target) for name, target in links.items()}


def test_list_keeps_modes_and_empty_files(connect, make_site_packages) -> None:
    site = make_site_packages("n")
    modes = {b"exec.sh": 0o755, b"private.py": 0o600, b"group.py": 0o640, b"readonly.py": 0o444,
             b"setuid": 0o4755, b"sticky_exec": 0o1777}
    for name, mode in modes.items():
        write_raw(site, raw(SRT) + b"/" + name, b"x", mode)
    write_raw(site, raw(SRT) + b"/empty.py")
    write_raw(site, raw(SRT) + b"/deep/er/empty")
    os.makedirs(os.path.join(raw(site), raw(SRT), b"empty_dir", b"nested"))
    got = listed(connect(site))
    for name, mode in modes.items():
        assert got[raw(SRT) + b"/" + name][1] == stat.S_IFREG | mode
    for name in (b"empty.py", b"deep/er/empty"):
        assert got[raw(SRT) + b"/" + name] == ("f", stat.S_IFREG | 0o644, 0, EMPTY_BLOB)
    assert not any(b"empty_dir" in path for path in got)
    assert got == live_entries(site)


def test_list_shows_fifos_sockets_and_devices_as_special_without_opening_them(connect, make_site_packages,
                                                                              monkeypatch) -> None:
    """A FIFO (opening it to read would block forever), a socket and a device are listed as
    what they are ("s", a line that says so), never opened; a read sends that line."""
    site = make_site_packages("n", files={f"{SRT}/a.py": "a"})
    os.mkfifo(site / SRT / "pipe")
    os.mknod(site / SRT / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # the tests run as root
    with socket.socket(socket.AF_UNIX) as server:
        # Bound by a relative name: a socket's path is limited to 107 bytes, and pytest's
        # folders under parallel workers are longer.
        monkeypatch.chdir(site / SRT)
        server.bind("sock")
        monkeypatch.undo()
        transport = connect(site)
        rows = listed(transport)
    special = {b"pipe": b"fifo", b"sock": b"socket", b"null": b"character device 1,3"}
    assert set(rows) == {f"{SRT}/{name}".encode() for name in ("a.py", "pipe", "sock", "null")}
    for name, what in special.items():
        line = b"snapver: special file: " + what + b"\n"
        kind, mode, size, oid = rows[f"{SRT}/".encode() + name]
        assert kind == "s" and not stat.S_ISREG(mode) and size == len(line)
        assert oid == hashlib.sha1(b"blob %d\0" % len(line) + line).hexdigest()
    read = {raw(path): (kind, data) for path, kind, data in transport.read_files([f"{SRT}/pipe", f"{SRT}/null"])}
    assert read == {f"{SRT}/pipe".encode(): ("s", b"snapver: special file: fifo\n"),
                    f"{SRT}/null".encode(): ("s", b"snapver: special file: character device 1,3\n")}


def test_list_excludes(connect, make_site_packages) -> None:
    files = [
        "keep.py", "pyc.py", "x.pyc.txt", "__pycache__.py", "drop.pyc", "__pycache__/m.cpython-311.pyc",
        "__pycache__/odd.txt", "a/__pycache__/deep.py", "lib.so", "tests/t.py", "a/tests/t.py", "tests.py",
        "gen/one.py", "gen/sub/two.py", "top.txt", "a/top.txt",
    ]
    site = make_site_packages("n", files={f"{SRT}/{name}": name for name in files})
    default = {os.fsdecode(path)[len(SRT) + 1:] for path in listed(connect(site))}
    assert default == set(files) - {"drop.pyc", "__pycache__/m.cpython-311.pyc", "__pycache__/odd.txt",
                                    "a/__pycache__/deep.py"}
    custom = connect(site, exclude=["*.so", "tests/", f"{SRT}/gen/*", f"/{SRT}/top.txt"])
    kept = {os.fsdecode(path)[len(SRT) + 1:] for path in listed(custom)}
    assert kept == set(files) - {"lib.so", "tests/t.py", "a/tests/t.py", "gen/one.py", "gen/sub/two.py",
                                 "top.txt"}


def test_list_never_tracks_git_metadata(connect, make_site_packages) -> None:
    """A `.git` inside the tree (a hand-made repo on the node) cannot live in a git tree: never listed."""
    site = make_site_packages("n", files={f"{SRT}/a.py": "a", f"{SRT}/.git/config": "[core]\n",
                                          f"{SRT}/.GIT/HEAD": "ref", f"{SRT}/sub/.git": "gitdir: ../x\n",
                                          f"{SRT}/sub/.gitignore": "*.pyc\n", f"{SRT}/.github/x.yml": "y"})
    assert set(listed(connect(site))) == {f"{SRT}/{name}".encode() for name in ("a.py", "sub/.gitignore",
                                                                               ".github/x.yml")}


def test_odd_site_packages_and_python_paths(connect, tmp_path: Path) -> None:
    folder = tmp_path / "we \"ird' $HOME `x` \n ü"
    site = folder / "site-packages"
    (site / SRT).mkdir(parents=True)
    (site / SRT / "a.py").write_text("a")
    python = folder / "bin dir" / "py thon"
    python.parent.mkdir()
    python.symlink_to(SYSTEM_PYTHON)
    transport = connect(site, python=str(python))
    assert transport.info is not None and transport.info.site_packages == str(site)
    assert set(listed(transport)) == {f"{SRT}/a.py".encode()}


def test_list_several_tracked_paths(connect, make_site_packages) -> None:
    site = make_site_packages("n", files={f"{SRT}/a.py": "a", "sglang/lang/b.py": "b", "sglang/other/c.py": "c"})
    got = listed(connect(site, paths=[SRT, "sglang/lang"]))
    assert set(got) == {b"sglang/srt/a.py", b"sglang/lang/b.py"}


def test_listing_against_a_cache_sends_only_what_differs(connect, make_site_packages) -> None:
    """With a cache the node sends only rows that differ from it; the listing the client
    rebuilds equals a full listing, whatever changed: edits, new, gone, file to link."""
    site = make_site_packages("n", files={f"{SRT}/{i}.py": f"file {i}\n" for i in range(200)})
    transport = connect(site)
    first = transport.list_tree()
    later = first.now_ns + 10 * 10**9
    before = transport.bytes_received
    unchanged = transport.list_tree(first.by_path(), later)
    delta_bytes = transport.bytes_received - before
    assert unchanged.by_path() == first.by_path() and unchanged.hashed == 0
    before = transport.bytes_received
    transport.list_tree()
    assert delta_bytes * 20 < transport.bytes_received - before  # 200 rows vs none

    (site / SRT / "1.py").write_text("FILE 1\n")  # same size
    (site / SRT / "2.py").unlink()
    (site / SRT / "3.py").unlink()
    os.symlink("4.py", site / SRT / "3.py")
    (site / SRT / "new.py").write_text("new\n")
    (site / SRT / "__pycache__").mkdir()
    (site / SRT / "__pycache__" / "x.pyc").write_text("excluded")
    rebuilt = transport.list_tree(first.by_path(), later)
    full = transport.list_tree()
    assert rebuilt.by_path() == full.by_path()
    assert {e.path for e in rebuilt.entries} == {e.path for e in first.entries} - {f"{SRT}/2.py"} | {f"{SRT}/new.py"}
    assert rebuilt.by_path()[f"{SRT}/3.py"].kind == "l"
    assert rebuilt.hashed == 2  # 1.py and new.py


def test_big_listings_and_caches_travel_compressed(connect, make_site_packages) -> None:
    """A listing of 1,500 files (and the cache sent back for a re-listing) is JSON of
    ~100 kB each; on the wire both are compressed, and the listing is still exact."""
    files = {f"{SRT}/layers/quantization/kernels/module_{i:04d}.py": f"value = {i}\n" for i in range(1500)}
    site = make_site_packages("n", files=files)
    transport = connect(site)
    received = transport.bytes_received
    first = transport.list_tree()
    listing_wire = transport.bytes_received - received
    assert {e.path: e.oid for e in first.entries} == {p: blob_id(d.encode()) for p, d in files.items()}
    rows = [[e.path, e.kind, e.mode, e.size, e.mtime_ns, e.ctime_ns, e.ino, e.oid, e.target] for e in first.entries]
    listing_json = len(json.dumps({"now_ns": first.now_ns, "entries": rows, "hashed": 1500}, separators=(",", ":")))
    assert listing_wire * 3 < listing_json, (listing_wire, listing_json)

    cache = first.by_path()
    cache_json = len(json.dumps({path: list(entry.stat_key) for path, entry in cache.items()}, separators=(",", ":")))
    sent = transport.bytes_sent
    again = transport.list_tree(cache, first.now_ns + 10 * 10**9)
    assert (transport.bytes_sent - sent) * 3 < cache_json, (transport.bytes_sent - sent, cache_json)
    assert again.by_path() == cache and again.hashed == 0


def test_stat_cache_skips_hashing_but_catches_same_size_same_mtime_changes(connect, make_site_packages) -> None:
    site = make_site_packages("n", files={f"{SRT}/{i}.py": f"file {i}\n" for i in range(20)})
    transport = connect(site)
    first = transport.list_tree()
    assert first.hashed == 20
    # A cache made "long after" the files last changed is trusted for every unchanged stat.
    later = first.now_ns + 10 * 10**9
    again = transport.list_tree(first.by_path(), later)
    assert again.hashed == 0
    assert [(e.path, e.oid) for e in again.entries] == [(e.path, e.oid) for e in first.entries]

    target = site / SRT / "3.py"
    before = os.stat(target)
    target.write_text("FILE 3\n")  # same size
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (os.stat(target).st_size, os.stat(target).st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    replaced = site / SRT / "4.py"
    before = os.stat(replaced)
    (site / SRT / "4.new").write_text("FILE 4\n")
    os.utime(site / SRT / "4.new", ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(site / SRT / "4.new", replaced)  # new inode, same size and mtime

    changed = transport.list_tree(first.by_path(), later)
    assert changed.hashed == 2
    oids = {e.path: e.oid for e in changed.entries}
    assert oids[f"{SRT}/3.py"] == blob_id(b"FILE 3\n")
    assert oids[f"{SRT}/4.py"] == blob_id(b"FILE 4\n")
    # A cache from the moment the files were written cannot be trusted (git's racy-clean rule).
    assert transport.list_tree(changed.by_path(), changed.now_ns).hashed == 20


# --------------------------------------------------------------------------- read_files and hash_files


@pytest.mark.parametrize("compress_level", [0, 1])
def test_read_files_streams_exact_content_in_order(connect, make_site_packages, compress_level: int) -> None:
    big = os.urandom(3 << 20)  # several frames
    huge = os.urandom((5 << 20) + 3)  # above the agent's BIG_FILE: streamed in pieces
    site = make_site_packages("n")
    paths = [write_raw(site, raw(SRT) + b"/" + name, b"odd " + name) for name in ODD_NAMES[:8]]
    paths += [write_raw(site, raw(SRT) + b"/big.bin", big), write_raw(site, raw(SRT) + b"/empty.py")]
    paths += [write_raw(site, raw(SRT) + b"/huge.so", huge)]
    os.symlink(b"big.bin", os.path.join(raw(site), raw(SRT), b"link"))
    paths += [raw(SRT) + b"/link", raw(SRT) + b"/vanished.py", raw(SRT) + b"/no/such/dir.py"]
    wanted = [os.fsdecode(path) for path in reversed(paths)]
    transport = connect(site)
    got = list(transport.read_files(wanted, compress_level=compress_level))
    assert [path for path, _, _ in got] == wanted
    for path, kind, data in got:
        full = os.path.join(raw(site), raw(path))
        if not os.path.lexists(full):
            assert (kind, data) == (None, b"")
        elif os.path.islink(full):
            assert (kind, data) == ("l", os.readlink(full))
        else:
            with open(full, "rb") as handle:
                assert (kind, data) == ("f", handle.read())
    assert transport.bytes_received >= (len(big) if compress_level == 0 else 0)
    assert transport.ping() < 5  # the channel is in step after the stream
    # stream_files: the same, a large file in pieces (none of them more than a MiB).
    streamed = []
    for path, kind, data in transport.stream_files(wanted, compress_level=compress_level):
        if isinstance(data, StreamedFile):
            pieces = [bytes(piece) for piece in data]
            assert len(pieces) > 1 and max(map(len, pieces)) <= 1 << 20 and data.size == len(huge)
            data = b"".join(pieces)
        streamed.append((path, kind, data))
    assert streamed == got
    assert len(transport.list_tree().entries) == len(paths) - 2


def test_hello_listing_and_listed_files_in_one_go(connect, make_site_packages) -> None:
    """A first pull sends hello, list and "read what you listed" before any reply comes back."""
    site = make_site_packages("n")
    paths = [write_raw(site, raw(SRT) + b"/" + name, b"odd " + name) for name in ODD_NAMES[:6]]
    os.symlink(b"nowhere", os.path.join(raw(site), raw(SRT), b"link"))
    write_raw(site, raw(SRT) + b"/__pycache__/x.cpython-311.pyc", b"excluded")
    transport = connect(site, open=False).start()
    listing = transport.request_listing(want_oids=False)
    files = transport.request_listed_files(compress_level=1)
    entries = listing().entries
    assert transport.info is not None and transport.info.site_packages == str(site)
    assert sorted(e.path for e in entries) == sorted([os.fsdecode(p) for p in paths] + [f"{SRT}/link"])
    got = list(files([e.path for e in entries]))
    assert [path for path, _, _ in got] == [e.path for e in entries]  # the listing's order
    for path, kind, data in got:
        full = os.path.join(raw(site), raw(path))
        expected = ("l", os.readlink(full)) if os.path.islink(full) else ("f", open(full, "rb").read())
        assert (kind, data) == expected
    assert transport.ping() < 5  # in step afterwards


def test_abandoned_stream_ends_the_agent_cleanly(connect, make_site_packages) -> None:
    site = make_site_packages("n", files={f"{SRT}/{i}.py": os.urandom(1 << 20) for i in range(4)})
    transport = connect(site)
    stream = transport.read_files([f"{SRT}/{i}.py" for i in range(4)])
    next(stream)
    stream.close()
    with pytest.raises(TransportError):
        transport.ping()


def test_hash_files(connect, make_site_packages) -> None:
    site = make_site_packages("n", files={f"{SRT}/a.py": "a\n", f"{SRT}/sub/b.py": b"\x00\xff"})
    os.symlink("a.py", site / SRT / "link")
    odd = write_raw(site, raw(SRT) + b"/caf\xe9 \n.py", b"odd")
    paths = [f"{SRT}/a.py", f"{SRT}/sub/b.py", f"{SRT}/link", os.fsdecode(odd), f"{SRT}/missing.py", f"{SRT}/sub"]
    transport = connect(site)
    for algo in ("sha256", "md5"):
        hashes = transport.hash_files(paths, algo)
        assert hashes == {
            f"{SRT}/a.py": hashlib.new(algo, b"a\n").hexdigest(),
            f"{SRT}/sub/b.py": hashlib.new(algo, b"\x00\xff").hexdigest(),
            f"{SRT}/link": hashlib.new(algo, b"a.py").hexdigest(),
            os.fsdecode(odd): hashlib.new(algo, b"odd").hexdigest(),
            f"{SRT}/missing.py": None,
            f"{SRT}/sub": None,
        }


def test_nothing_is_written_on_the_node(connect, make_site_packages) -> None:
    site = make_site_packages("n", files={f"{SRT}/a.py": "import os\n", f"{SRT}/sub/b.py": "b"})
    before = sorted((p, p.lstat().st_mtime_ns) for p in site.rglob("*"))
    transport = connect(site)
    transport.list_tree()
    list(transport.read_files([f"{SRT}/a.py", f"{SRT}/sub/b.py"]))
    transport.hash_files([f"{SRT}/a.py"])
    transport.close()
    assert sorted((p, p.lstat().st_mtime_ns) for p in site.rglob("*")) == before


# --------------------------------------------------------------------------- remote path errors


def test_missing_site_packages_names_the_path(connect, tmp_path: Path) -> None:
    missing = tmp_path / "no" / "site-packages"
    with pytest.raises(RemotePathError) as caught:
        connect(missing)
    assert str(missing) in caught.value.message
    assert caught.value.exit_code == 3


def test_missing_tracked_path_names_the_path(connect, make_site_packages) -> None:
    site = make_site_packages("n", files={"sglang/__init__.py": ""})
    transport = connect(site)
    with pytest.raises(RemotePathError) as caught:
        transport.list_tree()
    assert str(site / SRT) in caught.value.message
    assert transport.ping() < 5  # a refused request leaves the agent usable


def test_tracked_path_through_a_symlink_is_refused(connect, make_site_packages, tmp_path: Path) -> None:
    elsewhere = make_site_packages("elsewhere", files={f"{SRT}/a.py": "a"})
    site = make_site_packages("n")
    os.symlink(elsewhere / "sglang", site / "sglang")
    with pytest.raises(RemotePathError) as caught:
        connect(site).list_tree()
    assert str(site / "sglang") in caught.value.message


@pytest.fixture
def unprivileged(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A world-readable scratch folder and a `python` that runs the agent as nobody.

    Tests run as root, which no permission stops; the node's python is then a wrapper
    that drops to uid 65534, as a deployment under a service account would be.
    """
    if not shutil.which("setpriv") or os.geteuid() != 0:
        pytest.fail("needs root and setpriv (util-linux) to run the agent as nobody")
    folder = Path(tempfile.mkdtemp(prefix="snapver-perm-", dir="/tmp"))
    folder.chmod(0o755)
    wrapper = tmp_path / "python-as-nobody"
    wrapper.write_text(f"#!/bin/sh\nexec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups "
                       f"{SYSTEM_PYTHON} \"$@\"\n")
    wrapper.chmod(0o755)
    try:
        yield folder, str(wrapper)
    finally:
        shutil.rmtree(folder)


def test_permission_denied_names_the_path(connect, unprivileged) -> None:
    folder, python = unprivileged
    site = folder / "site-packages"
    srt = site / SRT
    (srt / "ok").mkdir(parents=True)
    (srt / "ok" / "a.py").write_text("a")
    for path in (site, site / "sglang", srt, srt / "ok"):
        path.chmod(0o755)
    (srt / "ok" / "a.py").chmod(0o644)
    assert len(connect(site, python=python).list_tree().entries) == 1  # nobody reads what it may

    (srt / "locked").mkdir(mode=0o700)
    with pytest.raises(RemotePathError) as caught:
        connect(site, python=python).list_tree()
    assert str(srt / "locked") in caught.value.message and "permission denied" in caught.value.message
    (srt / "locked").rmdir()

    (srt / "secret.py").write_text("s")
    (srt / "secret.py").chmod(0o600)
    with pytest.raises(RemotePathError) as caught:
        connect(site, python=python).list_tree()
    assert str(srt / "secret.py") in caught.value.message and "permission denied" in caught.value.message
    (srt / "secret.py").unlink()

    site.chmod(0o700)
    with pytest.raises(RemotePathError) as caught:
        connect(site, python=python)
    assert str(site) in caught.value.message and caught.value.exit_code == 3


def test_dead_agent_is_a_transport_error(connect, tmp_path: Path) -> None:
    broken = tmp_path / "broken-python"
    broken.write_text("#!/bin/sh\necho 'python: cannot start: out of luck' >&2\nexit 1\n")
    broken.chmod(0o755)
    with pytest.raises(TransportError) as caught:
        connect(tmp_path, python=str(broken))
    assert "out of luck" in caught.value.message


OLDEST_PYTHON = Path("/root/.pyenv/versions/3.8.18/bin/python3.8")


def test_agent_runs_on_python_3_8(connect, make_site_packages) -> None:
    """The oldest Python the agent promises to support, as a node's interpreter."""
    if not os.access(OLDEST_PYTHON, os.X_OK):
        pytest.skip(f"no Python 3.8 at {OLDEST_PYTHON}")
    site = make_site_packages("n")
    for index, name in enumerate(ODD_NAMES):
        write_raw(site, raw(SRT) + b"/" + name, b"%d" % index)
    os.symlink("x", site / SRT / "link")
    transport = connect(site, python=str(OLDEST_PYTHON))
    assert transport.info is not None and transport.info.python_version.startswith("3.8.")
    assert listed(transport) == live_entries(site)
    path = os.fsdecode(raw(SRT) + b"/" + ODD_NAMES[6])
    assert list(transport.read_files([path], compress_level=1)) == [(path, "f", b"6")]
    assert transport.hash_files([path]) == {path: hashlib.sha256(b"6").hexdigest()}
