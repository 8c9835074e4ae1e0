"""Live listings trust a file's stat only as git trusts its index — and `--checksum` trusts nothing.

diff, status, capture and rollback re-hash on the node only the files whose stat (size,
mtime, ctime, inode, mode) moved since the last pull. These tests pin down when that is
safe: an edit that keeps size and mtime still moves ctime, and `-c` hashes everything.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from pathlib import Path

import pytest
from helpers import toml_dumps
from snapver_inproc import run_inproc

from snapver.config import load_config
from snapver.ops.live import list_live, parse_stat_keys, read_stat_keys_file, records_digest, stat_keys_text
from snapver.store.cache import stat_cache_path, stat_keys_path
from snapver.store.repo import Store
from snapver.transport.connect import open_transport

FILES = {f"sglang/srt/m{i}.py": f"value = {i}\n" for i in range(20)}


def _keys_file(store: Store) -> tuple[dict, str]:
    """The keys file's header and its keys' JSON text (kept compressed)."""
    header, packed = read_stat_keys_file(stat_keys_path(store, "ct200"))
    return header, zlib.decompress(packed).decode("ascii")


def _write_keys_file(store: Store, header: dict, text: str) -> None:
    """Write keys as snapver does: the header line (with the digest of records), then their
    JSON text compressed."""
    header = {key: value for key, value in header.items() if key != "records_digest"}
    try:
        records = json.loads(text)
    except ValueError:
        records = None
    if isinstance(records, str):
        header["records_digest"] = records_digest("\0\0".join(sorted(records.split("\0\0"))))
    data = json.dumps({**header, "zlib": 1}).encode() + b"\n" + zlib.compress(text.encode("ascii"))
    stat_keys_path(store, "ct200").write_bytes(data)


def _cached_ids(store: Store) -> dict[str, str]:
    """``{path: blob id}`` as the stat cache holds them: its ids, in the keys file's order."""
    keys = parse_stat_keys(_keys_file(store)[1])
    return dict(zip(keys, json.loads(stat_cache_path(store, "ct200").read_text())["oids"], strict=False))


def _forge_cached_id(store: Store, path: str, oid: str, time_shift: int = 0) -> None:
    """Write a wrong blob id for ``path`` into the stat cache (as a stale cache would hold)."""
    keys = parse_stat_keys(_keys_file(store)[1])
    cache_file = stat_cache_path(store, "ct200")
    cache = json.loads(cache_file.read_text())
    cache["oids"][list(keys).index(path)] = oid
    cache["now_ns"] += time_shift
    cache_file.write_text(json.dumps(cache))


@pytest.fixture(params=["local", "ssh"])
def pulled(request, sshd, make_site_packages, ssh_node, local_node, tmp_path: Path):
    site = make_site_packages("ct200", files=FILES)
    time.sleep(2.2)  # older than the racy window, so the pull's stats can be trusted
    node = ssh_node("ct200", site) if request.param == "ssh" else local_node(site)
    config = tmp_path / "snapver.toml"
    config.write_text(toml_dumps({"store": {"path": str(tmp_path / "store")}, "nodes": {"ct200": node}}))
    assert run_inproc("--config", config, "pull", "ct200").code == 0
    return config, site


def _listing(config: Path):
    loaded = load_config(str(config))
    store = Store(loaded.store_path)
    with open_transport(loaded.node("ct200")) as transport:
        return store, list_live(store, transport), list_live(store, transport, checksum=True)


def test_unchanged_files_are_not_rehashed_and_an_edit_keeping_size_and_mtime_is(pulled) -> None:
    config, site = pulled
    _, trusted, full = _listing(config)
    assert trusted.hashed == 0 and full.hashed == len(FILES)
    target = site / "sglang/srt/m7.py"
    before = target.stat()
    target.write_text("value = 8\n")  # same size
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    _, trusted, _ = _listing(config)
    assert trusted.hashed == 1
    result = run_inproc("--config", config, "diff", "--name-status", "ct200")
    assert (result.code, result.out) == (1, "M\tsglang/srt/m7.py\n"), result


