"""The CLI's shared state: the global options, and the store a command opened (to sync it).

``app`` sets it from the options given before the command; the commands and ``render`` read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from snapver.config import Config
    from snapver.store.repo import Store


@dataclass
class Globals:
    """Options given before the command, shared by every command."""

    config_path: str | None = None
    verbose: bool = False
    color: bool = True
    no_pager: bool = False
    wide: bool = False  # -w/--wide of a command that prints a table: nothing cut, nothing wrapped
    outcome: int = 0  # the exit code of the result being printed (render.outcome)

    def config(self) -> Config:
        from snapver.config import load_config

        return load_config(self.config_path)

    command: str | None = None  # the command being run (for `[store] sync = "auto"`)
    auto_synced: bool = False
    opened: tuple[Store, Config] | None = None  # the store a command opened, to sync after it

    def store(self, config: Config, create: bool = False) -> Store:
        from snapver.config import NO_CONFIG_HINT
        from snapver.errors import StoreError
        from snapver.store.repo import Store

        try:
            store = Store.open_or_create(config.store_path) if create else Store(config.store_path)
        except StoreError as exc:
            note = config.no_config_note()
            if note and not config.store_path.exists():  # no store, and no config either: say both
                raise StoreError(f"{exc.message}: {note}", hint=NO_CONFIG_HINT) from None
            raise
        self.opened = (store, config)
        if self.command in SYNC_BEFORE and not self.auto_synced:
            auto_sync(store, config)
        return store


# `[store] sync = "auto"`: commands that read what others may have written sync first, and
# commands that write sync after (push and rollback both: a push checks the patch's newest version).
SYNC_BEFORE = frozenset({"log", "show", "diff", "status", "tag", "patch", "push", "rollback"})
SYNC_AFTER = frozenset({"pull", "tag", "patch", "push", "rollback", "import"})


def auto_sync(store: Store, config: Config) -> None:
    """One sync with a short timeout when the config asks for it; offline (or any failure)
    is one warning line on stderr, never a failed command."""
    if config.sync != "auto" or not config.remote or STATE.command == "sync":
        return
    from snapver.errors import SnapverError
    from snapver.store.team import AUTO_SYNC_TIMEOUT, sync

    STATE.auto_synced = True
    try:
        sync(store, config.remote, timeout=AUTO_SYNC_TIMEOUT, lock_wait=AUTO_SYNC_TIMEOUT)
    except SnapverError as exc:
        import sys

        from snapver.model import quote_controls

        print(f"snapver: warning: not synced with the team ({quote_controls(exc.message)}); working offline",
              file=sys.stderr)


def sync_after() -> None:
    """After a command that writes: sync what it wrote (when the config asks for it)."""
    if STATE.opened is not None:
        STATE.auto_synced = False
        auto_sync(*STATE.opened)


STATE = Globals()
