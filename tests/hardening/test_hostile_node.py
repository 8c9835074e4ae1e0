"""A compromised node: its `python` runs a tampered agent that lies in its replies.

The node's ``python`` key points at a wrapper (``faultkit.hostile_python``) that runs
the agent snapver sends with a payload spliced in, replacing the agent's ``list``,
``read`` or ``hello`` to send paths with ``..``, absolute paths, paths through a symlink
out of the tree, paths outside the tracked tree, paths it was not asked for, or
malformed replies. Every lie ends the pull for that node with exit 3 and one line; no
snapshot is recorded, nothing is written outside the store, no traceback.

File names that are shell syntax are no lie — they are recorded byte for byte and
never executed, by pull, diff, patch and export alike.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from faultkit import all_refs, hostile_python, live_blob_ids, snapshot_blob_ids

SRT = "sglang/srt"

# A listing entry: [path, kind, st_mode, size, mtime_ns, ctime_ns, ino, blob id, link target]
ADD_TO_LISTING = '''
_honest_list = OPS["list"]

class _Capture:
    def send(self, message):
        self.message = message

def _lying_list(channel, request):
    capture = _Capture()
    _honest_list(capture, request)
    capture.message["entries"] += {rows}
    channel.send(capture.message)

OPS["list"] = _lying_list
'''

EXTRA_READ_RECORD = '''
_honest_read = OPS["read"]

def _lying_read(channel, request):
    # Stream one more file first, one nobody asked for.
    request = dict(request, paths=[{path!r}] + list(request["paths"]))
    _honest_read(channel, request)

OPS["read"] = _lying_read
'''

MALFORMED_HELLO = '''
def _lying_hello(channel, request):
    channel.send({"protocol": 1, "hostname": "x", "python": 3})

OPS["hello"] = _lying_hello
'''

GARBAGE_LIST = '''
def _lying_list(channel, request):
    channel.wfile.write(b"\\x00\\x00\\x00\\x05{bad}")
    channel.wfile.flush()

OPS["list"] = _lying_list
'''


def row(path: str, kind: str = "f", mode: object = 0o100644, size: object = 4, oid: object = None,
        target: object = None) -> list:
    return [path, kind, mode, size, 0, 0, 1, oid, target]


LIES = {
    "dot-dot": ADD_TO_LISTING.format(rows=[row("../../evil.py")]),
    "dot-dot inside": ADD_TO_LISTING.format(rows=[row(f"{SRT}/../../../evil.py")]),
    "absolute": ADD_TO_LISTING.format(rows=[row("/etc/passwd")]),
    "outside the tracked tree": ADD_TO_LISTING.format(rows=[row("sglang/evil.py")]),
    "through a symlink out of the tree": ADD_TO_LISTING.format(rows=[row(f"{SRT}/escape/victim.py")]),
    "a path listed twice": ADD_TO_LISTING.format(rows=[row(f"{SRT}/a.py", kind="l", target="b.py")]),
    "a folder as a file": ADD_TO_LISTING.format(rows=[row(SRT)]),
    "unknown kind": ADD_TO_LISTING.format(rows=[row(f"{SRT}/dev", kind="d")]),
    "wrong types": ADD_TO_LISTING.format(rows=[row(f"{SRT}/t.py", mode="644", size=None)]),
    "a short row": ADD_TO_LISTING.format(rows=[[f"{SRT}/short.py", "f"]]),
    "a file sent unasked": EXTRA_READ_RECORD.format(path="../../etc/passwd"),
    "malformed hello": MALFORMED_HELLO,
    "garbage instead of a listing": GARBAGE_LIST,
}


@pytest.fixture
def victim_tree(make_site_packages, tmp_path) -> tuple[Path, Path]:
    """A node tree with a symlink ``escape`` to a folder outside it (holding ``victim.py``)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.py").write_text("secret = 1\n")
    site = make_site_packages("node", files={f"{SRT}/a.py": "a = 1\n", f"{SRT}/b.py": "b = 2\n"})
    (site / SRT / "escape").symlink_to(outside)
    return site, outside


