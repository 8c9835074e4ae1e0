"""The first commands as a user types them: init, nodes [--check], pull, log, show, fsck.

Each runs `python -m snapver` in a subprocess; exit codes and output are checked, and
no run may print a traceback.
"""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import tomllib
from helpers import Result

import snapver

SRT = "sglang/srt"
DIST_INFO = {"sglang-0.5.23.dist-info/METADATA": "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n"}


def ok(result: Result) -> Result:
    assert result.code == 0, str(result)
    assert "Traceback" not in result.out + result.err, str(result)
    return result


def fails(result: Result, code: int, *words: str) -> Result:
    """Exit ``code`` with one `snapver: error:` line (and maybe a hint) naming ``words``."""
    assert result.code == code, str(result)
    assert "Traceback" not in result.out + result.err, str(result)
    assert result.err.startswith("snapver: error: "), str(result)
    lines = [line for line in result.err.splitlines() if line]
    assert len(lines) <= 2 and all(line.startswith(("snapver: error: ", "hint: ")) for line in lines), str(result)
    for word in words:
        assert word in result.err, f"{word!r} not in:\n{result}"
    return result


def git(store: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(store), *args], capture_output=True, text=True,
                          check=True).stdout


@pytest.fixture
def fleet(make_site_packages, ssh_node, local_node, write_config, tmp_path) -> dict[str, Path]:
    """ct200 (ssh), laptop (local), both healthy; group tp8; the config in the cwd."""
    sites = {
        "ct200": make_site_packages("ct200", files={**DIST_INFO, f"{SRT}/a.py": "a = 1\n",
                                                    f"{SRT}/bin.dat": b"\x00\xff\xfe caf\xe9\n"}),
        "laptop": make_site_packages("laptop", files={f"{SRT}/a.py": "a = 1\n"}),
    }
    write_config({"ct200": ssh_node("ct200", sites["ct200"]), "laptop": local_node(sites["laptop"])},
                 groups={"tp8": ["ct200", "laptop"]})
    return sites


# --------------------------------------------------------------------------- the basics


def test_version_and_help(run_snapver) -> None:
    assert ok(run_snapver("--version")).out.strip() == f"snapver {snapver.__version__}"
    assert ok(run_snapver("-V")).out.strip() == f"snapver {snapver.__version__}"
    helped = ok(run_snapver("--help")).out
    for command in ("init", "nodes", "pull", "log", "show", "fsck"):
        assert re.search(rf"^\W*{command}\b", helped, re.MULTILINE), helped
    bare = run_snapver()  # no arguments: the help, never a traceback (nor an empty "snapver: error: ")
    assert bare.code in (0, 2) and "Commands" in bare.out + bare.err and "Traceback" not in bare.err
    assert "snapver: error:" not in bare.err, bare.err
    # A usage error is one line and a hint, like every other error (not click's Usage:/Error: form).
    wrong = run_snapver("diff", "--bogus")
    assert wrong.code == 2 and wrong.err.splitlines() == ["snapver: error: No such option: --bogus",
                                                           "hint: see `snapver diff --help`"], wrong


def test_unknown_command_and_option_are_usage_errors(run_snapver) -> None:
    for args in (["frobnicate"], ["log", "-n", "zero"]):
        result = run_snapver(*args)
        assert result.code == 2, str(result)
        assert "Traceback" not in result.err


