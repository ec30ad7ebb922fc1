"""The tfos exception hierarchy. Every error the library raises derives from TFOSError."""

from __future__ import annotations


class TFOSError(Exception):
    """Root of every error raised by tfos."""


class ConfigError(TFOSError, ValueError):
    """Bad arguments or settings, detected before any Spark job starts."""


class HadoopConfigError(ConfigError):
    """An hdfs:// or viewfs:// URI was used but this process has no working Hadoop client
    (JVM, libhdfs, Hadoop jars on CLASSPATH). The message lists what to set up."""


class ProtocolError(TFOSError):
    """A malformed, unknown or oversized message on a tfos channel."""


class AuthenticationError(ProtocolError):
    """A peer failed the per-cluster secret handshake."""


class TFOSTimeoutError(TFOSError, TimeoutError):
    """A blocking wait ran past its deadline. The message names the setting to raise."""


class ReservationTimeoutError(TFOSTimeoutError):
    """Not every node of the cluster started within ``reservation_timeout``."""


class FeedTimeoutError(TFOSTimeoutError):
    """Feeding data to (or reading results from) a node stalled beyond ``feed_timeout``."""


class FeedError(TFOSError):
    """Data could not be fed: a row could not be converted, or a feed was broken."""


class ClusterStateError(TFOSError):
    """An API call that the cluster's current state does not allow."""


class NodeFailedError(TFOSError):
    """One or more nodes of the cluster failed.

    ``failures`` holds one :class:`NodeFailure` per failed node, each with the node's
    rank, role, host, exit code, remote traceback and the last lines of its log.
    """

    def __init__(self, failures):
        self.failures = list(failures)
        super().__init__(format_failures(self.failures))


def format_failures(failures) -> str:
    """Render node failures; identical tracebacks from several nodes are grouped."""
    groups: dict[str, list] = {}
    for f in failures:
        groups.setdefault(f.traceback or f.reason, []).append(f)
    parts = []
    for _, group in groups.items():
        head = ", ".join(f"node {f.node_index} ({f.job_name}:{f.task_index} on {f.host})" for f in group)
        f = group[0]
        text = [f"[{head}] {f.reason}"]
        if f.traceback:
            text.append("Remote traceback:\n" + f.traceback.rstrip())
        if f.log_tail:
            text.append(f"Last log lines of node {f.node_index} ({f.log_path}):\n" + f.log_tail.rstrip())
        parts.append("\n".join(text))
    return "\n\n".join(parts)
