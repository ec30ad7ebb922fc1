"""What the driver asks of Spark: free task slots, the Hadoop default filesystem, the driver's
address, and Spark actions run in their own job group so they can be cancelled (runs on the
driver).

The user hands tfos a SparkContext, a classic SparkSession or a Spark Connect SparkSession;
:func:`spark_entry` wraps it as :class:`ClassicSpark` or :class:`ConnectSpark`, the only two
places that know which one it is. Under Spark Connect there is no SparkContext and no RDD: the
barrier stage is a ``mapInArrow(..., barrier=True)`` over ``spark.range(n)``, jobs are tagged
(``addTag``/``interruptTag``) instead of grouped, and what only the cluster knows (the Hadoop
default filesystem, GPU addresses) is read by the barrier tasks."""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import socket
import threading
import time

from tfos.cluster.driver.security import SPARK_SECURITY
from tfos.errors import ConfigError, ReservationTimeoutError
from tfos.host.deadline import Deadline
from tfos.host.private import SECRET_PROPERTY
from tfos.data.fs import spark_default_fs

logger = logging.getLogger(__name__)


def slots_offered(sc) -> int | None:
    """The concurrent task slots Spark offers now (its executors' cores over spark.task.cpus), None
    when this Spark cannot say."""
    jsc = sc._jsc.sc()
    try:
        return int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
    except Exception:  # very old or unusual Spark: let the barrier stage decide
        return None


def wait_for_slots(sc, num_executors: int, timeout: float) -> int:
    """Wait until Spark offers ``num_executors`` concurrent task slots; return the slot count
    (``num_executors`` when this Spark cannot say)."""
    seen: list[int | None] = []

    def offered() -> int | None:
        seen.append(slots_offered(sc))
        return seen[-1]

    wait_for_size(offered, num_executors, num_executors, timeout, why=lambda slots, secs: (
        f"cannot reserve {num_executors} executors: Spark offers {slots} concurrent task slot(s) after "
        f"waiting {secs:.0f}s (reservation_timeout). Add executors (--num-executors / "
        "spark.executor.instances, or more workers), lower num_executors, or raise reservation_timeout "
        "if executors are still starting."))
    return num_executors if seen[-1] is None else seen[-1]


#: how often a slot wait asks Spark again
SLOT_POLL_SECS = 0.5


def wait_for_size(offered, lo: int, hi: int, timeout: float, size_wait: float = 0.0, *, why=None,
                  pause=None, clock=time.monotonic) -> int | None:
    """How many nodes to start, ``lo`` .. ``hi`` (:func:`settings.size_to_start` on ``offered()``,
    Spark's slots now, polled every SLOT_POLL_SECS): ``hi`` as soon as Spark offers them, else what
    it offers after ``size_wait``; ReservationTimeoutError with ``why(slots, timeout)`` when it stays
    below ``lo`` for ``timeout`` seconds. The one slot wait: reserve() at a fixed size (``lo ==
    hi``) and in a range, and the supervisor's restart, whose ``pause(secs)`` returns True when
    the cluster ends meanwhile (then None)."""
    from tfos.cluster.driver.settings import size_to_start

    if why is None:
        def why(slots, secs):
            return (f"cannot reserve min_executors={lo} executors: Spark offers {slots} concurrent task slot(s) "
                    f"after waiting {secs:.0f}s (reservation_timeout). Add executors, lower min_executors, or "
                    "raise reservation_timeout if executors are still starting.")
    if pause is None:
        def pause(secs):
            time.sleep(secs)
            return False
    deadline = Deadline(timeout, clock)
    while True:
        slots = offered()
        size = size_to_start(slots, lo, hi, deadline.elapsed(), size_wait)
        if size is not None:
            return size
        if deadline.expired():
            raise ReservationTimeoutError(why(slots, timeout))
        if pause(deadline.slice(SLOT_POLL_SECS)):
            return None


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
    bind_setting: str = "spark.driver.bindAddress"  # the setting that chose ``bind``


