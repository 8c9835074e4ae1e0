"""`.snapver`: discovery, `[defaults]` inheritance, groups, and refusals that name file, key and reason."""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

import pytest

from snapver.config import load_config
from snapver.errors import ConfigError, UsageError


def _node(**extra: object) -> dict[str, object]:
    return {"host": "10.0.0.1", "site_packages": "/sp", **extra}


# --------------------------------------------------------------------------- discovery


def test_found_in_cwd_then_nearest_parent(write_config, tmp_path: Path, monkeypatch) -> None:
    top = write_config({"top": _node()}, where=tmp_path / "proj")
    deep = tmp_path / "proj" / "a" / "b"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    config = load_config()
    assert config.path == top.resolve()
    assert list(config.nodes) == ["top"]

    nearer = write_config({"near": _node()}, where=tmp_path / "proj" / "a")
    assert load_config().path == nearer.resolve()


def test_explicit_beats_environment_beats_discovery(write_config, tmp_path: Path, monkeypatch) -> None:
    write_config({"here": _node()})
    from_env = write_config({"env": _node()}, where=tmp_path / "env.toml")
    explicit = write_config({"explicit": _node()}, where=tmp_path / "explicit.toml")
    assert list(load_config().nodes) == ["here"]
    monkeypatch.setenv("SNAPVER_CONFIG", str(from_env))
    assert list(load_config().nodes) == ["env"]
    assert list(load_config(str(explicit)).nodes) == ["explicit"]


def test_missing_explicit_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(str(tmp_path / "nope.toml"))
    assert str(tmp_path / "nope.toml") in caught.value.message
    assert caught.value.exit_code == 2


def test_no_config_anywhere_is_the_embedded_local_default(tmp_path: Path) -> None:
    config = load_config(cwd=tmp_path / "work")
    assert config.path is None
    assert config.store_path == tmp_path / "work" / "snapshots"
    (node,) = config.nodes.values()
    assert node.name == "local" and node.local
    assert node.site_packages == sysconfig.get_paths()["purelib"]
    assert node.python == sys.executable


# --------------------------------------------------------------------------- values


def test_defaults_are_inherited_and_overridden(write_config, tmp_path: Path) -> None:
    defaults = {
        "user": "deploy", "port": 2222, "paths": ["sglang/srt", "sglang/lang/"],
        "exclude": ["*.so"], "identity_file": "~/.ssh/k", "known_hosts": "~/kh",
        "host_key_policy": "accept-new", "connect_timeout": 2.5,
    }
    nodes = {
        "a": _node(),
        "b": _node(user="root", port=22, paths=["x"], exclude=[], host_key_policy="strict",
                   connect_timeout=7, identity_file="/abs/key"),
        "c": {"local": True, "python": "/opt/venv/bin/python"},
    }
    config = load_config(str(write_config(nodes, defaults=defaults)))
    home = Path.home()
    a, b, c = config.nodes["a"], config.nodes["b"], config.nodes["c"]
    assert (a.user, a.port, a.paths, a.exclude) == ("deploy", 2222, ("sglang/srt", "sglang/lang"), ("*.so",))
    assert (a.identity_file, a.known_hosts) == (str(home / ".ssh/k"), str(home / "kh"))
    assert (a.host_key_policy, a.connect_timeout) == ("accept-new", 2.5)
    assert (b.user, b.port, b.paths, b.exclude) == ("root", 22, ("x",), ())
    assert (b.host_key_policy, b.connect_timeout, b.identity_file) == ("strict", 7.0, "/abs/key")
    assert c.local and c.python == "/opt/venv/bin/python" and c.site_packages is None
    assert a.address == "deploy@10.0.0.1:2222" and c.address == "local"


def test_builtin_defaults(write_config) -> None:
    node = load_config(str(write_config({"n": _node()}))).nodes["n"]
    assert node.paths == ("sglang/srt",)
    assert node.exclude == ("__pycache__/", "*.pyc")
    assert node.host_key_policy == "strict"
    assert node.connect_timeout == 10
    assert node.port is None and node.user is None and not node.local


