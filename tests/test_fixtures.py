"""The test infrastructure itself works, and can fail."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
from pathlib import Path

import pytest
import tomllib
from helpers import Sshd, git_blob, git_ls_tree, tree_hashes

# Counted from the wheel, not taken from its README: the zip has 2,856 entries
# under sglang/srt/, of which 254 are folders.
SGLANG_SRT_FILES = 2602


def _ssh(
    sshd: Sshd, address: str, command: str, known_hosts: Path
) -> subprocess.CompletedProcess[str]:
    # OpenSSH reads ~/.ssh/config from the passwd entry, not $HOME: -F /dev/null
    # and IdentitiesOnly keep the developer's files out.
    return subprocess.run(
        [
            "ssh", "-F", "/dev/null",
            "-i", str(sshd.identity_file),
            "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={known_hosts}",
            "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes",
            "-o", "ConnectTimeout=5",
            "-p", str(sshd.port),
            f"root@{address}",
            command,
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )


# --------------------------------------------------------------------------- environment


def test_isolated_env(tmp_path: Path) -> None:
    assert os.environ["HOME"] == str(tmp_path / "home")
    assert Path.cwd() == tmp_path / "work"
    # The one SNAPVER_ variable set on purpose: no background compaction outliving a test.
    assert {name for name in os.environ if name.startswith("SNAPVER_")} == {"SNAPVER_AUTO_GC"}
    assert os.environ["SNAPVER_AUTO_GC"] == "0"
    assert "SSH_AUTH_SOCK" not in os.environ
    assert {name for name in os.environ if name.startswith("GIT_")} == {"GIT_CONFIG_NOSYSTEM"}
    assert os.environ["NO_COLOR"] == "1"
    git_config = subprocess.run(
        ["git", "config", "--list", "--show-origin"], capture_output=True, text=True
    )
    assert git_config.stdout == ""


# --------------------------------------------------------------------------- sshd


@pytest.mark.parametrize("node", ["ct200", "ct129", "fleet00", "fleet15"])
def test_ssh_with_known_hosts(sshd: Sshd, node: str) -> None:
    command = "echo ok; python3 -c 'import sys; print(sys.version_info[:2])'"
    result = _ssh(sshd, sshd.addresses[node], command, sshd.known_hosts)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["ok", "(3, 11)"]


def test_sshd_listens_on_every_fleet_address(sshd: Sshd) -> None:
    assert len(sshd.addresses) == 18
    lines = sshd.known_hosts.read_text().splitlines()
    expected = [f"[{a}]:{sshd.port} {sshd.host_public_key}" for a in sshd.addresses.values()]
    assert lines == expected
    assert sshd.host_public_key.startswith("ssh-ed25519 AAAA")


def test_ssh_refuses_unknown_host(sshd: Sshd, tmp_path: Path) -> None:
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    result = _ssh(sshd, sshd.addresses["ct200"], "echo ok", empty)
    assert result.returncode == 255
    assert "ok" not in result.stdout
    assert "Host key verification failed" in result.stderr


def test_ssh_refuses_changed_host_key(sshd: Sshd, tmp_path: Path) -> None:
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    key = " ".join(Path(f"{other}.pub").read_text().split()[:2])
    wrong = tmp_path / "wrong_known_hosts"
    wrong.write_text(f"[{sshd.addresses['ct129']}]:{sshd.port} {key}\n")
    result = _ssh(sshd, sshd.addresses["ct129"], "echo ok", wrong)
    assert result.returncode == 255
    assert "HOST IDENTIFICATION HAS CHANGED" in result.stderr


# --------------------------------------------------------------------------- sglang tree


def test_template_is_the_sglang_wheel(sglang_site_template: Path) -> None:
    srt = sglang_site_template / "sglang" / "srt"
    files = [p for p in srt.rglob("*") if p.is_file() or p.is_symlink()]
    assert len(files) == SGLANG_SRT_FILES
    assert len(tree_hashes(sglang_site_template, exclude_pycache=False)) == SGLANG_SRT_FILES
    record = sglang_site_template / "sglang-0.5.23.dist-info" / "RECORD"
    assert record.is_file()
    # Spot-check modes restored from the zip and one RECORD hash.
    modes = {os.stat(p).st_mode & 0o7777 for p in files}
    assert 0o755 in modes and 0o644 in modes
    line = next(
        line for line in record.read_text().splitlines()
        if line.startswith("sglang/srt/") and ",sha256=" in line
    )
    path, digest, _size = line.rsplit(",", 2)
    content = (sglang_site_template / path).read_bytes()
    expected = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
    assert digest == f"sha256={expected}"


def test_make_site_packages_copies_with_modes(
    sglang_site_template: Path, make_site_packages, tmp_path: Path
) -> None:
    added = {"sglang/srt/new dir/ü.py": "x = 1\n"}
    site = make_site_packages("ct200", template=sglang_site_template, files=added)
    assert site == tmp_path / "nodes" / "ct200" / "site-packages"
    original = tree_hashes(sglang_site_template)
    copied = tree_hashes(site)
    assert copied.pop("sglang/srt/new dir/ü.py") == ("f", 0o644, hashlib.sha256(b"x = 1\n").hexdigest())
    assert copied == original
    assert any(mode == 0o755 for _, mode, _ in copied.values())
    assert (site / "sglang-0.5.23.dist-info" / "RECORD").is_file()


def test_make_site_packages_files_only(make_site_packages) -> None:
    files = {"sglang/srt/a.py": b"\x00\xff", "sglang/srt/b/c.txt": "ç"}
    site = make_site_packages("bare", files=files)
    assert tree_hashes(site) == {
        "sglang/srt/a.py": ("f", 0o644, hashlib.sha256(b"\x00\xff").hexdigest()),
        "sglang/srt/b/c.txt": ("f", 0o644, hashlib.sha256("ç".encode()).hexdigest()),
    }
    with pytest.raises(ValueError):
        make_site_packages("evil", files={"../x.py": "no"})


def test_tree_hashes_does_not_follow_links(tmp_path: Path) -> None:
    srt = tmp_path / "sp" / "sglang" / "srt"
    (srt / "__pycache__").mkdir(parents=True)
    (srt / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"pyc")
    (srt / "stray.pyc").write_bytes(b"pyc")
    (srt / "real.py").write_text("r")
    (srt / "real.py").chmod(0o750)
    (srt / "link.py").symlink_to("real.py")
    (srt / "dirlink").symlink_to("/etc")
    hashes = tree_hashes(tmp_path / "sp")
    assert hashes == {
        "sglang/srt/dirlink": ("l", 0, hashlib.sha256(b"/etc").hexdigest()),
        "sglang/srt/link.py": ("l", 0, hashlib.sha256(b"real.py").hexdigest()),
        "sglang/srt/real.py": ("f", 0o750, hashlib.sha256(b"r").hexdigest()),
    }
    assert len(tree_hashes(tmp_path / "sp", exclude_pycache=False)) == 5


# --------------------------------------------------------------------------- git helpers


def test_git_helpers_read_odd_paths(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    names = ["sp ace.py", "new\nline.py", 'quo"te.py', "ünï.py"]
    srt = repo / "sglang" / "srt"
    srt.mkdir(parents=True)
    for name in names:
        (srt / name).write_bytes(name.encode())
    (srt / "run.sh").write_text("#!/bin/sh\n")
    (srt / "run.sh").chmod(0o755)
    (srt / "link").symlink_to("run.sh")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
    listing = git_ls_tree(repo, "HEAD")
    assert set(listing) == {f"sglang/srt/{n}" for n in [*names, "run.sh", "link"]}
    assert listing["sglang/srt/run.sh"][0] == "100755"
    assert listing["sglang/srt/link"][0] == "120000"
    assert git_blob(repo, listing["sglang/srt/link"][1]) == b"run.sh"
    for name in names:
        assert git_blob(repo, listing[f"sglang/srt/{name}"][1]) == name.encode()
    with pytest.raises(AssertionError):
        git_ls_tree(repo, "no-such-rev")


# --------------------------------------------------------------------------- config


def test_write_config_round_trips(write_config, ssh_node, local_node, tmp_path: Path) -> None:
    nodes = {
        "ct200": ssh_node("ct200", tmp_path / 'we"ird\\pa th\n'),
        "laptop": local_node(tmp_path / "ünï", paths=["sglang/srt", "sglang/lang"]),
        "odd.name": {"local": True, "site_packages": "/x", "connect_timeout": 2.5, "flag": False},
    }
    groups = {"tp8": ["ct200", "ct129"], "empty": []}
    defaults = {"user": "root", "exclude": ["__pycache__/", "*.pyc"], "connect_timeout": 10}
    path = write_config(nodes, groups=groups, defaults=defaults)
    assert path == Path.cwd() / ".snapver"
    parsed = tomllib.loads(path.read_text(encoding="utf-8"))
    expected = {"store": {"path": "snapshots"}, "defaults": defaults, "nodes": nodes, "groups": groups}
    assert parsed == expected
    assert parsed["nodes"]["ct200"]["port"] > 0

    elsewhere = write_config({}, store=None, where=tmp_path / "sub")
    assert elsewhere == tmp_path / "sub" / ".snapver"
    assert tomllib.loads(elsewhere.read_text()) == {"nodes": {}}
    named = write_config({"a": local_node("/a")}, where=tmp_path / "custom.toml")
    assert tomllib.loads(named.read_text())["nodes"]["a"] == {"local": True, "site_packages": "/a"}