def test_init_writes_the_example_and_an_empty_store(run_snapver) -> None:
    here = Path.cwd()
    out = ok(run_snapver("init")).out
    config = here / ".snapver"
    assert str(config) in out
    text = config.read_text()
    for key in ("path", "user", "paths", "exclude", "identity_file", "known_hosts", "host_key_policy",
                "connect_timeout", "host", "port", "site_packages", "python", "local"):
        assert re.search(rf"^#?\s*{key}\b", text, re.MULTILINE), f"{key} is not documented"
    assert "\n[groups]\n" in text
    parsed = tomllib.loads(text)
    assert parsed.get("nodes", {}) == {}  # no node the user did not ask for
    assert f'# site_packages = "{sysconfig.get_paths()["purelib"]}"' in text  # documented, commented out
    assert git(here / "snapshots", "rev-parse", "--is-bare-repository").strip() == "true"
    # A second init keeps the user's edits.
    config.write_text(text + "\n# my edit\n")
    assert "kept" in ok(run_snapver("init")).out
    assert config.read_text().endswith("# my edit\n")
    # No node yet: commands that need one say so (exit 2), none fails to reach a node.
    for command in (["pull"], ["status"], ["pull", "--all"]):
        fails(run_snapver(*command), 2, "no nodes in")
    # --local asks for the embedded default's node: this Python's site-packages.
    elsewhere = here / "with-local"
    elsewhere.mkdir()
    assert "node `local`" in ok(run_snapver("init", "--local", cwd=elsewhere)).out
    local = tomllib.loads((elsewhere / ".snapver").read_text())["nodes"]
    assert local == {"local": {"local": True, "site_packages": sysconfig.get_paths()["purelib"]}}
    # That node has no sglang here: exit 3 naming the remote path.
    fails(run_snapver("pull", cwd=elsewhere), 3, str(Path(sysconfig.get_paths()["purelib"]) / "sglang"))


def test_config_is_found_by_flag_environment_and_parents(fleet, run_snapver, tmp_path) -> None:
    deep = Path.cwd() / "a" / "b"
    deep.mkdir(parents=True)
    assert "ct200" in ok(run_snapver("nodes", cwd=deep)).out
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    config = Path.cwd() / ".snapver"
    assert "ct200" in ok(run_snapver("--config", str(config), "nodes", cwd=elsewhere)).out
    assert "ct200" in ok(run_snapver("nodes", cwd=elsewhere, env={"SNAPVER_CONFIG": str(config)})).out
    fails(run_snapver("--config", str(tmp_path / "missing.toml"), "nodes"), 2, "missing.toml")


# --------------------------------------------------------------------------- nodes


def test_nodes_lists_nodes_and_groups(fleet, run_snapver) -> None:
    out = ok(run_snapver("nodes")).out
    assert "ct200" in out and "laptop" in out and "group tp8: ct200, laptop" in out
    assert str(fleet["ct200"]) in out
    document = json.loads(ok(run_snapver("nodes", "--json")).out)
    assert [node["node"] for node in document["nodes"]] == ["ct200", "laptop"]
    assert document["groups"] == {"tp8": ["ct200", "laptop"]}


def test_nodes_check_reaches_every_node(fleet, ssh_node, local_node, write_config, run_snapver, tmp_path) -> None:
    out = ok(run_snapver("nodes", "--check")).out
    ct200 = next(line for line in out.splitlines() if line.startswith("ct200"))
    assert "yes" in ct200 and "sglang 0.5.23" in ct200 and str(fleet["ct200"]) in ct200
    assert re.search(r"3\.\d+\.\d+", ct200)

    # A node that answers is reachable, whatever fails after: its python missing, its
    # site-packages missing (they were called unreachable, the error in the site-packages column).
    write_config({"ct200": ssh_node("ct200", fleet["ct200"]),
                  "dead": ssh_node("fleet00", fleet["ct200"], port=closed_port()),
                  "nopython": ssh_node("ct129", fleet["ct200"], python=str(tmp_path / "no-python")),
                  "nosite": local_node(tmp_path / "no-such-site")})
    result = run_snapver("nodes", "--check")
    assert result.code == 3, str(result)
    assert "Traceback" not in result.err
    assert "dead" in result.err and str(tmp_path / "no-such-site") in result.err and "no-python" in result.err
    rows = {line.split()[0]: line.split() for line in result.out.splitlines() if line.strip()}
    assert rows["ct200"][2] == "yes" and rows["dead"][2] == "no"
    assert rows["nopython"][2:5] == ["yes", "?", str(fleet["ct200"])], rows["nopython"]
    assert rows["nosite"][2:5] == ["yes", "?", str(tmp_path / "no-such-site")], rows["nosite"]
    document = json.loads(run_snapver("nodes", "--check", "--json").out)
    assert {n["node"]: n["reachable"] for n in document["nodes"]} == {"ct200": True, "dead": False,
                                                                     "nopython": True, "nosite": True}
    # Every error is one line and a hint (SPEC), a node's too: they came without one.
    for node, words in (("dead", "nodes --check"), ("nosite", "site_packages")):
        lines = run_snapver("pull", node).err.strip().splitlines()
        assert len(lines) == 2 and lines[0].startswith("snapver: error: ") and lines[1].startswith("hint: "), lines
        assert words in lines[1], lines


