"""RECORD rows of tracked paths (pure functions): the per-folder memo of ``tracked_filter``
answers as matching every part of every path would, on rows pip writes and rows it should not."""

from __future__ import annotations

import fnmatch
import posixpath

import pytest

from snapver.ops.record import tracked_record
from snapver.ops.scope import is_tracked

ROWS = """\
sglang/srt/a.py,sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,0
sglang/srt/layers/moe/b.py,sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,0
sglang/srt/layers/moe/__pycache__/b.cpython-311.pyc,,
sglang/srt/models/c.so,sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,12
./sglang/srt/./d.py,sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,0
sglang//srt/e.py,,
sglang/srt/q/../f.py,sha256=bad,1
../../bin/sglang,,
/abs/sglang/srt/g.py,,
sglang/srtx/h.py,,
sglang/lang/i.py,sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,0
"sglang/srt/with,comma.py",sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,0
sglang/srt/kernels/moe_fused.py,,
"""


def _reference(path: str, tracked: tuple[str, ...], exclude: tuple[str, ...]) -> bool:
    """Every part matched against every pattern, as the agent's walk would."""
    for root in tracked:
        if not path.startswith(root + "/"):
            continue
        parts = path.split("/")
        for index in range(root.count("/") + 1, len(parts)):
            name, below, is_dir = parts[index], "/".join(parts[:index + 1]), index < len(parts) - 1
            for pattern in exclude:
                glob = pattern.rstrip("/")
                if pattern.endswith("/") and not is_dir:
                    continue
                if fnmatch.fnmatchcase(below if "/" in glob else name, glob.lstrip("/")):
                    return False
        return True
    return False


@pytest.mark.parametrize("tracked, exclude", [
    (("sglang/srt",), ("__pycache__/", "*.pyc")),
    (("sglang/srt", "sglang/lang"), ("*.so", "moe/", "sglang/srt/models/")),
    (("sglang",), ()),
    (("sglang/srt/layers",), ("moe*",)),
])
def test_tracked_record_keeps_exactly_the_rows_a_walk_would_track(tracked, exclude) -> None:
    found = tracked_record(ROWS.encode(), tracked, exclude)
    paths = {posixpath.normpath(line.rsplit(",", 2)[0].strip('"')) for line in ROWS.splitlines()}
    wanted = {p for p in paths if not p.startswith(("/", "..")) and _reference(p, tracked, exclude)}
    assert set(found) == wanted
    assert all(is_tracked(p, tracked, exclude) == (p in wanted) for p in paths)
    if "sglang/srt/a.py" in found:
        entry = found["sglang/srt/a.py"]
        assert (entry.algo, entry.digest, entry.size) == (
            "sha256", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", 0)
