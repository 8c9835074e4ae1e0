"""The ref grammar (SPEC "Refs"): every row of the table, ambiguity and unknown refs.

One store is built per module: two nodes pulled for real, then their histories are
rewritten with git plumbing (``git commit-tree`` with fixed dates) so that the date
forms have known answers. Tests resolve through the API; a few go through the CLI
for exit codes and messages.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import pytest
from helpers import toml_dumps

from snapver.config import load_config
from snapver.errors import RefError
from snapver.ops.pull import pull
from snapver.refs import parse_day, resolve_snapshot, resolve_tree
from snapver.store.repo import Store

TODAY = date.today()
# The year `may22` means today (the latest May 22 not in the future), so the test holds in any year.
YEAR = TODAY.year if date(TODAY.year, 5, 22) <= TODAY else TODAY.year - 1


def _git(store: Path, *args: str, env: dict[str, str] | None = None, input: bytes | None = None) -> str:
    full_env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                "GIT_COMMITTER_EMAIL": "t@t", **(env or {})}
    done = subprocess.run(["git", "--git-dir", str(store), *args], capture_output=True, env=full_env,
                          input=input, check=True)
    return done.stdout.decode().strip()


def _commit(store: Path, tree: str, when: str, node: str, parent: str | None = None, kind: str = "snapshot",
            extra: dict | None = None) -> str:
    meta = json.dumps({"kind": kind, "node": node, **(extra or {})})
    args = ["commit-tree", tree, "-m", f"{node} {kind} at {when}\n\nsnapver-meta: {meta}"]
    if parent:
        args += ["-p", parent]
    return _git(store, *args, env={"GIT_COMMITTER_DATE": when, "GIT_AUTHOR_DATE": when})


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Nodes ct200, ct129, fleet00 (local), a store with dated histories, tags and patches."""
    root = tmp_path_factory.mktemp("refs")
    nodes = {}
    for name in ("ct200", "ct129", "fleet00"):
        site = root / name / "site-packages"
        (site / "sglang" / "srt").mkdir(parents=True)
        (site / "sglang" / "srt" / "a.py").write_text(f"print({name!r})\n")
        nodes[name] = {"local": True, "site_packages": str(site)}
    config_path = root / ".snapver"
    config_path.write_text(toml_dumps({"store": {"path": "snapshots"}, "nodes": nodes}))
    config = load_config(str(config_path))
    store = Store.open_or_create(config.store_path)
    assert pull(store, list(config.nodes.values())).exit_code == 0
    git_dir = config.store_path
    tree = _git(git_dir, "rev-parse", "refs/heads/nodes/ct200^{tree}")
    y = YEAR
    ids: dict[str, str] = {}
    ids["d1"] = _commit(git_dir, tree, f"{y}-05-20T10:00:00+0000", "ct200")
    ids["d2"] = _commit(git_dir, tree, f"{y}-05-22T09:00:00+0000", "ct200", ids["d1"])
    ids["d3"] = _commit(git_dir, tree, f"{y}-05-22T18:00:00+0000", "ct200", ids["d2"])
    ids["d4"] = _commit(git_dir, tree, f"{y}-05-25T12:00:00+0000", "ct200", ids["d3"])
    ids["c1"] = _commit(git_dir, tree, f"{y}-05-21T12:00:00+0000", "ct129")
    ids["c2"] = _commit(git_dir, tree, f"{y}-05-23T02:00:00+0000", "ct129", ids["c1"])
    ids["f1"] = _commit(git_dir, tree, f"{y}-04-01T12:00:00+0000", "fleet00")
    ids["g1"] = _commit(git_dir, tree, f"{y}-04-02T12:00:00+0000", "ghost")
    ids["p1"] = _commit(git_dir, tree, f"{y}-07-01T12:00:00+0000", "ct200", ids["d4"], kind="patch",
                        extra={"base": ids["d4"]})
    for ref, commit in {"refs/heads/nodes/ct200": "d4", "refs/heads/nodes/ct129": "c2",
                        "refs/heads/nodes/fleet00": "f1", "refs/heads/nodes/ghost": "g1",
                        "refs/tags/v1": "d2", "refs/tags/may20": "c1", "refs/tags/fleet00": "f1",
                        "refs/tags/shared": "d1", "refs/heads/patches/shared": "p1",
                        "refs/heads/patches/dflash-fix": "p1"}.items():
        _git(git_dir, "update-ref", ref, ids[commit])
    return {"config": config, "config_path": config_path, "store": store, "ids": ids}


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch):
    """Local time = UTC for the test (then the machine's own again)."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def snap(world: dict, text: str) -> str:
    return resolve_snapshot(world["store"], world["config"], text)


def tree(world: dict, text: str):
    return resolve_tree(world["store"], world["config"], text)


# -- node forms ---------------------------------------------------------------------------

def test_bare_node_is_live_where_a_tree_fits_and_newest_snapshot_elsewhere(world: dict) -> None:
    found = tree(world, "ct200")
    assert found.is_live and found.live_node == "ct200" and found.commit is None
    assert snap(world, "ct200") == world["ids"]["d4"]


def test_at_live_is_the_live_node_and_refused_where_only_a_snapshot_fits(world: dict) -> None:
    assert tree(world, "ct129@live").live_node == "ct129"
    with pytest.raises(RefError, match="live tree; only a snapshot fits") as caught:
        snap(world, "ct129@live")
    assert "ct129@latest" in str(caught.value)


def test_at_latest_and_tilde(world: dict) -> None:
    ids = world["ids"]
    assert snap(world, "ct200@latest") == ids["d4"]
    assert tree(world, "ct200@latest").commit == ids["d4"]
    assert snap(world, "ct200~1") == ids["d3"]
    assert snap(world, "ct200~") == ids["d3"]
    assert snap(world, "ct200~3") == ids["d1"]
    assert snap(world, "ct200@latest~2") == ids["d2"]
    assert tree(world, "ct200~2").commit == ids["d2"]  # ~N is a snapshot even where live fits
    assert snap(world, "v1~1") == ids["d1"]
    with pytest.raises(RefError, match="only 3 snapshot"):
        snap(world, "ct200~4")


def test_at_date_iso_and_spoken(world: dict, utc: None) -> None:
    ids = world["ids"]
    for form in (f"{YEAR}-05-22", "may22", "may-22", "May22", "may_22", "may 22"):
        assert snap(world, f"ct200@{form}") == ids["d3"], form
    assert snap(world, f"ct200@{YEAR}-05-21") == ids["d1"]  # on or before: the 20th
    assert snap(world, f"ct200@{YEAR}-05-22T12:00") == ids["d2"]  # an ISO time narrows it
    assert snap(world, "ct129@may22") == ids["c1"]
    assert snap(world, "ct200@may22~1") == ids["d2"]
    with pytest.raises(RefError, match="no snapshot from"):
        snap(world, f"ct200@{YEAR}-05-19")
    with pytest.raises(RefError, match="after '@' comes live, latest or a date"):
        snap(world, "ct200@yesterdayish")


def test_dates_are_local_time(world: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """c2 is taken at 02:00 UTC on the 23rd: on the 22nd five hours west of Greenwich."""
    ids = world["ids"]
    monkeypatch.setenv("TZ", "XST+5")  # POSIX: local = UTC - 5 h (no tz database needed)
    time.tzset()
    try:
        assert snap(world, "ct129@may22") == ids["c2"]
        with pytest.raises(RefError) as caught:
            snap(world, "may22")
        assert "ambiguous" in caught.value.message
        assert "ct200@may22" in caught.value.hint and "ct129@may22" in caught.value.hint
    finally:
        monkeypatch.undo()
        time.tzset()


# -- bare dates ---------------------------------------------------------------------------

def test_bare_date_is_the_snapshot_of_the_one_node_with_one_that_day(world: dict, utc: None) -> None:
    ids = world["ids"]
    assert snap(world, "may22") == ids["d3"]  # the newest of ct200's two that day
    assert snap(world, f"{YEAR}-05-22") == ids["d3"]
    assert snap(world, "may-21") == ids["c1"]
    assert snap(world, "may23") == ids["c2"]
    assert tree(world, "may22").commit == ids["d3"]
    with pytest.raises(RefError, match="no snapshot was taken on"):
        snap(world, "may24")


def test_a_tag_named_like_a_date_wins_over_the_date(world: dict, utc: None) -> None:
    assert snap(world, "may20") == world["ids"]["c1"]  # ct200 has a snapshot on May 20 too
    assert snap(world, "ct200@may20") == world["ids"]["d1"]


def test_node_at_a_date_takes_a_tag_of_that_spelling_only_when_it_is_the_nodes(world: dict, utc: None) -> None:
    """SPEC: `ct200@may22` is ct200's newest snapshot on or before that day, "a tag `may22` of
    ct200's wins over the date". Another node's tag of that spelling must not answer for
    ct200 (it did: ct200's snapshot at the tag's time, so a diff could say "identical")."""
    ids, git_dir = world["ids"], world["config"].store_path
    # may21 names ct200's May 22 09:00 snapshot; may25 and YEAR-05-25 ct129's of May 21 12:00.
    _git(git_dir, "update-ref", "refs/tags/may21", ids["d2"])
    _git(git_dir, "update-ref", "refs/tags/may25", ids["c1"])
    _git(git_dir, "update-ref", f"refs/tags/{YEAR}-05-25", ids["c1"])
    _git(git_dir, "update-ref", "refs/tags/apr1", ids["f1"])  # fleet00's, before any of ct129's
    _git(git_dir, "update-ref", "refs/tags/early", ids["f1"])
    try:
        assert snap(world, "ct200@may21") == ids["d2"]  # ct200's tag (the date alone: d1, May 20)
        assert snap(world, "ct200@may25") == ids["d4"]  # ct129's tag: the date (its time: d1)
        assert snap(world, f"ct200@{YEAR}-05-25") == ids["d4"]
        assert snap(world, "ct129@may25") == ids["c1"]  # ct129's own tag
        assert snap(world, "ct129@may21") == ids["c1"]  # ct200's tag: the date
        with pytest.raises(RefError, match="has no snapshot from apr1 or before"):
            snap(world, "ct129@apr1")
        # A tag not spelled as a date: its snapshot if the node's, else what the node ran then.
        assert snap(world, "ct200@v1") == ids["d2"]
        assert snap(world, "ct129@v1") == ids["c1"]  # v1: ct200's of May 22 09:00
        with pytest.raises(RefError, match="has no snapshot from before tag 'early'"):
            snap(world, "ct129@early")
    finally:
        for tag in ("may21", "may25", f"{YEAR}-05-25", "apr1", "early"):
            _git(git_dir, "update-ref", "-d", f"refs/tags/{tag}")


def test_snapshot_ids_from_four_hex_digits(world: dict) -> None:
    ids = world["ids"]
    every = _git(world["config"].store_path, "rev-list", "--all").split()
    unique = [c for c in ids.values() if sum(1 for other in every if other.startswith(c[:4])) == 1]
    assert unique  # 4 hex digits tell most of a dozen commits apart
    for commit in unique:
        assert snap(world, commit[:4]) == commit
        assert snap(world, commit[:4].upper()) == commit
    with pytest.raises(RefError, match="unknown ref"):
        snap(world, unique[0][:3])  # git's shortest abbreviation is 4


def test_parse_day_picks_the_latest_such_day_not_in_the_future() -> None:
    today = date(2027, 3, 10)
    assert parse_day("may22", today) == date(2026, 5, 22)
    assert parse_day("mar10", today) == date(2027, 3, 10)
    assert parse_day("mar-11", today) == date(2026, 3, 11)
    assert parse_day("september3", today) == date(2026, 9, 3)
    assert parse_day("sept3", today) == date(2026, 9, 3)
    assert parse_day("feb29", today) == date(2024, 2, 29)
    assert parse_day("2026-05-22", today) == date(2026, 5, 22)
    for text in ("ma22", "feb30", "2026-13-01", "may", "22may", "ct200", "june-"):
        assert parse_day(text, today) is None, text
    assert parse_day("may22") <= date.today()
    assert parse_day("may22") > date.today() - timedelta(days=367)


# -- tags, hex, patches -------------------------------------------------------------------

def test_tag_hex_prefix_and_patch(world: dict) -> None:
    ids = world["ids"]
    assert snap(world, "v1") == ids["d2"]
    assert snap(world, "tags/v1") == ids["d2"]
    assert snap(world, "refs/tags/v1") == ids["d2"]
    assert snap(world, ids["d2"][:7]) == ids["d2"]
    assert snap(world, ids["d2"][:7].upper()) == ids["d2"]
    assert snap(world, ids["d2"]) == ids["d2"]
    assert snap(world, "dflash-fix") == ids["p1"]
    assert tree(world, "dflash-fix").commit == ids["p1"]
    assert snap(world, "dflash-fix~1") == ids["d4"]  # a patch's first parent: its base
    assert snap(world, ids["d2"][:6]) == ids["d2"]
    with pytest.raises(RefError, match="unknown ref"):
        snap(world, "0000000")


# -- ambiguity, unknown, bad input ----------------------------------------------------------

def test_a_tag_named_like_a_node_is_ambiguous_and_lists_the_qualified_forms(world: dict) -> None:
    for resolve in (snap, tree):
        with pytest.raises(RefError) as caught:
            resolve(world, "fleet00")
        assert caught.value.exit_code == 2
        assert "ambiguous" in caught.value.message
        for form in ("fleet00@live", "fleet00@latest", "tags/fleet00"):
            assert form in caught.value.hint
    assert snap(world, "tags/fleet00") == world["ids"]["f1"]
    assert snap(world, "fleet00@latest") == world["ids"]["f1"]
    assert tree(world, "fleet00@live").live_node == "fleet00"


def test_a_tag_and_a_patch_of_one_name_are_ambiguous(world: dict) -> None:
    with pytest.raises(RefError) as caught:
        snap(world, "shared")
    assert "tags/shared" in caught.value.hint and "patches/shared" in caught.value.hint
    assert snap(world, "patches/shared") == world["ids"]["p1"]


def test_unknown_refs_say_what_they_could_have_meant(world: dict) -> None:
    with pytest.raises(RefError) as caught:
        snap(world, "ct20")
    assert caught.value.exit_code == 2
    assert "unknown ref 'ct20'" in caught.value.message
    assert "did you mean ct200" in caught.value.hint
    assert "v1" in caught.value.hint and "dflash-fix" in caught.value.hint
    for text in ("tags/nope", "patches/nope", "nope@latest", "nope@live"):
        with pytest.raises(RefError):
            tree(world, text)


def test_refs_that_look_like_options_or_are_empty_are_refused(world: dict) -> None:
    for text in ("-x", "--all", "", "  ", "a\nb"):
        with pytest.raises(RefError):
            snap(world, text)
        with pytest.raises(RefError):
            tree(world, text)


def test_a_node_only_in_the_store_has_snapshots_but_no_live_tree(world: dict) -> None:
    assert snap(world, "ghost") == world["ids"]["g1"]
    with pytest.raises(RefError, match="not in the config"):
        tree(world, "ghost")
    with pytest.raises(RefError, match="not in the config"):
        tree(world, "ghost@live")


def _commit_starting_with(store: Path, prefix: str, tree: str, when: int, node: str) -> str:
    """A snapshot commit of ``node`` made at ``when`` whose id starts with ``prefix`` (a nonce
    in its subject tried until SHA-1 agrees; about 65536 tries for 4 hex digits)."""
    meta = json.dumps({"kind": "snapshot", "node": node})
    for nonce in range(1 << 24):
        body = (f"tree {tree}\nauthor t <t@t> {when} +0000\ncommitter t <t@t> {when} +0000\n\n"
                f"{node} snapshot {nonce}\n\nsnapver-meta: {meta}\n").encode()
        if hashlib.sha1(b"commit %d\0" % len(body) + body).hexdigest().startswith(prefix):
            commit = _git(store, "hash-object", "-t", "commit", "-w", "--stdin", input=body)
            assert commit.startswith(prefix)
            return commit
    raise AssertionError(f"no commit id starting with {prefix}")


def test_a_date_spelled_in_hex_digits_is_a_snapshot_id_too(world: dict, tmp_path: Path, utc: None) -> None:
    """`feb1` is a day and a hex prefix (SPEC: a hex prefix names a commit; an ambiguous ref
    lists what it could have meant). With no snapshot that day it is the commit (it was an
    error that never named it); with a snapshot that day too, an error naming both."""
    git_dir = tmp_path / "store"
    store = Store.open_or_create(git_dir)
    empty_tree = _git(git_dir, "mktree", input=b"")
    day = parse_day("feb1")
    march = int(datetime(day.year, 3, 3, 12, tzinfo=timezone.utc).timestamp())
    by_id = _commit_starting_with(git_dir, "feb1", empty_tree, march, "ct200")
    _git(git_dir, "update-ref", "refs/heads/nodes/ct200", by_id)
    for text in ("feb1", "FEB1"):
        assert resolve_snapshot(store, world["config"], text) == by_id, text
    on_the_day = _commit(git_dir, empty_tree, f"{day.isoformat()}T12:00:00+0000", "ct129")
    _git(git_dir, "update-ref", "refs/heads/nodes/ct129", on_the_day)
    with pytest.raises(RefError) as caught:
        resolve_snapshot(store, world["config"], "feb1")
    assert caught.value.exit_code == 2
    assert caught.value.message == (f"ambiguous ref 'feb1': it names ct129's snapshot from {day.isoformat()} "
                                    f"and commit {by_id[:12]}")
    assert caught.value.hint == f"say ct129@feb1 or {by_id[:12]}"
    assert resolve_snapshot(store, world["config"], "ct129@feb1") == on_the_day  # after '@': a date
    assert resolve_snapshot(store, world["config"], by_id[:12]) == by_id


def test_without_a_store_only_live_nodes_resolve(world: dict) -> None:
    assert resolve_tree(None, world["config"], "ct200").live_node == "ct200"
    with pytest.raises(RefError, match="no store yet"):
        resolve_snapshot(None, world["config"], "ct200~1")
    with pytest.raises(RefError, match="no store yet"):
        resolve_snapshot(None, world["config"], "ct200@latest")


# -- through the command line ---------------------------------------------------------------

def test_cli_show_resolves_refs_and_fails_cleanly(world: dict, run_snapver) -> None:
    config = str(world["config_path"])
    shown = run_snapver("--config", config, "show", "--json", "v1")
    assert shown.code == 0, shown
    assert json.loads(shown.out)["id"] == world["ids"]["d2"]
    for args, expected in ((["show", "fleet00"], "ambiguous ref 'fleet00'"),
                           (["show", "nosuch"], "unknown ref 'nosuch'"),
                           (["show", "ct200@live"], "only a snapshot fits"),
                           (["show", "--", "-x"], "cannot start with '-'"),
                           (["tag", "x", "ct200@may19"], "no snapshot from")):
        result = run_snapver("--config", config, *args, env={"TZ": "UTC"})
        assert result.code == 2, result
        assert result.err.startswith("snapver: error: ") and expected in result.err, result
        assert "Traceback" not in result.err
    for args in (["diff", "-x"], ["diff", "-q", "--", "-x"], ["diff"]):
        result = run_snapver("--config", config, *args)
        assert result.code == 2 and "Traceback" not in result.err, result


def test_node_at_an_iso_time_is_local_time_in_the_command(world: dict, run_snapver) -> None:
    """`ct200@YYYY-05-22T13:30` five hours west of Greenwich is 18:30 UTC: d3 (18:00 UTC) was
    taken by then; read as UTC it is d2 (09:00); five hours east, 08:30 UTC: d1 (the 20th).
    TZ is set in the command's environment."""
    config = str(world["config_path"])
    for zone, expected in (("XST+5", "d3"), ("UTC", "d2"), ("XST-5", "d1")):
        shown = run_snapver("--config", config, "show", "--json", f"ct200@{YEAR}-05-22T13:30", env={"TZ": zone})
        assert shown.code == 0, (zone, shown)
        assert json.loads(shown.out)["id"] == world["ids"][expected], (zone, shown)


