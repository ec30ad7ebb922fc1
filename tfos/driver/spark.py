"""What the driver asks of Spark: free task slots, the Hadoop default filesystem, the driver's
address, and Spark actions run in their own job group so they can be cancelled (runs on the
driver)."""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
import threading
import time

from tfos.errors import ConfigError, ReservationTimeoutError


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


@dataclasses.dataclass(frozen=True)
class ControlAddress:
    advertise: str  # what executors connect to
    bind: str  # what the control service listens on
    port: int  # 0: the OS picks
    setting: str  # the setting that chose ``advertise`` (for error messages)
    ports: tuple = ()  # every port to try, in order (TFOS_SERVER_PORT may be a range); () = (port,)

    @property
    def bind_setting(self) -> str:
        """The setting that chose ``bind``."""
        return "TFOS_SERVER_HOST/TFOS_SERVER_PORT" if self.setting == "TFOS_SERVER_HOST" else "spark.driver.bindAddress"


def control_address(spark_conf: dict, environ: dict) -> ControlAddress:
    """Pure: where the driver's control service listens and what it tells executors.

    ``TFOS_SERVER_HOST``/``TFOS_SERVER_PORT`` (TensorFlowOnSpark's variables, for hosts with
    several interfaces; the port may be a range ``9997-9999``, tried in order) win; else Spark's own ``spark.driver.host`` (advertised) and
    ``spark.driver.bindAddress`` (bound; all interfaces if unset)."""
    port_s = environ.get("TFOS_SERVER_PORT") or "0"
    try:
        first, dash, last = port_s.partition("-")
        ports = tuple(range(int(first), int(last if dash else first) + 1))
        if not ports or not all(0 <= p < 65536 for p in ports) or (0 in ports and len(ports) > 1):
            raise ValueError
    except ValueError:
        raise ConfigError(f"TFOS_SERVER_PORT={port_s!r} is neither a port number nor a range like 9997-9999") from None
    host = environ.get("TFOS_SERVER_HOST")
    if host:
        return ControlAddress(host, host, ports[0], "TFOS_SERVER_HOST", ports)
    return ControlAddress(driver_host(spark_conf.get("spark.driver.host")),
                          spark_conf.get("spark.driver.bindAddress") or "0.0.0.0", ports[0], "spark.driver.host", ports)


def is_local_master(master: str, resolve=socket.gethostbyname) -> bool:
    """Pure (given ``resolve``): executors of this master run on the driver's machine: ``local``,
    ``local[...]``, ``local-cluster[...]``, or a standalone master on a loopback address."""
    if master == "local" or master.startswith(("local[", "local-cluster[")):
        return True
    if master.startswith("spark://"):
        hosts = [hp.rsplit(":", 1)[0] for hp in master[len("spark://"):].split(",")]
        try:
            return all(ipaddress.ip_address(resolve(h)).is_loopback for h in hosts)
        except (OSError, ValueError):
            return False
    return False


def check_advertised(address: ControlAddress, master: str, resolve=socket.gethostbyname) -> None:
    """ConfigError if executors of a non-local master would be told a loopback address."""
    if is_local_master(master, resolve):
        return
    try:
        ip = ipaddress.ip_address(resolve(address.advertise))
    except (OSError, ValueError):
        return  # unresolvable here: the executors may still resolve it; they report if they cannot
    if ip.is_loopback:
        raise ConfigError(f"the driver would tell executors to reach it at {address.advertise} ({ip}), a loopback "
                          f"address, but the master {master!r} runs executors on other hosts: set "
                          f"{address.setting} to an address of this machine that the executors can reach")


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
