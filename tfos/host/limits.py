"""The driver's open-file limit (runs on the driver): every node keeps a heartbeat connection to the
control service and opens others (its spec wait, reports, feed gate, save polls), so a cluster
of many nodes needs more descriptors than a 1,024 soft limit allows. ``ensure_open_files`` raises
the soft limit towards the hard one at start, and says which setting to raise when even the hard
limit is too low, instead of failing later with EMFILE ("Too many open files") in the middle of
a start."""

from __future__ import annotations

import logging

from tfos.errors import ConfigError

logger = logging.getLogger(__name__)

#: descriptors the driver holds besides its nodes' connections (Spark's gateway, logs, listeners)
BASE_FILES = 256
#: per node, at most at once: its heartbeat connection, a spec wait or gather poll, a save poll,
#: a report or feed request in flight
FILES_PER_NODE = 4
#: the soft limit asked for when the hard limit is unlimited
UNLIMITED_TARGET = 1 << 20


def files_needed(num_nodes: int) -> int:
    """Pure: the descriptors a driver of ``num_nodes`` nodes may hold at once."""
    return BASE_FILES + FILES_PER_NODE * max(0, num_nodes)


def listener_sizes(num_nodes: int) -> tuple[int, int, float]:
    """Pure: ``(max connections, listen backlog, handshake seconds)`` of the control service for
    ``num_nodes`` nodes: room for every connection a node may hold at once (:func:`files_needed`),
    at least 4,096; a backlog that lets every node connect at the same instant (the kernel caps it
    at somaxconn); and a handshake deadline of 10 s plus 10 ms a node, since thousands of nodes
    connecting at once keep a driver busy for seconds (a deadline missed reads as a wrong secret
    to the node, and fails it)."""
    return max(4096, files_needed(num_nodes)), max(64, min(65535, num_nodes)), round(10.0 + num_nodes / 100, 2)


def plan_open_files(soft: int, hard: int, needed: int, unlimited: int) -> tuple[int | None, str | None]:
    """Pure: ``(soft limit to set or None to keep it, error or None)`` for ``needed`` descriptors,
    with the current ``soft`` and ``hard`` limits (``unlimited``: RLIM_INFINITY). The soft limit
    goes up to the hard one (capped at UNLIMITED_TARGET), never down."""
    if soft == unlimited or soft >= needed:
        return None, None
    top = UNLIMITED_TARGET if hard == unlimited else hard
    if top < needed:
        return (top if top > soft else None), (
            f"the driver may need {needed} open files for this cluster, but its hard limit is {hard}: raise it "
            f"(ulimit -Hn {needed} in the shell that starts the driver, LimitNOFILE= for a systemd service, "
            f"or nofile in /etc/security/limits.conf), or run fewer nodes")
    return max(needed, top), None


def ensure_open_files(num_nodes: int) -> None:
    """Raise this process's soft open-file limit for ``num_nodes`` nodes; ConfigError naming
    ``ulimit -n`` when the hard limit is too low."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target, error = plan_open_files(soft, hard, files_needed(num_nodes), resource.RLIM_INFINITY)
    if target is not None:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            logger.info("tfos: raised the open-file limit from %d to %d (%d nodes)", soft, target, num_nodes)
        except (ValueError, OSError) as e:  # e.g. above the kernel's nr_open
            logger.warning("tfos: could not raise the open-file limit from %d to %d: %s", soft, target, e)
    if error:
        raise ConfigError(error)
