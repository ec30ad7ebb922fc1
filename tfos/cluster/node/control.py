"""How code in a TF process (and its children: a ``run_script`` script) reaches the driver: the
node's configuration in a private file named by ``TFOS_NODE_CONFIG`` (runs in the TF process).

The file (0600, in the node's 0700 directory) holds the encoded ``NodeConfig``, the cluster key
included; it is read back only after checking that it is a regular file of this user, so a planted
file or link is refused."""

from __future__ import annotations

import os
import stat

from tfos.errors import TFOSError
from tfos.host.private import write_private_file
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
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise TFOSError(f"{ENV}={path} cannot be read ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
            raise TFOSError(f"{ENV}={path} is not a private file of this user; refusing it")
        cfg = M.decode(f.read())
    if not isinstance(cfg, M.NodeConfig):
        raise TFOSError(f"{ENV}={path} does not hold a node configuration")
    return cfg
