"""Fixtures of the container tests: a real Docker daemon, the test image, SGLang containers.

``bash scripts/test.sh`` installs Docker (docker.io) and debootstrap and starts dockerd
when none answers. The image is built once (dockerkit.ensure_image); each test module
shares one container laid out like the official SGLang image (its tree at
/sgl-workspace/sglang/python/sglang), removed when the module ends.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import dockerkit  # noqa: E402


@pytest.fixture(scope="session")
def docker_image() -> str:
    """The test image ``snapver-test:bookworm`` (python3 and git), built when missing."""
    problem = dockerkit.daemon_problem()
    if problem:
        pytest.fail(problem)
    return dockerkit.ensure_image()


@pytest.fixture(scope="module")
def make_container(docker_image: str, sglang_site_template: Path) -> Iterator[Callable[..., str]]:
    """Factory: ``make_container(hint, sglang=True) -> name``: a running container of the
    test image, with the fixture wheel's sglang tree copied in; all removed at the module's end."""
    names: list[str] = []

    def make(hint: str, sglang: bool = True) -> str:
        name = dockerkit.run_container(docker_image, hint)
        names.append(name)
        if sglang:
            dockerkit.copy_sglang_in(name, sglang_site_template)
        return name

    try:
        yield make
    finally:
        for name in names:
            dockerkit.remove_container(name)


@pytest.fixture(scope="module")
def sglang_container(make_container: Callable[..., str]) -> str:
    """The module's shared container with sglang at /sgl-workspace/sglang/python/sglang."""
    return make_container("sglang")


@pytest.fixture
def container_node() -> Callable[..., dict[str, Any]]:
    """Factory: ``container_node(name, **extra)`` → a ``[nodes.X]`` table for a local container."""

    def node(name: str, **extra: Any) -> dict[str, Any]:
        return {"container": name, "site_packages": dockerkit.SGLANG_PYTHON, **extra}

    return node
