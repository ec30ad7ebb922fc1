"""Several "hosts" on this machine for the benchmarks: one Linux network namespace per host, each
joined by a veth pair to a bridge in the root namespace, optionally with its link shaped by ``tc``
(needs root and iproute2). No Spark (tests/multihost/hosts.py is the harness that runs Spark).

Layout: the bridge ``tnbr<tag>`` holds ``198.51.100.1``; host ``i`` (1-based) is the namespace
``tfosb-<tag>-h<i>`` with the address ``198.51.100.<20 + i>`` on its end of the veth pair and no
default route, so its traffic reaches the bridge's subnet and nothing else. Addresses come from
198.51.100.0/24 (TEST-NET-2, documentation only): :meth:`Net.start` refuses to run if an interface
of the machine already uses that range (e.g. while the multi-host test suite runs, or another
benchmark). :meth:`Net.close` kills every process in the namespaces and removes namespaces, veths
and bridge, whatever happened before; the context manager calls it in ``finally``.

Shaping (``rate``, e.g. ``"1gbit"``): a token bucket (``tbf``) on the egress of both ends of each
host's veth pair: the end inside the namespace limits what the host sends (its upload), the end
on the bridge what it receives (its download). Each host then has a full-duplex link of that rate
to a non-blocking switch, as a NIC on a real top-of-rack switch.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import re
import signal
import subprocess
import time
import uuid

SUBNET = ipaddress.ip_network("198.51.100.0/24")
BRIDGE_ADDRESS = "198.51.100.1"
FIRST_HOST = 21  # host i (1-based) has .20 + i
LOCKS = "/run" if os.path.isdir("/run") else "/tmp"  # a run holds LOCKS/tfosb-<tag>.lock while it lives

_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
          "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def rate_bits(rate: str) -> float:
    """Pure: bits per second of a tc rate such as ``1gbit``, ``500mbit``, ``100mbps`` (bytes)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-z]*)\s*", rate.lower())
    if not m or m.group(2) not in _UNITS and m.group(2) != "":
        raise ValueError(f"not a rate: {rate!r} (e.g. 1gbit, 500mbit)")
    return float(m.group(1)) * _UNITS.get(m.group(2) or "bit")


def tbf_args(rate: str, latency_ms: float = 50.0) -> list[str]:
    """Pure: the ``tbf`` parameters of a link of ``rate``: a bucket of 1 ms of the rate (at least
    128 KiB, so that a 64 KiB GSO packet passes whole) and a queue of ``latency_ms``."""
    burst = max(128 << 10, int(rate_bits(rate) / 8 / 1000))
    return ["tbf", "rate", rate, "burst", str(burst), "latency", f"{latency_ms:g}ms"]


def range_in_use() -> list[str]:
    """Interfaces of this machine with an address in SUBNET."""
    used = []
    for line in _ip("-o", "-4", "addr", "show").stdout.splitlines():
        parts = line.split()
        if "inet" in parts:
            addr = parts[parts.index("inet") + 1]
            if ipaddress.ip_interface(addr).network.overlaps(SUBNET):
                used.append(f"{parts[1]} {addr}")
    return used


def _lock_path(tag: str) -> str:
    return os.path.join(LOCKS, f"tfosb-{tag}.lock")


def reclaim_stale() -> list[str]:
    """Remove what a run of this module that died without closing left behind (its bridge
    ``tnbr<tag>`` and namespaces ``tfosb-<tag>-h<i>``), but only a run that no longer holds its lock
    (a live run holds it from before it creates anything until it removed everything) and none of
    whose namespaces holds a process. Returns the tags reclaimed; nothing else is touched."""
    links = _ip("-o", "link", "show").stdout
    spaces = _ip("netns", "list").stdout.split()
    tags = {m.group(1) for m in re.finditer(r"^\d+: tnbr([0-9a-f]{6})[:@]", links, re.M)}
    tags |= {m.group(1) for n in spaces for m in [re.fullmatch(r"tfosb-([0-9a-f]{6})-h\d+", n)] if m}
    reclaimed = []
    for tag in sorted(tags):
        try:
            fd = os.open(_lock_path(tag), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a live run
            mine = [n for n in spaces if re.fullmatch(rf"tfosb-{tag}-h\d+", n)]
            if any(_ip("netns", "pids", n, check=False).stdout.strip() for n in mine):
                continue  # processes of a dead run still live: leave them to whoever started them
            for n in mine:
                _ip("netns", "del", n, check=False)
            _ip("link", "del", f"tnbr{tag}", check=False)
            os.unlink(_lock_path(tag))
            reclaimed.append(tag)
        finally:
            os.close(fd)
    return reclaimed


class Host:
    def __init__(self, index: int, tag: str):
        self.index = index
        self.netns = f"tfosb-{tag}-h{index}"
        self.dev = f"tn{tag}{index}"  # inside the namespace (at most 15 characters)
        self.peer = f"tb{tag}{index}"  # on the bridge, in the root namespace
        self.address = str(SUBNET.network_address + FIRST_HOST - 1 + index)

    def __repr__(self) -> str:
        return f"Host({self.netns}, {self.address})"

    def exec_args(self, *cmd: str) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *cmd]

    def pids(self) -> list[int]:
        r = _ip("netns", "pids", self.netns, check=False)
        return [int(p) for p in r.stdout.split()] if r.returncode == 0 else []