def control_address(spark_conf: dict, environ: dict, default_advertise: str | None = None) -> ControlAddress:
    """Pure: where the driver's control service listens and what it tells executors.

    ``TFOS_SERVER_HOST``/``TFOS_SERVER_PORT`` (TensorFlowOnSpark's variables, for hosts with
    several interfaces; the port may be a range ``9997-9999``, tried in order) win; else Spark's
    own ``spark.driver.host`` (advertised; ``default_advertise`` replaces it, e.g. for a Spark
    Connect client, which is not the Spark driver) and ``spark.driver.bindAddress`` (bound; all
    interfaces if unset). ``TFOS_ADVERTISE_HOST`` changes only what executors are told (NAT,
    port forwarding: an address that reaches this machine but is not one of its own)."""
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
        address = ControlAddress(host, host, ports[0], "TFOS_SERVER_HOST", ports, "TFOS_SERVER_HOST/TFOS_SERVER_PORT")
    else:
        setting = "TFOS_SERVER_HOST" if default_advertise else "spark.driver.host"
        address = ControlAddress(default_advertise or driver_host(spark_conf.get("spark.driver.host")),
                                 spark_conf.get("spark.driver.bindAddress") or "0.0.0.0", ports[0], setting, ports,
                                 "TFOS_SERVER_HOST" if default_advertise else "spark.driver.bindAddress")
    if environ.get("TFOS_ADVERTISE_HOST"):
        address = dataclasses.replace(address, advertise=environ["TFOS_ADVERTISE_HOST"], setting="TFOS_ADVERTISE_HOST")
    return address


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
    """A Spark action running on its own thread in its own job group or tag (cancellable).
    ``on_done(job)`` is called on that thread when the action ended, however it ended; its tasks
    get ``secret`` (if any) as a local property."""

    def __init__(self, spark: "ClassicSpark | ConnectSpark", group: str, description: str, action, on_done=None,
                 secret: str = ""):
        self.spark = spark
        self.group = group
        self.result = None
        self.error: BaseException | None = None
        self.done = threading.Event()

        def target():
            try:
                spark.enter_job(group, description)
                if secret:  # the feeding tasks' way to the cluster's secret (ClassicSpark.lend_secret)
                    spark.lend_secret(secret)
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
            self.spark.cancel_job(self.group)
        self.thread.join(timeout)


# ---------------------------------------------------------------------- the user's Spark entry point
def spark_entry(obj) -> "ClassicSpark | ConnectSpark":
    """Wrap what the user passed (SparkContext, classic SparkSession, Spark Connect SparkSession)."""
    if isinstance(obj, (ClassicSpark, ConnectSpark)) or hasattr(obj, "barrier_stage"):
        return obj  # already an entry point (tfos.testing.fake_spark.FakeSpark is one too)
    if is_connect_session(obj):
        return ConnectSpark(obj)
    if hasattr(obj, "_jsc") and hasattr(obj, "parallelize"):
        return ClassicSpark(obj)
    if hasattr(obj, "sparkContext"):
        return ClassicSpark(obj.sparkContext)
    raise ConfigError(f"expected a SparkContext or a SparkSession (classic or Spark Connect), got {type(obj).__name__}")


def is_connect_session(obj) -> bool:
    return type(obj).__module__.startswith("pyspark.sql.connect")


class ClassicSpark:
    """A SparkContext: RDDs, job groups, the driver JVM's configuration and slot count."""

    connect = False

    def __init__(self, sc):
        self.sc = sc

    def conf(self) -> dict:
        return dict(self.sc.getConf().getAll())

    @property
    def master(self) -> str:
        return self.sc.master

    def wait_for_slots(self, num_executors: int, timeout: float) -> int | None:
        return wait_for_slots(self.sc, num_executors, timeout)

    def slots_offered(self) -> int | None:
        return slots_offered(self.sc)

    def default_fs(self) -> str:
        return spark_default_fs(self.sc)

    def control_address(self, environ: dict) -> ControlAddress:
        address = control_address(self.conf(), environ)
        check_advertised(address, self.master)
        return address

    def enter_job(self, group: str, description: str) -> None:
        self.sc.setJobGroup(group, description, interruptOnCancel=True)

    def lend_secret(self, secret: str) -> None:
        """Make this thread's Spark jobs carry ``secret`` to their tasks as a local property: in the
        task launch messages, never in a closure or block. The property's name is registered in the
        SparkConf, whose keys Spark's event log redacts (a local property alone it writes as is)."""
        conf = self.sc._jsc.sc().conf()
        if not conf.contains(SECRET_PROPERTY):
            conf.set(SECRET_PROPERTY, "(each tfos job's own, redacted)")
        self.sc.setLocalProperty(SECRET_PROPERTY, secret)

    def cancel_job(self, group: str) -> None:
        self.sc.cancelJobGroup(group)

    def barrier_stage(self, n: int, bootstrap):
        """The action that runs ``bootstrap`` as partition i of n barrier tasks; returns their lines.
        Each partition holds the cluster's secret: it reaches the executor in the task launch
        message, never in a block (bootstrap.Bootstrap)."""
        return lambda: self.sc.parallelize(bootstrap.rows(n), n).barrier().mapPartitions(bootstrap).collect()

    def repeat(self, rdd, times: int):
        """An RDD fed ``times`` times in a row (DataFrames are repeated with unionAll by the feeder)."""
        return rdd if times == 1 else self.sc.union([rdd] * times)

    def quiet_console(self) -> None:
        """Stop Spark's console progress bar ("[Stage 0:> (0 + 2) / 2]"), which would redraw over the
        tfos line for as long as the cluster's barrier stage runs. It stays off for this SparkContext."""
        try:
            bar = self.sc._jsc.sc().progressBar()
            if bar.isDefined():
                bar.get().stop()
                logger.info("Spark's console progress bar is off for this session: tfos shows its own")
        except Exception as e:  # SparkContext internals; nothing to do elsewhere
            logger.debug("could not stop Spark's console progress bar: %s", e)

    def parse_type(self, ddl: str):
        from pyspark.sql.types import _parse_datatype_string

        return _parse_datatype_string(ddl)

    def removed_executors(self) -> list[RemovedExecutor]:
        """The executors Spark removed, with the reason its cluster manager gave (e.g. YARN's "Container
        killed by YARN for exceeding physical memory limits"), from the driver's status store."""
        out = []
        try:
            summaries = self.sc._jsc.sc().statusStore().executorList(False)
            for i in range(summaries.size()):
                e = summaries.apply(i)
                reason, when = e.removeReason(), e.removeTime()
                if reason.isDefined():
                    out.append(RemovedExecutor(str(e.id()), str(e.hostPort()).rsplit(":", 1)[0], str(reason.get()),
                                               when.get().getTime() / 1000.0 if when.isDefined() else 0.0))
        except Exception as e:  # SparkContext internals: an explanation is a bonus, never a new failure
            logger.debug("could not read Spark's removed executors: %s", e)
        return out


