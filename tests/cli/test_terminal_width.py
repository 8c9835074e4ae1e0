"""Tables and listings at 80 and 200 columns, in a real pseudo-terminal: nothing wider
than the terminal, addresses, snapshot cells and dates whole, paths cut in the middle;
`-w/--wide` shows every cell whole."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from terminal import run_in_terminal

SRT = "sglang/srt"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
DATE = re.compile(r"\b\d{4}-\d\d-\d\d \d\d:\d\d\b")


def screen(*args: str, columns: int) -> list[str]:
    shown = run_in_terminal(*args, columns=columns, env={"SNAPVER_PAGER": "cat"})
    assert shown.code in (0, 1), shown
    return ANSI.sub("", shown.text).splitlines()


@pytest.fixture
def fleet(make_site_packages, ssh_node, write_config, run_snapver, tmp_path: Path) -> dict[str, str]:
    """ct200 and ct129 over SSH, at long site-packages paths that differ only in the middle;
    two snapshots each (with long messages), a tag, a patch for both."""
    sites = {}
    for name in ("ct200", "ct129"):
        site = make_site_packages(f"{name}/root/venv_sglang211/lib/python3.12",
                                  files={f"{SRT}/a.py": "a = 1\n"})
        sites[name] = site
    write_config({name: ssh_node(name, site) for name, site in sites.items()}, groups={"tp8": ["ct200", "ct129"]})
    for round_ in range(2):
        for site in sites.values():
            (site / SRT / "a.py").write_text(f"a = {round_}\n")
        message = f"round {round_}: skip capture above bs 256, and a message long enough to need a second line"
        assert run_snapver("pull", "tp8", "-m", message).code == 0
    assert run_snapver("tag", "may22", "ct200").code == 0
    assert run_snapver("patch", "new", "fix-attention-backend", "--base", "may22", "--nodes", "tp8",
                       "-m", "attention fix for the flashinfer backend").code == 0
    (sites["ct200"] / SRT / "a.py").write_text("a = 2\n")
    return {name: str(site) for name, site in sites.items()}


def addresses(run_snapver) -> list[str]:
    import json

    return [node["address"] for node in json.loads(run_snapver("nodes", "--json").out)["nodes"]]


def test_at_80_columns_nothing_is_wider_and_nothing_that_matters_is_cut(fleet, run_snapver) -> None:
    nodes = screen("nodes", "--check", columns=80)
    text = "\n".join(nodes)
    for address in addresses(run_snapver):  # whole: the nodes stay apart
        assert address in text, (address, text)
    # A record per node: what it checked (the python path, site-packages) is never cut; only
    # a path longer than the screen (these test paths are) is a line wider than it.
    assert "…" not in text and fleet["ct200"] in text and fleet["ct129"] in text, text
    assert all(len(line) <= 80 for line in nodes if line.strip() not in fleet.values()), nodes

    status = screen("status", columns=80)
    assert all(len(line) <= 80 for line in status[:3]), status  # the table; notes below may be long
    for node in ("ct200", "ct129"):
        row = next(line for line in status if line.startswith(node))
        # The snapshot cell on one line: whole, or in the short form when the table needs it.
        assert re.search(r"\b([0-9a-f]{10} \d+[smhd] ago|[0-9a-f]{7} \d+[smhd])\b", row), row

    log = screen("log", columns=80)
    assert all(len(line) <= 80 for line in log if not line.startswith("    round")), log
    assert len(DATE.findall("\n".join(log))) == 4, log  # every date whole
    oneline = screen("log", "--oneline", columns=80)
    assert len(DATE.findall("\n".join(oneline))) == 4, oneline
    patches = screen("patch", "list", columns=80)
    assert all(len(line) <= 80 for line in patches) and len(DATE.findall("\n".join(patches))) == 1, patches


def test_at_200_columns_or_wide_every_cell_is_whole(fleet, run_snapver) -> None:
    for args, columns in ((["nodes"], 200), (["nodes", "--check", "-w"], 80)):
        text = "\n".join(screen(*args, columns=columns))
        assert fleet["ct200"] in text and fleet["ct129"] in text and "…" not in text, text
    log = screen("log", "-w", columns=80)  # one line a snapshot, however long
    assert len(log) == 4 and all(DATE.search(line) for line in log), log
    wide = screen("log", columns=200)
    assert len(wide) == 4, wide
    # Off a terminal nothing changes: one line each, whole.
    piped = run_snapver("nodes", "--check")
    assert fleet["ct200"] in piped.out and "…" not in piped.out, piped


def test_no_color_takes_the_colour_out_of_help_too(tmp_path: Path) -> None:
    """`snapver --no-color --help` on a terminal printed typer's coloured help (yellow, cyan,
    green): the option is read after the help is made. Styles (bold, dim) are no colour."""
    colour = re.compile(r"\x1b\[[0-9;]*?(?:3[0-7]|9[0-7]|38;[0-9;]+)m")
    coloured = run_in_terminal("--help", cwd=tmp_path)
    assert coloured.code == 0 and colour.search(coloured.text), "help is coloured on a terminal"
    for args in (("--no-color", "--help"),):
        plain = run_in_terminal(*args, cwd=tmp_path)
        assert plain.code == 0 and "Usage" in plain.text and not colour.search(plain.text), args
