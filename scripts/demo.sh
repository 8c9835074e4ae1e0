#!/usr/bin/env bash
# snapver's main job on its embedded default: a `local` node, no SSH, no config file.
# Installs snapver, makes a throwaway venv holding the real SGLang tree from
# ../shared/fixtures (unpacked, not pip-installed), then pulls it, hot-fixes a file
# by hand, and shows how snapver sees the drift.  Usage: bash scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q -e .

demo=$repo/.demo
rm -rf "$demo"
python3 -m venv --system-site-packages "$demo/venv"
py=$demo/venv/bin/python
wheel=$(ls "$repo"/../shared/fixtures/sglang-*.whl | head -n 1)
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$py" - "$wheel" "$site" <<'PY'
import sys, zipfile
wheel, site = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as archive:
    for info in archive.infolist():
        if info.filename.startswith(("sglang/", "sglang-")):
            path = archive.extract(info, site)
            mode = (info.external_attr >> 16) & 0o7777
            if mode and not info.is_dir():
                import os; os.chmod(path, mode)
PY
cd "$demo"
run() { echo "\$ snapver $*"; "$py" -m snapver "$@"; echo; }
run nodes                      # the embedded default: node `local` = this venv's site-packages
run pull                       # first snapshot of sglang/srt into ./snapshots (a git repo)
run pull                       # nothing changed: no new snapshot
echo "# hot-fix a file by hand, as on a GPU node"
echo "# hot-fix: guard graph capture" >> "$site/sglang/srt/speculative/dflash_worker_v2.py"
run pull -m "after hot-fix"    # only the changed file crosses
run status || true             # still a hot-fix after that pull: held against the wheel's RECORD (exit 1)
run log
run show local@latest
run fsck
echo "store: $demo/snapshots  (try: git --git-dir $demo/snapshots log --all --stat)"
