"""The Transport protocol: one agent per node, spoken to over one byte channel.

A transport only knows how to start ``python -c <bootstrap>`` on its node and hand
back the process's stdin/stdout; everything else (listing, hashing, streaming files,
writing) is the same framed protocol for every transport (see ``agent/``).
"""

from __future__ import annotations

import dataclasses
import json
import marshal
import os
import re
import shlex
import struct
import threading
import time
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from importlib.util import MAGIC_NUMBER, cache_from_source, source_hash
from itertools import repeat
from pathlib import Path
from typing import Any, Protocol, cast

from snapver import interrupt
from snapver.config import NodeSpec
from snapver.environment import Environment
from snapver.errors import Cancelled, RemotePathError, TransportError
from snapver.model import FILE, LINK, SPECIAL, DistInfo, InstallInfo, NodeInfo, StatEntry, is_git_id, is_safe_relpath
from snapver.transport.agent import assemble
from snapver.transport.agent.wire import ABORT_FRAME, BIG_FILE, GREETING, MIN_PYTHON, SQUEEZE_OVER, SQUEEZED, Record
from snapver.transport.chunks import ByteQueue


class Transport(ABC):
    """What every transport offers the operations: one node's agent, however it is reached.

    ``AgentTransport`` (below) implements all of it over the agent's protocol; a concrete
    transport (local, ssh, mux, container) only starts the agent (``_start``)."""

    spec: NodeSpec  # the node as configured
    reached: bool  # the node answered (a login, a folder), whatever its agent did next
    bytes_sent: int
    bytes_received: int

    @abstractmethod
    def open(self) -> NodeInfo:
        """Connect, start the agent and learn the node's facts."""

    @abstractmethod
    def start(self) -> Transport:
        """``open`` without waiting: hello's reply is read when first needed."""

    @property
    @abstractmethod
    def info(self) -> NodeInfo | None:
        """The node's facts (python, site-packages, dists); None before ``open``."""

    @property
    @abstractmethod
    def is_open(self) -> bool:
        """True while the agent runs and is in step."""

    @abstractmethod
    def close(self) -> None:
        """Say goodbye to the agent and end the session."""

    @abstractmethod
    def abandon(self) -> None:
        """End a session out of step for good, at once, saying nothing more."""

    @abstractmethod
    def cut(self) -> None:
        """End the session at once, from any thread (an interrupt)."""

    @abstractmethod
    def list_tree(self, cache: dict[str, StatEntry] | None = None, cache_time_ns: int = 0,
                  want_oids: bool = True) -> Listing:
        """List the tracked tree; files whose stat matches ``cache`` are not re-hashed."""

    @abstractmethod
    def request_listing(self, cache: dict[str, StatEntry] | None = None, cache_time_ns: int = 0,
                        want_oids: bool = True, cache_keys: StatKeys | None = None,
                        rows_if_unchanged: bool = True) -> Callable[[], Listing]:
        """``list_tree`` in two steps: ask now, wait for the listing later."""

    @abstractmethod
    def read_files(self, paths: list[str], compress_level: int = 0) -> Iterator[tuple[str, str | None, bytes]]:
        """``(path, kind or None if it vanished, content)`` for ``paths``, in order, each whole."""

    @abstractmethod
    def stream_files(self, paths: list[str], compress_level: int = 0) -> Iterator[FileItem]:
        """``read_files``, with each large file a ``StreamedFile`` (in pieces)."""

    @abstractmethod
    def request_listed_files(self, compress_level: int = 0) -> Callable[[list[str]], Iterator[FileItem]]:
        """Ask now for every path of the listing just requested; ``stream_files`` for them."""

    @abstractmethod
    def hash_files(self, paths: list[str], algo: str = "sha256") -> dict[str, str | None]:
        """Each path's digest on the node; None for a path that is not there."""

    @abstractmethod
    def ping(self) -> float:
        """Seconds one request takes to come back."""

    @abstractmethod
    def call(self, op: str, **args: Any) -> dict[str, Any]:
        """Send one agent request (``check``, ``write``, ``ps``...) and return its reply."""

    @abstractmethod
    def call_within(self, seconds: float, op: str, **args: Any) -> dict[str, Any]:
        """``call``, its reply due within ``seconds``, else the session is cut."""

    @abstractmethod
    def request(self, op: str, **args: Any) -> Callable[[], dict[str, Any]]:
        """Send one request now; the function returned waits for its reply."""

    @abstractmethod
    def send_stream(self, chunks: Iterator[bytes], abortable: bool = True) -> None:
        """Send a run of frames ended by an empty one (a file's content for ``write``)."""

    @abstractmethod
    def compile_sources(self, sources: list[tuple[str, bytes]]
                        ) -> tuple[dict[str, tuple[int | None, str]], list[str]]:
        """Compile Python sources with the node's own interpreter: refusals, and those too large."""

    @abstractmethod
    def run_restart(self, command: str, timeout: float, deadline: float) -> dict[str, Any]:
        """Run a restart command where the node's service is managed from."""

    def container_identity(self, timeout: float = 30.0) -> tuple[str, str] | None:
        """(container id, image id) of the node's container, as its engine on the host says
        within ``timeout``; None for a node that is no named container, or no answer."""
        return None

    @abstractmethod
    def request_environment(self, within: float | None = None, gpu: bool = True) -> Callable[[], Environment]:
        """Ask now for the node's environment (Python, distributions, torch, GPU, kernel)."""

    @abstractmethod
    def request_environment_since(self, mark: str, within: float | None = None,
                                  gpu: bool = True) -> Callable[[], Environment | None]:
        """As ``request_environment``, None when the environment still has ``mark``."""

    def __enter__(self) -> Transport:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# Not a file: the name the assembled agent's .pyc is kept under, beside its parts' own.
_ASSEMBLED_NAME = Path(__file__).with_name("agent") / "snapver_agent.py"
_CHECKED_HASH = (3).to_bytes(4, "little")  # a .pyc's flags: hash-based, to be checked against the source


