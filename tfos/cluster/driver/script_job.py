"""``TFCluster.run_script``: an unchanged TF script on every node (runs on the driver; the nodes run
it with :mod:`tfos.cluster.node.script_process`)."""

from __future__ import annotations

import logging
import os

from tfos.errors import ConfigError
from tfos.topology import InputMode

logger = logging.getLogger(__name__)


#: Bounds on the modules shipped from the script's folder (its siblings): how many, and their bytes in all.
MAX_SIBLINGS = 200
MAX_SIBLING_BYTES = 16 * 1024 * 1024


def script_siblings(script: str) -> tuple[tuple[str, bytes], ...]:
    """The ``.py`` files beside ``script`` (not the script, not hidden files), name and source, as
    ``spark-submit --py-files`` would ship them; a warning names what the bounds leave out."""
    folder = os.path.dirname(os.path.abspath(script))
    out, total, skipped = [], 0, []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if not name.endswith(".py") or name.startswith(".") or not os.path.isfile(path) or os.path.samefile(path,
                                                                                                         script):
            continue
        size = os.path.getsize(path)
        if len(out) >= MAX_SIBLINGS or total + size > MAX_SIBLING_BYTES:
            skipped.append(name)
            continue
        try:
            with open(path, "rb") as f:
                out.append((name, f.read()))
        except OSError:
            skipped.append(name)
            continue
        total += size
    if skipped:
        logger.warning("tfos: %d module(s) beside %s are not shipped to the nodes (more than %d files or %d MiB): "
                       "%s; install them on the executors or ship them with spark.submit.pyFiles", len(skipped),
                       script, MAX_SIBLINGS, MAX_SIBLING_BYTES >> 20, ", ".join(skipped[:10]))
    return tuple(out)


def run_script(cls, sc, script: str, argv, num_executors: int, num_ps: int, master_node, timeout: float,
               grace_secs: float, kwargs: dict) -> None:
    """Read ``script`` (and the modules beside it) on the driver, reserve ``cls`` (TFCluster) with
    ``kwargs``, run the script on every node and wait for the trainers (see ``TFCluster.run_script``)."""
    from tfos.cluster.node.script_process import Script, script_main

    try:
        with open(script, "rb") as f:
            source = f.read()
        siblings = script_siblings(script)
    except OSError as e:
        raise ConfigError(f"cannot read the script {script!r} on the driver: {e}") from None
    if isinstance(argv, str):
        raise ConfigError("argv must be a list of arguments, e.g. ['--epochs', '3'], not a string")
    kwargs["release_port"] = True  # the script's TF server binds the ports in TF_CONFIG
    cluster = cls.reserve(sc, num_executors, num_ps, master_node=master_node, input_mode=InputMode.TENSORFLOW,
                          **kwargs)
    with cluster:
        cluster.start(script_main, Script(os.path.basename(script), source, tuple(map(str, argv)), siblings))
        cluster.shutdown(grace_secs=grace_secs, timeout=timeout)
