"""``TFCluster.run_script``: an unchanged TF script on every node (runs on the driver; the nodes run
it with :mod:`tfos.cluster.node.script`)."""

from __future__ import annotations

import os

from tfos.errors import ConfigError
from tfos.topology import InputMode


def run_script(cls, sc, script: str, argv, num_executors: int, num_ps: int, master_node, timeout: float,
               grace_secs: float, kwargs: dict) -> None:
    """Read ``script`` on the driver, reserve ``cls`` (TFCluster) with ``kwargs``, run the script on
    every node and wait for the trainers (see ``TFCluster.run_script``)."""
    from tfos.cluster.node.script import Script, script_main

    try:
        with open(script, "rb") as f:
            source = f.read()
    except OSError as e:
        raise ConfigError(f"cannot read the script {script!r} on the driver: {e}") from None
    if isinstance(argv, str):
        raise ConfigError("argv must be a list of arguments, e.g. ['--epochs', '3'], not a string")
    kwargs["release_port"] = True  # the script's TF server binds the ports in TF_CONFIG
    cluster = cls.reserve(sc, num_executors, num_ps, master_node=master_node, input_mode=InputMode.TENSORFLOW,
                          **kwargs)
    with cluster:
        cluster.start(script_main, Script(os.path.basename(script), source, tuple(map(str, argv))))
        cluster.shutdown(grace_secs=grace_secs, timeout=timeout)
