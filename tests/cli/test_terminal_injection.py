"""Text that comes from a node or from the store never drives the terminal.

A distribution's `Version:` is whatever its METADATA says; a snapshot's writer id, message,
hostname or python path is whatever the commit (maybe a team remote's) says. Each is printed
C-quoted (as paths are), so an escape sequence in it shows as ``\\033[2J``, never as a
cleared screen, a new window title or concealed text; and rich markup in it (``[red]``) is
shown as written, never read as a style. Our own colours (forced on here) still are there.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

SRT = "sglang/srt"
# Clear the screen, set the window title, then conceal what follows (SGR 8): the cell that
# says `hot-fixed` would be invisible; then rich markup that must stay text.
PAYLOAD = "\x1b[2J\x1b]0;owned\x07\x1b[8m[red]x[/red]"
QUOTED = "\\033[2J\\033]0;owned\\a\\033[8m[red]x[/red]"
COLOUR = {"NO_COLOR": "", "FORCE_COLOR": "1"}
OUR_COLOURS = re.compile(r"\x1b\[[0-9;]*m")


def assert_quoted(text: str, where: object, shown: bool = True) -> None:
    """No escape sequence but our own colours (never SGR 8, conceal); the payload, where
    the command shows it, quoted."""
    assert "\x1b[8m" not in text and "\x1b[2J" not in text and "\x1b]" not in text, (where, text)
    assert "\x1b" not in OUR_COLOURS.sub("", text), (where, text)
    assert not shown or QUOTED in OUR_COLOURS.sub("", text), (where, text)


def git(store: Path, *args: str, input: str | None = None) -> str:  # noqa: A002 - as subprocess.run
    who = {f"GIT_{role}_{what}": value for role in ("AUTHOR", "COMMITTER")
           for what, value in (("NAME", "eve"), ("EMAIL", "eve@remote"))}
    return subprocess.run(["git", "--git-dir", str(store), *args], input=input, capture_output=True, text=True,
                          check=True, env={**os.environ, **who}).stdout


def hostile_site(make_site_packages) -> Path:
    """A site-packages whose sglang dist-info says the payload is its version (RECORD matches)."""
    import base64
    import hashlib

    code = "a = 1\n"
    digest = base64.urlsafe_b64encode(hashlib.sha256(code.encode()).digest()).rstrip(b"=").decode()
    return make_site_packages("ct200", files={
        f"{SRT}/a.py": code,
        "sglang-0.5.23.dist-info/METADATA": f"Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23{PAYLOAD}\n\n",
        "sglang-0.5.23.dist-info/RECORD": f"{SRT}/a.py,sha256={digest},{len(code)}\n"
                                          "sglang-0.5.23.dist-info/RECORD,,\n",
        "sglang-0.5.23.dist-info/top_level.txt": "sglang\n",
    })


def test_a_version_from_a_nodes_metadata_is_quoted(make_site_packages, ssh_node, write_config,
                                                   run_snapver) -> None:
    """nodes --check, pull, log, show, status, verify: the node's `Version:` is shown quoted."""
    site = hostile_site(make_site_packages)
    write_config({"ct200": ssh_node("ct200", site)})
    pulled = run_snapver("pull", "ct200", env=COLOUR)
    assert pulled.code == 0, pulled
    assert "\x1b[2J" not in pulled.out + pulled.err, pulled
    store = Path.cwd() / "snapshots"
    meta = git(store, "log", "-1", "--format=%B", "refs/heads/nodes/ct200")
    assert PAYLOAD.replace("\x1b", "\\u001b").replace("\x07", "\\u0007") in meta  # kept as the node said
    for command in (["nodes", "--check"], ["log"], ["log", "--oneline"], ["show", "ct200"], ["status"],
                    ["verify", "ct200"]):
        result = run_snapver(*command, env=COLOUR)
        assert result.code == 0, (command, result)
        assert OUR_COLOURS.search(result.out) or command[0] in ("show", "verify"), (command, result)
        assert "\x1b" not in result.err, (command, result)
        assert_quoted(result.out, command, shown=command != ["log", "--oneline"])


def test_a_writer_message_and_facts_from_the_store_are_quoted(make_site_packages, local_node, write_config,
                                                              run_snapver) -> None:
    """A snapshot commit (as a team remote may bring one) whose writer, message, hostname,
    python and site-packages hold escape sequences and markup: log and show quote each."""
    site = make_site_packages("n", files={f"{SRT}/a.py": "a = 1\n"})
    write_config({"n": local_node(site)})
    assert run_snapver("pull", "n").code == 0
    store = Path.cwd() / "snapshots"
    ref = "refs/heads/nodes/n"
    body = git(store, "log", "-1", "--format=%B", ref)
    head, _, meta_line = body.rstrip("\n").rpartition("snapver-meta: ")
    meta = json.loads(meta_line)
    meta.update(writer=f"eve{PAYLOAD}", message=f"fine{PAYLOAD}", hostname=f"h{PAYLOAD}", python=f"3.12{PAYLOAD}",
                site_packages=f"/s{PAYLOAD}", host=f"10.0.0.1{PAYLOAD}")
    message = head + "snapver-meta: " + json.dumps(meta, sort_keys=True, separators=(",", ":")) + "\n"
    tree = git(store, "rev-parse", f"{ref}^{{tree}}").strip()
    forged = git(store, "commit-tree", tree, input=message).strip()
    git(store, "update-ref", ref, forged)
    (site / SRT / "a.py").write_text("a = 2\n")  # a second writer's snapshot on top: log says "by"
    assert run_snapver("pull", "n").code == 0
    for command in (["log"], ["log", "--oneline"], ["show", "n~1"], ["show", forged[:10]]):
        result = run_snapver(*command, env=COLOUR)
        assert result.code == 0, (command, result)
        assert OUR_COLOURS.search(result.out) or command[0] == "show", (command, result)
        assert_quoted(result.out + result.err, command)


def test_the_team_sync_warning_quotes_what_it_was_told(make_site_packages, local_node, write_config,
                                                       run_snapver) -> None:
    """`[store] sync = "auto"` that cannot reach its remote warns on stderr with the reason,
    which names the remote: its escape sequence is quoted there too."""
    site = make_site_packages("n", files={f"{SRT}/a.py": "a = 1\n"})
    config = write_config({"n": local_node(site)})
    assert run_snapver("pull", "n").code == 0
    remote = "/nonexistent/\x1b[2Jteam.git"
    config.write_text(config.read_text().replace('path = "snapshots"\n', 'path = "snapshots"\nremote = '
                                                 + json.dumps(remote) + '\nsync = "auto"\n'))
    result = run_snapver("log", env=COLOUR)
    assert result.code == 0 and "not synced with the team" in result.err, result
    assert "\x1b" not in result.err and "/nonexistent/\\033[2Jteam.git" in result.err, result
