"""The agent's entry: ``hello``, ``ping``, the table of ops, and the loop that serves one client."""

import gc
import os
import sys

from .answer import op_health_request
from .environ import op_env
from .listing import op_list
from .procs import ClientGone, op_health_url, op_ps, op_run
from .reading import op_hash, op_read
from .source import find_dists, locate, op_git_head
from .wire import GREETING, PROTOCOL, AgentError, Channel
from .writing import op_check, op_compile, op_write, op_write_done


def op_hello(channel, request):
    paths = request.get("paths") or []
    site, install = locate(request.get("site_packages"), paths)
    channel.send({
        "protocol": PROTOCOL,
        "hostname": os.uname().nodename,  # what socket.gethostname() returns, without importing socket
        "python_version": "%d.%d.%d" % sys.version_info[:3],
        "python": sys.executable,
        "site_packages": site,
        "dists": find_dists(site, paths),
        "install": install,
        # How this agent was loaded: "bytecode" (the client's, same magic) or "source".
        "loaded": "bytecode" if globals().get("L") == 1 else "source",
    })


def op_ping(channel, request):
    channel.send({"pong": True})


OPS = {"ping": op_ping, "hello": op_hello, "list": op_list, "read": op_read, "hash": op_hash,
       "check": op_check, "write": op_write, "write_done": op_write_done, "run": op_run,
       "compile": op_compile, "ps": op_ps, "health_url": op_health_url, "git_head": op_git_head,
       "health_request": op_health_request, "env": op_env}


def serve(channel):
    while True:
        try:
            request = channel.recv()
        except EOFError:
            return
        if request is None or request.get("op") == "bye":
            return
        handler = OPS.get(request.get("op"))
        try:
            if handler is None:
                raise AgentError("unknown op %r" % request.get("op"))
            handler(channel, request)
        except ClientGone:
            return
        except AgentError as exc:
            channel.send({"error": str(exc), "kind": exc.kind})
        except OSError as exc:
            channel.send({"error": "%s: %s" % (getattr(exc, "filename", "") or "", exc.strerror or exc),
                          "kind": "path" if isinstance(exc, (FileNotFoundError, PermissionError)) else "remote"})


def main():
    # An agent serves one command and leaves: the cyclic collector would only walk the
    # listing's thousands of rows again and again (a few ms of listing sglang/srt), and
    # freeing every object at exit is work nobody waits for.
    gc.disable()
    channel = Channel(sys.stdin.buffer, sys.stdout.buffer)
    channel.wfile.write(GREETING)
    channel.flush()
    serve(channel)
    try:
        sys.stdout.flush()
    except OSError:  # the client is gone
        pass
    os._exit(0)


if __name__ == "__main__" or __name__ == "snapver_agent":
    main()
