"""The tfos exception hierarchy. Every error the library raises derives from TFOSError."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


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


class ChannelClosed(ProtocolError):
    """The peer closed (or reset) a tfos channel."""


class RequestRefused(TFOSError):
    """A tfos service answered a request with an error (the message says why)."""


class TFOSTimeoutError(TFOSError, TimeoutError):
    """A blocking wait ran past its deadline. The message names the setting to raise."""


class ReservationTimeoutError(TFOSTimeoutError):
    """Not every node of the cluster started within ``reservation_timeout``."""


class FeedTimeoutError(TFOSTimeoutError):
    """Feeding data to (or reading results from) a node stalled beyond ``feed_timeout``."""


class FeedError(TFOSError):
    """Data could not be fed: a row could not be converted, or a feed was broken."""


class ScriptError(TFOSError):
    """A TF script run with ``TFCluster.run_script`` exited with a non-zero code."""


#: Marker file in a node's directory, written by the TF process when main_fun raised NonRetryable
#: or ConfigError; the agent reports it as ``NodeExited.retryable=False``.
NONRETRYABLE_FILE = "nonretryable"
#: Marker file written by the TF process when its error is a consequence of another rank's failure
#: (``tfos.cluster.node.exits.caused_by_a_peer``); the agent reports it as ``NodeExited.peer_failed``.
PEER_FAILED_FILE = "peer_failed"


class NonRetryable(TFOSError):
    """Raise it (or a subclass) in main_fun for a failure that a restart cannot fix (bad input,
    a wrong argument): the cluster then fails at once instead of restarting (``max_restarts``).
    ``raise tfos.NonRetryable("...") from e`` keeps the cause in the traceback."""


class CollectiveError(TFOSError):
    """A collective (all-reduce, broadcast) of the TF processes failed: a peer died, a connection
    broke, or a peer did not join before the collective's timeout."""


#: How tfos's collective ops start their errors: in a ``tf.function`` they can raise only TF's own,
#: and the TF process raises one whose message holds this as :class:`CollectiveError`.
COLLECTIVE_ERROR = "CollectiveError: "


def collective_error(message: str) -> CollectiveError | None:
    """The :class:`CollectiveError` that a TF error's ``message`` carries (the text after
    :data:`COLLECTIVE_ERROR`), or None when it carries none."""
    at = message.find(COLLECTIVE_ERROR)
    return None if at < 0 else CollectiveError(message[at + len(COLLECTIVE_ERROR):])


class UnevenDataError(FeedError, NonRetryable):
    """The ranks got unequal data and ``uneven='error'`` was chosen: raised on every rank at the
    same step (so none waits in a collective for another), naming each rank's rows and steps.
    A restart would feed the same rows again, so it is not retried."""


class StallError(TFOSError):
    """No training rank made progress for ``stall_timeout`` seconds while every process was alive.
    The message holds every rank's Python stacks and last log lines."""


class ClusterStateError(TFOSError):
    """An API call that the cluster's current state does not allow."""


class Cause(str, enum.Enum):
    """Why a node's TF process ended, as a value the driver decides on (it travels on
    ``NodeExited.cause`` and ``NodeFailure.cause``); the sentence in ``reason`` is for people."""

    EXITED = "exited"  # it ended on its own: an exit code (0: finished)
    RAISED = "raised"  # main_fun raised (the traceback says what)
    KILLED = "killed"  # a signal the node agent did not send (most often the kernel's OOM killer)
    STOPPED = "stopped"  # the driver asked (a restart, the end, a shrink)
    EVICTED = "evicted"  # the node agent got SIGTERM: its executor is being stopped (preemption, decommission)
    EXECUTOR_LOST = "executor_lost"  # the executor JVM that hosted the agent is gone
    TUNNEL_LOST = "tunnel_lost"  # the node's encrypting tunnel exited: TF and Gloo lost their network
    DRIVER_LOST = "driver_lost"  # the agent heard nothing from the driver for heartbeat_timeout
    AGENT_LOST = "agent_lost"  # the driver heard nothing from the agent (its executor or host died)
    AGENT_ERROR = "agent_error"  # the node agent itself failed
    DUPLICATE = "duplicate"  # Spark started the node a second time


#: causes that the loss of the node's executor or host may explain (Spark then knows why)
EXECUTOR_CAUSES = frozenset({Cause.EXECUTOR_LOST, Cause.AGENT_LOST, Cause.KILLED, Cause.EVICTED})


@dataclass
class NodeFailure:
    """Why one node failed, as the driver learned it."""

    node_index: int
    job_name: str
    task_index: int
    host: str
    reason: str
    exit_code: int | None = None
    traceback: str = ""
    log_tail: str = ""
    log_path: str = ""
    retryable: bool = True  # False: main_fun raised NonRetryable or ConfigError (no restart helps)
    attempt: int = 0  # which start of the cluster it happened in (0: the first; see max_restarts)
    cause: Cause = Cause.EXITED
    # its error is a consequence of another rank's failure (an aborted collective, a lost peer),
    # decided in its TF process from the exception's types: the driver names such failures last
    peer_failed: bool = False


class NodeFailedError(TFOSError):
    """One or more nodes of the cluster failed.

    ``failures`` holds one :class:`NodeFailure` per failed node, each with the node's
    rank, role, host, exit code, remote traceback and the last lines of its log.
    """

    def __init__(self, failures):
        self.failures = list(failures)
        super().__init__(format_failures(self.failures))


class Resizing(ClusterStateError):
    """A feed or call was interrupted by a planned restart at another size (the cluster grows or
    shrinks: docs/elastic.md); ``train()`` feeds the next attempt. No node failed: not a
    :class:`NodeFailedError`."""


def format_failures(failures) -> str:
    """Render node failures in order, the first cause first (the driver orders them); identical
    tracebacks from several nodes are grouped, and each later group begins with "then"."""
    groups: dict[str, list] = {}
    for f in failures:
        groups.setdefault(f.traceback or f.reason, []).append(f)
    parts = []
    for _, group in groups.items():
        head = ", ".join(f"node {f.node_index} ({f.job_name}:{f.task_index} on {f.host}"
                         + (f", attempt {f.attempt}" if f.attempt else "") + ")" for f in group)
        f = group[0]
        text = [("then " if parts else "") + f"[{head}] {f.reason}"]
        if f.traceback:
            text.append("Remote traceback:\n" + f.traceback.rstrip())
        if f.log_tail:
            text.append(f"Last log lines of node {f.node_index} ({f.log_path}):\n" + f.log_tail.rstrip())
        parts.append("\n".join(text))
    return "\n\n".join(parts)


def remote_error(exc: BaseException) -> TFOSError | None:
    """The tfos error that a Spark task raised, decoded from the text of the driver-side
    exception (Py4J/Spark wrap it as ``...tfos.errors.FeedError: message...``); None if the text
    holds no tfos error. The last one in the text wins (it is the innermost cause).

    This is the one place where remote errors are recognised by their text: Spark gives the
    driver nothing else. Only classes of this module are ever built from it."""
    text = str(exc)
    found = None
    for m in re.finditer(r"tfos\.errors\.([A-Za-z]+): ([^\n]*)", text):
        cls = globals().get(m.group(1))
        if isinstance(cls, type) and issubclass(cls, TFOSError) and cls is not NodeFailedError:
            found = (cls, m.group(2).strip())
    if found is None:
        return None
    cls, message = found
    return cls(message)
