"""The agent's ``locate``: where the node's Python finds the tracked package, never importing it.

Each case runs the agent's part in a fresh interpreter (``-S``, sys.path set by hand) on
real folders, as the node would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def locate(path_entries: list[Path], cwd: Path, paths: tuple[str, ...] = ("sglang/srt",)) -> dict:
    code = ("import json, sys; sys.path[:0] = json.loads(sys.argv[1]); sys.path.insert(0, sys.argv[2]);"
            "from snapver.transport.agent import source;"
            "sys.path.remove(sys.argv[2]);"
            "root, install = source.locate(None, json.loads(sys.argv[3]));"
            "print(json.dumps([root, install, sorted(sys.modules)]))")
    # The working folder first on sys.path, as `python -c` puts it (""), behind what is given.
    completed = subprocess.run([sys.executable, "-S", "-c", code, json.dumps([str(p) for p in path_entries] + [""]),
                                str(REPO), json.dumps(list(paths))], cwd=cwd, capture_output=True, text=True,
                               check=True)
    root, install, modules = json.loads(completed.stdout)
    assert "sglang" not in modules and not any(m.startswith("sglang.") for m in modules)
    return {"root": root, **install}


def package(folder: Path, marker: Path, init: bool = True) -> Path:
    (folder / "sglang" / "srt").mkdir(parents=True)
    if init:
        (folder / "sglang" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    (folder / "sglang" / "version.py").write_text('__version__ = "0.5.9"\n')
    (folder / "sglang" / "srt" / "a.py").write_text("x = 1\n")
    return folder


def test_a_source_tree_on_sys_path_is_found_without_running_its_init(tmp_path: Path) -> None:
    marker = tmp_path / "imported"
    checkout = package(tmp_path / "co" / "python", marker)
    found = locate([checkout], tmp_path)
    assert (found["root"], found["how"], found["version"], found["found_by"]) == (str(checkout), "source", "0.5.9",
                                                                                 "find_spec")
    assert found["checkout"] == "" and not marker.exists()


def test_a_wheel_is_its_site_packages(tmp_path: Path) -> None:
    site = package(tmp_path / "site-packages", tmp_path / "imported")
    (site / "sglang-0.5.9.dist-info").mkdir()
    (site / "sglang-0.5.9.dist-info" / "METADATA").write_text("Name: sglang\nVersion: 0.5.9\n\n")
    found = locate([site], tmp_path)
    assert (found["root"], found["how"], found["name"]) == (str(site), "wheel", "sglang")


def test_an_editable_install_names_its_checkout(tmp_path: Path) -> None:
    checkout = package(tmp_path / "sglang" / "python", tmp_path / "imported")
    (tmp_path / "sglang" / ".git").mkdir()
    site = tmp_path / "site-packages"
    (site / "sglang-0.5.9.dist-info").mkdir(parents=True)
    (site / "sglang-0.5.9.dist-info" / "METADATA").write_text("Name: sglang\nVersion: 0.5.9\n\n")
    (site / "sglang-0.5.9.dist-info" / "direct_url.json").write_text(
        json.dumps({"dir_info": {"editable": True}, "url": f"file://{checkout}"}))
    found = locate([site, checkout], tmp_path)
    assert (found["root"], found["how"], found["url"], found["checkout"]) == (
        str(checkout), "editable", f"file://{checkout}", str(tmp_path / "sglang"))
    assert found["dist_info"] == str(site / "sglang-0.5.9.dist-info")


def test_a_namespace_package_is_the_part_holding_the_tracked_path(tmp_path: Path) -> None:
    (tmp_path / "one" / "sglang").mkdir(parents=True)
    second = package(tmp_path / "two", tmp_path / "imported", init=False)
    assert locate([tmp_path / "one", second], tmp_path)["root"] == str(second)


@pytest.mark.parametrize("case", ["absent", "module", "in-the-working-folder"])
def test_what_the_python_cannot_find_falls_back_to_its_site_packages_with_the_reason(tmp_path: Path,
                                                                                     case: str) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if case == "module":
        (elsewhere / "sglang.py").write_text("raise SystemExit('imported')\n")
    if case == "in-the-working-folder":  # `python -c` puts it first; the deployment does not run there
        package(tmp_path, tmp_path / "imported")
    found = locate([elsewhere], tmp_path)
    assert found["found_by"] == "purelib", found
    assert ("as a module" if case == "module" else "cannot find sglang") in found["problem"], found
    assert found["root"] != str(tmp_path) and os.path.isabs(found["root"])
