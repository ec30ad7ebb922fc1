"""Addresses of the private network (pure; tested from tables).

Each cluster gets a /16 of the loopback range, ``127.<64..191>`` chosen from its id, and node ``i``
the address ``127.<b>.<(i+1) // 256>.<(i+1) % 256>`` in it; TF listens on the cluster's TF port at
that address. In a private namespace only the node's own processes see these addresses; on a host
that refuses namespaces they share the host's loopback, and the per-cluster block and port keep
two clusters of the host apart."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Sequence

#: the blocks: 127.64.0.0/16 to 127.191.0.0/16 (127.0/16 stays with everything else on the host)
FIRST_BLOCK = 64
BLOCKS = 128
#: TF's port: 20000 to 29999, from the cluster's id
FIRST_PORT = 20000
PORTS = 10000
MAX_NODES = 65534


def _digest(cluster_id: str) -> int:
    return int.from_bytes(hashlib.sha256(cluster_id.encode()).digest()[:8], "big")


def block_for(cluster_id: str) -> str:
    """The cluster's block, as its first two octets (``"127.77"``)."""
    return f"127.{FIRST_BLOCK + _digest(cluster_id) % BLOCKS}"


def tf_port_for(cluster_id: str) -> int:
    """The port every node's TF server listens on, at its own address."""
    return FIRST_PORT + (_digest(cluster_id) >> 16) % PORTS


def node_address(block: str, node_index: int) -> str:
    """Node ``node_index``'s address in ``block``."""
    if not 0 <= node_index < MAX_NODES:
        raise ValueError(f"a cluster has at most {MAX_NODES} nodes in its private network, not node {node_index}")
    n = node_index + 1
    return f"{block}.{n >> 8}.{n & 255}"


def in_private_network(nodes: Sequence, block: str) -> tuple:
    """``nodes`` (NodeInfo) as TF must name them: each at its address in ``block`` (same ports)."""
    return tuple(dataclasses.replace(n, host=node_address(block, n.node_index)) for n in nodes)


def peer_table(nodes: Sequence, me: int, block: str, my_host: str) -> list[list]:
    """What the tunnel needs of the other nodes (NodeInfo): ``[address, tunnel host, tunnel port,
    local, control]``, ``local`` when the node runs on this same host, ``control`` then its tunnel's
    control socket if it has a namespace of its own (the tunnel takes sockets in it there, so the
    two nodes' connections skip the tunnels), else "". Nodes without a tunnel are left out."""
    rows = []
    for n in nodes:
        if n.node_index != me and n.tunnel_port:
            local = n.host == my_host
            rows.append([node_address(block, n.node_index), n.host, n.tunnel_port, local,
                         n.tunnel_control if local else ""])
    return rows
