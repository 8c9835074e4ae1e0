"""The one error hierarchy: each class carries its exit code (SPEC "Output and exit codes")."""

from __future__ import annotations


class SnapverError(Exception):
    """Base of every error snapver reports; ``exit_code`` is what the process exits with."""

    exit_code = 1
    # Said when the raiser gave no hint of its own (SPEC: every error one line and a hint).
    default_hint: str | None = None

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    @property
    def shown_hint(self) -> str | None:
        """The hint printed under the error: the raiser's, else its class's."""
        return self.hint or self.default_hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} (hint: {self.hint})"


class UsageError(SnapverError):
    """Bad arguments on the command line."""

    exit_code = 2
    default_hint = "see `snapver COMMAND --help`"


class ConfigError(UsageError):
    """A `.snapver` that cannot be used: names the file, the key and what is wrong."""


class RefError(UsageError):
    """A ref that names nothing, or more than one thing."""


class PatchError(UsageError):
    """A malformed patch, or one that does not fit its base."""


class ConflictError(SnapverError):
    """A push refused because a node's files are neither the base nor the patch."""

    exit_code = 1


class TransportError(SnapverError):
    """A node that cannot be reached, or a command that failed on it."""

    exit_code = 3
    default_hint = "`snapver nodes --check` says what answers on each node"


class HostKeyError(TransportError):
    """A host key that is unknown (under strict) or changed."""


class RemotePathError(TransportError):
    """A remote path that is missing or not readable."""

    default_hint = "check the node's site_packages (or python) and paths in .snapver; `snapver nodes --check`"


class Cancelled(SnapverError):
    """Work stopped by an interrupt (Ctrl-C, SIGTERM) before it changed anything."""

    exit_code = 130


class StoreError(SnapverError):
    """The store is locked, corrupt, or cannot be written."""

    exit_code = 4
    default_hint = "`snapver fsck` checks the store"


class StoreLockedError(StoreError):
    """Another snapver command holds the store lock."""


class GitTimeoutError(StoreError):
    """A git process on the store that did not finish (or answer) in time, and was killed."""


class RemoteError(TransportError):
    """The team remote (`[store] remote`) that cannot be reached, refused a push, or is no snapver store."""

    default_hint = "check [store] remote in .snapver"


def env_seconds(name: str, default: float) -> float:
    """A number of seconds from the environment variable ``name`` (``default`` when unset);
    anything else than a number ≥ 0 is a usage error (exit 2), never an internal one."""
    import math
    import os

    text = os.environ.get(name)
    if text is None or not text.strip():
        return default
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds < math.inf:
        raise UsageError(f"{name}={text!r}: expected a number of seconds", hint=f"unset {name}, or give e.g. 10")
    return seconds
