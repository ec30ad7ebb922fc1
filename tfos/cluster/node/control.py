"""How code in a TF process (and its children: a ``run_script`` script) reaches the driver: the
node's configuration in a private file named by ``TFOS_NODE_CONFIG`` (runs in the TF process).

The file (0600, in the node's 0700 directory) holds the encoded ``NodeConfig``, the cluster key
included; it is read back only after checking that it is a regular file of this user, so a planted
file or link is refused."""

from __future__ import annotations

import os

from tfos.errors import TFOSError
from tfos.host.private import UnsafeDirectoryError, read_private_file, write_private_file
from tfos.wire import messages as M

ENV = "TFOS_NODE_CONFIG"
FILE = "node-config.json"


def publish(cfg: M.NodeConfig) -> str:
    """Write this node's config for the code it runs; returns the path (also set in ``os.environ``)."""
    path = os.path.join(cfg.node_dir, FILE)
    write_private_file(path, M.encode(cfg))
    os.environ[ENV] = path
    return path


def node_config() -> M.NodeConfig | None:
    """This node's config when the process runs in a tfos node, else None."""
    path = os.environ.get(ENV)
    if not path:
        return None
    try:
        cfg = M.decode(read_private_file(path))
    except UnsafeDirectoryError:
        raise TFOSError(f"{ENV}={path} is not a private file of this user; refusing it") from None
    except OSError as e:
        raise TFOSError(f"{ENV}={path} cannot be read ({e.strerror})") from None
    if not isinstance(cfg, M.NodeConfig):
        raise TFOSError(f"{ENV}={path} does not hold a node configuration")
    return cfg
