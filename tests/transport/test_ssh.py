"""SSH as OpenSSH users expect it: host keys, ~/.ssh/config aliases, identity files, timeouts.

Driven through the CLI (`snapver pull`, `snapver nodes --check`) against the real sshd;
known_hosts files are checked with `ssh-keygen -F` and the OpenSSH client itself.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import Sshd

SRT = "sglang/srt"


def fingerprint(public_key: str, tmp_path: Path) -> str:
    """``SHA256:...`` of a public key line, as ``ssh-keygen -l`` prints it."""
    path = tmp_path / "key.pub"
    path.write_text(public_key + "\n")
    out = subprocess.run(["ssh-keygen", "-l", "-f", str(path)], capture_output=True, text=True, check=True)
    return out.stdout.split()[1]


def other_public_key(tmp_path: Path) -> str:
    key = tmp_path / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True,
                   capture_output=True)
    return " ".join(Path(f"{key}.pub").read_text().split()[:2])


def known_to_ssh_keygen(known_hosts: Path, address: str, port: int) -> str:
    """The known_hosts line(s) OpenSSH finds for ``[address]:port`` ('' if none)."""
    out = subprocess.run(["ssh-keygen", "-F", f"[{address}]:{port}", "-f", str(known_hosts)],
                         capture_output=True, text=True)
    return "\n".join(line for line in out.stdout.splitlines() if not line.startswith("#"))


def openssh_accepts(sshd: Sshd, address: str, known_hosts: Path) -> bool:
    result = subprocess.run(
        ["ssh", "-F", "/dev/null", "-i", str(sshd.identity_file), "-o", "IdentitiesOnly=yes",
         "-o", f"UserKnownHostsFile={known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
         "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-p", str(sshd.port),
         f"root@{address}", "true"],
        stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    return result.returncode == 0


def assert_clean_error(result, code: int) -> None:
    assert result.code == code, str(result)
    assert "Traceback" not in result.out + result.err
    assert "snapver: error:" in result.err


@pytest.fixture
def site(make_site_packages) -> Path:
    return make_site_packages("node", files={f"{SRT}/a.py": "a = 1\n"})


def snapshots(store: Path) -> str:
    if not store.exists():
        return ""
    return subprocess.run(["git", "-C", str(store), "for-each-ref", "refs/heads/nodes/"],
                          capture_output=True, text=True, check=True).stdout


# --------------------------------------------------------------------------- host keys


def test_unknown_host_is_refused_under_strict(sshd, site, ssh_node, write_config, run_snapver, tmp_path) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    write_config({"ct200": ssh_node("ct200", site, known_hosts=str(known_hosts))})
    result = run_snapver("pull", "ct200")
    assert_clean_error(result, 3)
    assert "ct200" in result.err and "not known" in result.err
    assert fingerprint(sshd.host_public_key, tmp_path) in result.err
    assert known_hosts.read_text() == ""
    assert not (Path.home() / ".ssh" / "known_hosts").exists()
    assert snapshots(Path.cwd() / "snapshots") == ""


def test_accept_new_records_the_key_openssh_style(sshd, site, ssh_node, write_config, run_snapver,
                                                  tmp_path) -> None:
    known_hosts = tmp_path / "fresh" / "known_hosts"  # neither the file nor its folder exists yet
    address = sshd.addresses["ct129"]
    write_config({"ct129": ssh_node("ct129", site, known_hosts=str(known_hosts), host_key_policy="accept-new")})
    result = run_snapver("pull", "ct129")
    assert result.code == 0, str(result)
    found = known_to_ssh_keygen(known_hosts, address, sshd.port)
    assert found.split()[1:] == sshd.host_public_key.split(), known_hosts.read_text()
    assert openssh_accepts(sshd, address, known_hosts)
    # Once recorded, strict checking accepts it, and a second accept-new run adds nothing.
    write_config({"ct129": ssh_node("ct129", site, known_hosts=str(known_hosts))})
    assert run_snapver("pull", "ct129").code == 0
    write_config({"ct129": ssh_node("ct129", site, known_hosts=str(known_hosts), host_key_policy="accept-new")})
    assert run_snapver("pull", "ct129").code == 0
    assert len(known_hosts.read_text().splitlines()) == 1


def test_accept_new_without_known_hosts_uses_the_users_file(sshd, site, ssh_node, write_config,
                                                            run_snapver) -> None:
    node = ssh_node("ct200", site, host_key_policy="accept-new")
    del node["known_hosts"]
    write_config({"ct200": node})
    assert run_snapver("pull", "ct200").code == 0
    users_file = Path.home() / ".ssh" / "known_hosts"
    assert known_to_ssh_keygen(users_file, sshd.addresses["ct200"], sshd.port)
    assert openssh_accepts(sshd, sshd.addresses["ct200"], users_file)


def test_hashed_known_hosts_are_read(sshd, site, ssh_node, write_config, run_snapver, tmp_path) -> None:
    """Debian's default HashKnownHosts=yes writes `|1|salt|hash` names instead of addresses."""
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(sshd.known_hosts.read_text())
    subprocess.run(["ssh-keygen", "-H", "-f", str(known_hosts)], check=True, capture_output=True)
    assert known_hosts.read_text().startswith("|1|") and sshd.addresses["ct200"] not in known_hosts.read_text()
    write_config({"ct200": ssh_node("ct200", site, known_hosts=str(known_hosts))})
    assert run_snapver("pull", "ct200").code == 0


