"""No `.snapver` anywhere: snapver runs on its embedded default (node `local`), and a name
that is not a node of it says that no config was found and where it looked (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.parametrize("args", [("status", "ct200"), ("pull", "ct200"), ("diff", "ct200"), ("ps", "ct200")])
def test_a_name_the_embedded_default_lacks_says_no_config_was_found(args: tuple[str, ...], run_snapver,
                                                                     tmp_path: Path) -> None:
    """The story's own command, run from the folder beside the May 22 copy, said
    `unknown ref 'ct200' … hint: nodes: local` (or `no snapver store`): the user never
    learnt that their .snapver was not read."""
    folder = tmp_path / "beside-may22" / "deeper"
    folder.mkdir(parents=True)
    result = run_snapver(*args, cwd=folder)
    assert result.code == 2, result
    first = result.err.splitlines()[0]
    assert first.startswith("snapver: error: ") and "ct200" in first, result.err
    assert (f"no .snapver found in {folder.resolve()} or its parents (using the embedded default: node local)"
            in result.err), result.err
    assert "Traceback" not in result.err and "hint: " in result.err


def test_no_store_and_no_config_says_both(run_snapver, tmp_path: Path) -> None:
    """`show ct200` opens the store first: without one (exit 4), the missing config is said too."""
    result = run_snapver("show", "ct200", cwd=tmp_path)
    assert result.code == 4 and "no snapver store" in result.err, result
    assert f"no .snapver found in {tmp_path.resolve()} or its parents" in result.err, result


def test_the_embedded_default_still_serves_its_own_node(run_snapver, tmp_path: Path) -> None:
    result = run_snapver("nodes", cwd=tmp_path)
    assert result.code == 0 and "local" in result.out, result
