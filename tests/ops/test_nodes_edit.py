"""`snapver nodes add` / `nodes rm`: .snapver edited with its comments kept, checked by the
config loader before it is written, replaced atomically and only if nobody changed it
meanwhile (a second real process: an editor's save, another snapver)."""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SRT = "sglang/srt"


def hand_written(sshd) -> str:
    """A config as a person writes it: comments everywhere, defaults for the test sshd."""
    return (
        "# our two racks\n"
        "[store]\n"
        'path = "snapshots"   # the git store\n'
        "\n"
        "[defaults]\n"
        'user = "root"\n'
        f'identity_file = "{sshd.identity_file}"  # the CI key\n'
        f'known_hosts = "{sshd.known_hosts}"\n'
        f"port = {sshd.port}\n"
        "connect_timeout = 5\n"
        "\n"
        "# rack 3\n"
        "[nodes.ct200]\n"
        f'host = "{sshd.addresses["ct200"]}"  # the first box\n'
        'site_packages = "/nonexistent/site-packages"\n'
        "\n"
        "[groups]\n"
        'tp8 = ["ct200"]  # tensor parallel\n'
    )


def only_insertions(before: str, after: str) -> list[str]:
    """The lines ``after`` adds to ``before``; fails if any line of ``before`` changed or went."""
    added = []
    for line in difflib.ndiff(before.splitlines(), after.splitlines()):
        assert not line.startswith(("- ", "? ")), (line, after)
        if line.startswith("+ "):
            added.append(line[2:])
    return added


def snapver(*args: str, env: dict[str, str] | None = None, **popen: object) -> subprocess.Popen[str]:
    full = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "snapver", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=full, stdin=subprocess.DEVNULL, **popen)


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """The processes a test starts: ended whatever happens (a held one waits for its gate)."""
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=60)


def wait_for(path: Path, what: str) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline, f"{what} did not happen within 60 s"
        time.sleep(0.02)


def test_add_keeps_comments_and_the_node_works_over_ssh(sshd, make_site_packages, run_snapver) -> None:
    config = Path(".snapver")
    config.write_text(hand_written(sshd))
    before = config.read_text()
    site = make_site_packages("ct129", files={f"{SRT}/a.py": "a = 1\n"})
    added = run_snapver("nodes", "add", "ct129", "--host", sshd.addresses["ct129"], "--site-packages", str(site))
    assert added.code == 0, added
    after = config.read_text()
    assert set(only_insertions(before, after)) == {"[nodes.ct129]", f'host = "{sshd.addresses["ct129"]}"',
                                                  f'site_packages = "{site}"', ""}
    pulled = run_snapver("pull", "ct129")  # the new table, with the defaults, reaches the node
    assert pulled.code == 0, pulled
    again = run_snapver("nodes", "add", "ct129", "--host", "127.0.0.1", "--python", "/usr/bin/python3")
    assert again.code == 2 and "already" in again.err and "Traceback" not in again.err, again
    assert config.read_text() == after


def test_a_bad_result_is_refused_before_anything_is_written(sshd, run_snapver) -> None:
    config = Path(".snapver")
    config.write_text(hand_written(sshd))
    before = config.read_bytes()
    for args, said in ((["ct129", "--host", "bad host", "--python", "/usr/bin/python3"], "nodes.ct129.host"),
                       (["ct129", "--local"], "needs site_packages or python"),
                       (["tp8", "--host", "10.0.0.1", "--python", "/p"], "group"),
                       (["ct129", "--host", "10.0.0.1", "--port", "70000", "--python", "/p"], "port")):
        result = run_snapver("nodes", "add", *args)
        assert result.code == 2 and said in result.err and "Traceback" not in result.err, (args, result)
        assert config.read_bytes() == before
    assert sorted(os.listdir(".")) == [".snapver"]  # no temporary file left


