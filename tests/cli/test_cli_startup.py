"""Start-up: a command imports only its own module, and rich only where it draws.

`snapver log`, `pull`, `diff -q`, `status` off a terminal print plain lines through
`render.PlainConsole`, which must print exactly rich's bytes (checked here against rich
itself on many strings); `--help` and every command's help must not change with what is
loaded (checked against a process that loaded every command first).
"""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import Result

REPO_ROOT = Path(__file__).resolve().parents[2]
SRT = "sglang/srt"


def rich_prints(markup: object, no_color: bool = True) -> str:
    """What the console `render.console()` made before PlainConsole prints off a terminal."""
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, no_color=no_color, highlight=False, soft_wrap=True, width=400).print(markup)
    return out.getvalue()


# Lines as the commands print them (escaped user text inside), and the pieces fuzzing joins.
REAL_LINES = [
    "[bold]0ca38fe04d[/bold]  2026-11-30 13:17  local      2602 files, 2602 changed  sglang 0.5.23",
    "[bold]0ca38fe04d[/bold]  2026-11-30 13:17  ct200      3 files, 1 changed  -  [yellow](v1, may22)[/yellow]  a note",
    "local: unchanged since 0ca38fe04d — 2602 files, 0 changed, 0 B transferred (883.6 kB on the wire), 1.3 s",
    "local: snapshot [bold]0ca38fe04d[/bold] — 2602 files, 2602 changed, 84.0 MB transferred "
    "(84.7 MB on the wire), 1.4 s",
    "[red]snapver: error:[/red] ct200: cannot connect: [Errno 111] Connection refused",
    "no snapshots yet (run `snapver pull`)",
    "  [green]A[/green]  sglang/srt/new \\[1].py",
    " sglang/srt/a.py | 12 [green]++++++++[/green][red]----[/red]",
    "\nlaptop: 1 file differs from bfa6392f89",
    "  M  sglang/srt/a.py  [yellow]patch fix\\\\[/yellow]",
    "",
]
ATOMS = ["[", "]", "\\", "/", "bold", "[bold]", "[/bold]", "[/]", "[red]", "[/red]", "[green]", "[/yellow]",
         "[link=x]", "[@click]", "[bold red]", "[ bold]", "[x]", "[1]", "\\[", "\\\\[", ":", ":smile:", ":100:", "a:b",
         " ", "  ", "\t", "\r", "\n", "\x1b", "\x07", "\x00", "\u2028", "é", "中", "\udcff", "a", "b1", "-", "—"]