def closed_port() -> int:
    """A loopback port with nobody listening."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.10", 0))
        return probe.getsockname()[1]


# --------------------------------------------------------------------------- pull


def test_pull_prints_one_summary_line_per_node(fleet, run_snapver) -> None:
    result = ok(run_snapver("pull", "tp8"))
    lines = result.out.splitlines()
    assert len(lines) == 2, result.out
    for line in lines:
        assert re.fullmatch(r"(ct200|laptop): snapshot [0-9a-f]{10} — \d+ files, \d+ changed, "
                            r"[\d.]+ k?B transferred .*[\d.]+ s", line), line
    assert result.err == ""  # no progress bar without a terminal
    again = ok(run_snapver("pull", "tp8"))
    assert all("unchanged since" in line for line in again.out.splitlines())


def test_pull_shows_a_progress_bar_on_a_terminal(fleet, run_snapver) -> None:
    master, slave = os.openpty()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), TERM="xterm")
    process = subprocess.Popen([sys.executable, "-m", "snapver", "pull", "laptop"], stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    out = process.stdout.read() if process.stdout else b""
    process.wait(timeout=60)
    terminal = b""
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:
            break
        if not chunk:
            break
        terminal += chunk
    os.close(master)
    assert process.returncode == 0, (out, terminal)
    assert b"pulling" in terminal and b"files" in terminal
    assert b"laptop: snapshot" in out


def test_pull_usage_errors(fleet, run_snapver) -> None:
    fails(run_snapver("pull", "ct201"), 2, "ct201", "ct200", "laptop", "tp8")
    fails(run_snapver("pull"), 2, "ct200", "laptop", "--all")
    fails(run_snapver("pull", "tp8", "--tag", "v1"), 2, "--tag")
    fails(run_snapver("pull", "ct200", "--tag", "bad name"), 2, "bad name")
    assert not (Path.cwd() / "snapshots" / "refs" / "tags" / "v1").exists()


def test_pull_tag_and_message(fleet, run_snapver) -> None:
    ok(run_snapver("pull", "ct200", "--tag", "may22", "-m", "before the dflash fix"))
    store = Path.cwd() / "snapshots"
    head = git(store, "rev-parse", "refs/heads/nodes/ct200").strip()
    assert git(store, "rev-parse", "may22^{commit}").strip() == head
    assert "before the dflash fix" in git(store, "log", "-1", "--format=%B", head)
    # Like `snapver tag`, pull never moves an existing tag; nothing is pulled then.
    (fleet["ct200"] / SRT / "a.py").write_text("a = 3\n")
    fails(run_snapver("pull", "ct200", "--tag", "may22"), 2, "may22", head[:10], "--force")
    assert git(store, "rev-parse", "may22^{commit}").strip() == head
    assert git(store, "rev-parse", "refs/heads/nodes/ct200").strip() == head


def test_pull_json_is_one_document(fleet, run_snapver) -> None:
    result = ok(run_snapver("pull", "--json", "tp8"))
    document = json.loads(result.out)
    assert document["exit_code"] == 0
    assert {n["node"] for n in document["nodes"]} == {"ct200", "laptop"}
    for node in document["nodes"]:
        assert {"snapshot", "unchanged_since", "files", "changed", "fetched_files", "fetched_bytes",
                "seconds", "error"} <= set(node)


# --------------------------------------------------------------------------- log and show


@pytest.fixture
def history(fleet, run_snapver) -> dict[str, str]:
    """Two snapshots of ct200 (the second tagged) and one of laptop: name → commit id."""
    store = Path.cwd() / "snapshots"
    ok(run_snapver("pull", "ct200"))
    first = git(store, "rev-parse", "refs/heads/nodes/ct200").strip()
    (fleet["ct200"] / SRT / "a.py").write_text("a = 2  # hot-fix\n")
    (fleet["ct200"] / SRT / "new.py").write_text("new\n")
    ok(run_snapver("pull", "ct200", "--tag", "hotfix", "-m", "after the hot-fix"))
    ok(run_snapver("pull", "laptop"))
    return {"first": first, "second": git(store, "rev-parse", "refs/heads/nodes/ct200").strip(),
            "laptop": git(store, "rev-parse", "refs/heads/nodes/laptop").strip()}


def test_log_lists_snapshots_newest_first(history, run_snapver) -> None:
    lines = ok(run_snapver("log")).out.splitlines()
    ids = [line.split()[0] for line in lines]
    # Snapshots of different nodes in the same second may come in either order; a node's own never.
    assert sorted(ids) == sorted(history[k][:10] for k in ("laptop", "second", "first"))
    assert ids.index(history["second"][:10]) < ids.index(history["first"][:10])
    dates = [" ".join(line.split()[1:3]) for line in lines]
    assert dates == sorted(dates, reverse=True)
    lines = {line.split()[0]: line for line in lines}
    second = lines[history["second"][:10]]
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d", second)
    assert "ct200" in second and "3 files, 2 changed" in second and "sglang 0.5.23" in second
    assert "hotfix" in second and "after the hot-fix" in second
    assert "2 files, 2 changed" in lines[history["first"][:10]]

    only = ok(run_snapver("log", "ct200", "-n", "1")).out.splitlines()
    assert [line.split()[0] for line in only] == [history["second"][:10]]
    document = json.loads(ok(run_snapver("log", "--json", "ct200")).out)
    assert [s["id"] for s in document["snapshots"]] == [history["second"], history["first"]]
    assert document["snapshots"][0]["tags"] == ["hotfix"]
    fails(run_snapver("log", "ct201"), 2, "ct201", "ct200", "laptop")


def test_show_json_of_a_file_above_a_mib_is_base64_written_as_read(make_site_packages, local_node, write_config,
                                                                      run_snapver) -> None:
    """Past 1 MiB a file's JSON is base64, written piece by piece as the store gives it (the
    pieces' base64 must join up: 3 MiB + 1 byte, not a multiple of 3 nor of the piece)."""
    data = bytes(range(256)) * (3 * 4096) + b"!"
    site = make_site_packages("n", files={f"{SRT}/big.bin": data, f"{SRT}/big.txt": "é" * (1 << 20)})
    write_config({"n": local_node(site)})
    assert run_snapver("pull", "n").code == 0
    document = json.loads(ok(run_snapver("show", "--json", "n", f"{SRT}/big.bin")).out)
    assert (document["encoding"], document["size"]) == ("base64", len(data))
    assert base64.b64decode(document["content"], validate=True) == data
    text = json.loads(ok(run_snapver("show", "--json", "n", f"{SRT}/big.txt")).out)  # 2 MiB of UTF-8: base64 too
    assert base64.b64decode(text["content"]).decode() == "é" * (1 << 20)