@pytest.mark.parametrize("policy", ["strict", "accept-new"])
def test_changed_host_key_is_always_refused(sshd, site, ssh_node, write_config, run_snapver, tmp_path,
                                            policy: str) -> None:
    known_hosts = tmp_path / "known_hosts"
    line = f"[{sshd.addresses['ct200']}]:{sshd.port} {other_public_key(tmp_path)}\n"
    known_hosts.write_text(line)
    write_config({"ct200": ssh_node("ct200", site, known_hosts=str(known_hosts), host_key_policy=policy)})
    for command in (["pull", "ct200"], ["nodes", "--check"]):
        result = run_snapver(*command)
        assert_clean_error(result, 3)
        assert "CHANGED" in result.err and "ct200" in result.err
        assert fingerprint(sshd.host_public_key, tmp_path) in result.err
    assert known_hosts.read_text() == line
    assert snapshots(Path.cwd() / "snapshots") == ""


# --------------------------------------------------------------------------- ~/.ssh/config and keys


def test_ssh_config_alias_is_honoured(sshd, site, write_config, run_snapver) -> None:
    ssh_dir = Path.home() / ".ssh"
    ssh_dir.mkdir(mode=0o700)
    (ssh_dir / "config").write_text(
        "Host tp-a\n"
        f"    HostName {sshd.addresses['ct129']}\n"
        f"    Port {sshd.port}\n"
        "    User root\n"
        f"    IdentityFile {sshd.identity_file}\n"
        f"    UserKnownHostsFile {sshd.known_hosts}\n"
        "Host *\n"
        "    Port 1\n"
    )
    write_config({"ct129": {"host": "tp-a", "site_packages": str(site), "connect_timeout": 5}})
    result = run_snapver("nodes", "--check")
    assert result.code == 0, str(result)
    assert "yes" in result.out
    result = run_snapver("pull", "ct129")
    assert result.code == 0, str(result)
    assert "ct129" in snapshots(Path.cwd() / "snapshots")


