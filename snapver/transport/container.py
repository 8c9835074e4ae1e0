"""A node in a container: the same agent, started in the container's own Python.

The agent's sh command line runs as ``ENGINE exec -i CONTAINER /bin/sh -c LINE`` (or the
node's ``exec`` prefix, e.g. ``kubectl exec -i POD --``, then ``/bin/sh -c LINE``) on the
host: this machine, or the node's ``host`` over SSH. Everything the agent does (list,
read, check, write with compare-and-swap and rename, ps, health_url) then happens inside
the container. A restart command manages the container, so it runs on the host, not in
it; and since it may end the container's processes, the agent is started again after it.

The engine's own failures (no such container, not running, its socket refused, its
binary missing, no Python in the container) reach us as its stderr and an early end of
the agent's channel: they are told apart here, by the engine's wording, as one line
naming the node and the cause.
"""

from __future__ import annotations

import math
import re
import secrets
import shlex
import threading
from collections.abc import Callable
from typing import Any

from snapver import interrupt
from snapver.config import NodeSpec
from snapver.errors import TransportError
from snapver.transport.base import AgentTransport, RawChannel
from snapver.transport.local import spawn

OUTPUT_TAIL = 4000  # the most of a host command's output kept (its end), as the agent's run keeps
HOST_GRACE = 15.0  # seconds past a host command's own timeout before its channel is cut


def container_argv(spec: NodeSpec) -> list[str]:
    """The argv prefix that runs a command inside the node's container."""
    if spec.exec_prefix:
        return list(spec.exec_prefix)
    assert spec.container is not None
    return [spec.engine, "exec", "-i", spec.container]


def in_container(spec: NodeSpec, command: str) -> list[str]:
    """The argv that runs the sh ``command`` inside the container. /bin/sh by its path: an
    exec prefix that empties PATH (``env PATH=...``) still finds the shell."""
    return [*container_argv(spec), "/bin/sh", "-c", command]


def _where(spec: NodeSpec) -> str:
    return "on this machine" if spec.local else f"on {spec.host}"


def _target(spec: NodeSpec) -> str:
    return f"container {spec.container}" if spec.container else f"the container of exec {spec.exec_prefix[0]} ..."


def _tool(spec: NodeSpec) -> str:
    return spec.exec_prefix[0] if spec.exec_prefix else spec.engine


# (pattern in the engine's stderr, cause, hint); {target} {where} {tool} {container} filled in.
_CAUSES: tuple[tuple[str, str, str], ...] = (
    (r"permission denied.*(?:docker|podman)[^ ]*\.sock|docker\.sock.*permission denied",
     "permission denied on {tool}'s socket {where}",
     "run snapver as a user of the docker group (or root): `user` in .snapver"),
    (r"cannot connect to the docker daemon|is the docker daemon running|unable to connect to podman",
     "no {tool} daemon answers {where}", "start it (e.g. `systemctl start {tool}`)"),
    (r"no such container|no container with name or id",
     "{target} not found {where}", "`{tool} ps -a` lists the containers; check the node's container in .snapver"),
    (r"is not running|container state improper|is paused|can only create exec sessions on running containers",
     "{target} is not running {where}", "start it (`{tool} start {container}`), or check the node in .snapver"),
    (r"\(notfound\).*pods? .*not found|pods? \"[^\"]*\" not found",
     "the pod of {target} is gone (not found)", "`kubectl get pods` lists them; update the node's exec in .snapver"),
    (r"container not found|unable to upgrade connection",
     "{target} not found in its pod", "check the container name (-c) in the node's exec in .snapver"),
    (r"snapver: no python3 or python on the node",
     "no Python in {target} (no python3 or python on its PATH)",
     "set `python` for the node to the interpreter's path inside the container"),
    (r"executable file not found|/bin/sh.*no such file or directory|no such file or directory.*/bin/sh",
     "no /bin/sh in {target}", "snapver needs a POSIX sh and a Python 3.8+ inside the container"),
)


def explain_failure(spec: NodeSpec, stderr: str) -> TransportError | None:
    """The cause of a failed start in the engine's ``stderr``, as one line; None if unknown."""
    text = " ".join(stderr.split())
    if not text:
        return None
    fill = {"target": _target(spec), "where": _where(spec), "tool": _tool(spec), "container": spec.container or ""}
    for pattern, cause, hint in _CAUSES:
        if re.search(pattern, text, re.IGNORECASE):
            return TransportError(f"{spec.name}: {cause.format(**fill)}", hint=hint.format(**fill))
    python = spec.python or ""
    if python and re.search(rf"{re.escape(python)}\W.*(?:not found|no such file)", text, re.IGNORECASE):
        return TransportError(f"{spec.name}: no Python at {python} in {fill['target']}",
                              hint="set `python` for the node to the interpreter's path inside the container")
    tool = _tool(spec)
    if re.search(rf"(?:^|[\s:]){re.escape(tool)}: (?:command )?not found|{re.escape(tool)}: no such file",
                 text, re.IGNORECASE):
        return _tool_missing(spec)
    return None


def _tool_missing(spec: NodeSpec) -> TransportError:
    tool = _tool(spec)
    hint = (f"install {tool}, or give its full path (exec = [...])" if spec.exec_prefix
            else f'install {tool} there, or set engine = "podman" / exec = [...] for the node')
    return TransportError(f"{spec.name}: {tool} not found {_where(spec)}", hint=hint)


