"""Host keys, the cases tests/transport/test_ssh.py does not cover.

That file covers: unknown key refused under strict (fingerprint shown), accept-new
recording it (and strict accepting it afterwards), a changed key refused under both
policies with the file untouched, hashed entries read. Here: accept-new never
overwriting or adding to a *known* key wherever it is known (a hashed line in the
user's file while the node's own known_hosts is another file), a revoked key, and the
same refusals through a persistent connection (``control_persist``), which connects
from a background process.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SRT = "sglang/srt"


def other_key(tmp_path: Path, name: str) -> str:
    key = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, capture_output=True)
    return " ".join(Path(f"{key}.pub").read_text().split()[:2])


def fingerprint(public_key: str, tmp_path: Path) -> str:
    path = tmp_path / "fp.pub"
    path.write_text(public_key + "\n")
    return subprocess.run(["ssh-keygen", "-l", "-f", str(path)], capture_output=True, text=True,
                          check=True).stdout.split()[1]


@pytest.fixture
def site(make_site_packages) -> Path:
    return make_site_packages("node", files={f"{SRT}/a.py": "a = 1\n"})


def assert_refused(result, *words: str) -> None:
    assert result.code == 3, str(result)
    assert "Traceback" not in result.err and "internal error" not in result.err
    for word in words:
        assert word in result.err, result.err


@pytest.mark.parametrize("control_persist", [0, 30])
def test_accept_new_never_replaces_a_key_known_in_a_hashed_users_file(sshd, site, ssh_node, write_config,
                                                                      run_snapver, tmp_path, control_persist,
                                                                      store) -> None:
    """The user's ~/.ssh/known_hosts (hashed, as Debian writes it) knows another key for
    the node; the node's own known_hosts file is empty; accept-new must refuse, not add."""
    ssh_dir = Path.home() / ".ssh"
    ssh_dir.mkdir(mode=0o700)
    users_file = ssh_dir / "known_hosts"
    wrong = other_key(tmp_path, "impostor")
    users_file.write_text(f"[{sshd.addresses['ct200']}]:{sshd.port} {wrong}\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(users_file)], check=True, capture_output=True)
    hashed = users_file.read_text()
    assert hashed.startswith("|1|")
    own_file = tmp_path / "node_known_hosts"
    own_file.write_text("")
    write_config({"ct200": ssh_node("ct200", site, known_hosts=str(own_file), host_key_policy="accept-new",
                                    control_persist=control_persist)})
    result = run_snapver("pull", "ct200")
    assert_refused(result, "CHANGED", "ct200", fingerprint(sshd.host_public_key, tmp_path))
    assert users_file.read_text() == hashed
    assert own_file.read_text() == ""
    assert not store.exists() or not list((store / "refs" / "heads").rglob("*"))


@pytest.mark.parametrize("policy", ["strict", "accept-new"])
def test_a_revoked_key_is_refused(sshd, site, ssh_node, write_config, run_snapver, tmp_path, policy) -> None:
    """OpenSSH's ``@revoked`` marker: the key is refused even where it is also listed as known."""
    known_hosts = tmp_path / "known_hosts"
    text = (f"@revoked * {sshd.host_public_key}\n"
            f"[{sshd.addresses['ct200']}]:{sshd.port} {sshd.host_public_key}\n")
    known_hosts.write_text(text)
    write_config({"ct200": ssh_node("ct200", site, known_hosts=str(known_hosts), host_key_policy=policy)})
    result = run_snapver("pull", "ct200")
    assert_refused(result, "ct200", "REVOKED", fingerprint(sshd.host_public_key, tmp_path))
    assert known_hosts.read_text() == text


def test_unknown_and_changed_keys_through_a_persistent_connection(sshd, site, ssh_node, write_config, run_snapver,
                                                                  tmp_path) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    node = ssh_node("ct129", site, known_hosts=str(known_hosts), control_persist=30)
    write_config({"ct129": node})
    assert_refused(run_snapver("pull", "ct129"), "not known", fingerprint(sshd.host_public_key, tmp_path))
    assert known_hosts.read_text() == ""
    write_config({"ct129": {**node, "host_key_policy": "accept-new"}})
    result = run_snapver("pull", "ct129")
    assert result.code == 0, str(result)
    recorded = known_hosts.read_text()
    assert recorded.split()[1:] == sshd.host_public_key.split()
    assert run_snapver("pull", "ct129").code == 0
    assert known_hosts.read_text() == recorded  # recorded once
