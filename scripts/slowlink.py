"""A slow link on one machine, for the benchmark scripts: a network namespace whose loopback is
shaped by tc's token bucket filter, so every process started in it talks to the others over a
link of the given rate, both directions sharing it. Needs root, iproute2 and (for latency)
iptables.

This kernel has no netem, so latency is added in user space: with `rtt_ms`, every TCP connection
to 127.0.0.1 made in the namespace is redirected (iptables REDIRECT on OUTPUT) to a relay in the
namespace (`python3 scripts/slowlink.py relay`), which connects on to the original destination
(SO_ORIGINAL_DST) and holds each chunk it forwards for half the round trip, in each direction,
keeping their order. Each byte then crosses loopback twice (to the relay and from it), so the
filter's rate is doubled to keep the link's."""

import asyncio
import contextlib
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

RELAY_PORT = 7999
# The relay's own connections carry this mark, so that they are not redirected back to it.
RELAY_MARK = 0x7E11
SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h


def _run(c: list[str]) -> None:
    p = subprocess.run(c, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(c)} failed (root, iproute2 and iptables needed): {p.stderr.strip()}")


@contextlib.contextmanager
def slow_link(mbit: float, rtt_ms: float | None = None):
    """Creates the namespace with its shaped loopback (and, with `rtt_ms`, the relay that adds
    the round trip); yields its name; removes it afterwards."""
    name = f"foresight-link-{os.getpid()}"
    ns = ["ip", "netns", "exec", name]
    rate = 2 * mbit if rtt_ms else mbit
    relay = None
    try:
        _run(["ip", "netns", "add", name])
        _run([*ns, "ip", "link", "set", "lo", "up"])
        # burst ≥ loopback's 64 KiB packets, or the filter drops every large one.
        _run([*ns, "tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", f"{rate}mbit", "burst", "256kb",
              "latency", "100ms"])
        if rtt_ms:
            _run([*ns, "iptables", "-t", "nat", "-A", "OUTPUT", "-o", "lo", "-p", "tcp", "-d", "127.0.0.1",
                  "!", "--dport", str(RELAY_PORT), "-m", "mark", "!", "--mark", hex(RELAY_MARK),
                  "-j", "REDIRECT", "--to-ports", str(RELAY_PORT)])
            relay = subprocess.Popen([*inside(name), sys.executable, str(Path(__file__).resolve()), "relay",
                                      str(rtt_ms / 2)])
            _wait_for_relay(name, relay)
        yield name
    finally:
        if relay:
            relay.kill()
            relay.wait()
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _wait_for_relay(name: str, relay: subprocess.Popen) -> None:
    probe = [*inside(name), sys.executable, "-c",
             f"import socket; socket.create_connection(('127.0.0.1', {RELAY_PORT}), timeout=1).close()"]
    deadline = time.monotonic() + 10
    while subprocess.run(probe, capture_output=True).returncode != 0:
        if relay.poll() is not None or time.monotonic() > deadline:
            sys.exit("the latency relay did not start")
        time.sleep(0.1)


def inside(name: str) -> list[str]:
    """The command prefix that runs a program in the namespace's network only (nsenter; `ip netns
    exec` would also remount /sys, hiding the cgroup file system that CPU slices need)."""
    return ["nsenter", f"--net=/run/netns/{name}"]


async def _forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copies one direction, each chunk held until `delay` after it was read, in order."""
    queue: asyncio.Queue = asyncio.Queue()

    async def read() -> None:
        while True:
            data = await reader.read(1 << 16)
            queue.put_nowait((time.monotonic() + delay, data))
            if not data:
                return

    async def write() -> None:
        while True:
            due, data = await queue.get()
            if (wait := due - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            if not data:
                with contextlib.suppress(OSError):
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    await asyncio.gather(read(), write())


async def _relay(one_way: float) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raw = writer.get_extra_info("socket").getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
        port, ip = struct.unpack("!2xH4s8x", raw)
        if port == RELAY_PORT:  # a connection to the relay itself (its readiness probe)
            writer.close()
            return
        up = socket.socket()
        up.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, RELAY_MARK)
        up.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(up, (socket.inet_ntoa(ip), port))
        except OSError:
            up.close()
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(sock=up)
        try:
            await asyncio.gather(_forward(reader, up_writer, one_way), _forward(up_reader, writer, one_way))
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
            up_writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", RELAY_PORT)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "relay":
        sys.exit("usage: slowlink.py relay ONE_WAY_MS (inside the namespace; slow_link starts it)")
    asyncio.run(_relay(float(sys.argv[2]) / 1000))
