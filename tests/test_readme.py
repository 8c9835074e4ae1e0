"""The README is executable documentation: every ```console block runs, in order, in one
working folder, against two real sshd nodes holding the real SGLang tree.

Each ``$ `` line is run with bash; the ``(exit N)`` line after its output is the exit code
it must end with (none: 0). Outputs may differ in ids, times and sizes, so only the exit
codes are held to; ``README_TRANSCRIPT=FILE`` writes what each command printed,
to refresh the README's outputs with. ``$CT200`` and ``$CT129`` are the nodes'
site-packages; the working folder's ``.snapver`` holds the nodes, as the README shows it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
README = REPO_ROOT / "README.md"
EXIT = re.compile(r"^\(exit (\d+)\)$")


def console_commands(text: str) -> list[tuple[str, int, list[str]]]:
    """Each ``$ `` command of the README's console blocks: (command, exit code, output lines)."""
    commands: list[tuple[str, int, list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                commands.append((line[2:], 0, []))
            elif commands and (match := EXIT.match(line)):
                command, _, output = commands[-1]
                commands[-1] = (command, int(match.group(1)), output)
            elif commands:
                commands[-1][2].append(line)
    return commands


def test_the_parser_reads_commands_exit_codes_and_outputs() -> None:
    text = "x\n```console\n$ a\nout\n(exit 1)\n$ b\n```\n```sh\n$ not run\n```\n```console\n$ c\n```\n"
    assert console_commands(text) == [("a", 1, ["out"]), ("b", 0, []), ("c", 0, [])]


def test_the_readme_walk_through_runs_as_written(sshd, sglang_site_template, make_site_packages, ssh_node,
                                                 write_config, isolated_env) -> None:
    commands = console_commands(README.read_text(encoding="utf-8"))
    assert len(commands) >= 20, "the README lost its walk-through"
    sites = {name: make_site_packages(name, template=sglang_site_template) for name in ("ct200", "ct129")}
    write_config({name: ssh_node(name, site) for name, site in sites.items()}, groups={"tp8": ["ct200", "ct129"]})
    env = {**os.environ, "CT200": str(sites["ct200"]), "CT129": str(sites["ct129"]),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(REPO_ROOT), "SNAPVER_AUTO_GC": "0"}
    transcript = []
    for command, expected, _ in commands:
        done = subprocess.run(["bash", "-c", command], cwd=isolated_env, env=env, capture_output=True,
                              stdin=subprocess.DEVNULL, timeout=300)
        output = (done.stdout + done.stderr).decode("utf-8", "replace")
        transcript.append(f"$ {command}\n{output}" + (f"(exit {done.returncode})\n" if done.returncode else ""))
        if os.environ.get("README_TRANSCRIPT"):
            Path(os.environ["README_TRANSCRIPT"]).write_text("".join(transcript), encoding="utf-8")
        assert done.returncode == expected, f"README: `{command}` exited {done.returncode}, not {expected}:\n{output}"