def test_store_path_is_relative_to_the_config_file(write_config, tmp_path: Path) -> None:
    path = write_config({"n": _node()}, store="data/store", where=tmp_path / "proj")
    assert load_config(str(path)).store_path == (tmp_path / "proj" / "data" / "store").resolve()
    path = write_config({"n": _node()}, store="/abs/store", where=tmp_path / "abs.toml")
    assert load_config(str(path)).store_path == Path("/abs/store")
    path = write_config({"n": _node()}, store="~/s", where=tmp_path / "home.toml")
    assert load_config(str(path)).store_path == Path.home() / "s"
    path = write_config({"n": _node()}, store=None, where=tmp_path / "none")
    assert load_config(str(path)).store_path == (tmp_path / "none" / "snapshots").resolve()


def test_a_local_nodes_paths_are_relative_to_the_config_file(write_config, tmp_path: Path, monkeypatch) -> None:
    """A local node's site_packages (and python) are read as the store path is: ``~``
    expanded, relative to the config's folder; an SSH node's are the node's own."""
    from snapver_inproc import run_inproc

    site = tmp_path / "proj" / "sp" / "sglang" / "srt"
    site.mkdir(parents=True)
    (site / "a.py").write_text("a = 1\n")
    (tmp_path / "proj" / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "proj" / "venv" / "bin" / "python").symlink_to(sys.executable)
    local = {"local": True, "site_packages": "sp", "python": "venv/bin/python"}
    path = write_config({"a": local, "h": {"local": True, "site_packages": "~/sp", "python": "python3"},
                         "r": _node(site_packages="sp")}, where=tmp_path / "proj")
    monkeypatch.setenv("HOME", str(tmp_path / "proj"))
    config = load_config(str(path))
    assert config.node("a").site_packages == str(tmp_path / "proj" / "sp")
    assert config.node("a").python == str(tmp_path / "proj" / "venv" / "bin" / "python")
    assert (config.node("h").site_packages, config.node("h").python) == (str(tmp_path / "proj" / "sp"), "python3")
    assert config.node("r").site_packages == "sp"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for node in ("a", "h"):  # `a: sp: no such site-packages directory`, exit 3, before
        result = run_inproc("--config", str(path), "pull", node)
        assert result.code == 0 and "1 files" in result.out, result


# --------------------------------------------------------------------------- groups and selection


def test_select_expands_groups_in_order_without_repeats(write_config) -> None:
    nodes = {name: _node() for name in ("ct200", "ct129", "fleet00")}
    groups = {"tp8": ["ct200", "ct129"], "all3": ["fleet00", "ct129", "ct200"]}
    config = load_config(str(write_config(nodes, groups=groups)))
    assert config.groups == {"tp8": ("ct200", "ct129"), "all3": ("fleet00", "ct129", "ct200")}
    assert [s.name for s in config.select(["tp8"])] == ["ct200", "ct129"]
    assert [s.name for s in config.select(["fleet00", "tp8", "ct200"])] == ["fleet00", "ct200", "ct129"]
    assert [s.name for s in config.select(["all3"])] == ["fleet00", "ct129", "ct200"]
    assert [s.name for s in config.select([], all_nodes=True)] == ["ct200", "ct129", "fleet00"]