def snapshot_of_files(tmp_path: Path) -> dict[str, tuple[int, bytes]]:
    """Every regular file under ``tmp_path`` (store and node included) with its mtime and content."""
    found = {}
    for folder, _, files in os.walk(tmp_path):
        for name in files:
            full = os.path.join(folder, name)
            if os.path.isfile(full) and not os.path.islink(full):
                with open(full, "rb") as handle:
                    found[full] = (os.stat(full).st_mtime_ns, handle.read())
    return found


@pytest.mark.parametrize("lie", list(LIES))
def test_a_lying_node_is_refused(lie, victim_tree, local_node, write_config, run_snapver, tmp_path, store) -> None:
    site, outside = victim_tree
    wrapper = hostile_python(tmp_path / "compromised", LIES[lie])
    write_config({"evil": local_node(site, python=str(wrapper))})
    outside_before = snapshot_of_files(outside)
    result = run_snapver("pull", "--json", "evil")
    assert result.code == 3, str(result)
    assert "Traceback" not in result.err and "internal error" not in result.err
    document = json.loads(result.out)
    assert document["nodes"][0]["ok"] is False and "evil" in document["nodes"][0]["error"]
    assert all_refs(store) == {}, "a snapshot was recorded from a lying node"
    assert snapshot_of_files(outside) == outside_before
    assert not list(tmp_path.rglob("evil.py"))


@pytest.mark.parametrize("transport", ["local", "ssh"])
def test_a_symlink_escape_never_reaches_a_checkout(transport, victim_tree, local_node, ssh_node, write_config,
                                                   run_snapver, tmp_path, store) -> None:
    """The full attack: the node lists ``escape`` (a link to /outside) and ``escape/victim.py``;
    had the pull recorded both, `patch new` would write victim.py through the link."""
    site, outside = victim_tree
    wrapper = hostile_python(tmp_path / "compromised", LIES["through a symlink out of the tree"])
    keys = {"python": str(wrapper)}
    write_config({"evil": local_node(site, **keys) if transport == "local" else ssh_node("ct200", site, **keys)})
    before = snapshot_of_files(outside)
    assert run_snapver("pull", "evil").code == 3
    assert run_snapver("patch", "new", "p", "--base", "evil").code == 2  # there is no snapshot to check out
    assert snapshot_of_files(outside) == before
    # The honest agent records the link as a link, and the checkout holds a link, not a copy.
    write_config({"evil": local_node(site) if transport == "local" else ssh_node("ct200", site)})
    assert run_snapver("pull", "evil").code == 0
    assert snapshot_blob_ids(store, "refs/heads/nodes/evil") == live_blob_ids(site)
    result = run_snapver("patch", "new", "p", "--base", "evil")
    assert result.code == 0, str(result)
    checkout = Path.cwd() / ".snapver-patches" / "p"
    assert os.readlink(checkout / SRT / "escape") == str(outside)
    assert snapshot_of_files(outside) == before


# --------------------------------------------------------------------------- shell syntax in names


def shell_names(marker: str) -> list[str]:
    return [f"$(touch {marker}-a).py", f"`touch {marker}-b`.py", f"x; touch {marker}-c; y.py", f"x && touch {marker}-d",
            f"x | touch {marker}-e", f"'q\"uote {marker}.py", f"new\nline {marker}.py", f"-rf {marker}.py",
            f"${{IFS}}touch${{IFS}}{marker}-f.py"]


def executed(marker: str, *roots: Path) -> list[str]:
    """Files a shell would have created if it had run any of the names (in any likely cwd)."""
    found = []
    for root in roots:
        found += [str(p) for p in root.glob(f"{marker}-*")]
    return found