def fuzzed(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        text = "".join(rng.choice(ATOMS) for _ in range(rng.randint(0, 10)))
        if rng.random() < 0.03:
            text += " " * rng.randint(385, 415) + text
        texts.append(text)
    return texts


# --------------------------------------------------------------------------- rich's bytes


def test_plain_text_is_what_rich_prints(monkeypatch: pytest.MonkeyPatch) -> None:
    from snapver.cli.render import escape, plain_text

    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    for line in REAL_LINES:  # what the commands print never needs rich
        assert plain_text(line) is not None, line
        assert plain_text(line) + "\n" == rich_prints(line) == rich_prints(line, no_color=False), line
    handled = 0
    for index, text in enumerate(fuzzed(1, 6000)):
        for markup in (text, f"[bold]{escape(text)}[/bold] {escape(text)}"):
            plain = plain_text(markup)
            if plain is None:
                continue  # rich prints it
            handled += 1
            assert plain + "\n" == rich_prints(markup, no_color=index % 2 == 0), repr(markup)
    assert handled > 3000, handled  # PlainConsole is used, not only rich


def test_escape_is_richs_escape() -> None:
    """rich's escape, of the text with its control characters (but newline and tab) quoted."""
    from rich.markup import escape as rich_escape

    from snapver.cli.render import escape
    from snapver.model import quote_controls

    for text in fuzzed(2, 3000) + ["a\\", "a\\\\", "\\[bold]", "[bold]\\", "caf\udce9 [x]"]:
        expected = rich_escape(quote_controls(text).encode("utf-8", "backslashreplace").decode("utf-8"))
        assert escape(text) == expected, repr(text)
    assert escape("\x1b[2J[red]x\r\ty\n") == "\\033[2J\\[red]x\\r\ty\n"


def test_plain_table_is_what_rich_prints() -> None:
    from rich.table import Table

    from snapver.cli.render import plain_table

    rng = random.Random(3)
    cells = ["a", "bc", " ", "", "-", "[green]yes[/green]", "[red]no[/red]", "x" * 40, "é", "中", "(1/3)", "\n",
             "\\[", ":smile:", "0ca38fe04d 2026-11-30 13:17"]
    handled = 0
    for _ in range(1500):
        width = rng.randint(1, 6)
        columns = tuple("".join(rng.choice(cells[:5]) for _ in range(rng.randint(1, 3))) for _ in range(width))
        rows = [tuple("".join(rng.choice(cells) for _ in range(rng.randint(0, 3))) for _ in range(width))
                for _ in range(rng.randint(0, 4))]
        if rng.random() < 0.05:
            rows.append(tuple("y" * rng.randint(60, 130) for _ in range(width)))
        plain = plain_table(columns, rows)
        if plain is None:
            continue
        handled += 1
        table = Table(box=None, pad_edge=False)
        for column in columns:
            table.add_column(column)
        for row in rows:
            table.add_row(*row)
        assert plain == rich_prints(table), (columns, rows)
    assert handled > 300, handled


def test_plain_console_writes_as_rich(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain lines and what it hands to rich (a table, an emoji code, a tab) interleave in order."""
    from rich.table import Table

    from snapver.cli.render import PlainConsole

    table = Table(box=None, pad_edge=False)
    table.add_column("node")
    table.add_row("[green]ok[/green]")
    items = [*REAL_LINES, table, "a :smile: b", "x\ty", "[/]unbalanced", "[bold]x[/bold]"]
    for stderr in (False, True):
        stream = io.StringIO()
        monkeypatch.setattr(sys, "stderr" if stderr else "stdout", stream)
        out = PlainConsole(stderr=stderr, no_color=True)
        expected = ""
        for item in items:
            try:
                expected += rich_prints(item)
            except Exception as exc:  # rich refuses it: so must PlainConsole, the same way
                with pytest.raises(type(exc)):
                    out.print(item)
                continue
            out.print(item)
        assert stream.getvalue() == expected
        assert (out.is_terminal, out.width) == (False, 400)


# --------------------------------------------------------------------------- what is imported

# Runs snapver as `python -m snapver` does, then writes the modules it imported as JSON
# (when it leaves: `snapver.cli.run` ends with os._exit, which runs no atexit handlers).
MODULES_SCRIPT = """
import json, os, runpy, sys
report = sys.argv.pop(1)
real_exit = os._exit
def recording_exit(code):
    open(report, "w").write(json.dumps(sorted(sys.modules)))
    real_exit(code)
os._exit = recording_exit
sys.argv[0] = "snapver"
runpy.run_module("snapver", run_name="__main__", alter_sys=True)
"""


def run_recording(*args: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[Result, set[str]]:
    report = cwd / "modules.json"
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    full_env = {**os.environ, "PYTHONPATH": path}
    full_env.update(env or {})
    done = subprocess.run([sys.executable, "-c", MODULES_SCRIPT, str(report), *args], cwd=cwd, env=full_env,
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
    result = Result(done.returncode, done.stdout.decode("utf-8", "surrogateescape"),
                    done.stderr.decode("utf-8", "surrogateescape"))
    modules = set(json.loads(report.read_text()))
    report.unlink()
    return result, modules


def cli_modules(modules: set[str]) -> set[str]:
    return {name.rpartition(".")[2] for name in modules if name.startswith("snapver.cli.")}


def rich_modules(modules: set[str]) -> set[str]:
    return {name for name in modules if name == "rich" or name.startswith(("rich.", "typer.rich_utils"))}


def test_everyday_commands_import_one_command_module_and_no_rich(
        make_site_packages, write_config, local_node, isolated_env: Path) -> None:
    site = make_site_packages("laptop", files={f"{SRT}/a.py": "a = 1\n", f"{SRT}/sub/b.py": "b = 2\n"})
    write_config({"laptop": local_node(site)})

    result, modules = run_recording("log", cwd=isolated_env)  # no store yet: an error, still no rich
    assert result.code == 4 and result.err.startswith("snapver: error: no snapver store"), result
    assert cli_modules(modules) == {"app", "state", "options", "render", "log"} and not rich_modules(modules)

    result, modules = run_recording("pull", cwd=isolated_env)
    assert result.code == 0 and result.out.startswith("laptop: snapshot "), result
    assert cli_modules(modules) == {"app", "state", "options", "render", "pull"} and not rich_modules(modules)
    assert "tomllib" in modules and "sysconfig" not in modules  # a config file: not the embedded default

    (site / SRT / "a.py").write_text("a = 2\n")
    for args, code, module in ((["diff", "-q", "laptop"], 1, "diff"), (["status"], 1, "status"),
                               (["log"], 0, "log")):
        result, modules = run_recording(*args, cwd=isolated_env)
        assert result.code == code, result
        assert cli_modules(modules) == {"app", "state", "options", "render", module} and not rich_modules(modules), args
    assert result.out.count("\n") == 1 and "\x1b" not in result.out, result

    # Where rich would colour all the same (FORCE_COLOR), rich prints: the id is bold.
    result, modules = run_recording("log", cwd=isolated_env, env={"FORCE_COLOR": "1"})
    assert result.code == 0 and "\x1b[1m" in result.out, result
    assert "rich.console" in modules
    plain = run_recording("log", cwd=isolated_env)[0].out
    assert plain == result.out.replace("\x1b[1m", "").replace("\x1b[0m", "")

    # A reader gone before the first line (`snapver log | true`): silent, exit 0 — a read-only
    # command's reader had all it wanted (issue 17; 1 would mean "differences found").
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-m", "snapver", "log"], cwd=isolated_env, env=env, stdout=write_end,
                          stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=120)
    os.close(write_end)
    assert (done.returncode, done.stderr) == (0, b"")

    # --help lists every command: it loads them all.
    result, modules = run_recording("--help", cwd=isolated_env)
    assert result.code == 0 and cli_modules(modules) >= {"diff", "patch", "pull", "push", "status", "show", "log",
                                                          "tag", "verify"}, result


def test_default_config_imports_no_tomllib(isolated_env: Path) -> None:
    """Without a config file, the embedded default needs sysconfig, not the TOML parser."""
    result, modules = run_recording("log", cwd=isolated_env)
    assert result.code == 4, result
    assert "sysconfig" in modules and "tomllib" not in modules


# --------------------------------------------------------------------------- help unchanged

HELPS = [["pull", "--help"], ["log", "--help"], ["diff", "--help"], ["patch", "new", "--help"], ["status", "--help"],
         ["push", "--help"], ["rollback", "--help"], ["init", "--help"], ["nodes", "--help"], ["show", "--help"],
         ["fsck", "--help"], ["tag", "--help"], ["verify", "--help"], ["patch", "--help"], ["pul"], ["--help"], []]

# argv: eager|lazy, a folder; runs every HELPS case in this process, fd 1 and 2 into files.
HELP_SCRIPT = """
import json, os, sys
from snapver.cli import main
from snapver.cli.app import load_commands
mode, folder, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
if mode == "eager":
    load_commands()
loaded = []
for index, args in enumerate(cases):
    sys.stdout.flush(); sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    for fd, name in ((1, "out"), (2, "err")):
        target = os.open(os.path.join(folder, f"{index}.{name}"), os.O_WRONLY | os.O_CREAT)
        os.dup2(target, fd); os.close(target)
    try:
        main(args)
    except SystemExit as exc:
        print(f"exit {exc.code}")
    finally:
        sys.stdout.flush(); sys.stderr.flush()
        for fd, old in zip((1, 2), saved):
            os.dup2(old, fd); os.close(old)
    loaded.append(sorted(m for m in sys.modules if m.startswith("snapver.cli.")))
json.dump(loaded, open(os.path.join(folder, "loaded.json"), "w"))
"""


def test_help_is_the_same_whatever_is_loaded(tmp_path: Path) -> None:
    """Each command's help, the usage errors and the command list, lazily (one module at a time,
    out of order) and with every command loaded first, are the same bytes."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "100"}
    env.pop("FORCE_COLOR", None)
    outputs = {}
    for mode in ("eager", "lazy"):
        folder = tmp_path / mode
        folder.mkdir()
        subprocess.run([sys.executable, "-c", HELP_SCRIPT, mode, str(folder), json.dumps(HELPS)], env=env,
                       check=True, stdin=subprocess.DEVNULL, timeout=120)
        outputs[mode] = {index: ((folder / f"{index}.out").read_bytes(), (folder / f"{index}.err").read_bytes())
                         for index in range(len(HELPS))}
        loaded = json.loads((folder / "loaded.json").read_text())
    assert outputs["lazy"] == outputs["eager"]
    assert b"Did you mean 'pull'?" in outputs["lazy"][HELPS.index(["pul"])][1]
    listed = outputs["lazy"][HELPS.index(["--help"])][0].decode()
    for command in ("diff", "pull", "push", "rollback", "status", "init", "nodes", "log", "show", "fsck", "tag",
                    "verify", "patch"):
        assert f" {command} " in listed, command
    # The lazy run: `pull --help` loaded only pull; `log --help` added only log.
    assert loaded[0] == ["snapver.cli.app", "snapver.cli.options", "snapver.cli.pull", "snapver.cli.render",
                         "snapver.cli.state"], loaded[0]
    assert set(loaded[1]) - set(loaded[0]) == {"snapver.cli.log"}, loaded[1]


def test_command_table_names_every_command_with_its_module(tmp_path: Path) -> None:
    """COMMANDS (cli/app.py) names every registered command with its module (the order is
    the workflow's: test_cli_basics checks it)."""
    script = """
import json, typer
from snapver.cli.app import COMMANDS, app, load_commands
load_commands()
found = [(info.name or typer.main.get_command_name(info.callback.__name__), info.callback.__module__)
         for info in app.registered_commands]
found += [(info.name, info.typer_instance.registered_commands[0].callback.__module__)
          for info in app.registered_groups]
print(json.dumps([found, list(COMMANDS.items())]))
"""
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                          capture_output=True, text=True, check=True, timeout=60)
    found, table = json.loads(done.stdout)
    assert sorted((name, module.rpartition(".")[2]) for name, module in found) == sorted(map(tuple, table))