def test_rm_refuses_a_node_a_group_names_unless_asked(sshd, run_snapver) -> None:
    config = Path(".snapver")
    config.write_text(hand_written(sshd).replace("[groups]", '[nodes.ct129]\nhost = "10.0.0.2"\n'
                                                 'python = "/usr/bin/python3"  # keep me\n\n[groups]'))
    before = config.read_text()
    refused = run_snapver("nodes", "rm", "ct200")
    assert refused.code == 2 and "group 'tp8'" in refused.err and "--from-groups" in refused.err, refused
    assert config.read_text() == before
    removed = run_snapver("nodes", "rm", "ct129")
    assert removed.code == 0, removed
    text = config.read_text()
    assert "ct129" not in text and "# the CI key" in text and "# tensor parallel" in text
    listed = run_snapver("nodes", "--json")
    assert listed.code == 0 and '"ct129"' not in listed.out
    gone = run_snapver("nodes", "rm", "ct200", "--from-groups")
    assert gone.code == 0 and "tp8" in gone.out, gone
    assert "[nodes.ct200]" not in config.read_text() and "tp8" not in config.read_text()


def test_a_symlinked_or_missing_config_is_refused(sshd, run_snapver, tmp_path: Path) -> None:
    real = tmp_path / "real.toml"
    real.write_text(hand_written(sshd))
    os.symlink(real, ".snapver")
    linked = run_snapver("nodes", "add", "ct129", "--host", "10.0.0.2", "--python", "/p")
    assert linked.code == 2 and "symbolic link" in linked.err, linked
    assert real.read_text() == hand_written(sshd)
    os.unlink(".snapver")
    missing = run_snapver("nodes", "add", "ct129", "--host", "10.0.0.2", "--python", "/p")
    assert missing.code == 2 and "no .snapver" in missing.err and "snapver init" in missing.err, missing


def add_held_at_its_write(sshd, tmp_path: Path, started: list) -> tuple[Path, Path, subprocess.Popen]:
    """A `nodes add ct129` (a real second process) held just before it replaces `.snapver`;
    touching the gate lets it go on."""
    config = Path(".snapver")
    config.write_text(hand_written(sshd))
    gate = tmp_path / "gate"
    first = snapver("nodes", "add", "ct129", "--host", "10.0.0.2", "--python", "/p",
                    env={"SNAPVER_TEST_PAUSE_BEFORE_CONFIG_WRITE": str(gate)})
    started.append(first)
    wait_for(Path(f"{gate}.waiting"), "the first edit reaching its write")
    return config, gate, first


def test_an_editors_save_during_the_edit_wins_and_nothing_is_written(sshd, tmp_path: Path, started) -> None:
    config, gate, first = add_held_at_its_write(sshd, tmp_path, started)
    saved = hand_written(sshd) + "# saved by an editor meanwhile\n"
    with open(config, "r+") as handle:  # in place, as many editors save
        handle.write(saved)
    gate.touch()
    out, err = first.communicate(timeout=60)
    assert first.returncode == 2 and "changed while it was edited" in err, (out, err)
    assert config.read_text() == saved
    assert sorted(os.listdir(".")) == [".snapver"]


def test_a_second_snapver_waits_and_both_nodes_are_added(sshd, tmp_path: Path, started) -> None:
    config, gate, first = add_held_at_its_write(sshd, tmp_path, started)
    second = snapver("nodes", "add", "fleet00", "--host", "10.0.0.3", "--python", "/p")
    started.append(second)
    assert second.stderr is not None
    assert "waiting for another snapver" in second.stderr.readline()  # it holds off, then:
    gate.touch()
    assert first.wait(timeout=60) == 0
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, (out, err)
    text = config.read_text()
    assert "[nodes.ct129]" in text and "[nodes.fleet00]" in text and "# rack 3" in text


@pytest.mark.parametrize("words", [["nodes", "add", "--help"], ["nodes", "rm", "--help"], ["nodes", "--help"]])
def test_help_shows_examples(words: list[str], run_snapver) -> None:
    shown = run_snapver(*words)
    assert shown.code == 0 and "Examples:" in shown.out
