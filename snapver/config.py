"""`.snapver` (TOML): find it, inherit `[defaults]`, validate with file, key and reason."""

from __future__ import annotations

import math
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from snapver.errors import ConfigError, UsageError
from snapver.healthrequest import HealthRequest, from_table
from snapver.model import MAX_NAME_LENGTH  # node and group names: as tag and patch names, a ref's

# tomllib and sysconfig are imported where they are needed (start-up time): a command
# reads either a file or the embedded default, never both.

CONFIG_NAME = ".snapver"
ENV_CONFIG = "SNAPVER_CONFIG"
HOST_KEY_POLICIES = ("strict", "accept-new")
ENGINES = ("docker", "podman")
DEFAULT_PATHS = ("sglang/srt",)
DEFAULT_EXCLUDE = ("__pycache__/", "*.pyc")

# key → (type, description) of every key a node may set, in [defaults] or [nodes.X].
_NODE_KEYS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "host": (str, "a string"),
    "port": (int, "an integer"),
    "user": (str, "a string"),
    "local": (bool, "true or false"),
    "site_packages": (str, "a string"),
    "python": (str, "a string"),
    "paths": (list, "a list of strings"),
    "exclude": (list, "a list of strings"),
    "identity_file": (str, "a string"),
    "known_hosts": (str, "a string"),
    "host_key_policy": (str, '"strict" or "accept-new"'),
    "connect_timeout": ((int, float), "a number of seconds"),
    "compress": (str, '"auto", "zlib" or "none"'),
    "environment": (bool, "true or false"),
    "control_persist": ((int, float), "a number of seconds (0: off)"),
    "restart": (str, "a shell command"),
    "health": (str, "a shell command"),
    "health_url": (str, "an http:// or https:// URL"),
    "health_timeout": ((int, float), "a number of seconds"),
    "health_request": (dict, 'a table such as { url = "http://127.0.0.1:30000/generate", body = \'{...}\', '
                             'match = "text" }'),
    "container": (str, "a string (the container's name or id)"),
    "engine": (str, '"docker" or "podman"'),
    "exec": (list, 'a list of strings (an argv prefix, e.g. ["kubectl", "exec", "-i", "POD", "--"])'),
}
DEFAULT_HEALTH_TIMEOUT = 300.0
NO_CONFIG_HINT = ("run snapver where your .snapver is (or below it), pass --config PATH or set SNAPVER_CONFIG; "
                  "`snapver init` writes a new one here")
CONFIG_HINT = "every key is described in .snapver.example (snapver init writes it as a new .snapver)"
# What one node is; the rest a fleet may share ([defaults]): a container's name may be
# the same on every host, an exec prefix names one pod.
_NODE_ONLY_KEYS = {"host", "local", "exec"}


@dataclass(frozen=True)
class NodeSpec:
    """One node, with `[defaults]` already applied."""

    name: str
    site_packages: str | None
    python: str | None = None
    local: bool = False
    host: str | None = None
    port: int | None = None
    user: str | None = None
    paths: tuple[str, ...] = DEFAULT_PATHS
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    identity_file: str | None = None
    known_hosts: str | None = None
    host_key_policy: str = "strict"
    connect_timeout: float = 10.0
    compress: str = "auto"
    environment: bool = True  # each snapshot records the environment under the tree
    control_persist: float = 0.0
    restart: str | None = None  # run on the node after a push or rollback writes it
    health: str | None = None  # a shell command on the node: exit 0 = healthy
    health_url: str | None = None  # polled from the node itself: 2xx = healthy
    health_timeout: float = DEFAULT_HEALTH_TIMEOUT  # seconds for the restart, and to become healthy
    health_request: HealthRequest | None = None  # sent before a push writes and after the restart: same answer
    # The node is a container on the host (or on this machine, ``local``): the agent runs
    # through ``ENGINE exec -i CONTAINER``, or through ``exec_prefix`` (kubectl exec ... --).
    container: str | None = None
    engine: str = "docker"
    exec_prefix: tuple[str, ...] = ()

    @property
    def in_container(self) -> bool:
        """True when the agent runs in a container (``container`` or ``exec``), not on the host."""
        return bool(self.container or self.exec_prefix)

    @property
    def address(self) -> str:
        """Where the node lives, for humans: ``user@host:port`` or ``local``, then the
        container (``docker:sglang``) or exec prefix, if any."""
        if self.local:
            where = "local"
        else:
            user = f"{self.user}@" if self.user else ""
            port = f":{self.port}" if self.port else ""
            where = f"{user}{self.host}{port}"
        if self.container:
            return f"{where} {self.engine}:{self.container}"
        if self.exec_prefix:
            return f"{where} exec {shlex.join(self.exec_prefix)}"
        return where

    @property
    def tcp_connect_timeout(self) -> int:
        """Seconds to wait for TCP to connect: whole, at least 1 (as Fabric takes them)."""
        return max(1, int(round(self.connect_timeout)))


