"""The TF process's side of the tunnel: check that the shim is in place (fail closed), hand the
tunnel the other nodes, name every node by its private address (runs in the TF process)."""

from __future__ import annotations

import ctypes
import json
import socket

from tfos.errors import TFOSError
from tfos.tunnel import addresses
from tfos.wire import messages as M


class ShimMissing(TFOSError):
    """Encryption is on but the network shim is not loaded in this process: TF and Gloo would listen
    on open ports, so the node refuses to start them."""


def shim_loaded() -> bool:
    """True when tfos's network shim is loaded in this process (its version symbol is there)."""
    try:
        return ctypes.c_int.in_dll(ctypes.CDLL(None), "tfos_tunnel_shim_version").value >= 1
    except ValueError:
        return False


def require_shim() -> None:
    if not shim_loaded():
        raise ShimMissing("tfos's network shim is not loaded in the TF process (LD_PRELOAD was removed or "
                          "overridden), so TensorFlow's and Gloo's ports would be open to anyone: refusing to start. "
                          "Do not set LD_PRELOAD in reserve(env=...) over tfos's, or pass encrypt=False")


def hold_tf_port(info: M.TunnelInfo) -> socket.socket:
    """TF's port at the node's private address, bound and listening for ``ctx.tmp_socket``
    (``release_port=False``): the shim puts it where TF's own server will listen, so it is the
    port TF_CONFIG names, held until ``ctx.release_port()``."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((info.address, info.tf_port))
        s.listen(1)
    except OSError as e:
        s.close()
        raise TFOSError(f"could not hold TF's port {info.address}:{info.tf_port} in the node's private network "
                        f"for ctx.tmp_socket ({e}); reserve(release_port=True) leaves it to TF") from None
    return s


def request(control: str, line: str, timeout: float = 10.0) -> None:
    """Send one control request to the tunnel; TFOSError with its answer unless it says yes."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect(control)
            s.sendall(line.encode() + b"\n")
            answer = s.recv(1024)
        except OSError as e:
            raise TFOSError(f"the node's tunnel at {control} did not answer ({e})") from None
    if answer[:1] != b"Y":
        raise TFOSError(f"the node's tunnel refused {line.split(' ', 1)[0]}: "
                        f"{answer[1:].decode(errors='replace') or 'closed'}")


def connect_peers(info: M.TunnelInfo, nodes, me: int, my_host: str) -> None:
    """Tell the tunnel where every other node's tunnel is (before TF or Gloo connect)."""
    request(info.control, "PEERS " + json.dumps(addresses.peer_table(nodes, me, info.block, my_host)))


def spec_nodes(info: M.TunnelInfo | None, nodes) -> tuple:
    """The nodes as TF_CONFIG names them: at their private addresses when there is a tunnel."""
    return tuple(nodes) if info is None else addresses.in_private_network(nodes, info.block)
