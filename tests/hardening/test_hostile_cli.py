"""Hostile command lines and configs: refs that look like options, values of the wrong type.

tests/test_config.py covers the common wrong types key by key; here every node key is
fuzzed with values of every TOML type (hypothesis), plus the non-finite numbers and
path spellings that used to slip through (``connect_timeout = inf`` was an internal
error; ``paths = ["."]`` was accepted). Each refusal is a ConfigError (exit 2).
"""

from __future__ import annotations

import math
from datetime import date, datetime
from pathlib import Path

import pytest
from faultkit import all_refs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapver.config import _NODE_KEYS, parse_config
from snapver.errors import ConfigError

SRT = "sglang/srt"

TOML_VALUES = st.recursive(
    st.none().map(lambda _: "") | st.booleans() | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20) | st.dates() | st.datetimes(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(sorted(_NODE_KEYS)), value=TOML_VALUES, in_defaults=st.booleans())
def test_any_value_of_any_type_is_accepted_or_a_config_error(key: str, value: object, in_defaults: bool) -> None:
    node = {"host": "h", "site_packages": "/sp"}
    document = {"nodes": {"n": node}}
    if in_defaults and key not in ("host", "site_packages", "python", "local"):
        document["defaults"] = {key: value}
    else:
        node[key] = value
    try:
        config = parse_config(document, Path("/x/.snapver"))
    except ConfigError as exc:
        assert exc.exit_code == 2 and key in exc.message
        return
    spec = config.nodes["n"]
    assert math.isfinite(spec.connect_timeout) and spec.connect_timeout > 0
    assert math.isfinite(spec.control_persist) and spec.control_persist >= 0
    assert all(p and all(part not in ("", ".", "..") for part in p.split("/")) for p in spec.paths)
    assert not isinstance(value, (date, datetime)) or key not in ("port", "connect_timeout")


@pytest.mark.parametrize(("key", "value"), [
    ("connect_timeout", math.inf), ("connect_timeout", math.nan), ("control_persist", math.nan),
    ("control_persist", math.inf), ("paths", ["."]), ("paths", ["sglang//srt"]), ("paths", ["sglang/./srt"]),
])
def test_values_that_used_to_slip_through(write_config, run_snapver, key: str, value: object) -> None:
    write_config({"n": {"host": "127.0.0.200", "site_packages": "/sp", key: value}})
    result = run_snapver("nodes")
    assert result.code == 2, str(result)
    assert result.err.startswith("snapver: error: ") and f"nodes.n.{key}" in result.err
    assert "Traceback" not in result.err and "internal error" not in result.err


OPTION_LIKE = [
    ["diff", "--", "--help"], ["diff", "n", "--", "--help"], ["show", "-x"], ["show", "--", "-x"],
    ["show", "--", "--json"], ["tag", "--", "-d"], ["tag", "ok", "--", "-n1"], ["log", "--", "--all"],
    ["patch", "new", "--", "-p", "--base", "n"], ["patch", "new", "p", "--base", "--help"],
    ["patch", "show", "--", "-x"], ["push", "--", "--yes"], ["rollback", "--", "-n", "--yes"],
    ["diff", "n@latest", "--", "-"], ["show", "n~-1"], ["show", "n@--help"],
]


def test_refs_that_look_like_options_are_refused(small_site, local_node, write_config, run_snapver, store) -> None:
    write_config({"n": local_node(small_site)})
    assert run_snapver("pull", "n").code == 0
    before = all_refs(store)
    for args in OPTION_LIKE:
        result = run_snapver(*args)
        assert result.code == 2, f"{args}: {result}"
        assert "Traceback" not in result.err and "internal error" not in result.err, args
        assert len(result.err.strip().splitlines()) <= 2 and result.err.startswith("snapver: error: "), \
            f"{args}: {result.err}"
    # Past `--` an option-like word reaches the ref grammar, which names the reason.
    for args in (["show", "--", "-x"], ["show", "--", "--json"], ["patch", "new", "p", "--base=-x"]):
        assert "a ref cannot start with '-'" in run_snapver(*args).err, args
    assert all_refs(store) == before
    assert not (Path.cwd() / ".snapver-patches").exists()


@pytest.mark.parametrize("name", ["SNAPVER_LOCK_WAIT", "SNAPVER_GIT_TIMEOUT"])
@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf"])
def test_timeouts_from_the_environment_are_numbers_or_a_usage_error(small_site, local_node, write_config, run_snapver,
                                                                     name: str, value: str) -> None:
    """SNAPVER_LOCK_WAIT=abc was an internal error (ValueError), exit 1; SNAPVER_GIT_TIMEOUT=abc
    was silently the default. Both: one line naming the variable, a hint, exit 2, nothing written."""
    write_config({"n1": local_node(small_site)})
    result = run_snapver("pull", "n1", env={name: value})
    assert result.code == 2 and f"{name}={value!r}: expected a number of seconds" in result.err, str(result)
    assert "internal error" not in result.err and "hint:" in result.err
    listed = run_snapver("log")  # nothing recorded
    assert listed.code == 4 or "no snapshots" in listed.out + listed.err, str(listed)
