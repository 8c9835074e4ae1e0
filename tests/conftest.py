"""Shared fixtures: an isolated environment per test, a real sshd, a real sglang tree.

Fixture names and signatures are a contract used by every test module:

    isolated_env          autouse; fresh HOME and cwd, no GIT_*/SNAPVER_*/SSH_AUTH_SOCK
    sshd                  session; a real OpenSSH server on 127.0.0.200, .129, .10-.25
    sglang_site_template  session; the sglang 0.5.23 wheel unpacked (read-only by contract)
    make_site_packages    make_site_packages(name, template=None, files=None) -> Path
    write_config          write_config(nodes, groups=None, defaults=None, store="snapshots", where=None) -> Path
    ssh_node              ssh_node(name, site_packages, **extra) -> dict
    local_node            local_node(site_packages, **extra) -> dict
    run_snapver           run_snapver(*args, cwd=None, input=None, env=None, timeout=120) -> Result

Helpers that check results independently (tree_hashes, git_ls_tree, git_blob) live
in ``tests/helpers.py``; import them with ``from helpers import ...``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

# Make ``from helpers import ...`` work whatever pytest's import mode or package layout.
TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

from helpers import Result, Sshd, toml_dumps  # noqa: E402
from helpers import local_node as _local_node  # noqa: E402

REPO_ROOT = TESTS_DIR.parent
# Every Python the tests start (a snapver command, the persistent-connection daemon, the
# background compaction) runs this working tree, not whatever snapver the interpreter has installed.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
FIXTURES_DIR = REPO_ROOT.parent / "shared" / "fixtures"
SSHD_BINARY = "/usr/sbin/sshd"

NODE_ADDRESSES: dict[str, str] = {
    "ct200": "127.0.0.200",
    "ct129": "127.0.0.129",
    **{f"fleet{index:02d}": f"127.0.0.{10 + index}" for index in range(16)},
}


# --------------------------------------------------------------------------- environment


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Give every test its own HOME and working folder and a clean environment.

    Returns the working folder (also the cwd).
    """
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    for name in list(os.environ):
        if name.startswith(("GIT_", "SNAPVER_")) or name == "SSH_AUTH_SOCK":
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(home))
    # git also reads $XDG_CONFIG_HOME/git/config; keep that inside the fresh HOME too.
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")
    # No detached background repack outliving the test that started it (tests of
    # compaction call it directly).
    monkeypatch.setenv("SNAPVER_AUTO_GC", "0")
    monkeypatch.chdir(work)
    return work


# --------------------------------------------------------------------------- sshd


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _accepts(address: str, port: int) -> bool:
    """True if an SSH server answers on address:port."""
    try:
        with socket.create_connection((address, port), timeout=2) as probe:
            banner = probe.recv(256)
            # Answer with a banner of our own so sshd does not log the probe as an error.
            probe.sendall(b"SSH-2.0-snapver-test-probe\r\n")
            return banner.startswith(b"SSH-")
    except OSError:
        return False


def _keygen(path: Path, comment: str) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
    )


# OpenSSH refuses more than MAX_LISTEN_SOCKS (16) listen sockets per process
# ("Too many listen sockets"), so the 18 addresses are served by two sshd
# processes sharing one port, host key, authorized key and config.
MAX_LISTEN_SOCKS = 16