class Net:
    """``with Net(8, rate="1gbit") as net: net.hosts[0].exec_args(...)``."""

    def __init__(self, n: int, rate: str | None = None, latency_ms: float = 50.0):
        if not 1 <= n <= 200:
            raise ValueError("between 1 and 200 hosts")
        if rate is not None:
            rate_bits(rate)  # a clear error before anything is created
        self.tag = uuid.uuid4().hex[:6]
        self.bridge = f"tnbr{self.tag}"
        self.rate = rate
        self.latency_ms = latency_ms
        self.hosts = [Host(i + 1, self.tag) for i in range(n)]
        self._created: list[Host] = []
        self._bridge_created = False
        self._lock: int | None = None

    def __enter__(self) -> "Net":
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        if os.geteuid() != 0:
            raise RuntimeError("network namespaces need root")
        self._lock = os.open(_lock_path(self.tag), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX)  # held until close(): this run is alive
        reclaim_stale()
        used = range_in_use()
        if used:
            raise RuntimeError(f"{SUBNET} is already in use on this machine ({', '.join(used)}): another "
                               "harness or benchmark runs; not sharing it")
        _ip("link", "add", self.bridge, "type", "bridge")
        self._bridge_created = True
        _run("sysctl", "-qw", f"net.ipv6.conf.{self.bridge}.disable_ipv6=1", check=False)
        _ip("addr", "add", f"{BRIDGE_ADDRESS}/{SUBNET.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for h in self.hosts:
            _ip("netns", "add", h.netns)
            self._created.append(h)
            inside = ["ip", "netns", "exec", h.netns]
            _run(*inside, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", check=False)
            _run(*inside, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1", check=False)
            _ip("link", "add", h.peer, "type", "veth", "peer", "name", h.dev)
            _ip("link", "set", h.dev, "netns", h.netns)
            _run("sysctl", "-qw", f"net.ipv6.conf.{h.peer}.disable_ipv6=1", check=False)
            _ip("link", "set", h.peer, "master", self.bridge)
            _ip("link", "set", h.peer, "up")
            _run(*inside, "ip", "addr", "add", f"{h.address}/{SUBNET.prefixlen}", "dev", h.dev)
            _run(*inside, "ip", "link", "set", h.dev, "up")
            _run(*inside, "ip", "link", "set", "lo", "up")
            if self.rate:
                shape = tbf_args(self.rate, self.latency_ms)
                _run(*inside, "tc", "qdisc", "add", "dev", h.dev, "root", *shape)  # upload
                _run("tc", "qdisc", "add", "dev", h.peer, "root", *shape)  # download

    def qdiscs(self, h: Host) -> str:
        """What tc reports for both ends of host h's link (to show the shaping is in place)."""
        up = _run("ip", "netns", "exec", h.netns, "tc", "qdisc", "show", "dev", h.dev, check=False).stdout
        down = _run("tc", "qdisc", "show", "dev", h.peer, check=False).stdout
        return f"upload: {up.strip()} | download: {down.strip()}"

    def drops(self) -> int:
        """Packets the shaping queues dropped so far (both ends of every link; 0 unshaped)."""
        if not self.rate:
            return 0
        total = 0
        for h in self._created:
            for args in (("ip", "netns", "exec", h.netns, "tc", "-s", "qdisc", "show", "dev", h.dev),
                         ("tc", "-s", "qdisc", "show", "dev", h.peer)):
                total += sum(int(d) for d in re.findall(r"dropped (\d+)", _run(*args, check=False).stdout))
        return total

    def close(self) -> None:
        for h in self._created:
            for _ in range(50):  # until the namespace is empty (processes may fork meanwhile)
                pids = h.pids()
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.1)
        for h in self._created:
            _ip("link", "del", h.peer, check=False)  # removes the pair (and its qdiscs)
            _ip("netns", "del", h.netns, check=False)
        self._created = []
        if self._bridge_created:
            _ip("link", "del", self.bridge, check=False)
            self._bridge_created = False
        if self._lock is not None:
            try:
                os.unlink(_lock_path(self.tag))
            except OSError:
                pass
            os.close(self._lock)
            self._lock = None