@dataclass(frozen=True)
class Config:
    """A loaded, validated `.snapver`."""

    path: Path | None  # None for the embedded default
    store_path: Path
    nodes: dict[str, NodeSpec] = field(default_factory=dict)
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)
    waves: str | None = None  # [defaults] waves: how a push rolls out when --waves is not given
    # [groups.NAME] serving = true: nodes that run one server together (config order), each
    # pushed as one unit of a wave; every serving group is in ``groups`` as well.
    serving: dict[str, tuple[str, ...]] = field(default_factory=dict)
    max_fail: str | None = None  # [defaults] max_fail: units a push may lose and go on (push --max-fail)
    # [ui] pager: True (the default: $SNAPVER_PAGER, $PAGER or less), False (never), or a command.
    pager: bool | str = True
    # [store] remote: where `snapver sync` shares the store (anything git can push to); a
    # relative path is made absolute against the config's folder.
    remote: str | None = None
    sync: str = "manual"  # [store] sync: "auto" syncs before reading commands and after writing ones
    searched: Path | None = None  # the embedded default's: where no .snapver was found

    def no_config_note(self) -> str:
        """For the embedded default, what a name it lacks most likely means; else ""."""
        if self.path is not None:
            return ""
        return (f"no .snapver found in {self.searched or Path.cwd()} or its parents "
                f"(using the embedded default: node {', '.join(self.nodes)})")

    def unknown_name(self, message: str, hint: str) -> UsageError:
        """A name that is no node or group: with the embedded default, say that no config was read."""
        note = self.no_config_note()
        if note:
            return UsageError(f"{message}: {note}", hint=NO_CONFIG_HINT)
        return UsageError(message, hint=hint)

    def live_name(self, name: str) -> str:
        """``name`` with an ``@live`` suffix (any case) taken off when what is left is a node:
        ``ct200@live`` is the live node anywhere (SPEC "Refs"), wherever a node is named."""
        node, at, word = name.rpartition("@")
        return node if at and word.lower() == "live" and node in self.nodes else name

    def node(self, name: str) -> NodeSpec:
        """The node called ``name`` (or ``name@live``); an unknown name is a usage error listing the known."""
        try:
            return self.nodes[self.live_name(name)]
        except KeyError:
            raise self.unknown_name(f"unknown node {name!r}",
                                    hint=f"known nodes: {', '.join(sorted(self.nodes)) or '(none)'}") from None

    def select(self, names: list[str] | tuple[str, ...], all_nodes: bool = False) -> list[NodeSpec]:
        """Expand node and group names (in order, without repeats) to node specs; ``NODE@live``
        is the node."""
        if not self.nodes:
            raise UsageError(f"no nodes in {self.path or 'the config'}",
                             hint="add a [nodes.NAME] table (the file shows how), "
                             "or run `snapver init --local` in a new folder for this machine's site-packages")
        if all_nodes or not names:
            if not all_nodes and not names and len(self.nodes) != 1:
                raise UsageError(
                    "name a node or group, or use --all",
                    hint=f"nodes: {', '.join(sorted(self.nodes))}"
                    + (f"; groups: {', '.join(sorted(self.groups))}" if self.groups else ""),
                )
            return [self.nodes[name] for name in self.nodes]
        chosen: dict[str, NodeSpec] = {}
        for name in map(self.live_name, self._expand_ranges(names)):
            if name in self.groups:
                for member in self.groups[name]:
                    chosen.setdefault(member, self.nodes[member])
            elif name in self.nodes:
                chosen.setdefault(name, self.nodes[name])
            else:
                known = sorted(self.nodes) + sorted(self.groups)
                raise self.unknown_name(f"unknown node or group {name!r}",
                                        hint=f"known: {', '.join(known) or '(none)'}")
        return list(chosen.values())

    def _expand_ranges(self, names: list[str] | tuple[str, ...]) -> list[str]:
        """Names with node ranges (``ct[200-207,210]``) expanded to the configured nodes and
        groups they name; a range naming any other is a UsageError listing them."""
        from snapver.noderange import RangeError, expand, is_range

        expanded: list[str] = []
        for text in names:
            if not is_range(text):
                expanded.append(text)
                continue
            try:
                found = expand(text)
            except RangeError as exc:
                raise UsageError(f"bad node range: {exc}",
                                 hint="write a range as ct[200-207,210] or gpu[01-16]") from None
            unknown = [n for n in found if self.live_name(n) not in self.nodes and self.live_name(n) not in self.groups]
            if unknown:
                shown = ", ".join(unknown[:20]) + (f" and {len(unknown) - 20} more" if len(unknown) > 20 else "")
                raise UsageError(f"{text!r} names {len(unknown)} unknown node(s): {shown}",
                                 hint=f"known nodes: {', '.join(sorted(self.nodes)) or '(none)'}")
            expanded.extend(found)
        return expanded