def test_node_ranges_expand_in_groups_and_selections(write_config) -> None:
    """Issue 32: `ct[200-207,210]` and `gpu[01-16]` name the configured nodes, zero padding kept."""
    names = ["ct200", "ct201", "ct202", "ct210", "gpu01", "gpu02", "gpu10"]
    groups = {"fleet": ["ct[200-202,210]"], "gpus": ["gpu[01-02]", "gpu10"]}
    config = load_config(str(write_config({name: _node() for name in names}, groups=groups)))
    assert config.groups == {"fleet": ("ct200", "ct201", "ct202", "ct210"), "gpus": ("gpu01", "gpu02", "gpu10")}
    assert [s.name for s in config.select(["ct[201-202]", "gpu[01-02]@live"])] == ["ct201", "ct202", "gpu01", "gpu02"]
    assert [s.name for s in config.select(["ct[200,210],fleet"])] == ["ct200", "ct210", "ct201", "ct202"]
    with pytest.raises(UsageError) as caught:
        config.select(["ct[200-203]"])
    assert caught.value.exit_code == 2 and "'ct[200-203]' names 1 unknown node(s): ct203" in caught.value.message
    for text, why in [("ct[7-2]", "runs backwards"), ("ct[a-b]", "is not a number"),
                      ("ct[1-100000]", "names more than 10,000 nodes")]:
        with pytest.raises(UsageError) as caught:
            config.select([text])
        assert caught.value.exit_code == 2 and caught.value.message.startswith("bad node range: ") \
            and why in caught.value.message, text


@pytest.mark.parametrize("members, reason", [
    (["ct[200-202]"], "'ct[200-202]' names 1 unknown node(s): ct202"),
    (["ct[201-200]"], "bad node range: 'ct[201-200]': the span '201-200' runs backwards"),
    (["ct[200-201]", "ct200"], "node 'ct200' is listed twice"),
])
def test_bad_ranges_in_groups_name_the_key(write_config, members, reason) -> None:
    path = write_config({"ct200": _node(), "ct201": _node()}, groups={"fleet": members})
    with pytest.raises(ConfigError) as caught:
        load_config(str(path))
    assert caught.value.exit_code == 2 and "groups.fleet" in str(caught.value) and reason in str(caught.value)


def test_node_at_live_is_the_node_wherever_nodes_are_named(write_config) -> None:
    """SPEC: `ct200@live` is the live node anywhere (status, pull, verify, ps, push take nodes)."""
    config = load_config(str(write_config({"ct200": _node(), "ct129": _node()}, groups={"tp8": ["ct200"]})))
    assert [s.name for s in config.select(["ct200@live", "ct129@LIVE", "ct200", "tp8"])] == ["ct200", "ct129"]
    assert config.node("ct129@Live").name == "ct129"
    for name in ("ct201@live", "tp8@live", "ct200@latest", "@live"):
        with pytest.raises(UsageError, match=f"unknown node or group {name!r}"):
            config.select([name])


def test_unknown_name_lists_the_known_nodes_and_groups(write_config) -> None:
    config = load_config(str(write_config({"ct200": _node(), "ct129": _node()}, groups={"tp8": ["ct200"]})))
    with pytest.raises(UsageError) as caught:
        config.select(["ct201"])
    assert caught.value.exit_code == 2
    assert "ct201" in caught.value.message
    assert all(name in str(caught.value) for name in ("ct200", "ct129", "tp8"))
    with pytest.raises(UsageError) as caught:
        config.node("nope")
    assert "ct129" in str(caught.value) and "ct200" in str(caught.value)


def test_no_name_needs_exactly_one_node(write_config, tmp_path: Path) -> None:
    one = load_config(str(write_config({"only": _node()}, where=tmp_path / "one")))
    assert [s.name for s in one.select([])] == ["only"]
    two = load_config(str(write_config({"a": _node(), "b": _node()}, where=tmp_path / "two")))
    with pytest.raises(UsageError) as caught:
        two.select([])
    assert "--all" in caught.value.message and "a, b" in str(caught.value)


def test_site_packages_and_python_may_be_shared_defaults(write_config) -> None:
    """A fleet of one layout says its site-packages (or python) once, in [defaults]; a node may
    still set its own. (``defaults.site_packages`` was refused as an unknown key.)"""
    path = write_config({"a": {"host": "10.0.0.1"}, "b": {"host": "10.0.0.2", "site_packages": "/other"}},
                        defaults={"site_packages": "/venv/sp", "python": "/venv/bin/python"})
    config = load_config(str(path))
    assert [(config.node(n).site_packages, config.node(n).python) for n in "ab"] == [
        ("/venv/sp", "/venv/bin/python"), ("/other", "/venv/bin/python")]


