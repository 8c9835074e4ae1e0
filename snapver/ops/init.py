"""init: write `.snapver` from the example and create an empty store."""

from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from snapver.config import CONFIG_NAME, load_config
from snapver.errors import ConfigError
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


def _create(path: Path, text: str) -> bool:
    """Write ``path`` whole, unless it exists (made meanwhile too: never replaced). False if it did."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.link(tmp, path)  # all of it or nothing, and only where nothing is
    except FileExistsError:
        return False
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write the config: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return True


def init(folder: Path, local: bool = False, writer: str | None = None, config_path: Path | None = None) -> InitResult:
    """Create the config (``config_path``, else `.snapver` in ``folder``) unless it is
    there, and the store it names.

    It names no node unless asked: ``local`` adds node ``local``, this Python's
    site-packages (the embedded default's node); else every node example stays a comment.
    The store gets a writer id (``writer``, else ``user@host``), which names what it
    publishes to a team remote (`snapver sync`); init on an existing store changes it.
    """
    config_path = config_path or folder / CONFIG_NAME
    created = False
    if writer is not None:
        check_writer(writer)  # before anything is written
    if not config_path.exists():
        site_packages = sysconfig.get_paths()["purelib"]
        text = example_text().replace('"SITE_PACKAGES"', '"' + site_packages.replace("\\", "\\\\") + '"')
        if local:
            for line in LOCAL_NODE:
                text = text.replace(line, line[2:], 1)
        created = _create(config_path, text)
    config = load_config(str(config_path))
    store = Store.create(config.store_path)
    if writer is not None:
        set_writer(store, writer)
    return InitResult(config_path, created, config.store_path, ensure_writer(store))
