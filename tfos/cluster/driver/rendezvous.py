"""The key-value store of the TF processes' Gloo rendezvous (runs on the driver).

Gloo's ranks find each other through a store (``torch.distributed.Store``: set, get, wait, add,
...). PyTorch's ``TCPStore`` would listen on rank 0 for anyone; tfos's ranks use
:class:`tfos.tf.gloo.DriverStore` instead, whose requests travel on the driver's authenticated (and,
when on, encrypted) control channel to this store. Keys live in scopes (a group of one attempt);
every wait is bounded (a request waits at most ``MAX_WAIT`` s and is asked again), and so is
memory: at most ``MAX_KEYS`` keys of at most ``MAX_VALUE`` bytes, ``MAX_BYTES`` in all.
"""

from __future__ import annotations

import threading

from tfos.errors import ProtocolError

MAX_WAIT = 10.0
MAX_KEYS = 100_000
MAX_VALUE = 1 << 20
MAX_BYTES = 256 << 20
MAX_NAME = 512


class RendezvousStore:
    def __init__(self):
        self._cond = threading.Condition()
        self._data: dict[tuple[str, str], bytes] = {}
        self._bytes = 0

    def clear(self) -> None:
        """Forget every key (a new attempt of the cluster)."""
        with self._cond:
            self._data.clear()
            self._bytes = 0
            self._cond.notify_all()

    def _put(self, scope: str, key: str, value: bytes) -> None:
        if len(scope) > MAX_NAME or len(key) > MAX_NAME:
            raise ProtocolError(f"store names are at most {MAX_NAME} characters")
        if len(value) > MAX_VALUE:
            raise ProtocolError(f"store value of {len(value)} bytes exceeds {MAX_VALUE}")
        old = self._data.get((scope, key))
        grown = len(value) - (len(old) if old is not None else 0)
        if old is None and len(self._data) >= MAX_KEYS or self._bytes + grown > MAX_BYTES:
            raise ProtocolError(f"the rendezvous store is full ({MAX_KEYS} keys, {MAX_BYTES} bytes at most)")
        self._data[(scope, key)] = value
        self._bytes += grown
        self._cond.notify_all()

    def set(self, scope: str, key: str, value: bytes) -> None:
        with self._cond:
            self._put(scope, key, value)

    def get(self, scope: str, keys, wait: float) -> tuple[list[bytes] | None, list[str]]:
        """Every value of ``keys`` once all are set (waiting up to ``wait`` s, at most MAX_WAIT), else
        ``(None, the keys still missing)``."""
        with self._cond:
            self._cond.wait_for(lambda: all((scope, k) in self._data for k in keys),
                                timeout=min(max(wait, 0.0), MAX_WAIT))
            missing = [k for k in keys if (scope, k) not in self._data]
            if missing:
                return None, missing
            return [self._data[(scope, k)] for k in keys], []

    def add(self, scope: str, key: str, amount: int) -> int:
        """Add ``amount`` to the integer at ``key`` (0 when unset); its new value."""
        with self._cond:
            old = self._data.get((scope, key), b"0")
            try:
                value = int(old) + amount
            except ValueError:
                raise ProtocolError(f"store key {key!r} does not hold an integer") from None
            self._put(scope, key, str(value).encode())
            return value

    def compare_set(self, scope: str, key: str, expected: bytes, desired: bytes) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected`` (or is unset and ``expected`` is
        empty); the value it holds afterwards."""
        with self._cond:
            current = self._data.get((scope, key))
            if current == expected or (current is None and expected == b""):
                self._put(scope, key, desired)
                return desired
            return expected if current is None else current

    def delete(self, scope: str, key: str) -> bool:
        with self._cond:
            value = self._data.pop((scope, key), None)
            if value is None:
                return False
            self._bytes -= len(value)
            return True

    def num_keys(self, scope: str) -> int:
        with self._cond:
            return sum(1 for s, _ in self._data if s == scope)