def _sshd_config(folder: Path, port: int, addresses: list[str], index: int,
                 session_env: Mapping[str, str] | None = None) -> str:
    listen = "".join(f"ListenAddress {address}\n" for address in addresses)
    # SetEnv: the benchmarks give node sessions a HOME of their own (bench/common.py).
    setenv = "".join(f'SetEnv {name}="{value}"\n' for name, value in (session_env or {}).items())
    return (
        f"Port {port}\n"
        f"{listen}"
        f"HostKey {folder / 'host_ed25519'}\n"
        f"PidFile {folder / f'sshd.{index}.pid'}\n"
        f"AuthorizedKeysFile {folder / 'authorized_keys'}\n"
        "StrictModes no\n"
        "UsePAM no\n"
        "PubkeyAuthentication yes\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\n"
        # The node side runs as root with HOME=/root: never run that user's ~/.ssh/rc.
        "PermitUserRC no\n"
        "PermitUserEnvironment no\n"
        "MaxStartups 100:30:200\n"
        "MaxSessions 100\n"
        "LogLevel ERROR\n"
        "UseDNS no\n"
        "PrintMotd no\n"
        "PrintLastLog no\n"
        "X11Forwarding no\n"
        # Fabric's put/get speak SFTP; internal-sftp needs no helper binary.
        "Subsystem sftp internal-sftp\n"
        f"{setenv}"
    )


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _start_sshd(folder: Path, port: int,
                session_env: Mapping[str, str] | None = None) -> tuple[list[subprocess.Popen[bytes]], str]:
    """Start the sshd processes on ``port``: (processes, "") or ([], why not)."""
    addresses = list(NODE_ADDRESSES.values())
    processes = []
    for stale in folder.glob("sshd.*.pid"):
        stale.unlink()
    with open(folder / "sshd.log", "ab") as log:
        for index in range(0, len(addresses), MAX_LISTEN_SOCKS):
            chunk = addresses[index : index + MAX_LISTEN_SOCKS]
            config = folder / f"sshd_config.{index // MAX_LISTEN_SOCKS}"
            config.write_text(_sshd_config(folder, port, chunk, index // MAX_LISTEN_SOCKS, session_env))
            processes.append(
                subprocess.Popen(
                    [SSHD_BINARY, "-D", "-e", "-f", str(config)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
                )
            )
    # sshd writes its PidFile only once every listen socket is bound; an address
    # it could not bind (port taken there) is logged, not fatal, so check each.
    pid_files = [folder / f"sshd.{index}.pid" for index in range(len(processes))]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        dead = [process for process in processes if process.poll() is not None]
        if dead:
            _stop(processes)
            return [], f"sshd exited with {dead[0].returncode}"
        if all(pid_file.exists() for pid_file in pid_files):
            refused = [address for address in addresses if not _accepts(address, port)]
            if not refused:
                return processes, ""
            _stop(processes)
            return [], f"port {port} refused on {', '.join(refused)}"
        time.sleep(0.02)
    _stop(processes)
    pytest.fail(
        f"sshd did not accept connections on {NODE_ADDRESSES['ct200']}:{port} within 10 s:\n"
        + (folder / "sshd.log").read_text(errors="replace")
    )


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """A real OpenSSH server on loopback that lets root in with one ed25519 key."""
    if not os.access(SSHD_BINARY, os.X_OK):
        pytest.fail(f"{SSHD_BINARY} is missing: `bash scripts/test.sh` installs openssh-server")
    folder = tmp_path_factory.mktemp("sshd")
    # Privilege separation needs this folder; on a fresh container nothing made it.
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)

    _keygen(folder / "host_ed25519", "snapver-test-host")
    _keygen(folder / "user_ed25519", "snapver-test-user")
    (folder / "authorized_keys").write_text((folder / "user_ed25519.pub").read_text())
    key_type, key_blob = (folder / "host_ed25519.pub").read_text().split()[:2]
    host_public_key = f"{key_type} {key_blob}"

    for _attempt in range(5):
        port = _free_port()
        processes, why = _start_sshd(folder, port)
        if processes:
            break
    else:
        log = (folder / "sshd.log").read_text(errors="replace")
        pytest.fail(f"could not start sshd ({why}):\n{log}")

    known_hosts = folder / "known_hosts"
    known_hosts.write_text(
        "".join(f"[{address}]:{port} {host_public_key}\n" for address in NODE_ADDRESSES.values())
    )
    try:
        yield Sshd(
            port=port,
            identity_file=folder / "user_ed25519",
            known_hosts=known_hosts,
            host_public_key=host_public_key,
            addresses=dict(NODE_ADDRESSES),
            dir=folder,
        )
    finally:
        _stop(processes)


# --------------------------------------------------------------------------- sglang tree


def _find_wheel() -> Path:
    wheels = sorted(FIXTURES_DIR.glob("sglang-*.whl"))
    if not wheels:
        pytest.fail(f"no sglang wheel in {FIXTURES_DIR} (expected ../shared/fixtures beside the repo)")
    return wheels[-1]


def _unpack_wheel(wheel_path: Path, destination: Path) -> None:
    """Unzip a wheel with the file modes it records (zipfile itself drops them).

    Two threads roughly halve the time: zlib releases the GIL while inflating.
    """
    with zipfile.ZipFile(wheel_path) as wheel:
        members = wheel.infolist()
    for member in members:
        if member.filename.startswith("/") or ".." in member.filename.split("/"):
            raise ValueError(f"{wheel_path.name}: unsafe member {member.filename!r}")
        target = destination / member.filename
        (target if member.is_dir() else target.parent).mkdir(parents=True, exist_ok=True)
    files = [member for member in members if not member.is_dir()]
    workers = max(1, min(4, os.cpu_count() or 1))

    def extract(share: list[zipfile.ZipInfo]) -> None:
        with zipfile.ZipFile(wheel_path) as wheel:
            for member in share:
                target = destination / member.filename
                with wheel.open(member) as source, open(target, "wb") as sink:
                    shutil.copyfileobj(source, sink, 1 << 20)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(extract, [files[index::workers] for index in range(workers)]))
    for member in members:
        mode = (member.external_attr >> 16) & 0o7777
        if mode:
            os.chmod(destination / member.filename, mode)


def _fingerprint(root: Path) -> dict[str, tuple[int, int, int]]:
    """Cheap (no hashing) record of a tree: path → (mode, size, mtime_ns)."""
    prints = {}
    for folder, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            info = os.lstat(os.path.join(folder, name))
            prints[os.path.join(folder, name)] = (info.st_mode, info.st_size, info.st_mtime_ns)
    return prints


@pytest.fixture(scope="session")
def sglang_site_template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A site-packages holding the real ``sglang/`` 0.5.23 and its ``dist-info``.

    Shared by the whole session: never modify it, copy it with
    ``make_site_packages(name, template=sglang_site_template)``. Teardown fails if
    anything in it changed.
    """
    site_packages = tmp_path_factory.mktemp("sglang-template") / "site-packages"
    _unpack_wheel(_find_wheel(), site_packages)
    before = _fingerprint(site_packages)
    yield site_packages
    if _fingerprint(site_packages) != before:
        pytest.fail(f"a test modified the shared sglang_site_template at {site_packages}")


@pytest.fixture
def make_site_packages(tmp_path: Path) -> Callable[..., Path]:
    """Factory: ``make_site_packages(name, template=None, files=None) -> Path``.

    Creates ``tmp_path/nodes/NAME/site-packages``, copies ``template`` into it
    (``cp -a``: modes, links, times kept), then writes ``files`` (relative path →
    bytes, or str as UTF-8), creating parent folders and replacing copied files.
    """

    def make(
        name: str,
        template: Path | None = None,
        files: Mapping[str, bytes | str] | None = None,
    ) -> Path:
        site_packages = tmp_path / "nodes" / name / "site-packages"
        site_packages.mkdir(parents=True)
        if template is not None:
            subprocess.run(
                ["cp", "-a", f"{template}/.", str(site_packages)],
                check=True,
                stdin=subprocess.DEVNULL,
            )
        for relative, content in (files or {}).items():
            if os.path.isabs(relative) or ".." in Path(relative).parts:
                raise ValueError(f"make_site_packages: {relative!r} escapes site-packages")
            target = site_packages / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_symlink():
                target.unlink()
            target.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
        return site_packages

    return make


# --------------------------------------------------------------------------- config


@pytest.fixture
def write_config() -> Callable[..., Path]:
    """Factory: write a ``.snapver`` TOML file and return its path.

    ``write_config(nodes, groups=None, defaults=None, store="snapshots", where=None)``

    ``where``: a folder (the file is ``where/.snapver``) or, when it has a suffix
    such as ``.toml``, the file itself; default the cwd. ``store=None`` leaves out
    the ``[store]`` table; ``groups``/``defaults`` of None leave out theirs.
    """

    def write(
        nodes: Mapping[str, Mapping[str, Any]],
        groups: Mapping[str, list[str]] | None = None,
        defaults: Mapping[str, Any] | None = None,
        store: str | None = "snapshots",
        where: Path | None = None,
    ) -> Path:
        document: dict[str, Mapping[str, Any]] = {}
        if store is not None:
            document["store"] = {"path": str(store)}
        if defaults is not None:
            document["defaults"] = defaults
        document["nodes"] = nodes
        if groups is not None:
            document["groups"] = groups
        target = Path.cwd() / ".snapver" if where is None else Path(where)
        if target.is_dir() or (where is not None and not target.suffix):
            target = target / ".snapver"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(toml_dumps(document), encoding="utf-8")
        return target

    return write


@pytest.fixture
def ssh_node(sshd: Sshd) -> Callable[..., dict[str, Any]]:
    """Factory: ``ssh_node(name, site_packages, **extra)`` → a ``[nodes.NAME]`` table for sshd."""

    def node(name: str, site_packages: Path | str, **extra: Any) -> dict[str, Any]:
        return {
            "host": sshd.addresses[name],
            "port": sshd.port,
            "user": "root",
            "site_packages": str(site_packages),
            "identity_file": str(sshd.identity_file),
            "known_hosts": str(sshd.known_hosts),
            "host_key_policy": "strict",
            "connect_timeout": 5,
            **extra,
        }

    return node


@pytest.fixture
def local_node() -> Callable[..., dict[str, Any]]:
    """Factory: ``local_node(site_packages, **extra)`` → a ``[nodes.X]`` table, no SSH."""
    return _local_node


# --------------------------------------------------------------------------- the CLI


@pytest.fixture
def run_snapver() -> Callable[..., Result]:
    """Factory: run ``python -m snapver ARGS`` in a subprocess; returns a Result.

    ``run_snapver(*args, cwd=None, input=None, env=None, timeout=120)``: the
    isolated environment plus ``env``; stdin is empty unless ``input`` is given.
    The repo root is put first on PYTHONPATH so the working tree is what runs.
    """

    def run(
        *args: str,
        cwd: Path | None = None,
        input: bytes | None = None,  # noqa: A002 - mirrors subprocess.run
        env: Mapping[str, str] | None = None,
        timeout: float = 120,
    ) -> Result:
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(REPO_ROOT), full_env.get("PYTHONPATH")])
        )
        full_env.update(env or {})
        completed = subprocess.run(
            [sys.executable, "-m", "snapver", *map(os.fspath, args)],
            cwd=cwd,
            input=input,
            stdin=subprocess.DEVNULL if input is None else None,
            capture_output=True,
            env=full_env,
            timeout=timeout,
        )
        return Result(
            code=completed.returncode,
            out=completed.stdout.decode("utf-8", errors="surrogateescape"),
            err=completed.stderr.decode("utf-8", errors="surrogateescape"),
        )

    return run