def test_show_metadata_and_file_content(history, fleet, run_snapver) -> None:
    out = ok(run_snapver("show", "ct200")).out
    assert history["second"] in out
    for expected in ("ct200", str(fleet["ct200"]), "sglang 0.5.23", "hotfix", "after the hot-fix", "3 "):
        assert expected in out, out
    assert ok(run_snapver("show", "hotfix")).out.splitlines()[0] == f"snapshot {history['second']}"
    assert ok(run_snapver("show", history["first"][:8])).out.splitlines()[0] == f"snapshot {history['first']}"
    old = subprocess.run([sys.executable, "-m", "snapver", "show", "ct200~1", f"{SRT}/a.py"],
                         capture_output=True, env=dict(os.environ, PYTHONPATH=str(Path(snapver.__file__).parents[1])))
    assert (old.returncode, old.stdout) == (0, b"a = 1\n")
    binary = subprocess.run([sys.executable, "-m", "snapver", "show", "ct200", f"{SRT}/bin.dat"],
                            capture_output=True, env=dict(os.environ,
                                                          PYTHONPATH=str(Path(snapver.__file__).parents[1])))
    assert binary.stdout == (fleet["ct200"] / SRT / "bin.dat").read_bytes()
    document = json.loads(ok(run_snapver("show", "--json", "ct200")).out)
    assert document["id"] == history["second"]
    assert {e["path"] for e in document["manifest"]} == {f"{SRT}/a.py", f"{SRT}/bin.dat", f"{SRT}/new.py"}
    # A file with --json: one JSON document (it printed the raw content), text or base64.
    text = json.loads(ok(run_snapver("show", "--json", "ct200~1", f"{SRT}/a.py")).out)
    assert (text["encoding"], text["content"], text["path"], text["size"]) == ("utf-8", "a = 1\n", f"{SRT}/a.py", 6)
    data = json.loads(ok(run_snapver("show", "--json", "ct200", f"{SRT}/bin.dat")).out)
    assert data["encoding"] == "base64" and base64.b64decode(data["content"]) == binary.stdout

    fails(run_snapver("show", "ct200", f"{SRT}/nope.py"), 2, "nope.py")
    fails(run_snapver("show", "nosuch"), 2, "nosuch", "ct200")
    fails(run_snapver("show", "ct200~5"), 2, "ct200")


