"""init: write `.snapver` from the example and create an empty store."""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from snapver.config import CONFIG_NAME, load_config
from snapver.store.refs import check_writer
from snapver.store.repo import Store
from snapver.store.team import ensure_writer, set_writer


@dataclass(frozen=True)
class InitResult:
    config_path: Path
    config_created: bool
    store_path: Path
    writer: str = ""


def example_text() -> str:
    return resources.files("snapver").joinpath("example.toml").read_text(encoding="utf-8")


# The example's commented-out local node, which ``--local`` writes as a real one.
LOCAL_NODE = ("# [nodes.local]\n", "# local = true\n", "# site_packages = ")


def init(folder: Path, local: bool = False, writer: str | None = None) -> InitResult:
    """Create `.snapver` (unless one is there) and the store it names.

    It names no node unless asked: ``local`` adds node ``local``, this Python's
    site-packages (the embedded default's node); else every node example stays a comment.
    The store gets a writer id (``writer``, else ``user@host``), which names what it
    publishes to a team remote (`snapver sync`); init on an existing store changes it.
    """
    config_path = folder / CONFIG_NAME
    created = False
    if not config_path.exists():
        site_packages = sysconfig.get_paths()["purelib"]
        text = example_text().replace('"SITE_PACKAGES"', '"' + site_packages.replace("\\", "\\\\") + '"')
        if local:
            for line in LOCAL_NODE:
                text = text.replace(line, line[2:], 1)
        config_path.write_text(text, encoding="utf-8")
        created = True
    if writer is not None:
        check_writer(writer)
    config = load_config(str(config_path))
    store = Store.create(config.store_path)
    if writer is not None:
        set_writer(store, writer)
    return InitResult(config_path, created, config.store_path, ensure_writer(store))
