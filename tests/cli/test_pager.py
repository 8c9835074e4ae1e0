"""The pager, as git's: on a terminal, output longer than the screen goes through
$SNAPVER_PAGER, else `[ui] pager`, else $PAGER, else `less -FRX`; colours kept; never when
piped, with --json, with --no-pager or `[ui] pager = false`. Run in a real pseudo-terminal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from terminal import run_in_terminal

SRT = "sglang/srt"


def lines(prefix: str, count: int) -> str:
    return "".join(f"{prefix}{index} = {index}\n" for index in range(count))


@pytest.fixture
def changed(make_site_packages, write_config, local_node, run_snapver, isolated_env: Path) -> Path:
    """Node laptop pulled, then its a.py rewritten: `diff laptop` is 200+ lines, `log` one."""
    site = make_site_packages("laptop", files={f"{SRT}/a.py": lines("x", 100)})
    config = write_config({"laptop": local_node(site)})
    assert run_snapver("pull").code == 0
    (site / SRT / "a.py").write_text(lines("y", 100))
    return config


def test_long_output_on_a_terminal_goes_through_the_pager_with_colours(changed: Path, tmp_path: Path) -> None:
    paged = tmp_path / "paged"
    screen = run_in_terminal("diff", "laptop", env={"SNAPVER_PAGER": f"cat > {paged}"})
    assert screen.code == 1, screen  # the exit code is the command's, not the pager's
    text = paged.read_text()
    assert text.count("\n") > 200 and "\x1b[31m-x0 = 0\x1b[0m" in text and "\x1b[32m+y99 = 99" in text, text[:300]
    assert "x0 = 0" not in screen.text, screen.text[:300]  # nothing went to the terminal itself

    # log through rich: colours kept too, at the terminal's width. Short: printed as it is.
    short = run_in_terminal("log", env={"SNAPVER_PAGER": f"cat > {tmp_path / 'log-paged'}"})
    assert short.code == 0 and "\x1b[1m" in short.text and "laptop" in short.text, short
    assert not (tmp_path / "log-paged").exists()


def test_the_pager_is_chosen_as_git_chooses_it(changed: Path, tmp_path: Path) -> None:
    # $PAGER when there is no $SNAPVER_PAGER and no [ui] pager.
    screen = run_in_terminal("diff", "laptop", env={"PAGER": f"cat > {tmp_path / 'pager'}"})
    assert screen.code == 1 and (tmp_path / "pager").read_text().count("\n") > 200, screen
    # [ui] pager wins over $PAGER; $SNAPVER_PAGER over both.
    changed.write_text(changed.read_text() + f'\n[ui]\npager = "cat > {tmp_path / "ui"}"\n')
    run_in_terminal("diff", "laptop", env={"PAGER": f"cat > {tmp_path / 'pager2'}"})
    assert (tmp_path / "ui").read_text().count("\n") > 200 and not (tmp_path / "pager2").exists()
    run_in_terminal("diff", "laptop", env={"SNAPVER_PAGER": f"cat > {tmp_path / 'env'}"})
    assert (tmp_path / "env").exists()
    # `cat` (or empty) means no pager, as in git.
    screen = run_in_terminal("diff", "laptop", env={"SNAPVER_PAGER": "cat"})
    assert screen.code == 1 and "+y99 = 99" in screen.text


def test_never_paged_when_piped_with_json_or_turned_off(changed: Path, tmp_path: Path, run_snapver) -> None:
    pager = {"SNAPVER_PAGER": f"cat > {tmp_path / 'paged'}"}
    piped = run_snapver("diff", "laptop", env=pager)
    assert piped.code == 1 and piped.out.count("\n") > 200 and "\x1b" not in piped.out, piped
    as_json = run_in_terminal("diff", "--json", "laptop", env=pager)
    assert as_json.code == 1 and json.loads(as_json.text)["changes"], as_json.text[:300]
    off = run_in_terminal("--no-pager", "diff", "laptop", env=pager)
    assert off.code == 1 and "+y99 = 99" in off.text
    assert not (tmp_path / "paged").exists()

    changed.write_text(changed.read_text() + "\n[ui]\npager = false\n")
    screen = run_in_terminal("diff", "laptop", env=pager)
    assert screen.code == 1 and "+y99 = 99" in screen.text and not (tmp_path / "paged").exists()


def test_a_pager_that_is_not_there_still_shows_the_output(changed: Path) -> None:
    screen = run_in_terminal("diff", "laptop", env={"SNAPVER_PAGER": "no-such-pager-here"})
    assert screen.code == 1 and "+y99 = 99" in screen.text and "pager 'no-such-pager-here' not found" in screen.text


@pytest.mark.parametrize("value", ["3", "[1]"])
def test_ui_pager_is_validated(make_site_packages, write_config, local_node, run_snapver, value: str) -> None:
    config = write_config({"laptop": local_node(make_site_packages("laptop"))})
    config.write_text(config.read_text() + f"\n[ui]\npager = {value}\n")
    result = run_snapver("log")
    assert result.code == 2 and "ui.pager: expected true, false or a command" in result.err, result
    config.write_text(config.read_text().replace(f"pager = {value}", "colour = 1"))
    result = run_snapver("log")
    assert result.code == 2 and "ui.colour: unknown key" in result.err, result


def test_status_is_never_paged_as_git_status_is_not(changed: Path, tmp_path: Path) -> None:
    """`status` went through the pager: at 80x24 it stopped at `(END)` and the next typed
    command went to `less`. git pages diff, log and show, never status."""
    ran = tmp_path / "pager-ran"
    pager = {"SNAPVER_PAGER": f"touch {ran}; cat >/dev/null"}
    screen = run_in_terminal("status", rows=3, env=pager)  # longer than the screen
    assert screen.code == 1 and "laptop" in screen.text and screen.text.count("\n") >= 3, screen
    assert not ran.exists(), "status started the pager"
    run_in_terminal("diff", "laptop", rows=3, env=pager)  # the stand-in does run for what git pages
    assert ran.exists()
