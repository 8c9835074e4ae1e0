"""The TCP connection begun while paramiko imports: used when Fabric goes to the same
address, dropped otherwise, a timeout reported once. Real sockets, real sshd."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from snapver.config import parse_config
from snapver.transport.connect import open_transport
from snapver.transport.early import EarlyConnection, is_ip_address


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(5)
    yield server
    server.close()


def test_taken_for_its_own_address_it_is_the_connected_socket(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    early = EarlyConnection("127.0.0.1", port, 5)
    sock = early.take("127.0.0.1", port)
    assert sock is not None
    peer, _ = listener.accept()
    assert peer.getpeername() == sock.getsockname()
    sock.sendall(b"ping")
    assert peer.recv(4) == b"ping"
    sock.close()
    peer.close()


def test_for_another_address_it_is_closed_unused(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    early = EarlyConnection("127.0.0.1", port, 5)
    assert early.take("127.0.0.2", port) is None
    peer, _ = listener.accept()
    peer.settimeout(5)
    assert peer.recv(1) == b""  # closed by us, now or as soon as it had connected
    peer.close()


def test_a_refused_connection_is_left_to_the_caller() -> None:
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    assert EarlyConnection("127.0.0.1", port, 5).take("127.0.0.1", port) is None


def test_a_timeout_is_raised_not_waited_for_twice() -> None:
    """A listener whose queue is full drops new SYNs: connecting times out."""
    server = socket.create_server(("127.0.0.1", 0), backlog=0)
    port = server.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):  # fill the accept queue (never accepted)
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
        with pytest.raises((socket.timeout, TimeoutError)):
            EarlyConnection("127.0.0.1", port, 1).take("127.0.0.1", port)
    finally:
        for filler in fillers:
            filler.close()
        server.close()


def test_only_ip_addresses_connect_early() -> None:
    assert is_ip_address("127.0.0.200") and is_ip_address("::1")
    assert not is_ip_address("ct200") and not is_ip_address("tp-a") and not is_ip_address("")


def test_an_ssh_transport_uses_the_early_socket(sshd, ssh_node, make_site_packages, tmp_path: Path) -> None:
    site = make_site_packages("n", files={"sglang/srt/x.py": b"x = 1\n"})
    spec = parse_config({"nodes": {"n": ssh_node("ct200", site)}}, tmp_path / ".snapver").nodes["n"]
    transport = open_transport(spec)
    early = transport._early  # type: ignore[attr-defined]
    assert early is not None and early.address == (sshd.addresses["ct200"], sshd.port)
    early._thread.join()
    early_end = early._socket.getsockname()
    with transport:
        assert transport.info is not None
        assert transport._connection.transport.sock.getsockname() == early_end  # type: ignore[attr-defined]


def test_an_address_ssh_config_sends_elsewhere_is_not_used(sshd, ssh_node, make_site_packages, run_snapver,
                                                           write_config) -> None:
    """~/.ssh/config maps the node's address to ct200's: the early connection (to a silent
    listener at the configured address) is dropped, and Fabric connects where the config
    says (the silent listener would stall the handshake until the connect timeout)."""
    decoy = socket.create_server(("127.0.0.77", sshd.port))
    ssh_dir = Path.home() / ".ssh"
    ssh_dir.mkdir(mode=0o700)
    (ssh_dir / "config").write_text(f"Host 127.0.0.77\n    HostName {sshd.addresses['ct200']}\n")
    site = make_site_packages("n", files={"sglang/srt/x.py": b"x = 1\n"})
    write_config({"n": ssh_node("ct200", site, host="127.0.0.77")})
    try:
        result = run_snapver("pull", "n")
    finally:
        decoy.close()
    assert result.code == 0, str(result)


def test_a_node_that_never_accepts_is_waited_for_once(sshd, ssh_node, make_site_packages, run_snapver,
                                                      write_config) -> None:
    """TCP never connects (the listener's queue is full, new SYNs are dropped): the early
    connection's timeout is the one reported, not followed by a second wait of Fabric's."""
    timeout = 3
    server = socket.create_server((sshd.addresses["ct200"], 0), backlog=0)
    port = server.getsockname()[1]
    fillers = []
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex((sshd.addresses["ct200"], port))
        fillers.append(filler)
    site = make_site_packages("n", files={"sglang/srt/x.py": b"x = 1\n"})
    write_config({"n": ssh_node("ct200", site, port=port, connect_timeout=timeout)})
    try:
        began = time.monotonic()
        assert run_snapver("nodes").code == 0
        startup = time.monotonic() - began
        began = time.monotonic()
        result = run_snapver("pull", "n", timeout=60)
        elapsed = time.monotonic() - began
    finally:
        for filler in fillers:
            filler.close()
        server.close()
    assert result.code == 3, str(result)
    assert f"did not answer within {timeout} s" in result.err
    assert elapsed < startup + 1.6 * timeout, f"took {elapsed:.1f} s: waited more than once\n{result}"
