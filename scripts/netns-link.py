#!/usr/bin/env python3
"""A node's link with added delay and loss, for kernels without the netem qdisc.

scripts/netns-cluster.sh starts this when `shape` asks for --delay or --loss and the kernel has
no netem. It replaces the node's veth pair by two TAP devices, the node's `eth0` and the root
side `PORT` on the bridge, and forwards Ethernet frames between them in user space: each frame
waits DELAY before it is written on, and is dropped with probability LOSS. Frames keep their
order per direction. A rate, if asked for, is the kernel's tbf on both TAP devices, as for a
veth. Runs until SIGTERM, then removes both devices.

    netns-link.py --namespace NS --port PORT --bridge BR --address A/24 --mtu M
                  [--delay-ms D] [--loss-pct L] [--seed S] [--ready FILE] [--stats FILE]
"""
import argparse
import collections
import fcntl
import json
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time

TUNSETIFF = 0x400454CA
IFF_TAP, IFF_NO_PI = 0x0002, 0x1000


def ip(*args):
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"netns-link: ip {' '.join(args)}: {r.stderr.strip()}")


def open_tap(name):
    """Makes the persistent TAP device `name` in this namespace and attaches to it."""
    ip("tuntap", "add", "dev", name, "mode", "tap")
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


class Direction:
    """Frames read from one TAP device, written to the other DELAY later, some dropped."""

    def __init__(self, src, dst, delay_s, loss, rng):
        self.src, self.dst, self.delay_s, self.loss, self.rng = src, dst, delay_s, loss, rng
        self.queue = collections.deque()
        self.cv = threading.Condition()
        self.frames = self.dropped = 0

    def reader(self):
        while True:
            try:
                frame = os.read(self.src, 65536)
            except OSError:
                return
            self.frames += 1
            if self.loss > 0 and self.rng.random() < self.loss:
                self.dropped += 1
                continue
            with self.cv:
                self.queue.append((time.monotonic() + self.delay_s, frame))
                self.cv.notify()

    def writer(self):
        while True:
            with self.cv:
                while not self.queue:
                    self.cv.wait()
                due, frame = self.queue.popleft()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                os.write(self.dst, frame)
            except OSError:
                pass  # the device is going away, or the frame is too big: as a wire would, drop it


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--namespace", required=True)
    ap.add_argument("--port", required=True, help="the root side's device name, on the bridge")
    ap.add_argument("--bridge", required=True)
    ap.add_argument("--address", required=True, help="the node's eth0 address, e.g. 10.77.0.1/24")
    ap.add_argument("--mtu", type=int, default=1500)
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--loss-pct", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ready", help="a file written once both devices are up")
    ap.add_argument("--stats", help="a file rewritten every second: frames and drops per direction (JSON)")
    a = ap.parse_args()
    if a.delay_ms < 0 or not 0 <= a.loss_pct < 100:
        raise SystemExit("netns-link: --delay-ms must be >= 0 and --loss-pct in [0, 100)")
    node_tap = f"{a.port}n"
    port_fd = open_tap(a.port)
    node_fd = open_tap(node_tap)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        # The node's end moves into its namespace as eth0 (the fd stays attached to it).
        ip("link", "set", node_tap, "netns", a.namespace)
        ip("-n", a.namespace, "link", "set", node_tap, "name", "eth0")
        ip("-n", a.namespace, "link", "set", "eth0", "mtu", str(a.mtu))
        ip("-n", a.namespace, "addr", "replace", a.address, "dev", "eth0")
        ip("-n", a.namespace, "link", "set", "eth0", "up")
        ip("link", "set", a.port, "mtu", str(a.mtu))
        ip("link", "set", a.port, "master", a.bridge)
        ip("link", "set", a.port, "up")
        rng = random.Random(a.seed)
        dirs = [Direction(node_fd, port_fd, a.delay_ms / 1000, a.loss_pct / 100, rng),
                Direction(port_fd, node_fd, a.delay_ms / 1000, a.loss_pct / 100, rng)]
        for d in dirs:
            for f in (d.reader, d.writer):
                threading.Thread(target=f, daemon=True).start()
        if a.ready:
            with open(a.ready, "w") as f:
                f.write(f"{os.getpid()}\n")
        def counters():
            return {"to_root": {"frames": dirs[0].frames, "dropped": dirs[0].dropped},
                    "to_node": {"frames": dirs[1].frames, "dropped": dirs[1].dropped}}

        while not stop.wait(1.0):
            if a.stats:
                with open(a.stats + ".tmp", "w") as f:
                    json.dump(counters(), f)
                os.replace(a.stats + ".tmp", a.stats)
        print(f"netns-link {a.port}: frames node->root {dirs[0].frames} (dropped {dirs[0].dropped}), "
              f"root->node {dirs[1].frames} (dropped {dirs[1].dropped})", file=sys.stderr)
    finally:
        subprocess.run(["ip", "-n", a.namespace, "link", "del", "eth0"], capture_output=True)
        subprocess.run(["ip", "link", "del", a.port], capture_output=True)
        subprocess.run(["ip", "link", "del", node_tap], capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
