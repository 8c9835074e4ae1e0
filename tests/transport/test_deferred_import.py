"""snapver.transport.deferred: a module's code runs when one of its names is first read,
once, whole, whichever thread reads first; Fabric's YAML config files are still read."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from snapver.transport import deferred

PACKAGE = "snapver_deferred_probe"


@pytest.fixture
def probe(tmp_path: Path):
    """A package ``PACKAGE.slow`` whose code counts its runs, imports a sibling and
    sleeps half-way (a thread reading it meanwhile finds it half-made unless it waits)."""
    package = tmp_path / PACKAGE
    (package / "slow").mkdir(parents=True)
    (package / "__init__.py").write_text("runs = []\n")
    (package / "slow" / "__init__.py").write_text(textwrap.dedent(f"""\
        import time
        import {PACKAGE}
        {PACKAGE}.runs.append(1)
        first = 1
        time.sleep(0.3)
        from . import sibling
        last = sibling.VALUE
        """))
    (package / "slow" / "sibling.py").write_text("VALUE = 'last'\n")
    sys.path.insert(0, str(tmp_path))
    deferred.defer(f"{PACKAGE}.slow")
    yield package
    sys.path.remove(str(tmp_path))
    for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
        del sys.modules[name]


def test_the_code_runs_when_a_name_is_first_read_and_once(probe: Path) -> None:
    import snapver_deferred_probe
    from snapver_deferred_probe import slow  # noqa: F401 - bound, not run

    assert snapver_deferred_probe.runs == []
    assert slow.last == "last"  # the module's own `from . import sibling` worked
    assert slow.first == 1
    assert snapver_deferred_probe.runs == [1]
    assert type(slow).__name__ == "module"  # an ordinary module from then on
    with pytest.raises(AttributeError):
        _ = slow.missing


def test_a_second_thread_waits_for_the_whole_module(probe: Path) -> None:
    import snapver_deferred_probe
    from snapver_deferred_probe import slow

    seen: list[object] = []

    def read() -> None:
        try:
            seen.append(slow.last)
        except AttributeError as exc:  # the half-made module LazyLoader would show
            seen.append(exc)

    threads = [threading.Thread(target=read) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert seen == ["last"] * 4
    assert snapver_deferred_probe.runs == [1]


def _python(code: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(deferred.__file__).parents[2])},
    )


def test_ssh_does_not_run_yaml_and_fabric_still_reads_its_yaml_config(tmp_path: Path) -> None:
    checked = _python(
        "import sys, snapver.transport.ssh; print(sorted(m for m in sys.modules if 'yaml' in m.split('.')[-1]))",
        tmp_path,
    )
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.strip() == "['invoke.vendor.yaml']"  # bound, its code not run: no yaml.* submodule

    (tmp_path / ".fabric.yaml").write_text("snapver_probe:\n  depth: [1, 2]\n")
    read = _python("import snapver.transport.ssh as s; print(s.Config().snapver_probe.depth)", tmp_path)
    assert read.returncode == 0, read.stderr
    assert read.stdout.strip() == "[1, 2]"
