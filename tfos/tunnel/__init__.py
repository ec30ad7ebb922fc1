"""The node tunnel: TensorFlow's gRPC and Gloo reachable only by the cluster's own nodes.

TF 2.21's servers and stock Gloo accept any client and send in clear. With encryption on
(``reserve(encrypt=...)``) every node runs a tunnel beside its TF process:

* the TF process listens and connects, for TF and Gloo, only inside a **private network
  namespace** of its own (the loopback of a namespace that no other process can enter; on hosts
  that refuse one, the host's loopback: :func:`tfos.tunnel.agent.NodeTunnel` says so). An
  ``LD_PRELOAD`` shim (``shim.c``) redirects the two libc calls that would open TF's and Gloo's
  sockets elsewhere; every node has an address in a per-cluster loopback block (``addresses``),
  which ``TF_CONFIG`` and Gloo's rendezvous name;
* the tunnel (``rust/``, one process per node, started by the node agent) carries those
  connections between nodes over tfos's own protocol: the v5 handshake with the cluster secret,
  then AES-256-GCM records (:mod:`tfos.wire.crypto`), compiled (no Python per byte). Two nodes
  on one host need none of it: the tunnel hands its TF process a socket made in the other node's
  namespace (taken from that node's tunnel), and the two connect straight.

Modules: ``addresses`` (pure: blocks, node addresses, the peer table), ``build`` (``python -m
tfos.tunnel build``: the shim with the C compiler, the tunnel with cargo), ``agent`` (the node
agent starts and stops the tunnel), ``node`` (the TF process checks the shim and hands the tunnel
its peers).
"""