def test_checksum_hashes_everything_even_when_the_stats_say_unchanged(pulled) -> None:
    config, site = pulled
    store = Store(load_config(str(config)).store_path)
    # Forge the recorded id of one file (as a stale cache would be): only -c sees the truth.
    _forge_cached_id(store, "sglang/srt/m3.py", "0" * 40)
    trusting = run_inproc("--config", config, "diff", "--name-status", "ct200")
    checking = run_inproc("--config", config, "diff", "-q", "-c", "ct200")
    # The forged id differs from the snapshot: the cache was used, its ids paired with their paths.
    assert (trusting.code, trusting.out) == (1, "M\tsglang/srt/m3.py\n"), trusting
    assert checking.code == 0, checking  # the node hashed every file: identical
    # (no RECORD: the snapshot is named known-good, or status could not say the tree is pristine)
    status = run_inproc("--config", config, "status", "--checksum", "--against", "ct200@latest", "ct200")
    assert status.code == 0, status


def test_an_unchanged_repull_keeps_the_cache_and_still_sees_the_next_edit(pulled) -> None:
    """A re-pull whose node found every cached file as it was leaves the cache file alone
    (time included); an edit made afterwards, even one keeping size and mtime, is still
    hashed and recorded by the next pull."""
    config, site = pulled
    store = Store(load_config(str(config)).store_path)
    cache_file = stat_cache_path(store, "ct200")
    kept = cache_file.read_bytes()
    keys_before = list(_cached_ids(store))
    result = run_inproc("--config", config, "pull", "ct200")
    assert result.code == 0 and "unchanged since" in result.out, result
    assert cache_file.read_bytes() == kept

    target = site / "sglang/srt/m4.py"
    before = target.stat()
    target.write_text("value = 5\n")  # same size
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    result = run_inproc("--config", config, "pull", "ct200")
    assert result.code == 0 and "1 changed" in result.out, result
    assert cache_file.read_bytes() != kept
    assert _cached_ids(store)["sglang/srt/m4.py"] != dict(zip(keys_before, json.loads(kept)["oids"], strict=False))[
        "sglang/srt/m4.py"]


@pytest.fixture
def ssh_pulled(sshd, make_site_packages, ssh_node, tmp_path: Path):
    """A node over SSH (only there is a stat cache used), pulled once with trusted stats."""
    site = make_site_packages("ct200", files=FILES)
    time.sleep(2.2)  # older than the racy window, so the pull's stats can be trusted
    config = tmp_path / "snapver.toml"
    config.write_text(toml_dumps({"store": {"path": str(tmp_path / "store")},
                                  "nodes": {"ct200": ssh_node("ct200", site)}}))
    assert run_inproc("--config", config, "pull", "ct200").code == 0
    return config, Store(load_config(str(config)).store_path)


def test_stat_keys_of_another_cache_are_not_trusted_with_it(ssh_pulled) -> None:
    """The stat keys file is sent as it is; the cache read while the node lists must be the
    one written with it. One from elsewhere (a pull stopped between the two writes,
    another snapver) is not used: the node hashes everything and the truth is seen."""
    config, store = ssh_pulled
    assert stat_keys_path(store, "ct200").is_file()
    cache_file = stat_cache_path(store, "ct200")
    _forge_cached_id(store, "sglang/srt/m3.py", "0" * 40, time_shift=-1)  # a wrong id, in a cache of another time
    result = run_inproc("--config", config, "diff", "-q", "ct200")
    assert result.code == 0, result
    cache_file.unlink()  # the keys left alone, without their cache
    result = run_inproc("--config", config, "pull", "ct200")
    assert result.code == 0 and "unchanged since" in result.out, result


def _set_cache_time(store: Store, now_ns: int) -> None:
    """Give the keys file and the stat cache (written together) the time ``now_ns``."""
    header, text = _keys_file(store)
    _write_keys_file(store, {**header, "now_ns": now_ns}, text)
    cache_file = stat_cache_path(store, "ct200")
    cache_file.write_text(json.dumps({**json.loads(cache_file.read_text()), "now_ns": now_ns}))


