"""Progress values and timeline events sent by the TF process to the driver (runs in the TF process).

``report()`` keeps the latest values and a background thread sends them
at most once per ``report_interval`` seconds, so calling it every step costs a dict update.
Timeline events (Chrome trace "X" events with wall-clock microseconds) are buffered, bounded,
and shipped with the reports; with no timeline requested, ``trace()`` records nothing.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import threading
import time

from tfos.errors import TFOSError
from tfos.wire.clients import DriverClient

logger = logging.getLogger(__name__)

MAX_BUFFERED_EVENTS = 20000
MAX_BUFFERED_HISTORY = 20000  # ctx.report() calls waiting to be sent (oldest dropped beyond)
MAX_BUFFERED_OUTPUT = 2000  # printed lines waiting to be sent to the driver's console (oldest dropped beyond)
MAX_LINE = 2000  # characters of one printed line that reach the driver


def _jsonable(v, depth: int = 0):
    """Pure: a JSON value for ``v`` (numpy scalars become numbers, arrays lists, anything else its str)."""
    if isinstance(v, (str, bool, int)) or v is None:
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)
    if depth < 4 and isinstance(v, dict):
        return {str(k): _jsonable(x, depth + 1) for k, x in v.items()}
    if depth < 4 and isinstance(v, (list, tuple)):
        return [_jsonable(x, depth + 1) for x in v]
    if hasattr(v, "tolist"):  # numpy scalars and small arrays
        try:
            return _jsonable(v.tolist(), depth + 1)
        except (TypeError, ValueError):
            pass
    try:
        return _jsonable(float(v), depth + 1)
    except (TypeError, ValueError):
        return str(v)[:200]


class Reporter:
    def __init__(self, driver: DriverClient, interval: float = 1.0, timeline: bool = False, history: bool = False):
        self.driver = driver
        self.interval = interval
        self.timeline = timeline
        self.history = history  # keep every ctx.report() call, only when the driver logs them (MLflow)
        self._lock = threading.Lock()
        self._values: dict = {}
        self._dirty = False
        self._events: list = []
        self._history: list = []
        self._output: list = []
        self._output_dropped = 0
        self._dropped = 0
        self._history_dropped = 0
        self._warned = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tfos-reporter", daemon=True)
        self._thread.start()

    def report(self, values: dict) -> None:
        with self._lock:
            self._values.update({k: _jsonable(v) for k, v in values.items()})
            self._values["time"] = time.time()
            self._dirty = True

    def record(self, values: dict) -> None:
        """A ``ctx.report()`` call: the latest values, plus one entry of the run's metric history
        (the driver logs it to MLflow with its step), when the cluster keeps one."""
        if not self.history:
            self.report(values)
            return
        entry = {k: _jsonable(v) for k, v in values.items()}
        entry["t"] = time.time()
        with self._lock:
            if len(self._history) >= MAX_BUFFERED_HISTORY:
                self._history.pop(0)
                self._history_dropped += 1
            self._history.append(entry)
        self.report(values)

    def output(self, line: str) -> None:
        """A line main_fun printed, for the driver's console (sent with the next report)."""
        with self._lock:
            if len(self._output) >= MAX_BUFFERED_OUTPUT:
                self._output.pop(0)
                self._output_dropped += 1
            self._output.append(line[:MAX_LINE])

    def event(self, name: str, cat: str, start: float, end: float, args: dict | None = None) -> None:
        """Record one complete event; ``start``/``end`` are time.time() seconds."""
        if not self.timeline:
            return
        ev = {"name": name, "cat": cat, "ph": "X", "ts": int(start * 1e6), "dur": max(1, int((end - start) * 1e6))}
        if args:
            ev["args"] = _jsonable(args)
        with self._lock:
            if len(self._events) < MAX_BUFFERED_EVENTS:
                self._events.append(ev)
            else:
                self._dropped += 1

    @contextlib.contextmanager
    def trace(self, name: str, cat: str = "step", **args):
        t0 = time.time()
        try:
            yield
        finally:
            self.event(name, cat, t0, time.time(), args or None)

    def flush(self) -> None:
        with self._lock:
            if not self._dirty and not self._events and not self._history and not self._output:
                return
            values, events, history, output = dict(self._values), self._events, self._history, self._output
            if self._output_dropped:
                output.insert(0, f"[{self._output_dropped} earlier lines not sent: see the node log]")
                self._output_dropped = 0
            self._events, self._history, self._output, self._dirty = [], [], [], False
        try:
            self.driver.report(values, events, history, output)
        except (TFOSError, OSError) as e:
            logger.debug("progress report not delivered: %s", e)
        except Exception as e:  # reporting must never change how main_fun ends
            if not self._warned:
                self._warned = True
                logger.warning("progress report dropped: %s", e)

    def close(self) -> None:
        """Send what is left, then close the client's connection (the reporter owns its client)."""
        self._stop.set()
        self._thread.join(timeout=5)
        self.flush()
        self.driver.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.flush()


class LineTee(io.TextIOBase):
    """A text stream that writes to ``stream`` and hands every complete line to ``sink`` (the
    reporter's :meth:`Reporter.output`): main_fun's prints reach the node log and the driver."""

    def __init__(self, stream, sink):
        self._stream = stream
        self._sink = sink
        self._partial = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        n = self._stream.write(text)
        with self._lock:
            lines = (self._partial + text).split("\n")
            self._partial = lines.pop()
        for line in lines:
            self._sink(line.rstrip("\r"))
        return n

    def flush(self) -> None:
        self._stream.flush()

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self):
        return getattr(self._stream, "encoding", "utf-8")


def streams_output(setting: str, rank) -> bool:
    """Pure: whether a node of training ``rank`` (None: ps/evaluator) sends its printed lines to the
    driver under reserve(node_output=``setting``)."""
    return setting == "all" or (setting == "chief" and rank == 0)
