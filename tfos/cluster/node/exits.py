"""What kind of failure ended a TF process (TF process), decided where the exception is, from its
types, and left for the node agent as marker files beside ``error.txt``: whether a restart can
help (``NonRetryable``/``ConfigError``: ``NodeExited.retryable``) and whether the error is a
consequence of another rank's failure (``NodeExited.peer_failed``). The driver orders a failed
cluster's nodes by that flag (``lifecycle.first_cause_first``) and never reads the text for it.
"""

from __future__ import annotations

import os
import sys

from tfos.errors import NONRETRYABLE_FILE, PEER_FAILED_FILE, CollectiveError, ConfigError, NonRetryable

#: TensorFlow's errors for a collective that another task aborted, a peer that went away or an op
#: cancelled because of them (``tf.errors``; e.g. "Collective ops is aborted by: task ... stopped
#: sending heartbeats" is an UnavailableError)
TF_PEER_ERRORS = ("UnavailableError", "CancelledError", "AbortedError")
#: torch.distributed's errors for a lost peer or a failed backend connection (Gloo's "Connection reset")
TORCH_PEER_ERRORS = ("DistNetworkError", "DistBackendError")


def _loaded(module: str, names) -> tuple:
    """The classes ``names`` of ``module`` if that module is loaded (an error of a library that was
    never imported cannot have been raised): nothing is imported here."""
    mod = sys.modules.get(module)
    return tuple(c for c in (getattr(mod, n, None) for n in names) if isinstance(c, type)) if mod else ()


def _chain(exc: BaseException):
    """``exc`` and the exceptions it was raised from or during, each once."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def caused_by_a_peer(exc: BaseException) -> bool:
    """True when ``exc`` (or one it was raised from) says that another rank failed first: a tfos
    collective that failed (``CollectiveError``: Gloo, the reduction server), TensorFlow's aborted
    or unavailable collectives, torch.distributed's lost peers, a connection reset or refused."""
    kinds = (CollectiveError, ConnectionError) + _loaded("tensorflow.python.framework.errors_impl", TF_PEER_ERRORS) \
        + _loaded("torch.distributed", TORCH_PEER_ERRORS)
    return any(isinstance(e, kinds) for e in _chain(exc))


def write_error(node_dir: str, tb: str, exc: BaseException | None = None) -> None:
    """``error.txt``: the traceback; ``nonretryable`` when a restart cannot help; ``peer_failed``
    when the error is a consequence of another rank's failure (both from ``exc``'s types)."""
    markers = []
    if exc is not None and isinstance(exc, (NonRetryable, ConfigError)):
        markers.append((NONRETRYABLE_FILE, "main_fun raised NonRetryable or ConfigError\n"))
    if exc is not None and caused_by_a_peer(exc):
        markers.append((PEER_FAILED_FILE, "the error says another rank failed first\n"))
    try:
        with open(os.path.join(node_dir, "error.txt"), "w") as f:
            f.write(tb)
        for name, text in markers:
            with open(os.path.join(node_dir, name), "w") as f:
                f.write(text)
    except OSError:
        pass
