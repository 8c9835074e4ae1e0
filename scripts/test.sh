#!/usr/bin/env bash
# The test command: bash scripts/test.sh [pytest args...]
# On a fresh Debian machine (as root) it installs what the tests need first:
# a real OpenSSH server and client, rsync, git and zstd.
set -euo pipefail

cd "$(dirname "$0")/.."

missing=()
[[ -x /usr/sbin/sshd ]] || missing+=(/usr/sbin/sshd)
for tool in rsync ssh git zstd; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if ((${#missing[@]})); then
  echo "scripts/test.sh: missing ${missing[*]}; installing with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q openssh-server openssh-client rsync git zstd
fi
for tool in /usr/sbin/sshd ssh ssh-keygen rsync git zstd python3; do
  command -v "$tool" >/dev/null 2>&1 || { echo "scripts/test.sh: $tool is still missing" >&2; exit 1; }
done

PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q -e '.[test]'
# The real setproctitle wheel that tests/ops/test_ps.py installs into a node's venv (no index
# there): fetched from PyPI once into a cache beside the tests.
ls .test-wheels/setproctitle-*.whl >/dev/null 2>&1 ||
  python3 -m pip download -q --only-binary :all: --no-deps -d .test-wheels setproctitle ||
  echo "scripts/test.sh: could not download setproctitle (tests/ops/test_ps.py will try again)" >&2
# Two workers (pytest-xdist), a test file each at a time: the suite is mostly waiting on
# sshd, git and node agents, and these machines have two cores (10 min -> ~6 min).
# A later -n (e.g. `bash scripts/test.sh -n 0 tests/ops`) overrides it.
exec python3 -m pytest -q -n 2 --dist loadfile "$@"
