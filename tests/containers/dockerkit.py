"""Real Docker for the container tests: the test image built from nothing, and containers.

No registry can be reached, so the image ``snapver-test:bookworm`` is a Debian root made
by ``debootstrap`` (with python3 and git) and ``docker import``-ed; the root's tarball is
kept under CACHE_DIR so that a later run imports it again without debootstrap.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

IMAGE = "snapver-test:bookworm"
SUITE = "bookworm"
CACHE_DIR = Path(os.environ.get("SNAPVER_TEST_CACHE", "/var/cache/snapver-test"))
ROOTFS_TAR = CACHE_DIR / f"{SUITE}-minbase-python3-git.tar"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
BUILD_TIMEOUT = 900  # debootstrap downloads and unpacks ~200 packages
DOCKER_TIMEOUT = 120


def docker(*args: str, check: bool = True, timeout: float = DOCKER_TIMEOUT,
           input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:  # noqa: A002
    """Run the docker client; a failure with ``check`` raises with its stderr."""
    completed = subprocess.run(["docker", *args], input=input, capture_output=True, timeout=timeout,
                               stdin=None if input is not None else subprocess.DEVNULL)
    if check and completed.returncode:
        raise RuntimeError(f"docker {' '.join(args)}: exit {completed.returncode}: "
                           f"{completed.stderr.decode(errors='replace').strip()}")
    return completed


def daemon_problem() -> str:
    """Why the tests cannot use Docker ("" when they can)."""
    if shutil.which("docker") is None:
        return "no docker client on PATH (`bash scripts/test.sh` installs docker.io)"
    try:
        answer = docker("info", "--format", "{{.ServerVersion}}", check=False, timeout=30)
    except subprocess.TimeoutExpired:
        return "`docker info` did not answer within 30 s"
    if answer.returncode:
        lines = answer.stderr.decode(errors="replace").strip().splitlines() or ["(no error)"]
        return f"no Docker daemon answers (`bash scripts/test.sh` starts one): {lines[-1]}"
    return ""


def apt_mirror() -> str:
    """The Debian mirror this machine's apt uses (deb822 ``URIs:`` or a ``deb`` line)."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for source in sources:
        try:
            text = source.read_text(errors="replace")
        except OSError:
            continue
        if source.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                suites = re.search(r"^Suites:\s*(.+)$", stanza, re.M)
                uris = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
                if uris and suites and SUITE in suites.group(1).split():
                    return uris.group(1)
        elif source.suffix in (".list", ""):
            for line in text.splitlines():
                match = re.match(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+(\S+)", line.strip())
                if match and match.group(2) == SUITE:
                    return match.group(1)
    return DEFAULT_MIRROR


@contextmanager
def _cache_lock() -> Iterator[None]:
    """One builder at a time (pytest-xdist workers each have a session of their own)."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / ".lock", "w") as lock:
        deadline = time.monotonic() + BUILD_TIMEOUT
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{CACHE_DIR}/.lock held for {BUILD_TIMEOUT} s") from None
                time.sleep(0.5)
        yield


def _debootstrap_tarball() -> None:
    """Make ROOTFS_TAR: a minimal bookworm with python3 and git."""
    with tempfile.TemporaryDirectory(prefix="snapver-rootfs-", dir=CACHE_DIR) as scratch:
        root = Path(scratch) / "root"
        subprocess.run(["debootstrap", "--variant=minbase", "--include=python3,git", SUITE, str(root),
                        apt_mirror()], check=True, stdin=subprocess.DEVNULL, capture_output=True,
                       timeout=BUILD_TIMEOUT)
        shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
        partial = ROOTFS_TAR.with_suffix(".tar.part")
        subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(partial), "."], check=True,
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=BUILD_TIMEOUT)
        os.replace(partial, ROOTFS_TAR)


def ensure_image() -> str:
    """The test image's tag, built (or imported from the cached root) when Docker lacks it."""
    if not docker("image", "inspect", IMAGE, check=False).returncode:
        return IMAGE
    with _cache_lock():
        if docker("image", "inspect", IMAGE, check=False).returncode:  # not built meanwhile
            if not ROOTFS_TAR.is_file():
                _debootstrap_tarball()
            with open(ROOTFS_TAR, "rb") as tarball:
                subprocess.run(["docker", "import", "-", IMAGE], stdin=tarball, check=True,
                               capture_output=True, timeout=BUILD_TIMEOUT)
    return IMAGE


# The container's main process: a web server on its own loopback (a health_url reachable
# only from inside, with --network none), then sleep. Both come back with the container.
MAIN = "python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 & exec sleep infinity"
SGLANG_PYTHON = "/sgl-workspace/sglang/python"  # where the official SGLang image has sglang (editable)


def run_container(image: str, name_hint: str) -> str:
    """Start ``image`` as a new container (no network) running MAIN; returns its name."""
    name = f"snapver-test-{name_hint}-{uuid.uuid4().hex[:8]}"
    docker("run", "-d", "--network", "none", "--name", name, image, "sh", "-c", MAIN)
    return name


def copy_sglang_in(name: str, site_packages: Path) -> None:
    """Copy the wheel's ``sglang`` tree into the container's layer (docker cp, not a bind
    mount), where the official image has its editable checkout."""
    exec_in(name, f"mkdir -p {SGLANG_PYTHON}")
    docker("cp", f"{site_packages / 'sglang'}", f"{name}:{SGLANG_PYTHON}/sglang", timeout=300)


def remove_container(name: str) -> None:
    docker("rm", "-f", name, check=False)


def exec_in(name: str, script: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    """Run the sh ``script`` inside container ``name``."""
    return docker("exec", name, "sh", "-c", script, check=check)
