"""Serving groups (``[groups.dsv3]`` with ``nodes`` and ``serving = true``) and the failure
budget (``[defaults] max_fail``) in the config: what loads, and what is refused (exit 2,
naming the file, the key and what is wrong)."""

from __future__ import annotations

from pathlib import Path

import pytest

from snapver.config import load_config
from snapver.errors import ConfigError, UsageError
from snapver.failbudget import allowed_failures, parse_max_fail

NAMES = ("ct200", "ct201", "ct210", "ct211")


def _node() -> dict[str, object]:
    return {"host": "127.0.2.1", "site_packages": "/sp"}


def _write(tmp_path: Path, text: str) -> Path:
    nodes = "".join(f'[nodes.{name}]\nhost = "127.0.2.1"\nsite_packages = "/sp"\n' for name in NAMES)
    path = tmp_path / "serving.toml"
    path.write_text(nodes + text, encoding="utf-8")
    return path


def test_a_serving_group_is_a_table_beside_list_groups(tmp_path: Path) -> None:
    """The SPEC's example: `tp8 = [...]` beside `[groups.dsv3]` (nodes, serving = true); the
    serving group is a group as well (`pull dsv3` names its nodes), its nodes in config order."""
    path = _write(tmp_path, '[groups]\ntp8 = ["ct200", "ct201"]\n[groups.dsv3]\nnodes = ["ct211", "ct210"]\n'
                            'serving = true\n[groups.plain]\nnodes = ["ct[200-201]"]\n'
                            '[defaults]\nmax_fail = "25%"\n')
    config = load_config(str(path))
    assert config.groups == {"tp8": ("ct200", "ct201"), "dsv3": ("ct211", "ct210"), "plain": ("ct200", "ct201")}
    assert config.serving == {"dsv3": ("ct211", "ct210")}
    assert config.max_fail == "25%"
    assert [spec.name for spec in config.select(["dsv3"])] == ["ct211", "ct210"]


BAD = [
    # (id, [groups] text, [defaults] text, the key the error names, a word of the reason)
    ("overlap", '[groups.a]\nnodes = ["ct210", "ct211"]\nserving = true\n'
                '[groups.b]\nnodes = ["ct[211]", "ct200"]\nserving = true\n', "", "groups.b",
     "node 'ct211' is already in serving group 'a'"),
    ("twice", '[groups.a]\nnodes = ["ct[210-211]", "ct210"]\nserving = true\n', "", "groups.a",
     "node 'ct210' is listed twice"),
    ("unknown-key", '[groups.a]\nnodes = ["ct210"]\nserving = true\nrestart = "x"\n', "", "groups.a.restart",
     "unknown key"),
    ("unknown-node", '[groups.a]\nnodes = ["ct210", "ct212"]\nserving = true\n', "", "groups.a",
     "unknown node 'ct212'"),
    ("unknown-range", '[groups.a]\nnodes = ["ct[210-212]"]\nserving = true\n', "", "groups.a",
     "names 1 unknown node(s): ct212"),
    ("no-nodes", '[groups.a]\nserving = true\n', "", "groups.a.nodes", "missing"),
    ("empty-nodes", '[groups.a]\nnodes = []\nserving = true\n', "", "groups.a.nodes", "non-empty list"),
    ("serving-not-bool", '[groups.a]\nnodes = ["ct210"]\nserving = "yes"\n', "", "groups.a.serving",
     "true or false"),
    ("max-fail-percent", "", 'max_fail = "150%"\n', "defaults.max_fail", "out of range"),
    ("max-fail-negative", "", "max_fail = -1\n", "defaults.max_fail", "not a number of units"),
    ("max-fail-word", "", 'max_fail = "abc"\n', "defaults.max_fail", "not a number of units"),
    ("max-fail-bool", "", "max_fail = true\n", "defaults.max_fail", "expected a number of units"),
]


@pytest.mark.parametrize(("groups", "defaults", "key", "reason"), [case[1:] for case in BAD],
                         ids=[case[0] for case in BAD])
def test_bad_serving_groups_and_budgets_name_file_key_and_reason(tmp_path: Path, groups: str, defaults: str,
                                                                key: str, reason: str) -> None:
    path = _write(tmp_path, groups + ("[defaults]\n" + defaults if defaults else ""))
    with pytest.raises(ConfigError) as caught:
        load_config(str(path))
    assert caught.value.exit_code == 2
    assert caught.value.message.startswith(f"{path}: {key}: ") and reason in caught.value.message, \
        caught.value.message


def test_two_groups_may_share_nodes_when_at_most_one_serves(tmp_path: Path) -> None:
    """Only serving groups are exclusive: a list group over a serving group's nodes is fine."""
    path = _write(tmp_path, '[groups]\nall = ["ct[200-201,210-211]"]\n[groups.dsv3]\nnodes = ["ct[210-211]"]\n'
                            'serving = true\n')
    assert load_config(str(path)).serving == {"dsv3": ("ct210", "ct211")}


@pytest.mark.parametrize(("text", "units", "allowed"), [
    ("0", 4, 0), ("1", 4, 1), ("50%", 4, 2), ("50%", 3, 1), ("25%", 3, 0), ("100%", 5, 5), ("0%", 9, 0),
    (2, 1, 2),
])
def test_the_budget_counts_units_and_a_percentage_rounds_down(text: str | int, units: int, allowed: int) -> None:
    assert allowed_failures(text, units) == allowed


@pytest.mark.parametrize("text", ["150%", "-1", "abc", "", "1.5", "%", "²"])
def test_a_bad_budget_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_max_fail(text)
    assert caught.value.exit_code == 2 and caught.value.message.startswith("--max-fail: ")
