"""The node agent's side of the tunnel: start it before the TF process, hand the TF process its
environment (the shim), watch it, stop it (runs in the node agent).

The tunnel is the agent's child: it reads its settings as one JSON line on stdin and serves until
that pipe closes (the agent ended, even by SIGKILL) or it is terminated; it also gets SIGTERM when
the agent dies (PR_SET_PDEATHSIG), and its namespace helper dies with it."""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess

from tfos.errors import TFOSError, TFOSTimeoutError
from tfos.host import private, processes
from tfos.host.deadline import Deadline
from tfos.tunnel import addresses, build
from tfos.wire import messages as M

logger = logging.getLogger(__name__)

START_TIMEOUT = 30.0
#: AF_UNIX paths hold at most 107 bytes
_MAX_SOCKET_PATH = 100


class TunnelError(TFOSError):
    """The node's tunnel failed to start or ended."""


def control_path(node_dir: str, cluster_id: str, node_index: int) -> str:
    """The tunnel's control socket: in the node's private directory, or, where that path is too long
    for a unix socket (a YARN container's deep tmp), in a short private directory of this user."""
    path = os.path.join(node_dir, "tunnel.sock")
    if len(path.encode()) <= _MAX_SOCKET_PATH:
        return path
    short = f"/tmp/tfos-{os.getuid()}-t"
    try:
        os.mkdir(short, 0o700)
    except FileExistsError:
        pass
    private.check_private(short)
    return os.path.join(short, f"{cluster_id}-{node_index}.sock")


def parse_ready(line: str) -> tuple[int, str, str]:
    """Pure: ``(ingress port, mode, reason)`` from the tunnel's first line, or TunnelError with what it said."""
    words = line.strip().split(" ", 3)
    if len(words) >= 3 and words[0] == "READY" and words[1].isdigit() and words[2] in ("netns", "loopback"):
        return int(words[1]), words[2], words[3] if len(words) > 3 else ""
    if words and words[0] == "FAILED":
        raise TunnelError(f"the node's tunnel failed to start: {line.strip()[7:]}")
    raise TunnelError(f"the node's tunnel said {line.strip()[:200]!r} instead of READY")


def pod_mode(port: int, mode: str, reason: str, pod: bool) -> tuple[int, str, str]:
    """Pure: in a Kubernetes pod, the loopback the tunnel serves is the pod's own network namespace
    (only the pod's containers share it): mode "pod", as protected as "netns"."""
    if pod and mode == "loopback":
        return port, "pod", "the pod's own network namespace"
    return port, mode, reason


def shim_environment(info: M.TunnelInfo, shim: str, env) -> dict[str, str]:
    """Pure: what the TF process's environment gets so that its TF and Gloo sockets live in the
    node's private network (the shim first in LD_PRELOAD)."""
    preload = env.get("LD_PRELOAD", "")
    return {"LD_PRELOAD": f"{shim} {preload}".strip(), "TFOS_TUNNEL_CONTROL": info.control,
            "TFOS_TUNNEL_BLOCK": info.block, "TFOS_TUNNEL_SELF": info.address,
            "TFOS_TUNNEL_TF_PORT": str(info.tf_port)}


class NodeTunnel:
    """One node's tunnel process."""

    def __init__(self, cfg: M.NodeConfig, netns: str = "auto", pod: bool = False):
        self.cfg = cfg
        self.netns = netns
        self.pod = pod  # a Kubernetes pod: its loopback is the pod's own, as private as a namespace of ours
        self.proc: subprocess.Popen | None = None
        self.info: M.TunnelInfo | None = None
        self.shim = ""

    def start(self, timeout: float = START_TIMEOUT) -> M.TunnelInfo:
        c = self.cfg.cluster
        binary, self.shim = build.require()
        block = addresses.block_for(c.cluster_id)
        control = control_path(self.cfg.node_dir, c.cluster_id, self.cfg.node_index)
        settings = {"secret": c.key.secret, "self_ip": addresses.node_address(block, self.cfg.node_index),
                    "block": block, "control": control, "bind_host": "0.0.0.0", "netns": self.netns}
        with open(os.path.join(self.cfg.node_dir, "tunnel.log"), "ab") as log:
            self.proc = subprocess.Popen([binary], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                         preexec_fn=lambda: processes.die_with_parent(signal.SIGTERM))
        self.proc.stdin.write(json.dumps(settings).encode() + b"\n")
        self.proc.stdin.flush()  # stdin stays open: its end tells the tunnel we are gone
        line = self._first_line(timeout)
        port, mode, reason = pod_mode(*parse_ready(line), self.pod)
        self.info = M.TunnelInfo(port=port, mode=mode, reason=reason, control=control, block=block,
                                 address=settings["self_ip"], tf_port=addresses.tf_port_for(c.cluster_id))
        logger.info("node tunnel %d: port %d, %s%s", self.proc.pid, port, mode, f" ({reason})" if reason else "")
        return self.info

    def _first_line(self, timeout: float) -> str:
        deadline = Deadline(timeout)
        out = self.proc.stdout
        buf = b""
        while not buf.endswith(b"\n"):
            if deadline.expired():
                raise TFOSTimeoutError(f"the node's tunnel did not start within {timeout:.0f}s; see "
                                       f"{os.path.join(self.cfg.node_dir, 'tunnel.log')}")
            if select.select([out], [], [], deadline.slice(1.0))[0]:
                chunk = os.read(out.fileno(), 256)
                if not chunk:
                    code = self.proc.wait(5)
                    raise TunnelError(f"the node's tunnel exited with code {code} before it started: "
                                      + processes.tail(os.path.join(self.cfg.node_dir, "tunnel.log"), 5))
                buf += chunk
        return buf.decode(errors="replace")

    def environment(self, env) -> dict[str, str]:
        return shim_environment(self.info, self.shim, env)

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            self.proc.stdin.close()  # the tunnel ends when its stdin does
        except OSError:
            pass
        processes.terminate(self.proc, 3.0, "node tunnel")
        self.proc.stdout.close()