def _as_rows_without_keys(store: Store, now_ns: int) -> None:
    """Turn the cache into one an older snapver wrote (whole rows, no keys file), of time ``now_ns``."""
    keys = parse_stat_keys(_keys_file(store)[1])
    cache_file = stat_cache_path(store, "ct200")
    cache = json.loads(cache_file.read_text())
    rows = {path: [*key, oid] for (path, key), oid in zip(keys.items(), cache["oids"], strict=False)}
    cache_file.write_text(json.dumps({"commit": cache["commit"], "now_ns": now_ns, "entries": rows}))
    stat_keys_path(store, "ct200").unlink()


@pytest.mark.parametrize("cache_form", ["keys", "rows"])
def test_an_edit_in_the_tick_of_the_pull_keeping_size_and_mtime_is_rehashed(ssh_pulled, cache_form: str) -> None:
    """On a file system with coarse (whole-second) times, an edit made in the same tick as
    the pull that hashed the file leaves the stat the cache records, next to the id of the
    content before it. The edit put the mtime back (old), but the ctime is within 2 s of
    the cache's time: racy, so the node hashes the file again and `diff -q` sees the truth
    (with the stat keys a re-pull sends, and with an older cache of whole rows)."""
    config, store = ssh_pulled
    path = "sglang/srt/m4.py"
    target = Path(load_config(str(config)).node("ct200").site_packages) / path
    id_before = _cached_ids(store)[path]
    before = target.stat()
    target.write_text("value = 5\n")  # same size
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    result = run_inproc("--config", config, "pull", "ct200")
    assert result.code == 0 and "1 changed" in result.out, result
    # The keys now hold the edited file's stat; the cache is given the id from before the
    # edit and a time 1 s after it, as a pull hashing the file just before it would have made.
    _forge_cached_id(store, path, id_before)
    _set_cache_time(store, target.stat().st_ctime_ns + 10**9)
    if cache_form == "rows":
        _as_rows_without_keys(store, target.stat().st_ctime_ns + 10**9)
    result = run_inproc("--config", config, "diff", "-q", "ct200")
    assert result.code == 0, result


def test_a_cache_without_stat_keys_is_a_miss_and_an_unchanged_repull_writes_both_anew(ssh_pulled) -> None:
    """A cache an older snapver wrote (whole rows, no version, no keys file) is a miss: an
    unchanged re-pull re-reads the tree, finds it unchanged, and writes the cache and its
    keys anew, of one listing, that the next listing trusts (the node hashes nothing)."""
    config, store = ssh_pulled
    keys_file, cache_file = stat_keys_path(store, "ct200"), stat_cache_path(store, "ct200")
    keys = parse_stat_keys(_keys_file(store)[1])
    cache = json.loads(cache_file.read_text())
    rows = {path: [*key, oid] for (path, key), oid in zip(keys.items(), cache["oids"], strict=False)}
    cache_file.write_text(json.dumps({"commit": cache["commit"], "now_ns": cache["now_ns"], "entries": rows}))
    keys_file.unlink()
    kept = cache_file.read_bytes()
    result = run_inproc("--config", config, "pull", "ct200")
    assert result.code == 0 and "unchanged since" in result.out, result
    rewritten = json.loads(cache_file.read_text())
    assert cache_file.read_bytes() != kept and "entries" not in rewritten and rewritten["v"] == 1
    header, _ = _keys_file(store)
    assert header["v"] == 1 and header["now_ns"] == rewritten["now_ns"] and header["commit"] == cache["commit"]
    _, trusted, full = _listing(config)
    assert trusted.hashed == 0 and {e.path: e.oid for e in trusted.entries} == {e.path: e.oid for e in full.entries}


