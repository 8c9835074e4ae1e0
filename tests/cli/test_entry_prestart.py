"""`snapver pull NODE` begins its connections before the command line is loaded (snapver.entry,
snapver.transport.prestart).

Only a command line of one known shape does; the pull takes those connections over when
it selects the same nodes, so a node is connected to once; anything else begins nothing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer
from snapver_inproc import run_inproc

from snapver.cli.app import app, load_commands
from snapver.transport import connect
from snapver.transport import prestart as early

FILES = {f"sglang/srt/m{i}.py": f"value = {i}\n" for i in range(5)}
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def nothing_left_begun():
    yield
    left = early._prestarted
    early._prestarted = None
    if left is not None:
        left[1].close()


@pytest.mark.parametrize("argv, parsed", [
    (["pull", "ct200"], (None, ["ct200"], False)),
    (["pull", "--json", "ct200", "tp8"], (None, ["ct200", "tp8"], False)),
    (["--config", "c.toml", "-v", "pull", "--all"], ("c.toml", [], True)),
    (["--config=c.toml", "--no-color", "--no-pager", "pull", "-m", "note -x", "ct200"], ("c.toml", ["ct200"], False)),
    (["pull", "--message=a note", "ct200@live"], (None, ["ct200@live"], False)),
    (["pull"], (None, [], False)),
])
def test_the_pull_command_lines_it_reads(argv, parsed) -> None:
    assert early.pull_command(argv) == parsed


@pytest.mark.parametrize("argv", [
    [], ["status"], ["diff", "ct200"], ["pull", "--help"], ["pull", "--tag", "v1", "ct200"], ["pull", "--", "ct200"],
    ["pull", "-mnote", "ct200"], ["--config"], ["--unknown", "pull", "ct200"], ["--version"], ["pull", "-m"],
    ["ct200", "pull"], ["--config=", "pull", "ct200"], ["--config", "", "pull"],
])
def test_any_other_command_line_begins_nothing(argv) -> None:
    assert early.pull_command(argv) is None


def _option_spellings(command) -> dict[str, str]:
    """Every spelling of ``command``'s options as the CLI parses them (``-h`` and ``--help``
    included) → "valued", "flag", or "eager" (a flag that ends the program: --version)."""
    context = typer.Context(command, **command.context_settings)
    return {spelling: "valued" if not param.is_flag else "eager" if param.is_eager else "flag"
            for param in command.get_params(context) if param.param_type_name == "option"
            for spelling in (*param.opts, *param.secondary_opts)}


def test_the_pull_grammar_read_early_is_the_cli_s() -> None:
    """Each option the early reader takes is the CLI's, with or without a value as the CLI
    has it; every other option of `snapver` or of `snapver pull` makes it begin nothing."""
    load_commands("pull")
    root = typer.main.get_command(app)
    pull = root.get_command(typer.Context(root), "pull")
    global_options, pull_options = _option_spellings(root), _option_spellings(pull)
    assert "-h" in global_options and "--help" in pull_options  # the help spellings are read too

    assert global_options["--config"] == "valued"
    for flag in early.GLOBAL_FLAGS:
        assert global_options.get(flag) == "flag", flag
        assert early.pull_command([flag, "pull", "ct200"]) == (None, ["ct200"], False), flag
    for flag in early.PULL_FLAGS:
        assert pull_options.get(flag) == "flag", flag
        assert early.pull_command(["pull", flag, "ct200"]) == (None, ["ct200"], flag == "--all"), flag
    for option in early.PULL_VALUED:
        assert pull_options.get(option) == "valued", option
        assert early.pull_command(["pull", option, "-x", "ct200"]) == (None, ["ct200"], False), option

    for spelling in set(global_options) - early.GLOBAL_FLAGS - {"--config"}:
        assert early.pull_command([spelling, "pull", "ct200"]) is None, spelling
    for spelling in set(pull_options) - early.PULL_FLAGS - early.PULL_VALUED:
        assert early.pull_command(["pull", spelling, "ct200"]) is None, spelling
        assert early.pull_command(["pull", spelling, "v1", "ct200"]) is None, spelling
    # Every word that is not an option is a target: pull's one argument takes any number.
    arguments = [param for param in pull.params if param.param_type_name == "argument"]
    assert [(param.name, param.nargs) for param in arguments] == [("targets", -1)]


@pytest.fixture
def config(make_site_packages, ssh_node, write_config, tmp_path: Path) -> Path:
    site = make_site_packages("ct200", files=FILES)
    return write_config({"ct200": ssh_node("ct200", site)}, store=str(tmp_path / "store"),
                        where=tmp_path / "snapver.toml")


def _counting_starts(monkeypatch) -> list[list[str]]:
    """Record the nodes of every ``Starting`` made from now on."""
    made: list[list[str]] = []
    real_init = connect.Starting.__init__

    def init(self, specs):
        made.append([spec.name for spec in specs])
        real_init(self, specs)

    monkeypatch.setattr(connect.Starting, "__init__", init)
    return made


def test_the_pull_takes_over_the_connection_begun_for_it(config: Path, monkeypatch) -> None:
    made = _counting_starts(monkeypatch)
    argv = ["--config", str(config), "pull", "ct200"]
    early.prestart(argv)
    assert made == [["ct200"]]
    result = run_inproc(*argv)
    assert result.code == 0 and "ct200: snapshot" in result.out, result
    assert made == [["ct200"]] and early._prestarted is None  # one connection, the one begun first


def test_connections_begun_for_other_nodes_are_closed_not_used(config: Path, monkeypatch) -> None:
    made = _counting_starts(monkeypatch)
    early.prestart(["--config", str(config), "pull", "ct200"])
    begun = early._prestarted[1]
    assert early.adopt([]) is None and begun._closed and early._prestarted is None
    result = run_inproc("--config", config, "pull", "ct200")
    assert result.code == 0 and made == [["ct200"], ["ct200"]], result


@pytest.mark.parametrize("targets", [["nosuch"], []])
def test_an_error_begins_nothing_and_is_reported_once(config: Path, targets: list[str], monkeypatch) -> None:
    if not targets:  # a config that names no node
        config.write_text(config.read_text().split("[nodes")[0])
    made = _counting_starts(monkeypatch)
    early.prestart(["--config", str(config), "pull", *targets])
    assert made == [] and early._prestarted is None
    done = subprocess.run([sys.executable, "-m", "snapver", "--config", str(config), "pull", *targets],
                          capture_output=True, text=True, cwd=config.parent)
    assert done.returncode == 2 and done.stderr.count("snapver: error:") == 1, done.stderr


def test_python_m_snapver_and_the_console_script_pull(config: Path) -> None:
    for command in ([sys.executable, "-m", "snapver"], [str(Path(sys.executable).with_name("snapver"))]):
        done = subprocess.run([*command, "--config", str(config), "pull", "--json", "ct200"],
                              capture_output=True, text=True, cwd=config.parent)
        assert done.returncode == 0 and '"ct200"' in done.stdout, done.stderr


def test_the_process_is_set_up_before_any_connection_begins() -> None:
    """A closed stdout is /dev/null before ``prestart`` runs: a connection begun before
    would take descriptor 1 for its socket, and the command's output would go to it."""
    script = (
        "import os, sys\n"
        "os.close(1)\n"
        "from snapver import entry\n"
        "def prestart(argv):\n"
        "    os.write(2, b'fd 1 open: %d\\n' % os.path.exists('/proc/self/fd/1'))\n"
        "entry.prestart = prestart\n"
        "sys.argv = ['snapver', '--version']\n"
        "entry.run()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO_ROOT)
    assert done.returncode == 0 and "fd 1 open: 1" in done.stderr, done.stderr