# --------------------------------------------------------------------------- refusals

BAD_CONFIGS = [
    # (id, nodes, groups, defaults, the key the error must name, a word of the reason)
    ("unknown-node-key", {"n": _node(hots="x")}, None, None, "nodes.n.hots", "unknown key"),
    ("unknown-default-key", {"n": _node()}, None, {"colour": "red"}, "defaults.colour", "unknown key"),
    ("host-in-defaults", {"n": _node()}, None, {"host": "h"}, "defaults.host", "set per node"),
    ("local-in-defaults", {"n": _node()}, None, {"local": True}, "defaults.local", "set per node"),
    ("no-paths", {"n": _node(paths=[])}, None, None, "nodes.n.paths", "at least one path"),
    ("no-paths-by-default", {"n": _node()}, None, {"paths": []}, "nodes.n.paths", "at least one path"),
    ("group-empty", {"n": _node()}, {"tp8": []}, None, "groups.tp8", "non-empty"),
    ("group-twice", {"n": _node()}, {"tp8": ["n", "n"]}, None, "groups.tp8", "twice"),
    ("group-bad-name", {"n": _node()}, {"--all": ["n"]}, None, "groups.--all", "group name"),
    ("group-name-with-at", {"n": _node()}, {"g@x": ["n"]}, None, "groups.g@x", "group name"),
    ("port-as-string", {"n": _node(port="22")}, None, None, "nodes.n.port", "integer"),
    ("port-as-bool", {"n": _node(port=True)}, None, None, "nodes.n.port", "integer"),
    ("port-range", {"n": _node(port=70000)}, None, None, "nodes.n.port", "1-65535"),
    ("paths-not-list", {"n": _node(paths="sglang/srt")}, None, None, "nodes.n.paths", "list"),
    ("exclude-not-strings", {"n": _node(exclude=[1])}, None, None, "nodes.n.exclude", "list"),
    ("local-not-bool", {"n": {"local": "yes", "site_packages": "/sp"}}, None, None, "nodes.n.local", "true or false"),
    ("timeout-string", {"n": _node()}, None, {"connect_timeout": "10s"}, "defaults.connect_timeout", "seconds"),
    ("timeout-zero", {"n": _node(connect_timeout=0)}, None, None, "nodes.n.connect_timeout", "positive"),
    ("local-without-site-packages", {"n": {"local": True}}, None, None, "nodes.n", "site_packages or python"),
    ("no-host", {"n": {"site_packages": "/sp"}}, None, None, "nodes.n.host", "missing"),
    ("bad-policy", {"n": _node(host_key_policy="yes")}, None, None, "nodes.n.host_key_policy", "accept-new"),
    ("absolute-path", {"n": _node(paths=["/etc"])}, None, None, "nodes.n.paths", "relative"),
    ("dotdot-path", {"n": _node(paths=["sglang/../.."])}, None, None, "nodes.n.paths", "relative"),
    ("nested-paths", {"n": _node(paths=["sglang/srt", "sglang/srt/layers"])}, None, None, "nodes.n.paths",
     "part of 'sglang/srt'"),
    ("duplicate-paths", {"n": _node(paths=["sglang/srt", "sglang/srt/"])}, None, None, "nodes.n.paths",
     "already tracked"),
    ("same-path-twice", {"n": _node(paths=["sglang/srt", "sglang/srt"])}, None, None, "nodes.n.paths",
     "already tracked"),
    ("group-unknown-node", {"n": _node()}, {"tp8": ["n", "ghost"]}, None, "groups.tp8", "ghost"),
    ("group-not-list", {"n": _node()}, {"tp8": "n"}, None, "groups.tp8", "list"),
    ("group-named-like-node", {"n": _node()}, {"n": ["n"]}, None, "groups.n", "share"),
    ("bad-node-name", {"a b": _node()}, None, None, "nodes.a b", "node name"),
    ("long-node-name", {"n" * 101: _node()}, None, None, "nodes." + "n" * 101, "at most 100"),
    # Fabric reads `user@host:port` out of a host: it met `user` and failed inside the connect.
    ("host-with-user", {"n": _node(host="root@127.0.2.1")}, None, {"user": "root"}, "nodes.n.host", "user"),
    ("host-with-port", {"n": _node(host="127.0.2.1:2222")}, None, None, "nodes.n.host", "port"),
    ("host-with-space", {"n": _node(host="a b")}, None, None, "nodes.n.host", "a host name"),
    # A host read as an option by whatever passes it on (ssh's ProxyCommand %h, an alias's shell).
    ("host-like-an-option", {"n": _node(host="-oProxyCommand=touch")}, None, None, "nodes.n.host", "option"),
    ("host-bracketed", {"n": _node(host="[::1]:22")}, None, None, "nodes.n.host", "port"),
]