@pytest.mark.parametrize("change", ["delete", "add", "chmod", "link"])
def test_a_repull_against_stat_keys_records_what_no_cached_row_shows(ssh_pulled, change: str) -> None:
    """A re-pull whose node found every cached file unchanged reads neither the cache's rows
    nor the last manifest, so it must know that nothing else changed either: a file gone,
    a new file or link (no row in the cache), a mode changed — each is a new snapshot."""
    config, store = ssh_pulled
    site = Path(load_config(str(config)).node("ct200").site_packages)
    result = run_inproc("--config", config, "pull", "ct200")
    assert result.code == 0 and "unchanged since" in result.out and "20 files" in result.out, result
    srt = site / "sglang/srt"
    if change == "delete":
        (srt / "m3.py").unlink()
    elif change == "add":
        (srt / "new.py").write_text("added = 1\n")
    elif change == "chmod":
        (srt / "m5.py").chmod(0o755)
    else:
        (srt / "alias.py").symlink_to("m1.py")
    result = run_inproc("--config", config, "pull", "ct200")
    assert result.code == 0 and "snapshot" in result.out and "1 changed" in result.out, result
    show = run_inproc("--config", config, "diff", "--name-status", "ct200@latest~1", "ct200@latest")
    wanted = {"delete": "D\tsglang/srt/m3.py", "add": "A\tsglang/srt/new.py",
              "chmod": "T\tsglang/srt/m5.py",  # T: type or mode changed
              "link": "A\tsglang/srt/alias.py"}[change]
    assert show.out.strip() == wanted, show


@pytest.mark.parametrize("transport", ["local", "ssh"])
@pytest.mark.parametrize("other", ["link", "fifo"])
def test_the_last_link_removed_is_a_change_though_every_file_is_unchanged(
        sshd, make_site_packages, ssh_node, local_node, tmp_path: Path, transport: str, other: str) -> None:
    """Links and special files have no stat keys and are listed at every pull: a node
    whose files all match their keys and that lists nothing else has not "the tree of
    its last snapshot" if that snapshot had a link. (It said "unchanged", so a push
    recorded a stale "before" tree, and its rollback made the removed link again.)"""
    site = make_site_packages("ct200", files=FILES)
    other_path = site / "sglang/srt/other"
    if other == "link":
        other_path.symlink_to("m1.py")
    else:
        os.mkfifo(other_path)
    time.sleep(2.2)  # older than the racy window, so the pull's stats are trusted
    node = ssh_node("ct200", site) if transport == "ssh" else local_node(site)
    config = tmp_path / "snapver.toml"
    config.write_text(toml_dumps({"store": {"path": str(tmp_path / "store")}, "nodes": {"ct200": node}}))
    for _ in range(2):
        assert run_inproc("--config", config, "pull", "ct200").code == 0
    other_path.unlink()
    result = run_inproc("--config", config, "pull", "ct200")
    assert result.code == 0 and "snapshot" in result.out and "unchanged" not in result.out, result
    show = run_inproc("--config", config, "diff", "--name-status", "ct200@latest~1", "ct200@latest")
    assert show.out.strip() == "D\tsglang/srt/other", show
    result = run_inproc("--config", config, "pull", "ct200")  # files alone now: the shortcut serves again
    assert result.code == 0 and "unchanged since" in result.out, result
    assert _keys_file(Store(load_config(str(config)).store_path))[0]["others"] == 0


def test_an_old_cache_relisted_leaves_keys_and_cache_of_one_listing(ssh_pulled) -> None:
    """A cache an older snapver wrote (no keys file) that the node does not find exactly as
    it was (a file touched, same content: no new snapshot) is written anew, keys and ids
    of the same listing, so that the next pull trusts them and hashes nothing."""
    config, store = ssh_pulled
    keys_file, cache_file = stat_keys_path(store, "ct200"), stat_cache_path(store, "ct200")
    keys = parse_stat_keys(_keys_file(store)[1])
    cache = json.loads(cache_file.read_text())
    rows = {path: [*key, oid] for (path, key), oid in zip(keys.items(), cache["oids"], strict=False)}
    cache_file.write_text(json.dumps({"commit": cache["commit"], "now_ns": cache["now_ns"], "entries": rows}))
    keys_file.unlink()
    site = Path(load_config(str(config)).node("ct200").site_packages)
    touched = site / "sglang/srt/m2.py"
    os.utime(touched, ns=(touched.stat().st_atime_ns, touched.stat().st_mtime_ns - 10**9))
    time.sleep(2.2)  # the touch (its ctime) older than the racy window of the next listing
    result = run_inproc("--config", config, "pull", "ct200")
    assert result.code == 0 and "unchanged since" in result.out, result
    header, _ = _keys_file(store)
    assert header["now_ns"] == json.loads(cache_file.read_text())["now_ns"]
    _, trusted, _ = _listing(config)
    assert trusted.hashed == 0