def _expand_members(members: list[str], nodes: dict[str, NodeSpec], key: str, fail: Any) -> list[str]:
    """A group's members with node ranges expanded; a range naming a node not configured
    fails with them all."""
    from snapver.noderange import RangeError, expand, is_range

    expanded: list[str] = []
    for member in members:
        if not is_range(member):
            expanded.append(member)
            continue
        try:
            found = expand(member)
        except RangeError as exc:
            raise fail(key, f"bad node range: {exc}") from None
        unknown = [n for n in found if n not in nodes]
        if unknown:
            shown = ", ".join(unknown[:20]) + (f" and {len(unknown) - 20} more" if len(unknown) > 20 else "")
            raise fail(key, f"{member!r} names {len(unknown)} unknown node(s): {shown}")
        expanded.extend(found)
    return expanded


def find_config_path(explicit: str | None = None, cwd: Path | None = None) -> Path | None:
    """`--config`, else `$SNAPVER_CONFIG`, else `.snapver` here or in the nearest parent."""
    if explicit:
        return Path(explicit)
    if os.environ.get(ENV_CONFIG):
        return Path(os.environ[ENV_CONFIG])
    here = (cwd or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / CONFIG_NAME
        if candidate.is_file():
            return candidate
    return None


def load_config(explicit: str | None = None, cwd: Path | None = None) -> Config:
    """Find and load the config; with none anywhere, the embedded default (a local node)."""
    path = find_config_path(explicit, cwd)
    if path is None:
        return default_config(cwd or Path.cwd())
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file", hint="run `snapver init`") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}", hint=CONFIG_HINT) from exc
    return parse_config(data, path)


def default_config(cwd: Path) -> Config:
    """The embedded default: this Python's site-packages as node `local`, store `./snapshots`."""
    import sysconfig

    site_packages = sysconfig.get_paths()["purelib"]
    node = NodeSpec(name="local", local=True, site_packages=site_packages, python=sys.executable)
    return Config(path=None, store_path=cwd / "snapshots", nodes={"local": node}, searched=cwd.resolve())


