#!/usr/bin/env bash
# The test command: bash scripts/test.sh [pytest args...]
# On a fresh Debian machine (as root) it installs what the tests need first:
# a real OpenSSH server and client, rsync, git and zstd; and, for the container tests
# (tests/containers), Debian's Docker Engine and debootstrap, whose daemon it starts
# when none answers and stops again when the tests end.
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

# -- a Docker daemon for tests/containers ------------------------------------------------
DOCKERD_LOG=/tmp/snapver-test-dockerd.log
DOCKERD_PID=""  # set only when this script started the daemon: it stops only that one

stop_dockerd() {
  [[ -n "$DOCKERD_PID" ]] || return 0
  kill "$DOCKERD_PID" 2>/dev/null || true
  for _ in $(seq 1 150); do  # dockerd stops its containers first: up to ~15 s
    kill -0 "$DOCKERD_PID" 2>/dev/null || { DOCKERD_PID=""; return 0; }
    sleep 0.1
  done
  kill -9 "$DOCKERD_PID" 2>/dev/null || true
  DOCKERD_PID=""
}

start_dockerd() {
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    return 0  # a daemon answers already: use it, and leave it running
  fi
  if ! command -v dockerd >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
    echo "scripts/test.sh: no Docker daemon; installing docker.io and debootstrap with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q docker.io debootstrap
  fi
  echo "scripts/test.sh: starting dockerd (log: $DOCKERD_LOG)" >&2
  dockerd >"$DOCKERD_LOG" 2>&1 &
  DOCKERD_PID=$!
  trap stop_dockerd EXIT
  local deadline=$((SECONDS + 60))
  until docker info >/dev/null 2>&1; do
    if ! kill -0 "$DOCKERD_PID" 2>/dev/null || ((SECONDS >= deadline)); then
      echo "scripts/test.sh: dockerd did not answer within 60 s; its log:" >&2
      tail -n 20 "$DOCKERD_LOG" >&2 || true
      stop_dockerd
      exit 1
    fi
    sleep 0.5
  done
}

start_dockerd

# -- a Python of the suite's own ----------------------------------------------------------
# The tests and their dependencies live in a venv beside the checkout (SNAPVER_TEST_VENV,
# default .venv-test), never in the system's Python: its packages stay as they were.
VENV="${SNAPVER_TEST_VENV:-.venv-test}"
if [[ ! -x "$VENV/bin/python" ]]; then
  if ! python3 -m venv "$VENV" 2>/dev/null; then  # Debian's python3 needs python3-venv for ensurepip
    rm -rf "$VENV"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q python3-venv
    python3 -m venv "$VENV"
  fi
fi
PY="$VENV/bin/python"
PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install -q -e '.[test]'
# The real setproctitle wheel that tests/ops/test_ps.py installs into a node's venv (no index
# there): fetched from PyPI once into a cache beside the tests.
ls .test-wheels/setproctitle-*.whl >/dev/null 2>&1 ||
  "$PY" -m pip download -q --only-binary :all: --no-deps -d .test-wheels setproctitle ||
  echo "scripts/test.sh: could not download setproctitle (tests/ops/test_ps.py will try again)" >&2
# Two workers (pytest-xdist), a test file each at a time: the suite is mostly waiting on
# sshd, git and node agents, and these machines have two cores (10 min -> ~6 min).
# A later -n (e.g. `bash scripts/test.sh -n 0 tests/ops`) overrides it.
# Not `exec`: the dockerd started above is stopped when pytest ends, and pytest's exit
# code is this script's.
# Lint and types first (config in pyproject.toml): any finding fails the run.
"$PY" -m ruff check snapver tests bench
"$PY" -m mypy
status=0
"$PY" -m pytest -q -n 2 --dist loadfile "$@" || status=$?
stop_dockerd
exit "$status"