def test_shell_syntax_names_are_data_never_commands(make_site_packages, ssh_node, write_config, run_snapver,
                                                    tmp_path, store) -> None:
    marker = f"pwned-{uuid.uuid4().hex[:8]}"
    names = shell_names(marker)
    site = make_site_packages("node", files={f"{SRT}/{name}": f"{index}\n" for index, name in enumerate(names)})
    write_config({"ct200": ssh_node("ct200", site)})
    assert run_snapver("pull", "ct200").code == 0
    recorded = snapshot_blob_ids(store, "refs/heads/nodes/ct200")
    assert recorded == live_blob_ids(site) and len(recorded) == len(names)
    (site / SRT / names[0]).write_text("changed\n")
    for command in (["diff", "ct200"], ["diff", "--name-status", "ct200@latest", "ct200"], ["status", "ct200"]):
        result = run_snapver(*command)
        assert result.code == 1, str(result)
    result = run_snapver("patch", "new", "fix", "--base", "ct200")
    assert result.code == 0, str(result)
    checkout = Path.cwd() / ".snapver-patches" / "fix" / SRT
    (checkout / names[2]).write_text("patched\n")
    assert run_snapver("patch", "save", "fix").code == 0
    exported = run_snapver("patch", "export", "fix")
    assert exported.code == 0 and marker in exported.out
    roots = [tmp_path, Path.cwd(), Path.home(), Path("/root"), Path("/"), site / SRT, checkout]
    assert executed(marker, *roots) == []


@pytest.mark.parametrize("transport", ["local", "ssh"])
def test_shell_syntax_in_the_python_key_is_not_run(transport, make_site_packages, local_node, ssh_node,
                                                   write_config, run_snapver, tmp_path) -> None:
    marker = tmp_path / f"pwned-{uuid.uuid4().hex[:8]}"
    site = make_site_packages("node", files={f"{SRT}/a.py": "a\n"})
    # Unquoted, a shell would run the touch and then a working python: the pull would even succeed.
    python = f"$(touch {marker}){sys.executable}"
    write_config({"n": local_node(site, python=python) if transport == "local"
                  else ssh_node("ct200", site, python=python)})
    result = run_snapver("pull", "n")
    assert result.code == 3, str(result)
    assert "Traceback" not in result.err
    assert not marker.exists(), "the python key was run by a shell"


def test_a_hostile_store_cannot_make_a_checkout_write_outside(local_node, write_config, run_snapver, tmp_path,
                                                              store, make_site_packages) -> None:
    """Defence in depth: a store shared by someone else (or damaged) whose manifest lists a
    link ``escape`` → /outside and a file ``escape/x.py``: `patch new` refuses (exit 4)."""
    import blake3

    site = make_site_packages("node", files={f"{SRT}/a.py": "a\n"})
    write_config({"n": local_node(site)})
    assert run_snapver("pull", "n").code == 0
    outside = tmp_path / "outside"
    outside.mkdir()
    rows = []
    for path, kind, mode, data in ((f"{SRT}/escape", "l", "120777", str(outside).encode()),
                                   (f"{SRT}/escape/x.py", "f", "100644", b"planted\n")):
        oid = subprocess.run(["git", "--git-dir", str(store), "hash-object", "-w", "--stdin"], input=data,
                             capture_output=True, check=True).stdout.decode().strip()
        rows.append(f"{kind} {mode} {len(data)} {blake3.blake3(data).hexdigest()} {oid}\t{path}\n")
    git = lambda *args, data=b"": subprocess.run(  # noqa: E731
        ["git", "--git-dir", str(store), *args], input=data, capture_output=True, check=True,
        env={**os.environ, "GIT_AUTHOR_NAME": "x", "GIT_AUTHOR_EMAIL": "x@x", "GIT_COMMITTER_NAME": "x",
             "GIT_COMMITTER_EMAIL": "x@x"}).stdout.decode().strip()
    manifest = git("hash-object", "-w", "--stdin", data="".join(rows).encode())
    inner = git("mktree", data=f"100644 blob {manifest}\tmanifest\n".encode())
    tree = git("mktree", data=f"040000 tree {inner}\t.snapver\n".encode())
    meta = json.dumps({"kind": "snapshot", "node": "evil", "v": 1})
    commit = git("commit-tree", tree, "-m", f"evil\n\nsnapver-meta: {meta}")
    git("update-ref", "refs/heads/nodes/evil", commit)
    result = run_snapver("patch", "new", "p", "--base", "evil@latest")
    assert result.code == 4, str(result)
    # refused when its tree is written (a path both a link and a folder) or checked out
    assert ("escape/x.py" in result.err or f"{SRT}/escape is both" in result.err) and "Traceback" not in result.err
    assert list(outside.iterdir()) == []