TRICKY_NAMES = ["a b.py", "new\nline.py", "tab\there.py", "\u00e9t\u00e9.py", "trailing .py",
                "1 2 3 4 5 looks like a key.py", "sub dir/inner.py", "\u00e4/\u00fc.py"]


@pytest.mark.parametrize("transport", ["local", "ssh"])
def test_stat_keys_of_tricky_names_are_trusted_and_each_names_its_own_file(
        transport, sshd, make_site_packages, ssh_node, local_node, tmp_path: Path) -> None:
    """The keys go to the node as "size mtime ctime ino mode path" records: names with
    spaces, newlines, tabs, non-ASCII or bytes that are not UTF-8 find their own record
    (nothing re-hashed), and an edit of any of them is still seen."""
    site = make_site_packages(
        "ct200", files={f"sglang/srt/{name}": f"v = {i}\n" for i, name in enumerate(TRICKY_NAMES)}
    )
    not_utf8 = os.fsencode(site / "sglang/srt") + b"/caf\xe9.py"
    with open(not_utf8, "wb") as handle:
        handle.write(b"latin = 1\n")
    time.sleep(2.2)  # older than the racy window
    node = ssh_node("ct200", site) if transport == "ssh" else local_node(site)
    config = tmp_path / "snapver.toml"
    config.write_text(toml_dumps({"store": {"path": str(tmp_path / "store")}, "nodes": {"ct200": node}}))
    assert run_inproc("--config", config, "pull", "ct200").code == 0
    store, trusted, full = _listing(config)
    assert trusted.hashed == 0 and full.hashed == len(TRICKY_NAMES) + 1
    assert {e.path: e.oid for e in trusted.entries} == {e.path: e.oid for e in full.entries}
    assert set(parse_stat_keys(_keys_file(store)[1])) == {
        e.path for e in full.entries}
    # A key that differs by its inode alone (as after a file is swapped for an older one):
    # that file, and only it, is hashed again. (A real edit also moves ctime, after the cache.)
    header, text = _keys_file(store)
    keys = parse_stat_keys(text)
    size, mtime, ctime, ino, mode = keys["sglang/srt/new\nline.py"]
    keys["sglang/srt/new\nline.py"] = (size, mtime, ctime, ino + 1, mode)
    _write_keys_file(store, header, stat_keys_text((path, *key) for path, key in keys.items()))
    _, trusted, _ = _listing(config)
    assert trusted.hashed == 1
    for edited in ["sglang/srt/new\nline.py", "sglang/srt/1 2 3 4 5 looks like a key.py", os.fsdecode(not_utf8)]:
        target = site / edited
        before = target.stat()
        target.write_bytes(target.read_bytes().replace(b"=", b":"))  # same size, same mtime
        os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    _, trusted, _ = _listing(config)
    assert trusted.hashed == 3


def _trusted_then_one_change(config: Path, site: Path, store: Store) -> tuple[dict, str]:
    """Every key trusted (the node hashes nothing); then one edit pulled: its keys file."""
    _, trusted, _ = _listing(config)
    assert trusted.hashed == 0 and len(trusted.entries) == len(FILES)
    (site / "sglang/srt/m4.py").write_text("value = 44\n")
    result = run_inproc("--config", config, "pull", "ct200")
    assert result.code == 0 and "1 changed" in result.out, result
    return _keys_file(store)


