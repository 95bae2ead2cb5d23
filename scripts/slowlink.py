"""A slow link on one machine, for the benchmark scripts: a network namespace whose loopback is
shaped by tc's token bucket filter, so every process started in it talks to the others over a
link of the given rate, both directions sharing it. This kernel has no netem, so the link is slow
but not distant (no added latency). Needs root and iproute2."""

import contextlib
import os
import subprocess
import sys


@contextlib.contextmanager
def slow_link(mbit: float):
    """Creates the namespace with its shaped loopback; yields its name; removes it afterwards."""
    name = f"foresight-link-{os.getpid()}"
    cmds = [
        ["ip", "netns", "add", name],
        ["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"],
        # burst ≥ loopback's 64 KiB packets, or the filter drops every large one.
        ["ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", f"{mbit}mbit",
         "burst", "256kb", "latency", "100ms"],
    ]
    try:
        for c in cmds:
            p = subprocess.run(c, capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"{' '.join(c)} failed (root and iproute2 needed): {p.stderr.strip()}")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def inside(name: str) -> list[str]:
    """The command prefix that runs a program in the namespace's network only (nsenter; `ip netns
    exec` would also remount /sys, hiding the cgroup file system that CPU slices need)."""
    return ["nsenter", f"--net=/run/netns/{name}"]
