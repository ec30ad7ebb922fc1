"""What the driver asks of Spark: free task slots, the Hadoop default filesystem, the driver's
address, and Spark actions run in their own job group so they can be cancelled (runs on the
driver)."""

from __future__ import annotations

import socket
import threading
import time

from tfos.errors import ReservationTimeoutError


def wait_for_slots(sc, num_executors: int, timeout: float) -> int:
    """Wait until Spark offers ``num_executors`` concurrent task slots; return the slot count."""
    jsc = sc._jsc.sc()
    deadline = time.monotonic() + timeout
    while True:
        try:
            rp = jsc.resourceProfileManager().defaultResourceProfile()
            slots = int(jsc.maxNumConcurrentTasks(rp))
        except Exception:  # very old or unusual Spark: let the barrier stage decide
            return num_executors
        if slots >= num_executors:
            return slots
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ReservationTimeoutError(
                f"cannot reserve {num_executors} executors: Spark offers {slots} concurrent task slot(s) after "
                f"waiting {timeout:.0f}s (reservation_timeout). Add executors (--num-executors / "
                "spark.executor.instances, or more workers), lower num_executors, or raise reservation_timeout "
                "if executors are still starting.")
        time.sleep(min(0.5, remaining))


def default_fs(sc) -> str:
    try:
        return sc._jsc.hadoopConfiguration().get("fs.defaultFS") or "file:///"
    except Exception:
        return "file:///"


def driver_host(spark_conf_host: str | None) -> str:
    """The address executors use to reach this driver."""
    if spark_conf_host:
        return spark_conf_host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


class SparkJob:
    """A Spark action running on its own thread in its own job group (cancellable).
    ``on_done(job)`` is called on that thread when the action ended, however it ended."""

    def __init__(self, sc, group: str, description: str, action, on_done=None):
        self.sc = sc
        self.group = group
        self.result = None
        self.error: BaseException | None = None
        self.done = threading.Event()

        def target():
            try:
                sc.setJobGroup(group, description, interruptOnCancel=True)
                self.result = action()
            except BaseException as e:  # handed to the waiting thread
                self.error = e
            finally:
                self.done.set()
                if on_done is not None:
                    on_done(self)

        self.thread = threading.Thread(target=target, name=group, daemon=True)
        self.thread.start()

    def cancel(self, timeout: float = 30.0) -> None:
        if not self.done.is_set():
            self.sc.cancelJobGroup(self.group)
        self.thread.join(timeout)
