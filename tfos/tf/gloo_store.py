"""Gloo's rendezvous through the driver: a ``torch.distributed.Store`` whose keys live in the driver's
store (:mod:`tfos.cluster.driver.rendezvous`), reached over the node's authenticated (and, when on,
encrypted) control channel. PyTorch's ``TCPStore`` would listen on rank 0 for anyone on the network
who wants to join the group or read its addresses. Runs in the TF process (imports torch)."""

from __future__ import annotations

import base64
import datetime
import threading

import torch.distributed as dist

from tfos.errors import TFOSTimeoutError
from tfos.host.deadline import Deadline
from tfos.wire import messages as M
from tfos.wire.clients import DriverClient


def _b64(value) -> str:
    return base64.b64encode(value.encode() if isinstance(value, str) else bytes(value)).decode("ascii")


class DriverStore(dist.Store):
    """The keys of one Gloo group (``scope``) of this cluster attempt, kept by the driver. Blocking
    calls wait at most ``timeout_seconds`` (Gloo's own), in requests of at most 5 s each."""

    def __init__(self, cfg: M.NodeConfig, scope: str, timeout_seconds: float):
        super().__init__()
        self._client = DriverClient.for_node(cfg)
        self._client.keep_connection()
        self._lock = threading.Lock()  # one request at a time on the kept connection
        self._scope = scope
        self._timeout = float(timeout_seconds)

    def _call(self, fn, *args):
        with self._lock:
            return fn(self._scope, *args)

    def set(self, key, value):
        self._call(self._client.store_set, key, _b64(value))

    def _values(self, keys, timeout: float | None = None):
        keys = list(keys)
        limit = self._timeout if timeout is None else timeout
        deadline = Deadline(limit)
        while True:
            reply = self._call(self._client.store_get, keys, deadline.slice(5.0))
            if not reply.missing:
                return [base64.b64decode(v) for v in reply.values]
            if deadline.expired():
                raise TFOSTimeoutError(f"Gloo rendezvous: keys {list(reply.missing[:3])} of group {self._scope!r} were not "
                                       f"set within {limit:g} s: a rank did not start or join; raise the "
                                       "collectives' timeout_seconds if ranks are only slow to start")

    def get(self, key):
        return self._values([key])[0]

    def wait(self, keys, timeout=None):
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
        self._values(keys, seconds)

    def check(self, keys):
        return not self._call(self._client.store_get, list(keys), 0.0).missing

    def add(self, key, amount):
        return self._call(self._client.store_add, key, amount)

    def compare_set(self, key, expected, desired):
        return base64.b64decode(self._call(self._client.store_compare_set, key, _b64(expected), _b64(desired)))

    def delete_key(self, key):
        return bool(self._call(self._client.store_delete, key).number)

    def num_keys(self):
        return self._call(self._client.store_delete, "").count

    def close(self) -> None:
        self._client.close()