def test_stat_keys_an_older_snapver_wrote_are_a_miss(pulled) -> None:
    """Keys an older snapver wrote (no version, a JSON object of lists) are a miss: the
    node hashes every file and the listing is the truth; the re-pull writes keys of this
    version (records), which the next listing trusts."""
    config, site = pulled
    store = Store(load_config(str(config)).store_path)
    keys_file = stat_keys_path(store, "ct200")
    header, text = _keys_file(store)
    assert text.startswith('"') and "zlib" not in header
    older = {key: value for key, value in header.items() if key not in ("v", "records_digest")}
    keys_file.write_text(json.dumps(older) + "\n" + json.dumps(parse_stat_keys(text)))
    _, trusted, full = _listing(config)
    assert trusted.hashed == len(FILES) == full.hashed
    assert {e.path: e.oid for e in trusted.entries} == {e.path: e.oid for e in full.entries}
    result = run_inproc("--config", config, "pull", "ct200")
    assert result.code == 0 and "unchanged since" in result.out, result
    header, text = _keys_file(store)
    assert header["v"] == 1 and text.startswith('"') and len(parse_stat_keys(text)) == len(FILES)
    _trusted_then_one_change(config, site, store)


def test_the_first_repull_keeps_the_keys_compressed_as_it_sent_them(pulled) -> None:
    """A pull writes its keys as text (a 16-node first pull does not compress 16 sets);
    the first unchanged re-pull that sends them keeps them compressed, as sent, and the
    next re-pulls send them as they are, trusted all the same."""
    config, site = pulled
    store = Store(load_config(str(config)).store_path)
    keys_file = stat_keys_path(store, "ct200")
    header, text = _keys_file(store)
    assert "zlib" not in header and keys_file.read_bytes().split(b"\n", 1)[1] == text.encode()
    for _ in range(2):
        result = run_inproc("--config", config, "pull", "ct200")
        assert result.code == 0 and "unchanged since" in result.out, result
        kept, kept_text = _keys_file(store)
        assert kept == {**header, "zlib": 1} and kept_text == text
        assert zlib.decompress(keys_file.read_bytes().split(b"\n", 1)[1]).decode() == text
    header, _ = _trusted_then_one_change(config, site, store)
    assert "zlib" not in header and header["commit"] != kept["commit"]


@pytest.mark.parametrize("damage", ["truncated", "not JSON", "a list"])
def test_damaged_stat_keys_are_no_keys(pulled, damage: str) -> None:
    """Keys are sent to the node as the store holds them, compressed: keys damaged on disk
    make the node hash every file (and the client trust no cached row), never fail a
    command nor pass a file unseen."""
    config, site = pulled
    store = Store(load_config(str(config)).store_path)
    keys_file = stat_keys_path(store, "ct200")
    header, text = _keys_file(store)
    if damage == "truncated":
        data = keys_file.read_bytes()
        keys_file.write_bytes(data[:len(data) - 20])
    else:
        _write_keys_file(store, header, "{not json" if damage == "not JSON" else json.dumps([1, 2]))
    (site / "sglang/srt/m6.py").write_text("value = 66\n")
    _, trusted, full = _listing(config)
    assert trusted.hashed == len(FILES) == full.hashed
    assert {e.path: e.oid for e in trusted.entries} == {e.path: e.oid for e in full.entries}
    result = run_inproc("--config", config, "pull", "ct200")
    assert result.code == 0 and "1 changed" in result.out, result


def test_keys_carry_the_digest_of_their_records_and_keys_without_one_are_a_miss(pulled) -> None:
    """A pull writes its keys sorted, with the BLAKE2b the node compares its own records
    with before it decodes them; keys written before that (no digest) are a miss: the
    re-pull writes them anew, with their digest."""
    config, site = pulled
    store = Store(load_config(str(config)).store_path)
    header, text = _keys_file(store)
    records = json.loads(text)
    assert records.split("\0\0") == sorted(records.split("\0\0"))
    assert header["records_digest"] == records_digest(records)
    stat_keys_path(store, "ct200").write_bytes(
        json.dumps({k: v for k, v in header.items() if k != "records_digest"}).encode() + b"\n" + text.encode())
    result = run_inproc("--config", config, "pull", "ct200")
    assert result.code == 0 and "unchanged since" in result.out, result
    assert _keys_file(store)[0]["records_digest"] == records_digest(records)
    header, _ = _trusted_then_one_change(config, site, store)
    assert header["records_digest"] == records_digest(json.loads(_keys_file(store)[1]))