def parse_config(data: dict[str, Any], path: Path) -> Config:
    """Validate a parsed TOML document; every error names ``path`` and the key."""

    def fail(key: str, reason: str) -> ConfigError:
        return ConfigError(f"{path}: {key}: {reason}", hint=CONFIG_HINT)

    _check_keys(data, {"store", "defaults", "nodes", "groups", "ui"}, "", fail)
    ui = _table(data, "ui", fail)
    _check_keys(ui, {"pager"}, "ui.", fail)
    pager = ui.get("pager", True)
    if not isinstance(pager, (bool, str)):
        raise fail("ui.pager", f"expected true, false or a command, got {type(pager).__name__} {pager!r}")
    store = _table(data, "store", fail)
    _check_keys(store, {"path", "remote", "sync"}, "store.", fail)
    store_value = store.get("path", "snapshots")
    if not isinstance(store_value, str) or not store_value:
        raise fail("store.path", "expected a non-empty string")
    store_path = Path(os.path.expanduser(store_value))
    if not store_path.is_absolute():
        store_path = path.resolve().parent / store_path
    remote = store.get("remote")
    if remote is not None:
        if not isinstance(remote, str) or not remote.strip() or remote.startswith("-"):
            raise fail("store.remote", "expected a git URL or a path (ssh://host/path, git@host:path, /path)")
        remote = _remote_location(remote.strip(), path)
    sync = store.get("sync", "manual")
    if sync not in ("auto", "manual"):
        raise fail("store.sync", f'expected "auto" or "manual", got {sync!r}')

    defaults = dict(_table(data, "defaults", fail))
    for key in sorted(_NODE_ONLY_KEYS & set(defaults)):
        raise fail(f"defaults.{key}", "set per node ([nodes.NAME]), not in [defaults]")
    _check_keys(defaults, set(_NODE_KEYS) - _NODE_ONLY_KEYS | {"port", "waves", "max_fail"}, "defaults.", fail)
    max_fail = _max_fail(defaults.pop("max_fail", None), fail)
    waves = defaults.pop("waves", None)  # the fleet's, not a node's
    if waves is not None:
        if not isinstance(waves, str):
            raise fail("defaults.waves", f'expected a string such as "1,25%,100%", got {waves!r}')
        try:
            parse_waves(waves)
        except UsageError as exc:
            raise fail("defaults.waves", exc.message.replace("--waves: ", "")) from None
    _check_types(defaults, "defaults.", fail)

    nodes: dict[str, NodeSpec] = {}
    for name, table in _table(data, "nodes", fail).items():
        if not isinstance(table, dict):
            raise fail(f"nodes.{name}", "expected a table")
        if not valid_node_name(name):
            raise fail(f"nodes.{name}", f"a node name is letters, digits, '.', '_' or '-' (at most {MAX_NAME_LENGTH})")
        prefix = f"nodes.{name}."
        _check_keys(table, set(_NODE_KEYS), prefix, fail)
        _check_types(table, prefix, fail)
        merged = {**defaults, **table}
        if "exec" in table and "container" not in table:
            merged.pop("container", None)  # a node's own exec prefix replaces a shared container
        nodes[name] = _node_spec(name, merged, prefix, fail, path.resolve().parent)

    groups: dict[str, tuple[str, ...]] = {}
    serving: dict[str, tuple[str, ...]] = {}
    for name, value in _table(data, "groups", fail).items():
        key = f"groups.{name}"
        if not valid_node_name(name):
            raise fail(key, f"a group name is letters, digits, '.', '_' or '-' (at most {MAX_NAME_LENGTH})")
        if name in nodes:
            raise fail(key, f"a group cannot share its name with node {name!r}")
        members, is_serving = _group_members(value, key, fail)
        members = _expand_members(members, nodes, key, fail)
        twice = sorted({m for m in members if members.count(m) > 1})
        if twice:
            raise fail(key, f"node {twice[0]!r} is listed twice")
        for member in members:
            if member not in nodes:
                raise fail(key, f"unknown node {member!r} (known: {', '.join(sorted(nodes))})")
        groups[name] = tuple(members)
        if is_serving:
            _check_serving_overlap(name, members, serving, fail)
            serving[name] = tuple(members)
    return Config(path=path, store_path=store_path, nodes=nodes, groups=groups, waves=waves, pager=pager,
                  remote=remote, sync=sync, serving=serving, max_fail=max_fail)


