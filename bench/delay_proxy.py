"""A userspace TCP proxy on loopback that delays every chunk by a fixed time, each way.

    python3 bench/delay_proxy.py [--delay-ms 10] [--max-seconds 14400] [--parent PID]
                                 LISTEN_HOST:LISTEN_PORT=TARGET_HOST:TARGET_PORT ...

The kernel here has no ``netem``; this stands in for a far link. Each mapping listens
on LISTEN (port 0: any free port) and forwards every accepted connection to TARGET.
A chunk read at time t is written at t + delay, in each direction, so a round trip
costs 2 x delay (10 ms each way: 20 ms RTT). Chunks are pipelined, not serialised:
the reader keeps reading while earlier chunks wait for their time, so the delay does
not throttle bandwidth (up to --max-buffer bytes in flight per direction, after which
the reader waits: memory stays bounded; at most --max-connections at once). End of
stream is delayed like data.

Once every listener is bound it prints one line ``ready PORT [PORT...]`` (the ports in
the order of the mappings) on stdout. It stops by itself after --max-seconds, when
the process --parent exits, or on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import signal
import socket
import sys

READ_SIZE = 256 * 1024


def _parse_mapping(text: str) -> tuple[str, int, str, int]:
    try:
        listen, target = text.split("=", 1)
        listen_host, listen_port = listen.rsplit(":", 1)
        target_host, target_port = target.rsplit(":", 1)
        return listen_host, int(listen_port), target_host, int(target_port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LISTEN_HOST:PORT=TARGET_HOST:PORT, got {text!r}") from None


class DelayedPipe:
    """One direction of a connection: read chunks, write each one ``delay`` seconds later."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 delay: float, max_buffer: int, read_socket: socket.socket | None = None) -> None:
        self.reader = reader
        self.read_socket = read_socket
        self.writer = writer
        self.delay = delay
        self.max_buffer = max_buffer
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.buffered = 0
        self.arrived = asyncio.Event()   # something was queued
        self.drained = asyncio.Event()   # room freed in the buffer

    async def read_side(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                while self.buffered >= self.max_buffer:
                    self.drained.clear()
                    await self.drained.wait()
                data = await self.reader.read(READ_SIZE)
                _quick_ack(self.read_socket)
                self.queue.append((loop.time() + self.delay, data))
                self.buffered += len(data)
                self.arrived.set()
                if not data:  # end of stream: queued like data, so it is delayed too
                    return
        except (ConnectionError, OSError):
            self.queue.append((loop.time(), b""))
            self.arrived.set()

    async def write_side(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                while not self.queue:
                    self.arrived.clear()
                    await self.arrived.wait()
                due, data = self.queue.popleft()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if self.writer.can_write_eof():
                        self.writer.write_eof()
                    return
                self.writer.write(data)
                await self.writer.drain()
                self.buffered -= len(data)
                self.drained.set()
        except (ConnectionError, OSError):
            return


def _quick_ack(sock: socket.socket | None) -> None:
    """ACK what this side received now (Linux TCP_QUICKACK, renewed after every read).

    The proxy ends each TCP connection in the middle of the link, so its own kernel's
    ACKs stand in for the far end's. Delayed (up to 40 ms) they held back the small
    messages an SSH server sends after one we do not answer (Nagle): stalls no real
    link has. A wire's ACKs are not delayed by the wire.
    """
    if sock is not None and hasattr(socket, "TCP_QUICKACK"):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        except OSError:
            pass


ACTIVE = {"connections": 0}


async def _handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter,
                  target: tuple[str, int], delay: float, max_buffer: int, max_connections: int) -> None:
    if ACTIVE["connections"] >= max_connections:
        client_writer.close()
        return
    ACTIVE["connections"] += 1
    try:
        await _forward(client_reader, client_writer, target, delay, max_buffer)
    finally:
        ACTIVE["connections"] -= 1


async def _forward(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter,
                   target: tuple[str, int], delay: float, max_buffer: int) -> None:
    try:
        server_reader, server_writer = await asyncio.open_connection(*target)
    except OSError:
        client_writer.close()
        return
    for writer in (client_writer, server_writer):
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    pipes = [DelayedPipe(client_reader, server_writer, delay, max_buffer, client_writer.get_extra_info("socket")),
             DelayedPipe(server_reader, client_writer, delay, max_buffer, server_writer.get_extra_info("socket"))]
    try:
        await asyncio.gather(*(side for pipe in pipes for side in (pipe.read_side(), pipe.write_side())))
    except asyncio.CancelledError:
        pass  # the proxy is stopping: drop the connection quietly
    finally:
        for writer in (client_writer, server_writer):
            writer.close()


async def _watch(parent: int | None, max_seconds: float, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_seconds
    while not stop.is_set() and loop.time() < deadline:
        if parent is not None and os.getppid() != parent:
            break
        try:
            await asyncio.wait_for(stop.wait(), timeout=1.0)
        except asyncio.TimeoutError:
            pass
    stop.set()


async def serve(mappings: list[tuple[str, int, str, int]], delay: float, max_buffer: int,
                max_connections: int, max_seconds: float, parent: int | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    servers = []
    for listen_host, listen_port, target_host, target_port in mappings:
        def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter,
                    target: tuple[str, int] = (target_host, target_port)) -> asyncio.Future:
            return _handle(r, w, target, delay, max_buffer, max_connections)

        servers.append(await asyncio.start_server(handler, listen_host, listen_port, backlog=256))
    ports = [server.sockets[0].getsockname()[1] for server in servers]
    print("ready " + " ".join(map(str, ports)), flush=True)
    await _watch(parent, max_seconds, stop)
    for server in servers:
        server.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mappings", nargs="+", type=_parse_mapping, metavar="LISTEN=TARGET")
    parser.add_argument("--delay-ms", type=float, default=10.0, help="delay each way (default 10 ms)")
    parser.add_argument("--max-buffer", type=int, default=16 << 20,
                        help="bytes in flight per direction before reading pauses (default 16 MiB)")
    parser.add_argument("--max-connections", type=int, default=256,
                        help="connections at once; more are closed at once (default 256)")
    parser.add_argument("--max-seconds", type=float, default=4 * 3600, help="stop after this long (default 4 h)")
    parser.add_argument("--parent", type=int, default=None, help="stop when this process is no longer our parent")
    args = parser.parse_args()
    asyncio.run(serve(args.mappings, args.delay_ms / 1000, args.max_buffer, args.max_connections,
                      args.max_seconds, args.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