def test_an_ipv6_host_is_a_host(write_config) -> None:
    """Colons alone do not make a port: `::1` and `fe80::1` are addresses."""
    for host in ("::1", "fe80::1", "ct200.example", "10.0.0.1"):
        assert load_config(str(write_config({"n": _node(host=host)}))).nodes["n"].host == host


def test_a_host_holding_a_user_is_a_config_error_not_an_internal_one(write_config, run_snapver) -> None:
    """`host = "root@127.0.2.1"` with `user = "root"`: `nodes --check` was an internal error
    (Fabric: "You supplied the user via both shorthand and kwarg!"), exit 1."""
    write_config({"n": _node(host="root@127.0.2.1", connect_timeout=1)}, defaults={"user": "root"})
    for command in (["nodes", "--check"], ["pull", "n"]):
        result = run_snapver(*command)
        lines = result.err.splitlines()
        assert result.code == 2 and lines[0].startswith("snapver: error: ") and "nodes.n.host" in lines[0], result
        assert "internal error" not in result.err and len(lines) == 2 and lines[1].startswith("hint: "), result


@pytest.mark.parametrize(("nodes", "groups", "defaults", "key", "reason"),
                         [case[1:] for case in BAD_CONFIGS], ids=[case[0] for case in BAD_CONFIGS])
def test_bad_config_names_file_key_and_reason(write_config, nodes, groups, defaults, key, reason) -> None:
    path = write_config(nodes, groups=groups, defaults=defaults)
    with pytest.raises(ConfigError) as caught:
        load_config(str(path))
    message = caught.value.message
    assert caught.value.exit_code == 2
    assert message.startswith(f"{path}: {key}: "), message
    assert reason in message
    assert ".snapver.example" in caught.value.hint  # SPEC: one line and a hint


def test_unknown_top_level_and_store_keys(tmp_path: Path) -> None:
    cases = {
        "[stores]\npath = 'x'\n": "stores",
        "[store]\npath = 3\n": "store.path",
        "[store]\npath = 'x'\nbare = true\n": "store.bare",
        "nodes = 3\n": "nodes",
        "[nodes]\nn = 3\n": "nodes.n",
    }
    for text, key in cases.items():
        path = tmp_path / "c.toml"
        path.write_text(text)
        with pytest.raises(ConfigError) as caught:
            load_config(str(path))
        assert caught.value.message.startswith(f"{path}: {key}: "), (text, caught.value.message)


def test_invalid_toml_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("[nodes.a]\nhost = \n")
    with pytest.raises(ConfigError) as caught:
        load_config(str(path))
    assert caught.value.message.startswith(f"{path}: not valid TOML")
    assert "line 2" in caught.value.message
