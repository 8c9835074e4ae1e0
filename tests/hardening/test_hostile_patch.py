"""Hostile patch files through `snapver patch import`, the cases tests/ops/test_patch.py lacks.

That file covers ``..`` and absolute names on ---/+++ lines, a base symlink, malformed
hunks. Here: git's rename/copy headers naming ``..``, a symlink the same diff creates
and then writes through, the store's own ``.snapver/`` folder, a NUL in a quoted name,
absurd hunk sizes, a binary literal that inflates to far more than it states (a zip
bomb, run under a 1 GB address-space limit), and a big but honest diff. Each hostile
one: exit 2, one line, no patch recorded, nothing written anywhere but the store.
"""

from __future__ import annotations

import base64
import os
import resource
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from faultkit import all_refs, snapver_env

SRT = "sglang/srt"
A = f"{SRT}/server_args.py"  # "port = 30000\n" in small_site


def git_diff(path: str, old: str, new: str) -> str:
    return (f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-{old}\n+{new}\n")


def binary_lines(data: bytes) -> str:
    """Git's base85 lines for a `GIT binary patch` literal."""
    lines = []
    for at in range(0, len(data), 52):
        chunk = data[at:at + 52]
        size = chr(ord("A") + len(chunk) - 1) if len(chunk) <= 26 else chr(ord("a") + len(chunk) - 27)
        lines.append(size + base64.b85encode(chunk, pad=True).decode())
    return "\n".join(lines) + "\n"


def zip_bomb(inflated_mb: int) -> bytes:
    """A zlib stream that inflates to ``inflated_mb`` MB of zeros (identical full-flush blocks)."""
    zeros = bytes(1 << 20)
    compressor = zlib.compressobj(9)
    first = compressor.compress(zeros) + compressor.flush(zlib.Z_FULL_FLUSH)
    block = compressor.compress(zeros) + compressor.flush(zlib.Z_FULL_FLUSH)
    return first + block * (inflated_mb - 1) + compressor.flush()


HOSTILE = {
    "rename to ..": (f"diff --git a/{A} b/../../etc/cron.d/evil\nsimilarity index 100%\n"
                     f"rename from {A}\nrename to ../../etc/cron.d/evil\n", "unsafe"),
    "copy to an absolute path": (f"diff --git a/{A} /etc/cron.d/evil\nsimilarity index 100%\ncopy from {A}\n"
                                 "copy to /etc/cron.d/evil\n", "unsafe"),
    "a new link, then a file through it": (
        f"diff --git a/{SRT}/esc b/{SRT}/esc\nnew file mode 120000\n--- /dev/null\n+++ b/{SRT}/esc\n"
        "@@ -0,0 +1 @@\n+/etc\n\\ No newline at end of file\n"
        f"diff --git a/{SRT}/esc/cron.d/evil b/{SRT}/esc/cron.d/evil\nnew file mode 100644\n--- /dev/null\n"
        f"+++ b/{SRT}/esc/cron.d/evil\n@@ -0,0 +1 @@\n+* * * * * root touch /tmp/pwned\n", "symlink"),
    "the store's own folder": ("--- /dev/null\n+++ b/.snapver/manifest\n@@ -0,0 +1 @@\n+forged\n", "outside"),
    "a NUL in a quoted name": (f'--- a/{A}\n+++ "b/{SRT}/a\\000b.py"\n@@ -1 +1 @@\n-port = 30000\n+x\n', "unsafe"),
    "an absurd hunk size": (f"--- a/{A}\n+++ b/{A}\n@@ -1,999999999999 +1,999999999999 @@\n-port = 30000\n",
                            "ends early"),
    "a bad mode": (f"diff --git a/{A} b/{A}\nold mode 100644\nnew mode 99999999999999999999x\n", "malformed"),
    "a binary size that lies": (f"diff --git a/{SRT}/w.bin b/{SRT}/w.bin\nnew file mode 100644\n"
                                f"index 0000000..1111111\nGIT binary patch\nliteral 9999999999999\n"
                                + binary_lines(zlib.compress(b"small")) + "\n", "binary"),
}


@pytest.fixture
def based(small_site, local_node, write_config, run_snapver, store, tmp_path) -> Path:
    write_config({"n": local_node(small_site)})
    assert run_snapver("pull", "n").code == 0
    return tmp_path


def files_outside_store(root: Path, store: Path) -> set[str]:
    found = set()
    for folder, dirs, files in os.walk(root):
        if Path(folder) == store:
            dirs[:] = []
            continue
        found |= {os.path.join(folder, name) for name in files}
    return found


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_patch_is_refused(case, based, run_snapver, store) -> None:
    text, word = HOSTILE[case]
    diff = based / "hostile.diff"
    diff.write_text(text, encoding="utf-8")
    refs = all_refs(store)
    files = files_outside_store(based, store)
    result = run_snapver("patch", "import", "p", str(diff), "--base", "n")
    assert result.code == 2, str(result)
    assert result.err.startswith("snapver: error: ") and word in result.err.lower(), result.err
    assert "Traceback" not in result.err and len(result.err.strip().splitlines()) <= 2
    assert all_refs(store) == refs
    assert files_outside_store(based, store) == files
    assert not Path("/tmp/pwned").exists()


def test_a_binary_zip_bomb_is_refused_within_bounded_memory(based, store) -> None:
    """A literal stating 10 bytes that inflates to 1.5 GB, imported with 1 GB of address space."""
    bomb = zip_bomb(1536)
    diff = based / "bomb.diff"
    diff.write_text(f"diff --git a/{SRT}/w.bin b/{SRT}/w.bin\nnew file mode 100644\nGIT binary patch\nliteral 10\n"
                    + binary_lines(bomb) + "\n")
    limit = 1 << 30
    done = subprocess.run([sys.executable, "-m", "snapver", "patch", "import", "p", str(diff), "--base", "n"],
                          capture_output=True, text=True, env=snapver_env(), stdin=subprocess.DEVNULL,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    assert done.returncode == 2, done.stderr
    assert "binary" in done.stderr and "Traceback" not in done.stderr and "MemoryError" not in done.stderr
    assert "refs/heads/patches/p" not in all_refs(store)


def test_a_big_honest_diff_imports_exactly(based, run_snapver, store) -> None:
    lines = [f"weights_{i} = {i * 7919 % 100003}\n" for i in range(60000)]  # ~1.4 MB
    diff = based / "big.diff"
    diff.write_text(f"--- /dev/null\n+++ b/{SRT}/big_table.py\n@@ -0,0 +1,{len(lines)} @@\n"
                    + "".join("+" + line for line in lines))
    result = run_snapver("patch", "import", "big", str(diff), "--base", "n")
    assert result.code == 0, str(result)
    stored = subprocess.run(["git", "--git-dir", str(store), "cat-file", "blob",
                             f"refs/heads/patches/big:{SRT}/big_table.py"], capture_output=True, check=True).stdout
    assert stored == "".join(lines).encode()
