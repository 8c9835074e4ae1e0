"""Every command's `--help` at 80 columns: each option's own name whole, each line of its
text as written (not re-wrapped, not dedented, no word lost to rich markup), examples
in every command and command group."""

from __future__ import annotations

import inspect

import pytest
from snapver_inproc import run_inproc


def commands() -> dict[tuple[str, ...], object]:
    """Every command and group of the app, by the words that name it."""
    import typer

    from snapver.cli.app import app, load_commands

    load_commands()
    root = typer.main.get_command(app)
    found: dict[tuple[str, ...], object] = {}

    def visit(words: tuple[str, ...], command: object) -> None:
        found[words] = command
        for name, sub in getattr(command, "commands", {}).items():
            visit((*words, name), sub)

    for name, command in root.commands.items():  # type: ignore[attr-defined]
        visit((name,), command)
    return found


COMMANDS = commands()


def rendered(words: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setenv("COLUMNS", "80")
    shown = run_inproc(*words, "--help")
    assert shown.code == 0, shown
    return [line.rstrip() for line in shown.out.splitlines()]


@pytest.mark.parametrize("words", sorted(COMMANDS), ids=" ".join)
def test_help_at_80_columns_keeps_every_name_and_line(words: tuple[str, ...],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    command = COMMANDS[words]
    lines = rendered(words, monkeypatch)
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    text = "\n".join(lines)
    for param in command.params:  # type: ignore[attr-defined]
        for name in param.opts:
            if name.startswith("--"):
                assert f"{name} " in text or f"{name}\n" in text or text.endswith(name), (name, text)
    # What the code wrote: an example line as written, its indent kept; a paragraph's prose
    # whole, in its words (rich wraps it to the terminal), no word lost to markup.
    help_text = inspect.cleandoc(command.help or "").replace("\\[", "[")  # type: ignore[attr-defined]
    flowed = " ".join(" ".join(lines).split())
    for line in help_text.splitlines():
        if line.startswith(" "):
            assert f" {line}" in lines, (line, text)
    for paragraph in help_text.split("\n\n"):
        prose = " ".join(line for line in paragraph.splitlines() if not line.startswith(" "))
        assert " ".join(prose.split()) in flowed, (prose, text)
    assert "Examples:" in text


def test_sync_help_names_the_store_table(monkeypatch: pytest.MonkeyPatch) -> None:
    text = " ".join(" ".join(rendered(("sync",), monkeypatch)).split())
    assert "push records from [store] remote, then" in text, text


def test_patch_group_help_has_examples(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "\n".join(rendered(("patch",), monkeypatch))
    assert "Examples:\n   snapver patch new" in text, text
