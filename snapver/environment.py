"""The environment under a node's tree, as a value: what the agent's ``env`` reports, how a
snapshot stores it (``.snapver/env``, canonical JSON), and its comparable items.

Every string is data from the node: bounded here again (the agent is not trusted to have
done it), never printed raw (the CLI quotes control characters).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

ENV_PATH = ".snapver/env"
ENV_VERSION = 1
MAX_DISTS = 2000
MAX_NOTES = 21
MAX_GPUS = 64
MAX_TEXT = 200
MAX_URL = 500
# Item labels of the facts that are not distributions: capitalised or spaced, so that no
# distribution's normalized name (lower case, dashes) is ever one of them.
PYTHON, TORCH_CUDA, GPU, DRIVER, KERNEL = "Python", "torch CUDA", "GPU", "GPU driver", "Linux kernel"
FACTS = (PYTHON, TORCH_CUDA, GPU, DRIVER, KERNEL)


def _text(value: Any, limit: int = MAX_TEXT) -> str:
    """A string from the node, bounded; anything else is malformed."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {type(value).__name__}")
    return value if len(value) <= limit else value[: limit - 1] + "\u2026"


def normalized(name: str) -> str:
    """A distribution's name as PEP 503 compares it: ``Flash_Infer`` → ``flash-infer``."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Dist:
    """One installed distribution."""

    name: str
    version: str
    installer: str = ""
    editable: bool = False
    url: str = ""
    commit: str = ""

    @classmethod
    def from_json(cls, row: Any) -> Dist:
        if not isinstance(row, dict):
            raise ValueError("a distribution is not an object")
        return cls(_text(row.get("name")), _text(row.get("version")), _text(row.get("installer")),
                   row.get("editable") is True, _text(row.get("url"), MAX_URL), _text(row.get("commit")))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "installer": self.installer,
                "editable": self.editable, "url": self.url, "commit": self.commit}

    @property
    def shown_version(self) -> str:
        """The version, and that it is an editable install (its commit when known)."""
        if not self.editable:
            return self.version
        return f"{self.version} (editable{' @' + self.commit[:10] if self.commit else ''})"


@dataclass(frozen=True)
class Gpu:
    name: str
    driver: str
    memory: str


@dataclass(frozen=True)
class Environment:
    """A node's environment (see the agent's ``environ`` part)."""

    python_version: str
    python: str
    kernel: str
    dists: tuple[Dist, ...] = ()
    torch: dict[str, str] | None = None
    gpus: tuple[Gpu, ...] = ()
    driver: str = ""
    gpu_source: str = ""
    notes: tuple[str, ...] = field(default=())
    mark: str = field(default="", compare=False)  # what the agent read it from (never stored)

    @classmethod
    def from_json(cls, document: Any) -> Environment:
        """The environment of an agent's reply or a stored blob; ValueError if malformed."""
        if not isinstance(document, dict) or not isinstance(document.get("python"), dict):
            raise ValueError("not an environment")
        dists, notes = document.get("dists") or [], document.get("notes") or []
        gpu = document.get("gpu")
        torch = document.get("torch")
        if not isinstance(dists, list) or not isinstance(notes, list) or not isinstance(gpu, (dict, type(None))) \
                or not isinstance(torch, (dict, type(None))):
            raise ValueError("malformed environment")
        gpu = gpu or {}
        gpus = gpu.get("gpus") or []
        if not isinstance(gpus, list) or not all(isinstance(g, dict) for g in gpus):
            raise ValueError("malformed GPU list")
        return cls(
            python_version=_text(document["python"].get("version")),
            python=_text(document["python"].get("executable"), MAX_URL),
            kernel=_text(document.get("kernel")),
            dists=tuple(sorted((Dist.from_json(row) for row in dists[:MAX_DISTS]), key=lambda d: normalized(d.name))),
            torch=None if torch is None else {key: _text(torch.get(key)) for key in ("version", "cuda", "git_version")},
            gpus=tuple(Gpu(_text(g.get("name")), _text(g.get("driver")), _text(g.get("memory")))
                       for g in gpus[:MAX_GPUS]),
            driver=_text(gpu.get("driver")),
            gpu_source=_text(gpu.get("source")),
            notes=tuple(_text(note, MAX_URL) for note in notes[:MAX_NOTES]),
        )

    def to_json(self) -> dict[str, Any]:
        gpu = None if not (self.gpus or self.driver or self.gpu_source) else {
            "source": self.gpu_source, "driver": self.driver,
            "gpus": [{"name": g.name, "driver": g.driver, "memory": g.memory} for g in self.gpus]}
        return {"v": ENV_VERSION, "python": {"version": self.python_version, "executable": self.python},
                "kernel": self.kernel, "dists": [d.to_json() for d in self.dists], "torch": self.torch,
                "gpu": gpu, "notes": list(self.notes)}

    def canonical(self) -> bytes:
        """The bytes a snapshot stores: the same environment, the same bytes (one blob in git)."""
        return json.dumps(self.to_json(), ensure_ascii=True, sort_keys=True, separators=(",", ":")).encode() + b"\n"

    @classmethod
    def from_blob(cls, data: bytes) -> Environment:
        try:
            return cls.from_json(json.loads(data))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not JSON: {exc}") from None

    @property
    def gpu_summary(self) -> str:
        """``8 × NVIDIA H100 80GB HBM3``; GPUs of several models are each counted."""
        counts: dict[str, int] = {}
        for gpu in self.gpus:
            counts[gpu.name] = counts.get(gpu.name, 0) + 1
        return ", ".join(f"{count} \u00d7 {name}" for name, count in counts.items())

    def items(self) -> dict[str, str]:
        """What is compared across nodes and across time: each fact (``FACTS``) the node has,
        and each distribution by its normalized name, with its version."""
        found = {PYTHON: self.python_version, KERNEL: self.kernel}
        if self.torch is not None and self.torch.get("cuda"):
            found[TORCH_CUDA] = self.torch["cuda"]
        if self.gpus:
            found[GPU] = self.gpu_summary
        if self.driver:
            found[DRIVER] = self.driver
        for dist in self.dists:
            found.setdefault(normalized(dist.name), dist.shown_version)
        return found

    def summary(self) -> str:
        """One line: Python, torch and its CUDA, GPU, driver, how many distributions."""
        parts = [f"Python {self.python_version}"]
        if self.torch is not None:
            parts.append(f"torch {self.torch.get('version') or '?'}"
                         + (f" (CUDA {self.torch['cuda']})" if self.torch.get("cuda") else " (no CUDA)"))
        if self.gpus:
            parts.append(self.gpu_summary)
        if self.driver:
            parts.append(f"driver {self.driver}")
        parts.append(f"{len(self.dists)} distributions")
        return ", ".join(parts)