def _max_fail(value: Any, fail: Any) -> str | None:
    """``[defaults] max_fail`` (a number of units or "P%") as text, checked."""
    if value is None:
        return None
    from snapver.failbudget import parse_max_fail

    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise fail("defaults.max_fail", f'expected a number of units or a string such as "25%", got {value!r}')
    try:
        parse_max_fail(value)
    except UsageError as exc:
        raise fail("defaults.max_fail", exc.message.replace("--max-fail: ", "")) from None
    return str(value).strip()


def _group_members(value: Any, key: str, fail: Any) -> tuple[list[str], bool]:
    """A group's members as written and whether it is a serving group: a list (``tp8 =
    [...]``), or a table (``[groups.dsv3]``: ``nodes``, and ``serving`` true or false)."""
    serving = False
    if isinstance(value, dict):
        _check_keys(value, {"nodes", "serving"}, key + ".", fail)
        serving = value.get("serving", False)
        if not isinstance(serving, bool):
            raise fail(key + ".serving", f"expected true or false, got {serving!r}")
        if "nodes" not in value:
            raise fail(key + ".nodes", "missing (the group's nodes, e.g. nodes = [\"ct[210-211]\"])")
        key, value = key + ".nodes", value["nodes"]
    if not isinstance(value, list) or not all(isinstance(m, str) for m in value) or not value:
        raise fail(key, "expected a non-empty list of node names")
    return value, serving


def _check_serving_overlap(name: str, members: list[str], serving: dict[str, tuple[str, ...]], fail: Any) -> None:
    """A node runs one server: it may be in one serving group only."""
    for other, others in serving.items():
        shared = [m for m in members if m in others]
        if shared:
            raise fail(f"groups.{name}", f"node {shared[0]!r} is already in serving group {other!r} (a node runs "
                       "one server: it belongs to one serving group)")


def _remote_location(remote: str, config_path: Path) -> str:
    """A remote as git should be given it: URLs (``scheme://``) and scp-like ``host:path``
    as they are; a path made absolute (``~`` expanded, relative to the config's folder)."""
    if "://" in remote or re.match(r"^[^/]+:", remote):
        return remote
    return _local_path(remote, config_path.resolve().parent) or remote


def _local_path(value: str | None, folder: Path, command: bool = False) -> str | None:
    """A local node's path as the store's is read: ``~`` expanded, relative to the config's
    folder (not to wherever snapver runs); a ``command`` named bare (``python3``) stays one."""
    if not value or (command and "/" not in value and not value.startswith("~")):
        return value
    return os.path.normpath(Path(folder, os.path.expanduser(value)))


def _container_keys(merged: dict[str, Any], prefix: str, fail: Any) -> tuple[str | None, str, tuple[str, ...]]:
    """(container, engine, exec prefix) of a node, checked."""
    container, prefix_argv = merged.get("container"), merged.get("exec")
    if container is not None and prefix_argv is not None:
        raise fail(prefix.rstrip("."), "container and exec are two ways to reach one container: set one "
                   '(exec = [...] for anything but docker or podman, e.g. ["kubectl", "exec", "-i", "POD", "--"])')
    if container is not None and (not container.strip() or container.startswith("-") or "\0" in container):
        raise fail(prefix + "container", f"expected a container name or id, got {container!r}")
    engine = merged.get("engine", "docker")
    if engine not in ENGINES:
        raise fail(prefix + "engine", f'expected "docker" or "podman", got {engine!r}')
    if prefix_argv is not None and (not prefix_argv or not prefix_argv[0].strip()):
        raise fail(prefix + "exec", "expected a non-empty list of strings starting with a command")
    return container, engine, tuple(prefix_argv or ())