# --------------------------------------------------------------------------- fsck


def test_fsck_passes_a_sound_store_and_catches_a_lying_manifest(fleet, run_snapver) -> None:
    store = Path.cwd() / "snapshots"
    ok(run_snapver("pull", "tp8"))
    assert re.search(r"store ok: 2 snapshots", ok(run_snapver("fsck")).out)
    # Forge a snapshot whose tree no longer matches its manifest: a.py replaced behind snapver's back.
    head = git(store, "rev-parse", "refs/heads/nodes/ct200").strip()
    forged_blob = subprocess.run(["git", "--git-dir", str(store), "hash-object", "-w", "--stdin"],
                                 input=b"forged\n", capture_output=True, check=True).stdout.decode().strip()
    index = {**os.environ, "GIT_INDEX_FILE": str(store / "forge-index")}
    subprocess.run(["git", "--git-dir", str(store), "read-tree", head], env=index, check=True)
    subprocess.run(["git", "--git-dir", str(store), "update-index", "--cacheinfo",
                    f"100644,{forged_blob},{SRT}/a.py"], env=index, check=True)
    tree = subprocess.run(["git", "--git-dir", str(store), "write-tree"], env=index, capture_output=True,
                          text=True, check=True).stdout.strip()
    message = git(store, "log", "-1", "--format=%B", head)
    forged = subprocess.run(["git", "--git-dir", str(store), "-c", "user.name=x", "-c", "user.email=x@x",
                             "commit-tree", tree, "-p", head], input=message, capture_output=True, text=True,
                            check=True).stdout.strip()
    git(store, "update-ref", "refs/heads/nodes/ct200", forged)
    result = run_snapver("fsck")
    assert result.code == 4, str(result)
    assert "Traceback" not in result.err
    assert f"{SRT}/a.py" in result.err and forged[:10] in result.err

    # Put the true snapshot back, then damage the stored bytes themselves.
    git(store, "update-ref", "refs/heads/nodes/ct200", head)
    ok(run_snapver("fsck"))
    largest = max((f for f in (store / "objects").rglob("*") if f.is_file() and "info" not in f.parts),
                  key=lambda f: f.stat().st_size)
    data = bytearray(largest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    largest.chmod(0o644)
    largest.write_bytes(bytes(data))
    result = run_snapver("fsck")
    assert result.code == 4 and "Traceback" not in result.err, str(result)
    assert "problem" in result.err


def test_commands_need_a_store(fleet, run_snapver) -> None:
    for args in (["log"], ["show", "ct200"], ["fsck"]):
        fails(run_snapver(*args), 4, "snapshots", "snapver pull")


# --------------------------------------------------------------------------- bad configs

BAD = {
    "unknown key": ("[nodes.ct200]\nhost = 'h'\nsite_packages = '/sp'\nhots = 'x'\n", "nodes.ct200.hots"),
    "wrong type": ("[nodes.ct200]\nhost = 'h'\nsite_packages = '/sp'\nport = '22'\n", "nodes.ct200.port"),
    "no site_packages": ("[nodes.ct200]\nlocal = true\n", "nodes.ct200"),  # a local folder node names its folder
    "group of ghosts": ("[nodes.ct200]\nhost = 'h'\nsite_packages = '/sp'\n[groups]\ntp8 = ['ct200', 'ct129']\n",
                        "groups.tp8"),
    "not TOML": ("[nodes.ct200\nhost = \n", "not valid TOML"),
}


@pytest.mark.parametrize(("case", "command"), [
    ("unknown key", ["pull", "ct200"]), ("wrong type", ["nodes", "--check"]), ("no site_packages", ["log"]),
    ("group of ghosts", ["show", "ct200"]), ("not TOML", ["fsck"])], ids=list(BAD))
def test_bad_config_is_exit_2_naming_file_and_key(run_snapver, case: str, command: list[str]) -> None:
    text, key = BAD[case]
    config = Path.cwd() / ".snapver"
    config.write_text(text)
    fails(run_snapver(*command), 2, str(config), key)


# --------------------------------------------------------------------------- help: order, names, examples

WORKFLOW = ["init", "nodes", "pull", "log", "show", "tag", "diff", "status", "verify", "patch", "push",
            "rollback", "ps", "env", "import", "sync", "fsck"]
PATCH_COMMANDS = ["new", "save", "import", "capture", "list", "show", "export", "rebase", "delete"]


def test_commands_are_listed_in_workflow_order(run_snapver) -> None:
    helped = ok(run_snapver("--help", env={"COLUMNS": "100"})).out
    listed = re.findall(r"^│ (\w+) ", helped.split("Commands")[1], re.MULTILINE)
    assert listed == WORKFLOW, listed


def test_every_help_has_examples_and_one_spelling_of_arguments(run_snapver) -> None:
    """1-3 examples of real commands in each help; arguments spelled NODE, REF, PATCH,
    [NODE|GROUP]... (required bare, optional in brackets); no line wider than 80 columns."""
    commands = [[name] for name in WORKFLOW if name != "patch"] + [["patch", name] for name in PATCH_COMMANDS]
    usages = {}
    for command in commands:
        text = ok(run_snapver(*command, "--help", env={"COLUMNS": "80"})).out
        assert all(len(line) <= 80 for line in text.splitlines()), command
        examples = text.split("Examples:")[1].split("╭")[0].split("\n") if "Examples:" in text else []
        examples = [line.strip() for line in examples if line.strip()]
        assert 1 <= len(examples) <= 3, (command, text)
        for example in examples:
            words = example.split("|")[-1].split()  # `git diff | snapver patch import …`
            assert words[0] == "snapver" and words[1:1 + len(command)] == command, (command, example)
        usage = re.search(r"Usage: snapver (.*)", text)
        assert usage, text
        usages[" ".join(command)] = usage.group(1).strip()
        assert "{" not in usage.group(1) and not re.search(r"\b[a-z]+\]", usage.group(1)), usage.group(1)
    assert usages["diff"] == "diff [OPTIONS] REF [REF] [-- PATH...]"
    assert usages["log"] == "log [OPTIONS] [NODE] [-- PATH...]"
    assert usages["show"] == "show [OPTIONS] [REF] [PATH]"  # SPEC: show [REF] [PATH]
    assert usages["tag"] == "tag [OPTIONS] [NAME] [REF]"
    assert usages["pull"] == "pull [OPTIONS] [NODE|GROUP]..."
    assert usages["status"] == "status [OPTIONS] [NODE|GROUP]... [-- PATH...]"
    assert usages["push"] == "push [OPTIONS] PATCH [NODE|GROUP]..."
    assert usages["rollback"] == "rollback [OPTIONS] NODE|GROUP..."
    assert usages["patch show"] == "patch show [OPTIONS] PATCH"
    assert usages["patch capture"] == "patch capture [OPTIONS] PATCH NODE"


def test_a_reader_that_goes_away_ends_a_read_only_command_quietly(make_site_packages, local_node, write_config,
                                                                   run_snapver) -> None:
    """`snapver log | true` (the reader closed before we wrote): exit 0 and nothing on stderr,
    not 1 (which means "differences found") — also where rich prints (with FORCE_COLOR,
    or a line rich must render: `show | head -1` reached rich's own handler, which exits 1)."""
    site = make_site_packages("n", files={"sglang/srt/a.py": "a = 1\n"})
    write_config({"n": local_node(site)})
    assert run_snapver("pull", "n").code == 0
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    for command, colour in [(c, f) for c in (["log"], ["show", "n"], ["nodes"]) for f in ({}, {"FORCE_COLOR": "1"})]:
        read_end, write_end = os.pipe()
        os.close(read_end)  # the reader is gone before snapver writes a byte
        done = subprocess.run([sys.executable, "-m", "snapver", *command], stdout=write_end, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, env={**env, **colour}, timeout=60)
        os.close(write_end)
        assert done.returncode == 0 and done.stderr == b"", (command, colour, done)


def _installed_site(make_site_packages, name: str, code: str = "a = 1\n") -> Path:
    """A site-packages whose sglang dist-info RECORD holds sglang/srt/a.py as ``code``."""
    import hashlib

    digest = base64.urlsafe_b64encode(hashlib.sha256(code.encode()).digest()).rstrip(b"=").decode()
    return make_site_packages(name, files={
        "sglang/srt/a.py": code,
        "sglang-0.5.23.dist-info/METADATA": "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n\n",
        "sglang-0.5.23.dist-info/RECORD": f"sglang/srt/a.py,sha256={digest},{len(code)}\n"
                                          "sglang-0.5.23.dist-info/RECORD,,\n"})


def test_differences_piped_to_a_reader_that_goes_away_still_exit_1(make_site_packages, local_node, write_config,
                                                                   run_snapver) -> None:
    """`snapver diff n | head`: the differences were found, whether or not the reader read them
    all: diff, status and verify keep their exit 1 (it was 0), plain and where rich prints."""
    site = _installed_site(make_site_packages, "n")
    write_config({"n": local_node(site), "m": local_node(_installed_site(make_site_packages, "m"))})
    assert run_snapver("pull", "n", "m").code == 0
    (site / "sglang/srt/a.py").write_text("a = 2\n" * 2000)  # more than a pipe holds
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    commands = (["diff", "n"], ["diff", "n", "--stat"], ["diff", "n", "--name-status"], ["diff", "n", "--json"],
                ["status"], ["status", "--files"], ["verify", "n"], ["verify", "n", "--json"])
    for command, colour in [(c, f) for c in commands for f in ({}, {"FORCE_COLOR": "1"})]:
        read_end, write_end = os.pipe()
        os.close(read_end)  # the reader is gone before snapver writes a byte
        done = subprocess.run([sys.executable, "-m", "snapver", *command], stdout=write_end, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, env={**env, **colour}, timeout=60)
        os.close(write_end)
        assert done.returncode == 1 and done.stderr == b"", (command, colour, done)
    piped = subprocess.run(["bash", "-o", "pipefail", "-c", f"{sys.executable} -m snapver diff n | head -1"],
                           capture_output=True, env=env, timeout=60)
    assert piped.returncode == 1 and piped.stdout.startswith(b"diff --git"), piped


def test_a_closed_standard_stream_is_no_traceback(make_site_packages, local_node, write_config, run_snapver) -> None:
    """`snapver log >&-`: Python leaves sys.stdout None (an AttributeError and a traceback,
    exit 1); `diff nosuch 2>&-` exited 1, not 2. A closed stream is /dev/null now."""
    site = make_site_packages("n", files={"sglang/srt/a.py": "a = 1\n"})
    write_config({"n": local_node(site)})
    assert run_snapver("pull", "n").code == 0
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    python = sys.executable
    for line, code in ((f"{python} -m snapver log -n 1 >&-", 0), (f"{python} -m snapver diff nosuch 2>&-", 2),
                       (f"{python} -m snapver log -n 1 <&-", 0)):
        done = subprocess.run(["bash", "-c", line], capture_output=True, env=env, timeout=60)
        assert done.returncode == code and b"Traceback" not in done.stderr, (line, done)


def test_init_makes_the_config_named_by_flag_or_environment(run_snapver, tmp_path) -> None:
    """`--config FILE init` writes FILE (not `.snapver` here) and the store FILE names, with
    the writer asked for; on an existing FILE it keeps it and sets that store's writer.
    $SNAPVER_CONFIG is honoured the same way; a bad writer id writes nothing."""
    here = Path.cwd()
    team = tmp_path / "team"
    team.mkdir()
    config = team / "team.toml"
    fails(run_snapver("--config", str(config), "init", "--writer", "no/slash"), 2, "writer")
    assert not config.exists() and not (here / ".snapver").exists()
    result = json.loads(ok(run_snapver("--config", str(config), "init", "--writer", "alice@lab", "--json")).out)
    assert (result["config"], result["config_created"], result["writer"]) == (str(config), True, "alice@lab")
    assert result["store"] == str(team / "snapshots")  # relative to the config file
    assert not (here / ".snapver").exists() and not (here / "snapshots").exists()
    assert git(team / "snapshots", "config", "snapver.writer").strip() == "alice@lab"
    config.write_text(config.read_text() + "\n# kept\n")
    again = json.loads(ok(run_snapver("init", "--writer", "bob@lab", "--json",
                                      env={"SNAPVER_CONFIG": str(config)})).out)
    assert (again["config_created"], again["writer"]) == (False, "bob@lab")
    assert config.read_text().endswith("# kept\n")
    assert git(team / "snapshots", "config", "snapver.writer").strip() == "bob@lab"
    fails(run_snapver("--config", str(tmp_path / "absent" / "x.toml"), "init"), 2, "cannot write the config")


def test_patch_help_has_examples_of_its_subcommands(run_snapver) -> None:
    """`snapver patch --help` shows how a patch is made and recorded: 1-3 examples, each a
    real patch subcommand, within 80 columns; the command list still names each subcommand."""
    text = ok(run_snapver("patch", "--help", env={"COLUMNS": "80"})).out
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert "Examples:" in text, text
    examples = [line.strip() for line in text.split("Examples:")[1].split("╭")[0].splitlines() if line.strip()]
    assert 1 <= len(examples) <= 3, text
    for example in examples:
        words = example.split("#")[0].split("|")[-1].split()  # `git diff | snapver patch import …`
        assert words[:2] == ["snapver", "patch"] and words[2] in PATCH_COMMANDS, (example, text)
        assert example.startswith(("snapver ", "git ")), example  # indented as every command's examples
    listed = re.findall(r"^│ (\w+) ", text.split("Commands")[1], re.MULTILINE)
    assert listed == PATCH_COMMANDS, listed