def test_proxyjump_hops_have_their_host_keys_checked_too(sshd, site, write_config, run_snapver, tmp_path) -> None:
    """A bastion reached through ProxyJump is checked like the node: unknown refused, known accepted."""
    lines = sshd.known_hosts.read_text().splitlines(keepends=True)
    bastion_known = tmp_path / "bastion_known_hosts"
    node_known = tmp_path / "node_known_hosts"
    node_known.write_text("".join(line for line in lines if line.startswith(f"[{sshd.addresses['ct129']}]")))
    ssh_dir = Path.home() / ".ssh"
    ssh_dir.mkdir(mode=0o700)
    (ssh_dir / "config").write_text(
        f"Host bastion\n    HostName {sshd.addresses['ct200']}\n    Port {sshd.port}\n    User root\n"
        f"    IdentityFile {sshd.identity_file}\n    UserKnownHostsFile {bastion_known}\n"
        f"Host inner\n    HostName {sshd.addresses['ct129']}\n    Port {sshd.port}\n    User root\n"
        f"    IdentityFile {sshd.identity_file}\n    ProxyJump bastion\n")
    write_config({"ct129": {"host": "inner", "site_packages": str(site), "known_hosts": str(node_known),
                            "connect_timeout": 5}})
    bastion_known.write_text("")
    result = run_snapver("pull", "ct129")
    assert_clean_error(result, 3)
    assert "not known" in result.err and sshd.addresses["ct200"] in result.err
    assert bastion_known.read_text() == ""
    bastion_known.write_text(f"[{sshd.addresses['ct200']}]:{sshd.port} {other_public_key(tmp_path)}\n")
    assert_clean_error(result := run_snapver("pull", "ct129"), 3)
    assert "CHANGED" in result.err and sshd.addresses["ct200"] in result.err
    bastion_known.write_text("".join(line for line in lines if line.startswith(f"[{sshd.addresses['ct200']}]")))
    assert run_snapver("pull", "ct129").code == 0


def test_identity_file_with_tilde(sshd, site, ssh_node, write_config, run_snapver) -> None:
    ssh_dir = Path.home() / ".ssh"
    ssh_dir.mkdir(mode=0o700)
    key = ssh_dir / "deploy_key"
    key.write_bytes(sshd.identity_file.read_bytes())
    key.chmod(0o600)
    write_config({"ct200": ssh_node("ct200", site, identity_file="~/.ssh/deploy_key")})
    result = run_snapver("pull", "ct200")
    assert result.code == 0, str(result)


def test_wrong_or_no_identity_is_refused(sshd, site, ssh_node, write_config, run_snapver, tmp_path) -> None:
    wrong = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], check=True,
                   capture_output=True)
    write_config({"ct200": ssh_node("ct200", site, identity_file=str(wrong))})
    result = run_snapver("pull", "ct200")
    assert_clean_error(result, 3)
    assert "ct200" in result.err and "authentication" in result.err.lower()
    node = ssh_node("ct200", site)
    del node["identity_file"]
    write_config({"ct200": node})
    assert_clean_error(run_snapver("pull", "ct200"), 3)


# --------------------------------------------------------------------------- unreachable nodes