def test_node_at_its_tag_is_the_tagged_snapshot_when_another_was_taken_the_same_second(world: dict) -> None:
    """`twin@t` where t names twin's snapshot s1 and s2 (its newest) was taken in the same
    second: s1, the tag's — not the newest snapshot taken at or before the tag's time.
    Another node's snapshot of that very second is what it ran when t was taken."""
    git_dir = world["config"].store_path
    tree_id = _git(git_dir, "rev-parse", "refs/heads/nodes/ct200^{tree}")
    when = f"{YEAR}-06-01T12:00:00+0000"
    s1 = _commit(git_dir, tree_id, when, "twin")
    s2 = _commit(git_dir, tree_id, when, "twin", s1, extra={"message": "same second"})
    other = _commit(git_dir, tree_id, when, "twin2")
    refs = {"refs/heads/nodes/twin": s2, "refs/tags/t": s1, "refs/heads/nodes/twin2": other}
    for ref, commit in refs.items():
        _git(git_dir, "update-ref", ref, commit)
    try:
        assert snap(world, "twin@t") == s1
        assert snap(world, "t") == s1
        assert snap(world, "twin@latest") == s2
        assert snap(world, "twin2@t") == other  # taken at the tag's second: at or before it
    finally:
        for ref in refs:
            _git(git_dir, "update-ref", "-d", ref)