def _host_line(command: str, timeout: float, marker: str) -> str:
    """A sh line running ``command`` on the host within ``timeout`` (coreutils' timeout
    where there is one), output and errors together, then ``marker CODE`` on a line."""
    quoted = shlex.quote(command)
    seconds = max(1, math.ceil(timeout))
    return (f"{{ if command -v timeout >/dev/null 2>&1; then timeout -k 5 {seconds} /bin/sh -c {quoted}; "
            f"else /bin/sh -c {quoted}; fi; }} </dev/null 2>&1; printf '\\n{marker} %d\\n' \"$?\"")


def run_host_command(start: Callable[[str], RawChannel], command: str, timeout: float) -> dict[str, Any]:
    """Run the sh ``command`` through ``start`` (a host's shell) as the agent's ``run`` does:
    ``{"code", "output", "timed_out"}``. Its end is a marker line, not the channel's end: a
    command that leaves a server running in the background holds the channel open."""
    marker = f"snapver-exit-{secrets.token_hex(8)}"
    channel = start(_host_line(command, timeout, marker))
    try:
        channel.stdin.close()
    except OSError:
        pass
    found: dict[str, Any] = {"tail": bytearray(), "code": None}
    token = marker.encode()

    def read() -> None:
        line = bytearray()
        try:
            while byte := channel.stdout.read(1):
                if byte != b"\n":
                    line += byte
                    continue
                if line.startswith(token):
                    found["code"] = int(line[len(token):] or b"-1")
                    return
                found["tail"] += line + b"\n"
                del found["tail"][:-OUTPUT_TAIL]
                line.clear()
        except (OSError, EOFError, ValueError):
            pass

    reader = threading.Thread(target=read, daemon=True, name="snapver-host-command")
    reader.start()
    reader.join(timeout + HOST_GRACE)
    timed_out = reader.is_alive()
    channel.end(hurry=True)
    reader.join(5)
    code = found["code"]
    output = bytes(found["tail"]).decode("utf-8", "replace")
    if code is None and not timed_out:
        output = output or "the host's shell ended before the command did"
    return {"code": code, "output": output, "timed_out": timed_out or code == 124}


class ContainerTransport(AgentTransport):
    """The agent in a container; ``_host_start`` runs an argv on the container's host."""

    _engine_stderr = ""

    def _host_start(self, argv: list[str]) -> RawChannel:
        """Run ``argv`` on the host; its pipes."""
        raise NotImplementedError

    def _host_shell(self) -> tuple[Callable[[str], RawChannel], Callable[[], None]]:
        """(start an sh line on the host, close what that opened): for host commands."""
        raise NotImplementedError

    def _start(self, command: str) -> RawChannel:
        channel = self._host_start(in_container(self.spec, command))
        close = channel.close

        def close_keeping_stderr() -> str:
            self._engine_stderr = close() or ""
            return self._engine_stderr

        channel.close = close_keeping_stderr
        return channel

    def _dead(self, exc: BaseException | None) -> TransportError:
        error = super()._dead(exc)
        if interrupt.requested():
            return error
        return explain_failure(self.spec, self._engine_stderr) or error

    def run_restart(self, command: str, timeout: float, deadline: float) -> dict[str, Any]:
        """Run a restart on the container's host (it manages the container), then start the
        agent again: a restart of the container ended the one running there. The host's
        command is bounded by ``timeout`` itself (``deadline`` is for an agent's reply)."""
        start, close = self._host_shell()
        try:
            reply = run_host_command(start, command, timeout)
        finally:
            close()
        self._start_again()
        return reply

    def _start_again(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.end(hurry=True)
        self._disconnect()
        self._info, self._hello_pending, self._unanswered = None, False, 0
        self.start()

    def container_identity(self, timeout: float = 30.0) -> tuple[str, str] | None:
        """(container id, image id) as the engine on the host tells them; None for an exec
        prefix (its tool is not known) or when the engine does not say."""
        if not self.spec.container:
            return None
        line = shlex.join([self.spec.engine, "inspect", "--type", "container", "--format",
                           "{{.Id}} {{.Image}}", self.spec.container])
        start, close = self._host_shell()
        try:
            reply = run_host_command(start, line, timeout)
        finally:
            close()
        words = reply["output"].split()
        if reply["code"] != 0 or len(words) != 2:
            return None
        return words[0], words[1]


class _HostShell(AgentTransport):
    """This machine's /bin/sh as a transport's ``_start`` (no agent is ever started)."""

    def _start(self, command: str) -> RawChannel:
        return spawn(self.spec.name, ["/bin/sh", "-c", command])


class LocalContainerTransport(ContainerTransport):
    """A container on this machine."""

    def _host_start(self, argv: list[str]) -> RawChannel:
        try:
            return spawn(self.spec.name, argv)
        except TransportError as exc:
            if isinstance(exc.__cause__, FileNotFoundError):
                raise _tool_missing(self.spec) from exc
            raise

    def _host_shell(self) -> tuple[Callable[[str], RawChannel], Callable[[], None]]:
        return _HostShell(self.spec)._start, lambda: None
