"""The commit metadata builders (store/records.py): the JSON a commit message carries is
the on-disk format, so each builder's fields are pinned here, as a table, and read back
through the message trailer the way `log` and `fsck` read them."""

from __future__ import annotations

from datetime import datetime, timezone

from snapver.model import DistInfo, Entry, Manifest, NodeInfo
from snapver.store.records import format_message, import_meta, moment_ns, parse_meta, push_record_meta, snapshot_meta

WHEN = datetime(2025, 5, 22, 9, 30, 15, 123456, tzinfo=timezone.utc)
MANIFEST = Manifest.of([Entry("sglang/srt/a.py", "file", 0o100644, 3, "d" * 64, "a" * 40),
                        Entry("sglang/srt/b.so", "file", 0o100755, 5, "e" * 64, "b" * 40)])
INFO = NodeInfo("gpu-7", "3.10.12", "/usr/bin/python3", "/opt/venv/lib/python3.10/site-packages",
                (DistInfo("sglang", "0.4.6", "sglang-0.4.6.dist-info"),))
STAMP = "2025-05-22T09:30:15+00:00"


def test_a_pulled_snapshot_s_fields() -> None:
    meta = snapshot_meta(node="ct200", host="10.0.0.7", writer="alice@lab", info=INFO, when=WHEN,
                         paths=("sglang/srt",), exclude=("__pycache__",), manifest=MANIFEST, changed=1)
    assert meta == {"v": 1, "kind": "snapshot", "node": "ct200", "host": "10.0.0.7", "writer": "alice@lab",
                    "site_packages": "/opt/venv/lib/python3.10/site-packages", "hostname": "gpu-7",
                    "python": "3.10.12", "time": STAMP, "time_ns": 1747906215123456000,
                    "paths": ["sglang/srt"], "exclude": ["__pycache__"], "dists": [["sglang", "0.4.6"]],
                    "files": 2, "changed": 1, "bytes": 8, "event": "pull"}


def test_a_snapshot_s_event_and_message_are_added() -> None:
    meta = snapshot_meta(node="ct200", host="h", writer="w", info=INFO, when=WHEN, paths=(), exclude=(),
                         manifest=Manifest(), changed=0, event={"event": "push-before", "push_id": "f0"},
                         message="before the hot-fix")
    assert (meta["event"], meta["push_id"], meta["message"], meta["files"], meta["bytes"]) == \
        ("push-before", "f0", "before the hot-fix", 0, 0)
    assert "message" not in snapshot_meta(node="n", host="h", writer="w", info=INFO, when=WHEN, paths=(),
                                          exclude=(), manifest=Manifest(), changed=0, message="")


def test_an_imported_snapshot_s_fields() -> None:
    imported = datetime(2025, 6, 1, 12, 0, 0, tzinfo=timezone.utc)
    meta = import_meta(node="ct200", writer="bob@lab", source="/srv/old", layout="site-packages",
                       site_packages="/srv/old", when=WHEN, imported=imported, paths=("sglang/srt",),
                       exclude=(), dists=[["sglang", "0.4.5"]], manifest=MANIFEST, changed=2, message="may build")
    assert meta == {"v": 1, "kind": "snapshot", "event": "import", "node": "ct200", "host": "import",
                    "writer": "bob@lab", "source": "/srv/old", "layout": "site-packages",
                    "site_packages": "/srv/old", "time": STAMP, "imported": "2025-06-01T12:00:00+00:00",
                    "paths": ["sglang/srt"], "exclude": [], "dists": [["sglang", "0.4.5"]], "files": 2,
                    "changed": 2, "bytes": 8, "message": "may build"}


def test_a_push_record_s_own_fields_win_over_its_rows() -> None:
    row = {"node": "ct129", "state": "done", "patch": "port", "kind": "forged", "writer": "mallory@lab", "v": 9}
    meta = push_record_meta(row, writer="alice@lab", action="rollback", push_id="0123456789abcdef", when=WHEN)
    assert meta == {"node": "ct129", "state": "done", "patch": "port", "v": 1, "kind": "push",
                    "writer": "alice@lab", "action": "rollback", "push_id": "0123456789abcdef", "time": STAMP,
                    "time_ns": moment_ns(WHEN)}
    assert moment_ns(WHEN) == 1747906215123456000


def test_metadata_survives_the_message_trailer() -> None:
    meta = push_record_meta({"state": "started", "files": {"write": ["a.py"]}}, writer="w", action="push",
                            push_id="p", when=WHEN)
    message = format_message("push port to ct129: started", meta, "body\n")
    assert message.startswith("push port to ct129: started\n\nbody\n\nsnapver-meta: {")
    assert parse_meta(message) == meta