@pytest.fixture
def closed_port() -> int:
    """A loopback port nobody listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.200", 0))
        return probe.getsockname()[1]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that completes TCP handshakes and then never says a word."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.200", 0))
        listener.listen(16)
        yield listener.getsockname()[1]


@pytest.fixture
def banner_only_port() -> Iterator[int]:
    """A port that sends an SSH banner, then falls silent (a hung sshd)."""
    listener = socket.socket()
    listener.bind(("127.0.0.200", 0))
    listener.listen(16)
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            connection.sendall(b"SSH-2.0-OpenSSH_9.2p1 hung\r\n")
            held.append(connection)

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1]
    listener.close()
    for connection in held:
        connection.close()


def test_refused_port_is_exit_3_at_once(site, ssh_node, write_config, run_snapver, closed_port) -> None:
    write_config({"ct200": ssh_node("ct200", site, port=closed_port, connect_timeout=20)})
    began = time.monotonic()
    result = run_snapver("pull", "ct200")
    assert_clean_error(result, 3)
    assert time.monotonic() - began < 10
    assert "ct200" in result.err and str(closed_port) in result.err


@pytest.mark.parametrize("server", ["silent_port", "banner_only_port"])
def test_unanswering_node_is_exit_3_within_connect_timeout(request, site, ssh_node, write_config, run_snapver,
                                                          server: str) -> None:
    port = request.getfixturevalue(server)
    timeout = 2
    write_config({"ct200": ssh_node("ct200", site, port=port, connect_timeout=timeout)})
    began = time.monotonic()
    assert run_snapver("nodes").code == 0  # what start-up alone costs on this machine right now
    startup = time.monotonic() - began
    began = time.monotonic()
    result = run_snapver("pull", "ct200", timeout=60)
    elapsed = time.monotonic() - began
    assert_clean_error(result, 3)
    assert f"ct200: root@127.0.0.200:{port} did not" in result.err and f"within {timeout} s" in result.err
    assert timeout * 0.9 <= elapsed < timeout + startup + 1.5, f"took {elapsed:.1f} s\n{result}"


# --------------------------------------------------------------------------- the agent's end

def agent_processes(marker: str) -> list[int]:
    """Pids of processes whose command line names ``marker``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker.encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_agent_ends_with_the_command(sshd, site, ssh_node, write_config, run_snapver, tmp_path) -> None:
    """The client leaves a finished session without waiting for the agent to exit (a round
    trip saved); the agent ends at its ``bye``: nothing of snapver stays on the node."""
    python = tmp_path / "node-bin" / "python3"
    python.parent.mkdir()
    python.symlink_to(subprocess.run(["sh", "-c", "command -v python3"], capture_output=True, text=True,
                                     check=True).stdout.strip())
    write_config({"ct200": ssh_node("ct200", site, python=str(python))})
    for args in (["pull", "ct200"], ["diff", "-q", "ct200@latest", "ct200"], ["status", "--against", "ct200@latest"]):
        result = run_snapver(*args)
        assert result.code == 0, result
        deadline = time.monotonic() + 5
        while agent_processes(str(python)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert agent_processes(str(python)) == [], f"an agent outlived `snapver {' '.join(args)}`"


def test_ssh_socket_sends_and_acks_at_once(sshd, site, ssh_node, tmp_path) -> None:
    """paramiko sends each SSH message on its own: the socket must not hold small ones back
    (TCP_NODELAY) nor delay its ACKs (TCP_QUICKACK, renewed on every read), else Nagle
    costs ~40 ms three times per handshake. And the session still works on it."""
    import socket as socket_module

    from snapver.config import parse_config
    from snapver.transport.connect import open_transport
    from snapver.transport.ssh import _QuickAckSocket

    spec = parse_config({"nodes": {"ct200": ssh_node("ct200", site)}}, tmp_path / ".snapver").nodes["ct200"]
    transport = open_transport(spec)
    try:
        assert transport.open().site_packages == str(site)
        sock = transport._connection.transport.sock  # type: ignore[attr-defined]
        assert isinstance(sock, _QuickAckSocket)
        assert sock.getsockopt(socket_module.IPPROTO_TCP, socket_module.TCP_NODELAY) == 1
        assert [e.path for e in transport.list_tree().entries] == [f"{SRT}/a.py"]
    finally:
        transport.close()


def test_a_refused_connection_is_said_in_words(make_site_packages, ssh_node, write_config, run_snapver) -> None:
    """Nothing listens on the node's port: one line naming the node, its address and what
    failed (not paramiko's `[Errno None] Unable to connect to port …`), exit 3."""
    import socket as sockets

    with sockets.socket() as probe:  # a port nobody listens on (closed again at once)
        probe.bind(("127.0.0.200", 0))
        port = probe.getsockname()[1]
    site = make_site_packages("ct200", files={"sglang/srt/a.py": "a = 1\n"})
    write_config({"ct200": ssh_node("ct200", site, port=port)})
    result = run_snapver("pull", "ct200")
    assert result.code == 3, result
    assert result.err.splitlines()[0] == f"snapver: error: ct200 (root@127.0.0.200:{port}): connection refused", result