def _bytecode_path() -> Path:
    return Path(cache_from_source(str(_ASSEMBLED_NAME)))


def _agent_bytecode() -> bytes:
    """The assembled agent as this Python's bytecode: the body of its cached ``.pyc`` when
    that was compiled from this very source (its hash), as the import system checks a
    hash-based ``.pyc``; b"" without a fresh one."""
    try:
        data = _bytecode_path().read_bytes()
    except OSError:
        return b""
    if (len(data) <= 16 or data[:4] != MAGIC_NUMBER or data[4:8] != _CHECKED_HASH
            or data[8:16] != source_hash(assemble())):
        return b""
    return data[16:]


def _compiled_agent() -> bytes:
    """The assembled agent compiled now, and cached for the next command. The cache is
    written whatever ``PYTHONDONTWRITEBYTECODE`` says: that governs the import system's
    ``.pyc`` of modules (which ``pip install`` compiled already), and no install step makes
    this one; without it every command would compile the agent again."""
    source = assemble()
    code = marshal.dumps(compile(source, "snapver-agent", "exec", dont_inherit=True))
    _write_atomically(_bytecode_path(), MAGIC_NUMBER + _CHECKED_HASH + source_hash(source) + code)
    return code


def _write_atomically(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all (a folder without write access: not at all)."""
    temporary = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(exist_ok=True)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)


_PAYLOAD_LOCK = threading.Lock()


def agent_payload() -> tuple[bytes, bytes]:
    """``_agent_payload``, made once: the nodes of a fleet start at once, and each thread
    that found the cache empty would make it again."""
    with _PAYLOAD_LOCK:
        return _agent_payload()


@cache
def _agent_payload() -> tuple[bytes, bytes]:
    """What the node is sent: the assembled source compressed, then the same code as this
    Python's bytecode (cached, else compiled here). A node whose Python has the same
    bytecode magic runs the bytecode (no compile on the node's CPU on every command); any
    other node (or a bytecode part that does not load) compiles the source. Made when a
    node is first started, not at import (commands which never connect need not pay)."""
    bytecode = _agent_bytecode() or _compiled_agent()
    return zlib.compress(assemble(), 6), zlib.compress(bytecode, 1)


# The entry kind of each whole record's kind (Record.GONE: None, the path vanished).
_ENTRY_KINDS = {Record.FILE: FILE, Record.LINK: LINK, Record.SPECIAL: SPECIAL}
# The largest record of one piece (a file up to BIG_FILE, a link, a reason): a larger size
# is a node out of step, never a request to hold that much.
WHOLE_RECORD_MAX = 2 * BIG_FILE
INFLATE_AT_ONCE = 4 << 20


@dataclass(frozen=True)
class StatKeys:
    """A stat cache's keys as the agent's ``list`` takes them: their JSON text (a string of
    "path NUL size mtime_ns ctime_ns ino mode" records) compressed with zlib, sent as they
    are; and a function reading the cache's entries (None when they no longer belong with
    these keys)."""

    packed: bytes
    read_cache: Callable[[], dict[str, StatEntry] | None]
    files: int | None = None  # how many files the keys name, if the snapshot has nothing else (else None)
    header: dict[str, Any] | None = None  # their file's header, when the file holds them as text
    digest: tuple[str, int] | None = None  # of their records, sorted (ops.pull.records_digest), and how many


class FileChanged(Exception):
    """The node saw a streamed file change while it read it: what came of it is void, and
    the stream sends the path again (another state of the file, or its end)."""


class StreamedFile:
    """A large file as it arrives: ``size`` (as the node found it when it opened it) and its
    pieces, by iterating once (each piece is valid until the next is asked for). The
    iteration raises ``FileChanged`` at its end if the node saw the file change."""

    def __init__(self, path: str, size: int, pieces: Iterator[bytes | memoryview]) -> None:
        self.path = path
        self.size = size
        self._pieces = pieces

    def __iter__(self) -> Iterator[bytes | memoryview]:
        return self._pieces

    def drain(self) -> None:
        """Read whatever its consumer left unread (to keep the stream in step)."""
        try:
            for _ in self._pieces:
                pass
        except FileChanged:
            pass


# What a file stream yields: (path, kind or None if it vanished, content or its pieces).
FileItem = tuple[str, str | None, bytes | StreamedFile]


class AgentInput(Protocol):
    """What is written to an agent: a pipe, or an SSH channel's writer."""

    def write(self, data: bytes, /) -> int: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


class AgentOutput(Protocol):
    """What an agent's answers are read from."""

    def read(self, size: int, /) -> bytes: ...


@dataclass
class RawChannel:
    """A started agent process: its stdin and stdout, and a way to end it."""

    stdin: AgentInput
    stdout: AgentOutput
    close: Any  # () -> str: ends the process, returns what it wrote on stderr
    # () -> None: end a session whose agent was told ``bye``, without waiting for it to exit
    # (over SSH that wait is a round trip; the agent exits at the bye, or at the EOF the
    # closed connection gives it). None: ``close``.
    leave: Any = None
    # () -> None: end it at once, waiting for nothing, safe from another thread (an
    # interrupt); reads and writes in progress fail at once. None: ``leave`` or ``close``.
    kill: Any = None

    def end(self, hurry: bool = False) -> str:
        """``close`` (its stderr), or when ``hurry`` (an interrupt) ``kill``: waits for nothing."""
        if hurry:
            (self.kill or self.leave or self.close)()
            return ""
        return self.close() or ""


@dataclass(frozen=True)
class Listing:
    """A live tree as the node listed it; ``now_ns`` is the node's clock at the start."""

    now_ns: int
    entries: list[StatEntry]
    hashed: int
    # A listing against a cache in which the node found every cached file unchanged
    # and nothing else: the cache still holds (its rows, its time) as it was.
    as_cached: bool = False
    # ``as_cached`` with the cache's rows left unread (``rows_if_unchanged=False``):
    # ``entries`` is empty, the tree is the cache's, these many files.
    rows_omitted: int = 0

    def by_path(self) -> dict[str, StatEntry]:
        return {entry.path: entry for entry in self.entries}


# <prefix>/lib/pythonX.Y/site-packages (venv, conda, pyenv, /usr/local...): <prefix>/bin has its python.
_PREFIX_LAYOUT = re.compile(r"^(/.*)/lib(?:64)?/python(3(?:\.\d+)?)/(?:site|dist)-packages/?$")


def deployment_pythons(site_packages: str | None) -> list[str]:
    """The interpreters that own ``site_packages`` by its layout, most specific first.

    Starting the deployment's own interpreter by path (rather than the first ``python3``
    on PATH) records the right version and skips PATH shims (pyenv's are slow).
    """
    match = _PREFIX_LAYOUT.match(site_packages or "")
    if not match:
        return []
    prefix, version = match.groups()
    names = [f"python{version}", "python3", "python"] if "." in version else ["python3", "python"]
    return [f"{prefix}/bin/{name}" for name in names]


# The bootstrap the node's python runs. A Python older than MIN_PYTHON never compiles the
# agent (3.6 lacks time.time_ns, later ones may lack syntax it uses): it answers hello with
# an error the client shows as it is, then drains stdin until the client hangs up, so that
# the client's pipelined requests never meet a closed pipe. Kept valid on any Python 3.
_BOOTSTRAP = """import sys,zlib
if sys.version_info<({major},{minor}):
 import json,struct;i=sys.stdin.buffer;o=sys.stdout.buffer;i.read({size});o.write({greeting!r})
 v="%d.%d.%d"%tuple(sys.version_info[:3])
 e="Python "+v+" is too old (snapver needs \\u2265 {major}.{minor})"
 m=json.dumps({{"error":e,"kind":"too_old","python_version":v,"python":sys.executable}}).encode()
 o.write(struct.pack(">I",len(m))+m);o.flush()
 while i.read(65536):pass
 sys.exit(0)
i=sys.stdin.buffer;s=i.read({size});b=i.read({code_size});c=None
if b:
 try:
  import _frozen_importlib_external as x,marshal
  if x.MAGIC_NUMBER=={magic!r}:c=marshal.loads(zlib.decompress(b));L=1
 except Exception:c=None
exec(c or compile(zlib.decompress(s),"snapver-agent","exec"))"""


def agent_command(python: str | None, no_site: bool = False, site_packages: str | None = None) -> str:
    """The POSIX sh command that starts the agent, reading its source from stdin.

    ``no_site`` (when site-packages is known, so the agent needs only the standard
    library) runs Python with ``-S``: no ``site`` import, no ``.pth`` files to process.
    Without a configured ``python``: the interpreter that owns ``site_packages`` by its
    layout if there is one, else ``python3`` or ``python`` from PATH.
    """
    source, bytecode = agent_payload()
    code = _BOOTSTRAP.format(size=len(source), code_size=len(bytecode), magic=MAGIC_NUMBER, greeting=GREETING,
                             major=MIN_PYTHON[0], minor=MIN_PYTHON[1])
    flags = "-S -c" if no_site else "-c"
    if python:
        return f"exec {shlex.quote(python)} {flags} {shlex.quote(code)}"
    owners = " ".join(shlex.quote(p) for p in deployment_pythons(site_packages))
    by_layout = f'for p in {owners}; do [ -f "$p" ] && [ -x "$p" ] && exec "$p" {flags} "$c"; done; ' if owners else ""
    return (
        f"c={shlex.quote(code)}; {by_layout}"
        'for p in python3 python; do command -v "$p" >/dev/null 2>&1 && '
        f'exec "$p" {flags} "$c"; done; '
        'echo "snapver: no python3 or python on the node" >&2; exit 127'
    )


def _too_old_hint(python: Any) -> str:
    where = f" ({python})" if isinstance(python, str) and python else ""
    return (f"the node's python{where} must be {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer: "
            "set `python = ...` for the node in .snapver")


def check_python_version(node: str, version: str, python: str = "") -> None:
    """TransportError (exit 3) when hello's ``version`` ("3.6.15") is older than MIN_PYTHON."""
    try:
        found = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        raise TransportError(f"{node}: the agent reports an unreadable Python version {version!r}") from None
    if found < MIN_PYTHON:
        raise TransportError(f"{node}: Python {version} is too old (snapver needs ≥ {MIN_PYTHON[0]}.{MIN_PYTHON[1]})",
                             hint=_too_old_hint(python))


class AgentTransport(Transport):
    """A connection to one node's agent, over the byte channel a concrete transport starts.
    Use as a context manager."""

    def __init__(self, spec: NodeSpec) -> None:
        self.spec = spec
        self._info: NodeInfo | None = None
        self._hello_pending = False
        self._unanswered = 0  # requests sent whose replies have not been read
        self._greeted = False  # the agent's GREETING was read (it comes before any reply)
        self.bytes_received = 0
        self.bytes_sent = 0
        self._channel: RawChannel | None = None
        # The node answered (an SSH login, or a folder of this machine), whatever its agent
        # did next: a python that is not there is not an unreachable node.
        self.reached = spec.local

    # -- what a concrete transport provides -------------------------------------
    @abstractmethod
    def _start(self, command: str) -> RawChannel:
        """Run ``command`` with POSIX sh on the node; return its pipes."""

    def _disconnect(self) -> None:
        """Close whatever connection ``_start`` opened (nothing for a local folder)."""

    # -- lifecycle ---------------------------------------------------------------
    def open(self) -> NodeInfo:
        """Connect, start the agent and learn the node's facts (python, site-packages)."""
        info = self.start().info
        assert info is not None
        return info

    def start(self) -> AgentTransport:
        """``open`` without waiting: the reply to ``hello`` is read when first needed
        (``info``, or the reply to the next request), so the first real request travels
        right behind it and the node's shell and Python start-up overlap with the caller's
        own work. A node that cannot answer hello fails that first use."""
        self._greeted = False  # every agent started greets first, a restarted one too
        self._channel = self._start(agent_command(self.spec.python, no_site=bool(self.spec.site_packages),
                                                  site_packages=self.spec.site_packages))
        interrupt.register(self)
        try:
            self._channel.stdin.write(b"".join(agent_payload()))
        except (OSError, EOFError) as exc:  # paramiko raises EOFError on a dropped connection
            raise self._dead(exc) from exc
        self._send({"op": "hello", "paths": list(self.spec.paths), "site_packages": self.spec.site_packages})
        self._hello_pending = True
        self._unanswered += 1
        return self

    @property
    def info(self) -> NodeInfo | None:
        """The node's facts, from the agent's reply to hello (None before ``open``)."""
        if self._hello_pending:
            self._hello_pending = False
            reply = self._reply()
            try:
                self._info = NodeInfo(
                    hostname=_text(reply["hostname"]),
                    python_version=_text(reply["python_version"]),
                    python=_text(reply["python"]),
                    site_packages=_text(reply["site_packages"]),
                    dists=tuple(DistInfo(*map(_text, dist)) for dist in reply["dists"]),
                    install=_install_of(reply.get("install")),
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise TransportError(f"{self.spec.name}: malformed reply from the agent to hello: {exc!r}") from None
            check_python_version(self.spec.name, self._info.python_version, self._info.python)
            self._check_found(self._info)
        return self._info

    def _check_found(self, info: NodeInfo) -> None:
        """A node told neither site_packages nor python relies on its Python finding the
        tracked package: one that cannot is an error naming why, not a guess."""
        install = info.install
        if self.spec.site_packages or self.spec.python or install is None or install.found_by != "purelib":
            return
        raise RemotePathError(f"{self.spec.name}: {install.problem or 'the tracked package was not found'}",
                              hint="set site_packages (or python) for the node in .snapver, or install "
                              f"{install.name or 'the package'} where the node's python3 imports it")

    @property
    def is_open(self) -> bool:
        """True while the agent is running and in step with us."""
        return self._channel is not None and (self._hello_pending or self._info is not None)

    def close(self) -> None:
        interrupt.unregister(self)
        channel = self._channel
        if channel is not None and interrupt.requested():
            self._channel = None
            channel.end(hurry=True)
        elif channel is not None:
            try:
                self._send({"op": "bye"})  # the agent ends when it reads it
            except TransportError:  # the agent is gone (and its channel closed)
                pass
            if self._channel is not None:
                self._channel = None
                # In step, nothing left to hear: leave at once. Else (a request still
                # running) wait for the agent to finish and exit.
                (channel.leave if channel.leave and not self._unanswered else channel.close)()
        self._disconnect()

    def abandon(self) -> None:
        """End a session that is out of step for good (a stream left half-sent, a node that
        printed before its agent): at once, nothing more said to the agent, which drops
        what it staged when its input ends. Safe to call again; ``close`` after it too."""
        interrupt.unregister(self)
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.end(hurry=True)
        self._disconnect()

    def cut(self) -> None:
        """End the agent's session at once, from any thread (an interrupt): whatever waits
        on it fails at once. ``close`` still cleans up after."""
        channel = self._channel
        if channel is not None:
            channel.end(hurry=True)

    # -- the protocol -----------------------------------------------------------
    def call(self, op: str, **args: Any) -> dict[str, Any]:
        """Send one request and return its reply; an agent error becomes a TransportError."""
        return self.request(op, **args)()

    def call_within(self, seconds: float, op: str, **args: Any) -> dict[str, Any]:
        """``call``, its reply due within ``seconds`` (for an op the agent itself bounds in
        time, plus a margin): else the session is cut and a TransportError says so."""
        reply = self.request(op, **args)
        with self._deadline(seconds) as expired:
            try:
                answer = reply()
            except TransportError:
                if not expired.is_set():
                    raise
        if expired.is_set():
            raise TransportError(f"{self.spec.name}: no answer to {op} within {seconds:g} s",
                                 hint="the node or the link stalled; the session was ended")
        return answer

    def request(self, op: str, **args: Any) -> Callable[[], dict[str, Any]]:
        """Send one request now; the returned function waits for its reply.

        Replies come in the order of requests: wait for each before sending another.
        """
        args.setdefault("site_packages", self.spec.site_packages)
        self._send({"op": op, **args})
        return self._awaiting_reply()

    def _awaiting_reply(self) -> Callable[[], dict[str, Any]]:
        """Count the request just sent as unanswered; the function that waits for its reply."""
        self._unanswered += 1

        def reply() -> dict[str, Any]:
            if self._hello_pending:
                self.info  # noqa: B018 - the hello reply comes first
            return self._reply()

        return reply

    def _request_with_keys(self, op: str, keys: bytes, **args: Any) -> Callable[[], dict[str, Any]]:
        """``request`` whose ``cache`` follows in a frame of its own: ``keys``, its JSON text
        compressed with zlib as the store keeps it (not compressed again on every re-pull)."""
        args.setdefault("site_packages", self.spec.site_packages)
        head = json.dumps({"op": op, **args, "cache_frame": True}, ensure_ascii=True, separators=(",", ":"))
        data = head.encode("ascii")
        self._write_frames(struct.pack(">I", len(data)) + data + struct.pack(">I", len(keys)) + keys)
        return self._awaiting_reply()

    def _reply(self) -> dict[str, Any]:
        if not self._greeted:
            self._read_greeting()
        self._unanswered -= 1
        try:
            reply = json.loads(self._recv_message())
        except (ValueError, zlib.error):
            reply = None
        if not isinstance(reply, dict):
            raise TransportError(f"{self.spec.name}: the agent sent a reply that is not a JSON object")
        if "error" in reply:
            if reply.get("kind") == "too_old":
                raise TransportError(f"{self.spec.name}: {reply['error']}", hint=_too_old_hint(reply.get("python")))
            error = RemotePathError if reply.get("kind") == "path" else TransportError
            raise error(f"{self.spec.name}: {reply['error']}")
        return reply

    @contextmanager
    def _deadline(self, seconds: float) -> Iterator[threading.Event]:
        """Cut the agent's session if the block takes more than ``seconds``: a read or write
        waiting on it fails at once. The event says whether it was cut (checked again on
        leaving: a cut that came as the block ended still ends the session)."""
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            self.cut()

        timer = threading.Timer(seconds, expire)
        timer.daemon = True
        timer.start()
        try:
            yield expired
        finally:
            timer.cancel()

    def _read_greeting(self) -> None:
        """Read the agent's GREETING, which comes before any reply, within the node's
        ``connect_timeout`` (at least AGENT_START_MIN). Anything else there was printed by the
        node before the agent started (a login banner, a shell rc file, a printing
        sitecustomize): read as a frame's length, it would have the client wait for
        gigabytes that never come. A banner is refused as soon as it arrives."""
        self._greeted = True
        seconds = max(self.spec.connect_timeout, AGENT_START_MIN)
        with self._deadline(seconds) as expired:
            try:
                head = self._read_exact(len(GREETING))
                printed = b"" if head == GREETING else self._read_printed(head)
            except TransportError:
                if not expired.is_set():
                    raise
        if expired.is_set():
            raise TransportError(f"{self.spec.name}: the agent did not start within {seconds:g} s",
                                 hint="the node's login shell or python is waiting on something; "
                                 "raise connect_timeout for a slow node")
        if printed:
            self.abandon()
            raise TransportError(f"{self.spec.name}: the node printed {_shortened(printed)} before the agent "
                                 "(login banner?)", hint=_BANNER_HINT)

    def _read_printed(self, head: bytes) -> bytes:
        """What the node printed before the agent, from ``head`` on: read up to the
        agent's GREETING, at most PRINTED_MAX bytes, or until the session ends."""
        printed = bytearray(head)
        while GREETING not in printed and len(printed) < PRINTED_MAX:
            try:
                printed += self._read_exact(1)
            except TransportError:
                break
        return bytes(printed).split(GREETING)[0] or head

    def _send(self, message: dict[str, Any]) -> None:
        self._send_data(json.dumps(message, ensure_ascii=True, separators=(",", ":")).encode("ascii"))

    def _send_data(self, data: bytes) -> None:
        """Send one request's JSON text (compressed when large)."""
        size = len(data)
        if size > SQUEEZE_OVER:  # a listing's cache: ~4x smaller (see the agent's docstring)
            data = zlib.compress(data, 1)
            size = len(data) | SQUEEZED
        self._write_frames(struct.pack(">I", size) + data)

    def _write_frames(self, frames: bytes) -> None:
        """Write whole frames to the agent at once, and flush them."""
        if self._channel is None:
            raise TransportError(f"{self.spec.name}: not connected")
        try:
            self._channel.stdin.write(frames)
            self._channel.stdin.flush()
        except (OSError, EOFError) as exc:  # paramiko raises EOFError on a dropped connection
            raise self._dead(exc) from exc
        self.bytes_sent += len(frames)

    def send_stream(self, chunks: Iterator[bytes], abortable: bool = True) -> None:
        """Send a run of frames ended by an empty one (for writes). After an interrupt the
        stream is abandoned between pieces with ABORT_FRAME, and ``Cancelled`` raised."""
        assert self._channel is not None
        try:
            for chunk in chunks:
                if abortable and interrupt.requested():
                    self._channel.stdin.write(struct.pack(">I", ABORT_FRAME))
                    self._channel.stdin.flush()
                    raise Cancelled(f"{self.spec.name}: interrupted while sending; nothing was committed there")
                if chunk:
                    self._channel.stdin.write(struct.pack(">I", len(chunk)) + chunk)
                    self.bytes_sent += len(chunk) + 4
            self._channel.stdin.write(struct.pack(">I", 0))
            self._channel.stdin.flush()
        except (OSError, EOFError) as exc:  # paramiko raises EOFError on a dropped connection
            raise self._dead(exc) from exc

    def _recv_frame(self) -> bytes:
        assert self._channel is not None
        head = self._read_exact(4)
        (size,) = struct.unpack(">I", head)
        return self._read_exact(size) if size else b""

    def _recv_message(self) -> bytes:
        """A reply's JSON text, uncompressed (zlib.error if it does not decompress)."""
        (size,) = struct.unpack(">I", self._read_exact(4))
        if size & SQUEEZED:
            return zlib.decompress(self._read_exact(size & ~SQUEEZED))
        return self._read_exact(size) if size else b""

    def _read_exact(self, size: int) -> bytes:
        assert self._channel is not None
        try:
            data = self._channel.stdout.read(size)
        except (OSError, EOFError) as exc:  # paramiko raises EOFError on a dropped connection
            raise self._dead(exc) from exc
        if data is None or len(data) != size:
            raise self._dead(None)
        self.bytes_received += size
        return data

    def _dead(self, exc: BaseException | None) -> TransportError:
        """The agent went away: say why, with what it wrote on stderr."""
        stderr = ""
        if self._channel is not None:
            channel, self._channel = self._channel, None
            try:
                stderr = channel.end(hurry=interrupt.requested())
            except Exception:  # noqa: BLE001 - best effort while already failing
                stderr = ""
        if interrupt.requested():
            return TransportError(f"{self.spec.name}: interrupted")
        detail = stderr.strip().splitlines()[-1] if stderr.strip() else (str(exc) if exc else "connection closed")
        return TransportError(f"{self.spec.name}: agent ended unexpectedly: {detail}")

    # -- operations every transport offers ---------------------------------------
    def list_tree(self, cache: dict[str, StatEntry] | None = None, cache_time_ns: int = 0,
                  want_oids: bool = True) -> Listing:
        """List the tracked tree; paths whose stat matches ``cache`` are not re-hashed."""
        return self.request_listing(cache, cache_time_ns, want_oids)()

    def request_listing(self, cache: dict[str, StatEntry] | None = None, cache_time_ns: int = 0,
                        want_oids: bool = True, cache_keys: StatKeys | None = None,
                        rows_if_unchanged: bool = True) -> Callable[[], Listing]:
        """``list_tree`` in two steps: ask now, and get a function that waits for the listing.

        ``cache_keys``: the cache's stat keys already encoded, sent as they are, with a
        function reading the cache itself, called only once the request is sent (so the
        caller parses it while the node lists); used instead of ``cache``. Without
        ``rows_if_unchanged``, the cache is read only once the reply says some file
        differs: a node that found every file unchanged gives a listing whose rows are
        left unread (``Listing.rows_omitted``; a pull needs none of them then).
        """
        if cache_keys is not None:
            # delta: the node sends only the rows of files whose stat differs from the cache
            # (an unchanged tree: none); it does not need their blob ids, which we have.
            digest = ({"records_digest": cache_keys.digest[0], "records": cache_keys.digest[1]}
                      if cache_keys.digest else {})
            reply = self._request_with_keys("list", cache_keys.packed, paths=list(self.spec.paths),
                                            exclude=list(self.spec.exclude), cache_time_ns=cache_time_ns,
                                            oids=want_oids, delta=True, **digest)

            def merged() -> Listing:
                if rows_if_unchanged:
                    files = cache_keys.read_cache()
                    answer = reply()
                else:
                    answer = reply()
                    unchanged = _all_unchanged(answer, cache_keys.files)
                    if unchanged is not None:
                        return unchanged
                    files = cache_keys.read_cache()
                if files is None:  # the cache the keys came from is gone: list again, hashing all
                    return self.request_listing(None, 0, want_oids)()
                return self._checked_listing(answer, {p: e for p, e in files.items() if e.kind == FILE})

            return merged
        files = {path: entry for path, entry in (cache or {}).items() if entry.kind == FILE}
        wire_cache = {path: list(entry.stat_key) for path, entry in files.items()}
        reply = self.request("list", paths=list(self.spec.paths), exclude=list(self.spec.exclude),
                             cache=wire_cache, cache_time_ns=cache_time_ns, oids=want_oids, delta=bool(files))
        return lambda: self._checked_listing(reply(), files)

    def _checked_listing(self, reply: dict[str, Any], cache: dict[str, StatEntry]) -> Listing:
        try:
            entries = _checked_rows(reply["entries"])
            if cache:  # a delta: the rows not sent are the cache's, less what is gone
                sent = {entry.path for entry in entries}
                gone = set(reply["gone"])
                same = [entry for path, entry in cache.items() if path not in sent and path not in gone]
                if len(same) != reply["same"]:
                    raise ValueError(f"{reply['same']} rows said unchanged, {len(same)} left in the cache")
                entries += same
            listing = Listing(int(reply["now_ns"]), entries, int(reply["hashed"]),
                              as_cached=bool(cache) and not reply["entries"] and not reply["gone"])
        except (KeyError, TypeError, ValueError) as exc:
            raise TransportError(f"{self.spec.name}: malformed listing from the agent: {exc}") from None
        unsafe = unsafe_listing_path(entries, self.spec.paths)
        if unsafe is not None:
            raise TransportError(f"{self.spec.name}: refused unsafe path in listing: {unsafe!r}",
                                 hint="a listing names only files and links inside the tracked paths, "
                                 "once each, never below a link or a file")
        return listing

    def read_files(self, paths: list[str], compress_level: int = 0) -> Iterator[tuple[str, str | None, bytes]]:
        """Stream ``(path, kind or None if it vanished, content)`` for ``paths``, in order.

        Each content is whole, a large file's too: for consumers of small files (RECORD, a
        diff's text); ``stream_files`` hands large files over in pieces."""
        reply = self.request("read", paths=paths, compress_level=compress_level)
        items = self._file_stream(reply, paths, compress_level, whole=True)
        return cast(Iterator[tuple[str, str | None, bytes]], items)  # whole=True: every content is bytes

    def stream_files(self, paths: list[str], compress_level: int = 0) -> Iterator[FileItem]:
        """``read_files``, with each large file as a ``StreamedFile`` (read its pieces before
        asking for the next item; one the node saw change while read raises ``FileChanged``
        and comes again, as the next item)."""
        reply = self.request("read", paths=paths, compress_level=compress_level)
        return self._file_stream(reply, paths, compress_level, whole=False)

    def request_listed_files(self, compress_level: int = 0) -> Callable[[list[str]], Iterator[FileItem]]:
        """Ask now for every path of the listing requested just before, so that the node
        streams them right after its listing (a first pull saves a round trip); returns
        ``stream_files`` for those paths (``paths``: the listing's, in its order)."""
        reply = self.request("read", listed=True, compress_level=compress_level)
        return lambda paths: self._file_stream(reply, paths, compress_level, whole=False)

    def _file_stream(self, reply: Callable[[], dict[str, Any]], paths: list[str],
                     compress_level: int, whole: bool) -> Iterator[FileItem]:
        reply()
        decompressor = zlib.decompressobj() if compress_level else None
        stream = ByteQueue()
        wanted = set(paths)
        finished = False

        def fill(size: int) -> None:
            while stream.size < size:
                if decompressor is not None and decompressor.unconsumed_tail:
                    stream.put(decompressor.decompress(decompressor.unconsumed_tail, INFLATE_AT_ONCE))
                    continue
                frame = self._recv_frame()
                if not frame:
                    raise TransportError(f"{self.spec.name}: file stream ended early")
                # At most INFLATE_AT_ONCE a step: a MB of zlib can hold a GB of zeros.
                stream.put(decompressor.decompress(frame, INFLATE_AT_ONCE) if decompressor else frame)

        def take(size: int) -> bytes:
            fill(size)
            return stream.take(size)

        def pieces(path: str, size: int) -> Iterator[bytes | memoryview]:
            received = 0
            while True:
                (length,) = struct.unpack(">I", take(4))
                if not length:
                    break
                received += length
                if received > size + 1:  # the node reads at most one byte more than it said
                    raise TransportError(f"{self.spec.name}: sent more of {path!r} than its size")
                fill(length)
                piece = stream.take_view(length)
                if received <= size:  # (beyond: it grew while read, and the end says it changed)
                    yield piece
            (stable,) = take(1)
            if stable == Record.CHANGED:
                raise FileChanged(path)
            if stable != Record.SAME or received != size:
                raise TransportError(f"{self.spec.name}: malformed file stream for {path!r}")

        try:
            while True:
                (name_len,) = struct.unpack(">I", take(4))
                if name_len == 0:
                    finished = True
                    break
                path = take(name_len).decode("utf-8", "surrogateescape")
                kind_code, size = struct.unpack(">BQ", take(9))
                if path not in wanted:
                    raise TransportError(f"{self.spec.name}: sent a path it was not asked for: {path!r}")
                if kind_code == Record.STREAMED:
                    streamed = StreamedFile(path, size, pieces(path, size))
                    if whole:
                        try:
                            data = b"".join(streamed)
                        except FileChanged:
                            continue  # it comes again
                        yield path, FILE, data
                    else:
                        yield path, FILE, streamed
                        streamed.drain()
                    continue
                if size > WHOLE_RECORD_MAX:
                    raise TransportError(f"{self.spec.name}: sent a record of {size} bytes for {path!r}")
                data = take(size)
                if kind_code == Record.UNREADABLE:  # the reason is the content
                    raise TransportError(f"{self.spec.name}: {data.decode('utf-8', 'replace')}")
                yield path, _ENTRY_KINDS.get(kind_code), data
        finally:
            if finished:
                while self._recv_frame():  # the rest up to the stream's end
                    pass
            elif self._channel is not None:
                # Abandoned mid-stream: the protocol is out of step, so end the agent.
                channel, self._channel = self._channel, None
                channel.end(hurry=interrupt.requested())

    def ping(self) -> float:
        """Seconds one request takes to come back: the link's round-trip time."""
        self.info  # noqa: B018 - not the time the node takes to start
        began = time.monotonic()
        self.call("ping")
        return time.monotonic() - began

    def compile_sources(self, sources: list[tuple[str, bytes]]
                        ) -> tuple[dict[str, tuple[int | None, str]], list[str]]:
        """Compile each (path, Python source) with the node's own interpreter (nothing is
        written there): ``({path: (line, message)}`` for every source it refuses, the paths
        too large for the node to hold and compile``)``."""
        if not sources:
            return {}, []
        reply = self.request("compile", files=[[path, len(data)] for path, data in sources])
        for _, data in sources:
            self.send_stream(data[i:i + (1 << 20)] for i in range(0, len(data), 1 << 20))
        answer = reply()
        errors = answer.get("errors") or {}
        return ({str(path): (found[0] if isinstance(found[0], int) else None, str(found[1]))
                 for path, found in errors.items() if isinstance(found, list) and len(found) == 2},
                [str(path) for path in answer.get("unchecked") or ()])

    def hash_files(self, paths: list[str], algo: str = "sha256") -> dict[str, str | None]:
        """Hash ``paths`` on the node; ``None`` for a path that is not there."""
        return self.call("hash", paths=paths, algo=algo)["hashes"]

    def run_restart(self, command: str, timeout: float, deadline: float) -> dict[str, Any]:
        """Run a restart command where the node's service is managed from: on the node, by
        its agent (a container's transport runs it on the container's host), its reply due
        within ``deadline`` seconds. The reply:
        ``{"code": exit code or None, "output": its tail, "timed_out": bool}``."""
        return self.call_within(deadline, "run", command=command, timeout=timeout)

    def request_environment(self, within: float | None = None, gpu: bool = True) -> Callable[[], Environment]:
        """Ask the agent for the node's environment now; the function returned waits for it
        (the agent bounds its one slow part, nvidia-smi, in time), ``within`` seconds if
        given, else the session is cut. Without ``gpu``: no GPU or driver (nvidia-smi not run)."""
        asked = self.request_environment_since("", within, gpu)

        def environment() -> Environment:
            found = asked()
            assert found is not None  # "same" is answered only to a mark
            return found

        return environment

    def request_environment_since(self, mark: str, within: float | None = None,
                                  gpu: bool = True) -> Callable[[], Environment | None]:
        """As ``request_environment``; None when the node's environment still has ``mark``
        (the agent compares what it is read from, and reads nothing more). The environment
        returned carries its own ``mark``."""
        reply = self.request("env", gpu=gpu, **({"unless": mark} if mark else {}))

        def answer() -> dict[str, Any]:
            if within is None:
                return reply()
            with self._deadline(within) as expired:
                try:
                    found = reply()
                except TransportError:
                    if not expired.is_set():
                        raise
            if expired.is_set():
                raise TransportError(f"{self.spec.name}: no answer to env within {within:g} s",
                                     hint="the node or the link stalled; the session was ended")
            return found

        def environment_or_same() -> Environment | None:
            found = answer()
            if mark and found.get("same") == mark:
                return None
            try:
                return dataclasses.replace(Environment.from_json(found.get("env")), mark=str(found.get("mark") or ""))
            except (ValueError, TypeError, AttributeError) as exc:
                raise TransportError(f"{self.spec.name}: malformed environment from the agent: {exc}") from None

        return environment_or_same


def _all_unchanged(reply: dict[str, Any], files: int | None) -> Listing | None:
    """The listing of a delta reply that found every one of the cache's ``files`` files
    unchanged and nothing else (no row sent, none gone), its rows unread; else None."""
    try:
        if files and reply["entries"] == [] and reply["gone"] == [] and reply["same"] == files:
            return Listing(int(reply["now_ns"]), [], int(reply["hashed"]), as_cached=True, rows_omitted=files)
    except (KeyError, TypeError, ValueError):
        pass  # malformed: the full check says so
    return None


# Starting the node's Python and the agent takes longer than a TCP connect on a busy node:
# a connect_timeout below this does not cut an agent that is still starting.
AGENT_START_MIN = 5.0
# The most read of what a node printed before its agent, to quote it.
PRINTED_MAX = 512
PRINTED_SHOWN = 80
_BANNER_HINT = ("a non-interactive session must print nothing: quiet the node's ~/.bashrc, /etc/profile.d, "
                "ForceCommand or authorized_keys command= wrapper, and any sitecustomize that prints")


def _shortened(printed: bytes) -> str:
    """What a node printed, quoted on one line of at most PRINTED_SHOWN characters."""
    text = " ".join(printed.decode("utf-8", "replace").split())
    if not text:  # only blanks or line ends: show them
        return repr(printed[:PRINTED_SHOWN])
    return repr(text if len(text) <= PRINTED_SHOWN else text[:PRINTED_SHOWN - 1] + "…")


def _install_of(found: Any) -> InstallInfo | None:
    """hello's ``install`` (an older agent's hello has none)."""
    if not isinstance(found, dict):
        return None
    fields = {key: _text(found.get(key) or "") for key in InstallInfo.__dataclass_fields__}
    return InstallInfo(**fields) if fields["how"] and fields["root"] else None


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _checked_rows(rows: Any) -> list[StatEntry]:
    """A listing's rows as StatEntry, each checked as ``_checked_row`` checks it.

    Checked a column at a time (types, sizes, blob ids, encodings) in C, not row by row:
    a fleet pays this for every node's thousands of rows. A listing
    that fails a check goes row by row, for the error naming the first bad row.
    """
    if type(rows) is not list:
        raise TypeError(f"expected a list of rows, got {type(rows).__name__}")
    if not rows or set(map(type, rows)) != {list} or set(map(len, rows)) != {9}:
        return [StatEntry(*_checked_row(row)) for row in rows]
    entries = list(map(StatEntry._make, rows))
    paths, _kinds, modes, sizes, mtimes, ctimes, inodes, oids, targets = zip(*entries, strict=False)
    blob_ids = [oid for oid in oids if oid is not None]
    if (set(map(type, paths)) == {str}
            and set(map(type, modes)) | set(map(type, sizes)) | set(map(type, mtimes)) | set(map(type, ctimes))
            | set(map(type, inodes)) == {int} and min(sizes) >= 0
            and set(map(type, blob_ids)) <= {str} and set(map(len, blob_ids)) <= {40}
            and _lower_hex("".join(blob_ids))
            and set(map(type, targets)) <= {str, type(None)}):
        "\n".join(paths).encode("utf-8", "surrogateescape")  # a lone surrogate outside the escape range raises
        return entries
    return [StatEntry(*_checked_row(row)) for row in rows]


def _lower_hex(text: str) -> bool:
    """Only the digits 0-9a-f (``bytes.fromhex`` also takes capitals and spaces between
    pairs, which change the case or the length); cheaper than a regular expression."""
    try:
        return len(bytes.fromhex(text)) * 2 == len(text) and text == text.lower()
    except ValueError:
        return False


def _checked_row(row: Any) -> tuple[Any, ...]:
    """A listing row with the types StatEntry holds (a node's reply is not trusted)."""
    if type(row) is not list or len(row) != 9:
        raise ValueError(f"a listing row has 9 fields: {row!r}")
    path, kind, mode, size, mtime_ns, ctime_ns, ino, oid, target = row
    if not (type(path) is str and type(mode) is int and type(size) is int and type(mtime_ns) is int
            and type(ctime_ns) is int and type(ino) is int and size >= 0):
        raise TypeError(f"bad field types in {row!r}")
    if oid is not None and not (type(oid) is str and is_git_id(oid)):
        raise ValueError(f"bad blob id in {row!r}")
    if not (target is None or type(target) is str):
        raise TypeError(f"bad link target in {row!r}")
    path.encode("utf-8", "surrogateescape")  # a lone surrogate outside the escape range raises
    return path, kind, mode, size, mtime_ns, ctime_ns, ino, oid, target


def unsafe_listing_path(entries: list[StatEntry], tracked: tuple[str, ...]) -> str | None:
    """The first path a node may not list, or None: each path must be safe, inside a
    tracked path, listed once, a file or a link, and not below another listed path (a
    file below a listed link would be written through that link in a checkout)."""
    roots = tuple(root.strip("/") + "/" for root in tracked)
    paths = [entry.path for entry in entries]
    seen = set(paths)
    # All paths at once first (a fleet checks thousands of rows per node): each path is
    # wrapped in slashes in the joined text as ``is_safe_relpath`` wraps it, and the
    # separator's "\n" can make no "//", "/./" or "/../" with a safe neighbour.
    wrapped = "/" + "/\n/".join(paths) + "/"
    if (len(seen) != len(paths) or "//" in wrapped or "/./" in wrapped or "/../" in wrapped or "\0" in wrapped
            or not {entry.kind for entry in entries} <= {FILE, LINK, SPECIAL}
            or not all(map(str.startswith, paths, repeat(roots)))):
        return _first_unsafe(entries, roots)
    return _first_below_another(paths, seen)


def _first_unsafe(entries: list[StatEntry], roots: tuple[str, ...]) -> str | None:
    seen: set[str] = set()
    for entry in entries:
        if (not is_safe_relpath(entry.path) or entry.kind not in (FILE, LINK, SPECIAL) or entry.path in seen
                or not entry.path.startswith(roots)):
            return entry.path
        seen.add(entry.path)
    return _first_below_another([entry.path for entry in entries], seen)


def _first_below_another(paths: list[str], listed: set[str]) -> str | None:
    # The folders above any path, from the few distinct parents: none listed is the rule.
    # (A path without "/" gives a name that is no folder: a superset, and the exact pass decides.)
    folders = set()
    for folder in {path[:path.rfind("/")] for path in paths}:
        while folder and folder not in folders:
            folders.add(folder)
            folder = folder[:max(folder.rfind("/"), 0)]
    if folders.isdisjoint(listed):
        return None
    folders = set()  # parents already known not to be listed, nor their own parents
    for path in paths:
        parent = path
        while (cut := parent.rfind("/")) > 0:
            parent = parent[:cut]
            if parent in listed:
                return path
            if parent in folders:
                break
            folders.add(parent)
    return None