def item_order(name: str) -> tuple[int, str]:
    """The facts first, in FACTS order; then distributions by name."""
    return (FACTS.index(name), "") if name in FACTS else (len(FACTS), name)


@dataclass(frozen=True)
class EnvChange:
    """One item that differs between two environments: added (``old`` None), removed
    (``new`` None) or changed."""

    item: str
    old: str | None
    new: str | None

    def to_json(self) -> dict[str, Any]:
        return {"item": self.item, "old": self.old, "new": self.new}


def env_changes(old: Environment, new: Environment) -> list[EnvChange]:
    """What differs from ``old`` to ``new``, facts first, then distributions by name."""
    before, after = old.items(), new.items()
    names = sorted(set(before) | set(after), key=item_order)
    return [EnvChange(name, before.get(name), after.get(name)) for name in names
            if before.get(name) != after.get(name)]


def distribution_changes(changes: list[EnvChange]) -> int:
    return sum(1 for change in changes if change.item not in FACTS)


def ground_changes(changes: list[EnvChange]) -> list[EnvChange]:
    """The changes a plain diff reports: distributions, Python, torch's CUDA and the kernel
    (the GPU and driver are read only by ``diff --env``: nvidia-smi is slow)."""
    return [change for change in changes if change.item not in (GPU, DRIVER)]


def changes_summary(changes: list[EnvChange]) -> str:
    """``Python, 3 distributions``: what a list of changes touches."""
    facts = [change.item for change in changes if change.item in FACTS]
    count = distribution_changes(changes)
    if count:
        facts.append(f"{count} distribution{'s' if count != 1 else ''}")
    return ", ".join(facts)
