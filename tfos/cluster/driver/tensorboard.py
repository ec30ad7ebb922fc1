"""TensorBoard as a child of the driver process, serving the cluster's log_dir."""

from __future__ import annotations

import importlib.util
import logging
import re
import select
import subprocess
import sys
import threading

from tfos.host import processes
from tfos.host.deadline import Deadline
from tfos.errors import ConfigError, TFOSError

logger = logging.getLogger(__name__)

_URL = re.compile(r"(https?://\S+?:\d+/?)")


def require_tensorboard() -> None:
    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("tensorboard=True needs the tensorboard package on the driver: "
                          "pip install tensorboard (or tfos[tensorboard]), or pass tensorboard=False")


class TensorBoard:
    """``python -m tensorboard.main --logdir LOG_DIR --host HOST --port PORT`` (port 0: the OS picks,
    TensorBoard prints the URL, which we read back). Dies with the driver (PR_SET_PDEATHSIG)."""

    def __init__(self, log_dir: str, bind_host: str, port: int = 0, timeout: float = 60.0):
        self.log_dir = log_dir
        self.proc = processes.popen_dying_with_process(
            [sys.executable, "-m", "tensorboard.main", "--logdir", log_dir, "--host", bind_host, "--port", str(port),
             "--reload_interval", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        self.url = self._read_url(timeout)
        self.url = self.url.replace("://0.0.0.0:", f"://{bind_host}:")
        threading.Thread(target=self._drain, name="tfos-tensorboard-log", daemon=True).start()
        logger.info("TensorBoard for %s at %s", log_dir, self.url)

    def _read_url(self, timeout: float) -> str:
        deadline = Deadline(timeout)
        seen = []
        buf = b""
        while not deadline.expired():
            if self.proc.poll() is not None:
                break
            ready, _, _ = select.select([self.proc.stderr], [], [], 0.5)
            if not ready:
                continue
            chunk = self.proc.stderr.read1(4096) if hasattr(self.proc.stderr, "read1") else self.proc.stderr.read(1)
            if not chunk:
                break
            buf += chunk
            text = buf.decode("utf-8", "replace")
            m = _URL.search(text)
            if m and "\n" in text[m.end():] + "\n":
                return m.group(1).rstrip("/") + "/"
            seen = text.splitlines()[-20:]
        processes.terminate(self.proc, 2.0, "TensorBoard")
        raise TFOSError(f"TensorBoard did not start within {timeout:.0f}s: " + " | ".join(seen))

    def _drain(self) -> None:
        try:
            for line in iter(self.proc.stderr.readline, b""):
                logger.debug("tensorboard: %s", line.decode("utf-8", "replace").rstrip())
        except (OSError, ValueError):
            pass

    def stop(self) -> None:
        processes.terminate(self.proc, 3.0, "TensorBoard")
