"""Secrets stay secret, and files are made with the user's umask.

- No private key material, passphrase or environment value shows up in any output
  (text, ``--json``, ``-v``, errors), in the store, or on the node (the agent's
  environment over SSH).
- With ``umask 027``, nothing snapver creates — store, config, patch checkout — is
  readable or writable by others, writable by the group, or setuid; even when the node's
  files are world-writable or setuid.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from faultkit import hostile_python, snapver_env

SRT = "sglang/srt"

DUMP_ENV = '''
import json as _json
with open({path!r}, "w") as _handle:
    _json.dump(dict(os.environ), _handle)
'''


def key_material(private_key: Path) -> list[str]:
    """The base64 lines of a private key file (what must never be printed)."""
    return [line for line in private_key.read_text().splitlines() if line and not line.startswith("-----")]


def store_text(store: Path) -> bytes:
    """Everything the store holds: its files and every object's content, uncompressed."""
    chunks = []
    for folder, _, files in os.walk(store):
        for name in files:
            with open(os.path.join(folder, name), "rb") as handle:
                chunks.append(handle.read())
    chunks.append(subprocess.run(["git", "--git-dir", str(store), "cat-file", "--batch-all-objects", "--batch"],
                                 capture_output=True, check=True).stdout)
    return b"\n".join(chunks)


def test_no_secret_in_outputs_store_or_node(sshd, make_site_packages, ssh_node, write_config, run_snapver,
                                            tmp_path, store) -> None:
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    passphrase = f"pass-{uuid.uuid4().hex}"
    locked_key = tmp_path / "locked_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-f", str(locked_key)], check=True,
                   capture_output=True)
    fake_key = tmp_path / "not_a_key"
    fake_key.write_text(f"-----BEGIN OPENSSH PRIVATE KEY-----\n{secret}AAAA\n-----END OPENSSH PRIVATE KEY-----\n")
    site = make_site_packages("node", files={f"{SRT}/a.py": "a = 1\n"})
    node_env = tmp_path / "node-env.json"
    spy = hostile_python(tmp_path / "spy", DUMP_ENV.format(path=str(node_env)))
    env = {"AWS_SECRET_ACCESS_KEY": secret, "SNAPVER_TEST_PASSPHRASE": passphrase, "GITHUB_TOKEN": secret}
    outputs = []

    def run(*args: str, expect: int) -> None:
        result = run_snapver(*args, env=env)
        assert result.code == expect, str(result)
        outputs.append(result.out + result.err)

    write_config(
        {
            "ct200": ssh_node("ct200", site, python=str(spy)),
            "locked": ssh_node("ct129", site, identity_file=str(locked_key)),
            "fake": ssh_node("fleet00", site, identity_file=str(fake_key)),
        }
    )
    run("pull", "ct200", expect=0)
    run("pull", "--json", "ct200", expect=0)
    for args in (["nodes", "--check"], ["-v", "nodes", "--check"], ["-v", "pull", "--json", "--all"]):
        run(*args, expect=3)  # `locked` and `fake` cannot log in
    (site / SRT / "a.py").write_text("a = 2\n")
    for args, expect in ((["log", "--json"], 0), (["show", "--json", "ct200"], 0), (["diff", "--json", "ct200"], 1),
                         (["-v", "diff", "ct200"], 1), (["status", "--json", "ct200"], 1), (["fsck"], 0)):
        run(*args, expect=expect)
    text = "\n".join(outputs)
    assert "locked" in text and "fake" in text  # the failures were reported …
    forbidden = [secret, passphrase, *key_material(locked_key), *key_material(sshd.identity_file)]
    for value in forbidden:  # … without a trace of any secret
        assert value not in text, f"{value[:12]}… printed"
    everything = store_text(store)
    for value in forbidden:
        assert value.encode() not in everything, f"{value[:12]}… stored"
    # The agent on the node never saw the client's environment (SSH sends none).
    seen_on_node = node_env.read_text()
    assert secret not in seen_on_node and passphrase not in seen_on_node


def umask_run(umask: int, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run snapver in a child whose umask is ``umask`` (set between fork and exec)."""
    return subprocess.run([sys.executable, "-m", "snapver", *args], cwd=cwd, capture_output=True, text=True,
                          env=snapver_env(), preexec_fn=lambda: os.umask(umask), stdin=subprocess.DEVNULL)


def loose_modes(root: Path, umask: int) -> list[str]:
    """Paths under ``root`` with a permission bit the umask takes away, or setuid/setgid/sticky."""
    bad = []
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            full = os.path.join(folder, name)
            mode = os.lstat(full).st_mode
            if stat.S_ISLNK(mode):
                continue
            if mode & umask or mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX):
                bad.append(f"{stat.filemode(mode)} {os.path.relpath(full, root)}")
    return bad


@pytest.mark.parametrize("umask", [0o027])
def test_files_are_made_with_the_users_umask(umask, make_site_packages, local_node, write_config, tmp_path) -> None:
    site = make_site_packages("node", files={f"{SRT}/a.py": "a\n", f"{SRT}/open.py": "o\n", f"{SRT}/suid": "s\n",
                                             f"{SRT}/run.sh": "#!/bin/sh\n"})
    (site / SRT / "open.py").chmod(0o666)
    (site / SRT / "suid").chmod(0o4755)
    (site / SRT / "run.sh").chmod(0o775)
    work = tmp_path / "umask"
    work.mkdir()
    assert umask_run(umask, "init", cwd=work).returncode == 0
    write_config({"n": local_node(site)}, where=work)
    for args in (["pull", "n"], ["patch", "new", "p", "--base", "n"]):
        done = umask_run(umask, *args, cwd=work)
        assert done.returncode == 0, done.stderr
    checkout = work / ".snapver-patches" / "p" / SRT
    (checkout / "a.py").write_text("edited\n")
    done = umask_run(umask, "patch", "save", "p", cwd=work)
    assert done.returncode == 0, done.stderr
    # Only the edit was recorded: the checkout's umask-trimmed modes are not mode changes.
    shown = umask_run(umask, "patch", "show", "p", cwd=work)
    assert "a.py" in shown.stdout and "open.py" not in shown.stdout and "suid" not in shown.stdout, shown.stdout
    assert loose_modes(work, umask) == [], "\n".join(loose_modes(work, umask))
    # The executable stays executable (for its owner) in the checkout.
    assert os.stat(checkout / "run.sh").st_mode & stat.S_IXUSR