def _node_spec(name: str, merged: dict[str, Any], prefix: str, fail: Any, folder: Path) -> NodeSpec:
    container, engine, exec_prefix = _container_keys(merged, prefix, fail)
    in_container = bool(container or exec_prefix)
    # A container without a host is on this machine, as `local = true` says it.
    local = bool(merged.get("local", False)) or (in_container and not merged.get("host"))
    if local and not in_container:  # a path on a node is the node's to read (its home, its working folder)
        merged = {**merged, "site_packages": _local_path(merged.get("site_packages"), folder),
                  "python": _local_path(merged.get("python"), folder, command=True)}
    # Without either, the node's own Python says where it imports the tracked package from
    # (an editable checkout, a wheel); a folder of this machine has no Python of its own to ask.
    if local and not in_container and not merged.get("site_packages") and not merged.get("python"):
        raise fail(prefix.rstrip("."), "needs site_packages or python (a local node is a folder of this machine)")
    if not local and not merged.get("host"):
        raise fail(prefix + "host", "missing (or set local = true)")
    problem = host_problem(merged["host"]) if merged.get("host") else ""
    if problem:
        raise fail(prefix + "host", problem)
    policy = merged.get("host_key_policy", "strict")
    if policy not in HOST_KEY_POLICIES:
        raise fail(prefix + "host_key_policy", f"expected one of {', '.join(HOST_KEY_POLICIES)}, got {policy!r}")
    compress = merged.get("compress", "auto")
    if compress not in ("auto", "zlib", "none"):
        raise fail(prefix + "compress", f"expected auto, zlib or none, got {compress!r}")
    port = merged.get("port")
    if port is not None and not 0 < port < 65536:
        raise fail(prefix + "port", f"expected 1-65535, got {port}")
    persist = merged.get("control_persist", 0)
    if not 0 <= persist < math.inf:  # also refuses nan
        raise fail(prefix + "control_persist", f"expected 0 (off) or a positive number of seconds, got {persist}")
    timeout = merged.get("connect_timeout", 10)
    if not 0 < timeout < math.inf:
        raise fail(prefix + "connect_timeout", f"expected a positive number of seconds, got {timeout}")
    for key in ("restart", "health"):
        if key in merged and not merged[key].strip():
            raise fail(prefix + key, "expected a shell command, got an empty string")
    health_url = merged.get("health_url")
    if health_url is not None:
        problem = url_problem(health_url)
        if problem:
            raise fail(prefix + "health_url", problem)
    health_request = from_table(merged["health_request"], url_problem, fail, prefix + "health_request") \
        if "health_request" in merged else None
    health_timeout = merged.get("health_timeout", DEFAULT_HEALTH_TIMEOUT)
    if not 0 < health_timeout < math.inf:
        raise fail(prefix + "health_timeout", f"expected a positive number of seconds, got {health_timeout}")
    paths = tuple(merged.get("paths", DEFAULT_PATHS))
    if not paths:
        raise fail(prefix + "paths", "expected at least one path (a pull of none would record an empty tree)")
    for tracked in paths:
        parts = tracked.strip("/").split("/")
        if (not tracked or tracked.startswith("/") or any(part in ("", ".", "..") for part in parts)
                or parts[0] == ".snapver" or "\0" in tracked):
            raise fail(prefix + "paths", f"{tracked!r} must be a relative path inside site-packages")
    stripped = [tracked.strip("/") for tracked in paths]
    for index, outer in enumerate(stripped):
        for inner in stripped[:index] + stripped[index + 1:]:
            if (inner + "/").startswith(outer + "/"):
                raise fail(prefix + "paths", f"{inner!r} is already tracked as part of {outer!r}")
    expand = lambda value: os.path.expanduser(value) if value else value  # noqa: E731
    return NodeSpec(
        name=name,
        site_packages=merged.get("site_packages"),
        python=merged.get("python"),
        local=local,
        host=merged.get("host"),
        port=port,
        user=merged.get("user"),
        paths=tuple(p.strip("/") for p in paths),
        exclude=tuple(merged.get("exclude", DEFAULT_EXCLUDE)),
        identity_file=expand(merged.get("identity_file")),
        known_hosts=expand(merged.get("known_hosts")),
        host_key_policy=policy,
        connect_timeout=float(timeout),
        compress=compress,
        environment=merged.get("environment", True),
        control_persist=float(persist),
        restart=merged.get("restart"),
        health=merged.get("health"),
        health_url=health_url,
        health_timeout=float(health_timeout),
        health_request=health_request,
        container=container,
        engine=engine,
        exec_prefix=exec_prefix,
    )


