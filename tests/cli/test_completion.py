"""Shell completion: `--show-completion` / `--install-completion`, and what bash completes
(commands, options, node and group names, tags, patch names), driven as bash drives it:
the script sourced, `complete -p snapver`, then COMP_WORDS/COMP_CWORD and the function."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SRT = "sglang/srt"


@pytest.fixture
def on_path(tmp_path: Path) -> Path:
    """A folder with a `snapver` program (this tree's) to put first on PATH, as an install would."""
    folder = tmp_path / "bin"
    folder.mkdir()
    program = folder / "snapver"
    program.write_text(f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(REPO_ROOT))} exec "
                       f"{shlex.quote(sys.executable)} -m snapver \"$@\"\n")
    program.chmod(0o755)
    return folder


def bash(script: str, on_path: Path) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a non-interactive bash with snapver on PATH and its completion sourced."""
    prelude = """
source <(snapver --show-completion) || exit 9
complete_words() {  # complete_words WORD... : what bash offers for the last word
    COMP_WORDS=("$@"); COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 )); COMPREPLY=()
    _snapver_completion snapver
    printf '%s\\n' "${COMPREPLY[@]}" | sort | tr '\\n' ' '; echo
}
"""
    env = {**os.environ, "PATH": f"{on_path}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", prelude + script], env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def fleet(make_site_packages, write_config, local_node, run_snapver) -> None:
    """Nodes laptop and lab (group both), a snapshot of each, tags may22 and mainline, patch fix-attn."""
    nodes = {name: local_node(make_site_packages(name, files={f"{SRT}/a.py": f"{name} = 1\n"}))
             for name in ("laptop", "lab")}
    write_config(nodes, groups={"both": ["laptop", "lab"]})
    assert run_snapver("pull", "--all").code == 0
    assert run_snapver("tag", "may22", "laptop").code == 0
    assert run_snapver("tag", "mainline", "lab").code == 0
    assert run_snapver("patch", "new", "fix-attn", "--base", "laptop").code == 0


def test_bash_completes_commands_options_nodes_tags_and_patches(fleet: None, on_path: Path) -> None:
    done = bash("""
complete -p snapver
complete_words snapver pu
complete_words snapver pull l
complete_words snapver pull ''
complete_words snapver status laptop b
complete_words snapver log ''
complete_words snapver diff m
complete_words snapver show ''
complete_words snapver tag -d ''
complete_words snapver push f
complete_words snapver patch sa
complete_words snapver patch show ''
complete_words snapver pull --a
complete_words snapver --config .snapver diff may22 la
complete_words snapver nodes rm ''
""", on_path)
    assert done.returncode == 0 and done.stderr == "", done
    lines = done.stdout.splitlines()
    assert lines[0] == "complete -o default -F _snapver_completion snapver", lines
    assert lines[1:] == [
        "pull push ",
        "lab laptop ",
        "both lab laptop ",
        "both ",
        "lab laptop ",  # log NODE: nodes only
        "mainline may22 ",
        "fix-attn lab laptop mainline may22 ",  # a REF: tags, nodes, patches
        "mainline may22 ",
        "fix-attn ",
        "save ",
        "fix-attn ",
        "--all ",
        "lab laptop ",
        "lab laptop ",  # nodes rm NAME: nodes only
    ], done.stdout


def test_completion_never_fails(make_site_packages, write_config, local_node, on_path: Path) -> None:
    """A broken config, or no store yet: nothing to offer, no error under the cursor."""
    config = write_config({"laptop": local_node(make_site_packages("laptop"))})
    done = bash("complete_words snapver diff ''\ncomplete_words snapver pull ''", on_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, "laptop \nlaptop \n", ""), done
    config.write_text("this is [not toml\n")
    done = bash("complete_words snapver pull ''\ncomplete_words snapver st", on_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, " \nstatus \n", ""), done


def test_completion_with_node_ranges(make_site_packages, write_config, local_node, on_path: Path) -> None:
    """A group written as a range completes as any group; a range being typed offers nothing, fails nothing."""
    write_config({name: local_node(make_site_packages(name)) for name in ("lab01", "lab02")},
                 groups={"labs": ["lab[01-02]"]})
    done = bash("complete_words snapver pull ''\ncomplete_words snapver status 'lab[0'", on_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, "lab01 lab02 labs \n \n", ""), done


def test_scripts_and_install(on_path: Path, isolated_env: Path) -> None:
    from snapver.cli.completion import script

    assert "compdef _snapver_completion snapver" in script("zsh")
    assert "complete --command snapver" in script("fish")
    home = Path(os.environ["HOME"])
    done = bash("snapver --install-completion", on_path)
    assert done.returncode == 0 and "bash completion installed in" in done.stdout, done
    installed = home / ".bash_completions" / "snapver.sh"
    assert "_SNAPVER_COMPLETE=complete_bash" in installed.read_text()
    assert f"source '{installed}'" in (home / ".bashrc").read_text()


# Runs snapver's main(ARGS) and prints the modules imported by then (main exits: catch it).
MODULES_SCRIPT = """
import json, sys
from snapver.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps([code, sorted(sys.modules)]), file=sys.stderr)
"""


def test_completion_costs_commands_nothing(make_site_packages, write_config, local_node,
                                           isolated_env: Path) -> None:
    """The completion module is imported by no command (start-up measured with
    bench: no change beyond noise)."""
    import json

    write_config({"laptop": local_node(make_site_packages("laptop", files={f"{SRT}/a.py": "a = 1\n"}))})
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    for args in (["--version"], ["pull"], ["log"]):
        done = subprocess.run([sys.executable, "-c", MODULES_SCRIPT, *args], env=env, capture_output=True,
                              text=True, stdin=subprocess.DEVNULL, timeout=120)
        code, modules = json.loads(done.stderr.splitlines()[-1])
        assert code in (0, None), done
        # (typer.main imports typer's own completion code whatever the app says.)
        assert "snapver.cli.completion" not in modules, args