@dataclasses.dataclass(frozen=True)
class RemovedExecutor:
    executor_id: str
    host: str
    reason: str
    time: float  # epoch seconds


class ConnectSpark:
    """A Spark Connect SparkSession: DataFrames only, tags, and the server's runtime configuration.
    This process is a client of the Spark driver, possibly on another network."""

    connect = True

    def __init__(self, spark):
        self.session = spark

    def get(self, key: str) -> str | None:
        try:
            return self.session.conf.get(key, None)
        except Exception:  # a conf the server will not show
            return None

    def conf(self) -> dict:
        keys = ("spark.master", "spark.driver.host", "spark.driver.bindAddress", "spark.dynamicAllocation.enabled",
                "spark.hadoop.fs.defaultFS") + SPARK_SECURITY
        return {k: v for k in keys if (v := self.get(k)) is not None}

    @property
    def master(self) -> str:
        return self.get("spark.master") or ""

    @property
    def server_host(self) -> str:
        return self.session.client._builder.host

    def wait_for_slots(self, num_executors: int, timeout: float) -> int | None:
        """A Connect client cannot ask the scheduler how many slots it has: the barrier stage itself
        waits for them, and start() gives up after reservation_timeout with the same error."""
        return None

    def slots_offered(self) -> int | None:
        return None  # see wait_for_slots

    def default_fs(self) -> str:
        """``spark.hadoop.fs.defaultFS`` if the session sets it; else "" and every barrier task reads
        its executor's Hadoop configuration (``tfos.data.fs.hadoop_default_fs``)."""
        return self.get("spark.hadoop.fs.defaultFS") or ""

    def control_address(self, environ: dict) -> ControlAddress:
        """The control service runs in this client: executors are told the address of this machine
        on the route to the Connect server (the server's driver address when both share a host)."""
        server = self.server_host
        try:
            local = ipaddress.ip_address(socket.gethostbyname(server)).is_loopback
        except (OSError, ValueError):
            local = False
        if local:  # the Spark driver runs on this machine: its address reaches this client too
            advertise = driver_host(self.get("spark.driver.host"))
        else:
            advertise = route_source_address(server) or driver_host(None)
        address = control_address({}, environ, default_advertise=advertise)  # the server's bind settings are not ours
        if local:
            check_advertised(address, self.master)
        return address

    def enter_job(self, group: str, description: str) -> None:
        self.session.addTag(group)  # the client's tags are per thread

    def lend_secret(self, secret: str) -> None:
        """Nothing: a Connect client sets no local property. Its feeding tasks read the secret that
        a node left on their host (tfos.host.private.load_cluster_secret)."""

    def cancel_job(self, group: str) -> None:
        self.session.interruptTag(group)

    def barrier_stage(self, n: int, bootstrap):
        from tfos.cluster.executor.bootstrap import arrow_bootstrap

        # a local relation of n rows is n partitions of one row (up to the default parallelism, which a
        # barrier stage of n tasks needs anyway): the secret reaches each task in its launch message
        rows = self.session.createDataFrame([(s,) for s in bootstrap.rows(n)], "secret string")
        df = rows.mapInArrow(arrow_bootstrap(bootstrap), "status string", barrier=True)
        return lambda: [r[0] for r in df.collect()]

    def quiet_console(self) -> None:
        """Nothing to stop: the server's console is not this client's, and the Connect client shows
        progress only through handlers the user registers."""

    def removed_executors(self) -> list[RemovedExecutor]:
        return []  # a Connect client cannot see the server's executors

    def parse_type(self, ddl: str):
        return self.session._parse_ddl(ddl)


def raise_no_rdd(what: str):
    raise ConfigError(f"{what} needs a SparkContext, which a Spark Connect session does not have (no RDDs): pass "
                      "a DataFrame instead (spark.createDataFrame(...), spark.read...), or use a classic session")


def route_source_address(host: str, port: int = 15002) -> str | None:
    """This machine's address on the route to ``host`` (no packet is sent: a UDP socket is only
    connected); None if there is no route."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return s.getsockname()[0]
    except OSError:
        return None