def host_problem(host: str) -> str:
    """Why ``host`` cannot be a node's host ("" when it can). Fabric would read a user out of
    ``user@host`` and a port out of ``host:port`` (and fail inside the connect when `user` is
    set as well): each has a key of its own. Two colons or more are an IPv6 address."""
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in host):
        return f"expected a host name, an address or an ~/.ssh/config alias, got {host!r}"
    if host.startswith("-"):  # as OpenSSH refuses it: read as an option wherever it is passed on
        return f"{host!r} starts with '-', read as an option: expected a host name, an address or an alias"
    if "@" in host:
        user, _, rest = host.rpartition("@")
        return f"{host!r} holds a user: write host = {rest!r} and user = {user!r}"
    if host.startswith("[") or host.count(":") == 1:
        name, _, port = host.rpartition(":")
        return f"{host!r} holds a port: write host = {name.strip('[]')!r} and port = {port or 'N'}"
    return ""


def url_problem(url: str) -> str:
    """Why ``url`` cannot be a health URL ("" when it can): http(s), a host, nothing odd."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        return f"not a URL ({exc}): {url!r}"
    if parts.scheme not in ("http", "https"):
        return f"expected an http:// or https:// URL, got {url!r}"
    if not parts.hostname or any(ch.isspace() or ord(ch) < 32 for ch in url):
        return f"expected an http:// or https:// URL with a host, got {url!r}"
    return ""


def valid_node_name(name: str) -> bool:
    return (bool(name) and len(name) <= MAX_NAME_LENGTH and all(ch.isalnum() or ch in "._-" for ch in name)
            and not name.startswith((".", "-")))


def _table(data: dict[str, Any], key: str, fail: Any) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise fail(key, "expected a table")
    return value


def _check_keys(table: dict[str, Any], allowed: set[str], prefix: str, fail: Any) -> None:
    for key in table:
        if key not in allowed:
            raise fail(prefix + key, f"unknown key (allowed: {', '.join(sorted(allowed))})")


def _check_types(table: dict[str, Any], prefix: str, fail: Any) -> None:
    for key, value in table.items():
        expected, description = _NODE_KEYS[key]
        wrong = not isinstance(value, expected) or (isinstance(value, bool) and expected is not bool)
        if not wrong and expected is list:
            wrong = not all(isinstance(item, str) for item in value)
        if wrong:
            raise fail(prefix + key, f"expected {description}, got {type(value).__name__} {value!r}")


def parse_waves(text: str) -> list[tuple[float, bool]]:
    """``1,25%,100%`` → [(1, False), (25, True), (100, True)]: each wave's cumulative size,
    a node count or a percentage of the targets. Sizes must grow; a count is at least 1, a
    percentage 1-100. Anything else is a usage error."""
    steps: list[tuple[float, bool]] = []
    for piece in text.split(","):
        item = piece.strip()
        percent = item.endswith("%")
        number = item[:-1].strip() if percent else item
        if not number.isdigit():
            raise UsageError(f"--waves: {item!r} is not a node count or a percentage (in {text!r})",
                             hint="e.g. --waves 1,25%,100%: one node, then up to a quarter, then all")
        value = int(number)
        if value < 1 or (percent and value > 100):
            raise UsageError(f"--waves: {item!r} is out of range (a count is at least 1, a percentage 1-100%)",
                             hint="e.g. --waves 1,25%,100%")
        steps.append((float(value), percent))
    return steps
