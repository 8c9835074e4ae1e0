"""A health request sent from the node itself (``health_request``): one HTTP request to the
node's own server, bounded in time and in size, following no redirect and no proxy."""

import time

from .procs import ClientGone, TooLong, client_gone, health_opener, within


class _Said(Exception):
    """Why an attempt got no answer: ``kind`` (down, timeout, redirect, status, large,
    error) and a short text."""

    def __init__(self, kind, text, code=None):
        Exception.__init__(self, text)
        self.kind = kind
        self.code = code  # the HTTP status, when there was one


def _read_capped(reply, cap):
    """The reply's body, at most ``cap`` bytes held: a longer one raises."""
    length = reply.headers.get("Content-Length") or ""
    if length.strip().isdigit() and int(length) > cap:
        raise _Said("large", "answer larger than %d MiB (Content-Length %s)" % (cap >> 20, length.strip()))
    pieces = []  # type: list[bytes]
    held = 0
    while held <= cap:
        piece = reply.read(min(65536, cap + 1 - held))
        if not piece:
            return b"".join(pieces)
        pieces.append(piece)
        held += len(piece)
    raise _Said("large", "answer larger than %d MiB" % (cap >> 20))


def _attempt(opener, request, wait, cap):
    """One request, the whole of it within ``wait`` seconds: ``(status, body bytes)``; what
    kept an answer away raises ``_Said``."""
    import http.client
    import socket
    import urllib.error

    def ask():
        with opener.open(request, timeout=wait) as reply:
            return reply.status, _read_capped(reply, cap)

    try:
        return within(wait, ask)
    except urllib.error.HTTPError as exc:
        if 300 <= exc.code < 400:
            raise _Said("redirect", "answered %d %s (a redirect to %s, not followed)" % (
                exc.code, exc.reason, exc.headers.get("Location") or "nowhere"))
        raise _Said("status", "answered %d %s" % (exc.code, exc.reason), exc.code)
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, (socket.timeout, TimeoutError)):
            raise _Said("timeout", "no answer within %g s" % wait)
        raise _Said("down", getattr(exc.reason, "strerror", None) or str(exc.reason))
    except (socket.timeout, TimeoutError, TooLong):
        raise _Said("timeout", "no answer within %g s" % wait)
    except ConnectionError as exc:  # accepted, then closed without an answer (a server starting or ending)
        raise _Said("down", exc.strerror or str(exc) or type(exc).__name__)
    except (http.client.HTTPException, OSError, ValueError) as exc:
        raise _Said("error", str(exc) or type(exc).__name__)


def op_health_request(channel, request):
    """Send the request (``url``, ``method``, ``body``) from the node, each attempt within
    ``timeout`` seconds; while the server is down (refused, reset) try again until
    ``wait_up`` seconds have passed. Replies the status and body (at most ``cap`` bytes),
    or what kept an answer away (``kind``, ``said``). Stops if the client goes."""
    import urllib.request

    body = request.get("body")
    data = body.encode("utf-8", "surrogateescape") if body is not None else None
    headers = {"Content-Type": "application/json"} if data is not None else {}
    timeout = float(request.get("timeout") or 60)
    cap = int(request.get("cap") or 1 << 20)
    began = time.monotonic()
    deadline = began + float(request.get("wait_up") or 0)
    opener, attempts = health_opener(), 0
    while True:
        attempts += 1
        asked = urllib.request.Request(request["url"], data=data, headers=headers, method=request["method"])
        try:
            status, content = _attempt(opener, asked, timeout, cap)
        except _Said as said:
            if said.kind != "down" or time.monotonic() + 0.2 >= deadline:
                channel.send({"ok": False, "kind": said.kind, "said": str(said), "status": said.code,
                              "attempts": attempts, "seconds": time.monotonic() - began})
                return
            if client_gone(channel):
                raise ClientGone()
            time.sleep(0.2)
            continue
        channel.send({"ok": True, "status": status, "body": content.decode("utf-8", "surrogateescape"),
                      "attempts": attempts, "seconds": time.monotonic() - began})
        return
