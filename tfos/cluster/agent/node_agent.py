"""The node agent's supervisor loop (runs in the node agent process).

It starts the node's TF process with its GPU pinning and the user's environment, captures its
output in the node log, sends heartbeats to the driver, and stops the TF process (SIGTERM,
grace period, SIGKILL) when the driver asks, when the driver is unreachable for
``heartbeat_timeout``, or when the executor JVM is gone.

The TF process runs under a reaper (``tfos.cluster.agent.reaper``), the agent's child: it stops the TF
process and every descendant of it when the agent asks (SIGTERM) or dies, and exits as the TF
process did. The reaper gets SIGTERM when the agent dies (PR_SET_PDEATHSIG), the TF process
also has a pipe watchdog, so nothing started for the node outlives its supervisor.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from tfos.cluster.agent import reaper
from tfos.host.gpus import gpu_environment, pick_gpus
from tfos.errors import NONRETRYABLE_FILE, PEER_FAILED_FILE, Cause, TFOSError
from tfos.host import cgroup, private, processes
from tfos.host.deadline import Deadline
from tfos.topology import CPU_ONLY_JOBS
from tfos.tunnel.agent import NodeTunnel
from tfos.wire import messages as M
from tfos.wire.clients import DriverClient

logger = logging.getLogger(__name__)

#: How the TF process is started: ``python -u -m tfos.cluster.node`` (pure, tested).
TF_PROCESS_MODULE = "tfos.cluster.node"
#: How long the agent tries to report the TF process's exit to a driver it can reach.
REPORT_EXIT_SECS = 15.0
#: What the agent allows the reaper beyond the stop grace before it SIGKILLs it.
REAPER_MARGIN_SECS = reaper.KILL_WAIT_SECS + 2.0


def tf_process_command(python: str) -> list[str]:
    return [python, "-u", "-m", TF_PROCESS_MODULE]


#: glibc malloc settings for the TF process: feed chunks and tensors are MiB-sized buffers that glibc
#: would otherwise map and unmap (each new one page-faulting its memory in again); keeping freed memory
#: for reuse costs RSS at its peak (bench/README, "Constants": malloc).
MALLOC_DEFAULTS = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(512 << 20),
                   "MALLOC_TOP_PAD_": str(64 << 20)}


def malloc_environment(env) -> dict[str, str]:
    """Pure: the malloc settings to add to the TF process's environment ``env``: tfos's defaults,
    unless ``env`` already tunes malloc (any ``MALLOC_*`` variable or ``GLIBC_TUNABLES``) or
    preloads another allocator (``LD_PRELOAD``)."""
    if "GLIBC_TUNABLES" in env or env.get("LD_PRELOAD") or any(k.startswith("MALLOC_") for k in env):
        return {}
    return dict(MALLOC_DEFAULTS)


#: TensorFlow's own settings for the TF process: its BFC allocator for host memory, which reuses freed
#: tensor memory instead of page-faulting each fresh tensor in; RSS stays at its peak (bench/README,
#: "Constants": TF's allocator).
TF_ALLOCATOR_DEFAULTS = {"TF_CPU_ALLOCATOR_USE_BFC": "true"}


def memory_environment(env) -> dict[str, str]:
    """Pure: the memory settings to add to the TF process's environment ``env``: the malloc ones
    (:func:`malloc_environment`) and TF's BFC host allocator unless ``env`` sets
    ``TF_CPU_ALLOCATOR_USE_BFC`` itself."""
    out = malloc_environment(env)
    out.update({k: v for k, v in TF_ALLOCATOR_DEFAULTS.items() if k not in env})
    return out


def node_log_path(logs_dir: str, node_index: int, env) -> str:
    """Pure: where the node's log (the TF process's stdout and stderr) goes. In a YARN container
    (``LOG_DIRS`` set by the NodeManager) it is the container's first log directory, so
    ``yarn logs -applicationId ...`` collects it with the executor's own logs; elsewhere
    ``node-<i>.log`` in ``logs_dir`` (:func:`kept_logs_dir`). Both outlive the node directory."""
    log_dirs = [d for d in env.get("LOG_DIRS", "").split(",") if d]
    if log_dirs:
        return os.path.join(log_dirs[0], f"tfos-node-{node_index}.log")
    return os.path.join(logs_dir, f"node-{node_index}.log")


#: node logs of this many clusters are kept on each host (the oldest directories go first)
KEEP_CLUSTER_LOGS = 20


def kept_logs_dir(cluster_id: str) -> str:
    """``<tmp>/tfos-<uid>/logs/<cluster_id>`` (private, 0700): the node logs of a cluster, kept after
    it ends; creating it removes the oldest clusters' logs beyond KEEP_CLUSTER_LOGS."""
    parent = private.private_dir("logs")
    path = private.private_dir("logs", cluster_id)
    try:
        others = sorted((e for e in os.scandir(parent) if e.is_dir(follow_symlinks=False) and e.path != path),
                        key=lambda e: e.stat(follow_symlinks=False).st_mtime)
    except OSError:
        return path
    for old in others[:max(0, len(others) - (KEEP_CLUSTER_LOGS - 1))]:
        shutil.rmtree(old.path, ignore_errors=True)
    return path


class NodeAgent:
    def __init__(self, cfg: M.NodeConfig):
        self.cfg = cfg
        self.oom_kills_before = 0  # the container's OOM kills before the TF process started (cgroup)
        self.driver = DriverClient.for_node(cfg)
        self.beats = DriverClient.for_node(cfg)  # heartbeats only, on one connection held until the agent ends
        self.beats.keep_connection()
        self.stop_event = threading.Event()  # a termination signal
        self.wake = threading.Event()  # supervise() looks again now: a termination signal, or the TF process ended
        self.proc: subprocess.Popen | None = None  # the reaper, parent of the TF process
        self.log_path = node_log_path(kept_logs_dir(cfg.cluster.cluster_id) if "LOG_DIRS" not in os.environ else "",
                                      cfg.node_index, os.environ)
        self.error_path = os.path.join(cfg.node_dir, "error.txt")
        self.tunnel: NodeTunnel | None = None  # with encryption on: TF's and Gloo's private network (tfos.tunnel)
        self._watch_w: int | None = None
        self._dumped = 0  # the last stack request answered

    def start_tf_process(self, gpus: list[str]) -> None:
        cfg = self.cfg
        watch_r, watch_w = os.pipe()
        self._watch_w = watch_w  # held open for the TF process's lifetime; closes when we die
        env = dict(os.environ)
        env.update({k: str(v) for k, v in cfg.cluster.env.items()})
        env.update(gpu_environment(gpus))
        env.update(memory_environment(env))
        if self.tunnel is not None:  # after the malloc settings, which an LD_PRELOAD of the user's would turn off
            env.update(self.tunnel.environment(env))
        env["PYTHONUNBUFFERED"] = "1"
        tf_cfg = dataclasses.replace(cfg, gpus=tuple(gpus), watchdog_fd=watch_r,
                                     tunnel=self.tunnel.info if self.tunnel is not None else None)
        command = reaper.reaper_command(cfg.python, cfg.cluster.stop_grace_secs, (watch_r,),
                                        tf_process_command(cfg.python))
        self.oom_kills_before = cgroup.memory_state()[1]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                         pass_fds=(watch_r,), cwd=cfg.working_dir, env=env, start_new_session=True,
                                         preexec_fn=_reaper_dies_with_agent)
        os.close(watch_r)
        self.proc.stdin.write(M.encode(tf_cfg) + b"\n")
        self.proc.stdin.close()

    def run(self) -> int:
        cfg = self.cfg
        try:
            limits = cfg.cluster.gpus_per_node
            gpus = pick_gpus(cfg.cluster.num_gpus, cfg.spark_gpus,
                             limits[cfg.node_index] if cfg.node_index < len(limits) else None
                             ) if cfg.job_name not in CPU_ONLY_JOBS else []
            if cfg.cluster.key.encrypt:
                self.tunnel = NodeTunnel(cfg, tunnel_netns(cfg.cluster.env, os.environ), pod=in_pod(os.environ))
                self.tunnel.start()
            self.start_tf_process(gpus)
            self.driver.agent_started(cfg.host, os.getpid(), self.proc.pid, self.log_path)
        except Exception as e:
            logger.exception("node agent failed to start the TF process")
            _say(f"FAILED {type(e).__name__}: {e}")
            if self.proc:
                self.stop_tf_process()
            if self.tunnel is not None:
                self.tunnel.stop()
            return 1
        _say(f"STARTED tf_pid={self.proc.pid} gpus={','.join(gpus) or 'none'}")
        # the TF process's end wakes supervise() at once, not at its next heartbeat: a restart starts sooner
        threading.Thread(target=lambda: (self.proc.wait(), self.wake.set()), name="tfos-tf-exit", daemon=True).start()
        logger.info("TF process started under reaper %d for node %d (%s:%d), gpus=%s", self.proc.pid,
                    cfg.node_index, cfg.job_name, cfg.task_index, gpus or "none")
        cause, why = Cause.AGENT_ERROR, "error in the node agent"
        try:
            cause, why = self.supervise()
        finally:
            code = self.stop_tf_process()
            if self.tunnel is not None:
                self.tunnel.stop()
        code = -9 if code is None else code
        peak_rss_mb = processes.children_peak_rss_mb()  # the TF process's: the reaper waited for it
        logger.info("TF process of node %d exited with code %s (%s)", cfg.node_index, code, why or "finished")
        limit, oom_kills = cgroup.memory_state()  # a container's OOM kill of the TF process: its limit, named
        self.report_exit(code, cause, why, peak_rss_mb, memory_limit_mb=(limit or 0) >> 20,
                         oom_killed=oom_kills > self.oom_kills_before)
        self.beats.close()  # after the exit report: the driver never reads this end as the agent's loss
        if code == 0 or cause is Cause.STOPPED:  # a failed node keeps its directory (logs) for debugging
            logging.shutdown()
            private.remove_tree(cfg.node_dir)
            private.release_cluster_secret(os.path.dirname(cfg.node_dir))  # when no node of it is left here
        return 0

    def stop_tf_process(self) -> int | None:
        """SIGTERM the reaper, which stops the TF process and its descendants within the stop grace
        (plus KILL_WAIT_SECS for SIGKILLed ones); SIGKILL the reaper if it takes longer. Returns the
        reaper's exit code, which is the TF process's (None if even SIGKILL did not end it)."""
        grace = self.cfg.cluster.stop_grace_secs + REAPER_MARGIN_SECS
        return processes.terminate(self.proc, grace, "TF process reaper")

    def supervise(self) -> "tuple[Cause, str]":
        """Watch the TF process until it exits (``Cause.EXITED``) or must be stopped (``Cause.STOPPED``
        when the driver asked, else why the agent stopped it), with the reason in words ("" when the
        process ended on its own or the driver asked)."""
        c = self.cfg.cluster
        last_contact = time.monotonic()
        evicted: tuple[float, Cause, str] | None = None  # told to go, saving first: (until when, cause, why)
        while True:
            self.wake.clear()
            if self.proc.poll() is not None:
                return Cause.EXITED, ""
            if self.stop_event.is_set() and evicted is None:
                evicted = self.told_to_go(Cause.EVICTED, "the node agent received a termination signal")
                if evicted is None:
                    return Cause.EVICTED, "the node agent received a termination signal"
            if evicted is not None and time.monotonic() >= evicted[0]:
                logger.error("the cluster did not save within eviction_grace (%.0fs); stopping the TF process",
                             c.eviction_grace)
                return evicted[1], f"{evicted[2]}; the cluster did not save within eviction_grace " \
                                   f"({c.eviction_grace:.0f}s)"
            ended = self.tunnel.exit_code() if self.tunnel is not None else None
            if ended is not None:
                logger.error("the node's tunnel exited with code %s; stopping the TF process", ended)
                return Cause.TUNNEL_LOST, f"the node's tunnel exited with code {ended} (TF and Gloo lost their network; see " \
                       f"{os.path.join(self.cfg.node_dir, 'tunnel.log')})"
            jvm = self.cfg.jvm_pid
            if jvm and evicted is None and not processes.alive(jvm):
                why = f"the executor JVM (pid {jvm}) is gone"
                evicted = self.told_to_go(Cause.EXECUTOR_LOST, why)
                if evicted is None:
                    logger.error("executor JVM %d is gone; stopping the TF process", jvm)
                    return Cause.EXECUTOR_LOST, why
            try:
                # a busy driver answers late, not never: waiting as long as it would wait for us
                # keeps the connection (closing it would read as this agent's end, a false loss)
                reply = self.beats.heartbeat_reply(timeout=c.heartbeat_timeout)
                last_contact = time.monotonic()
                if reply.stop:
                    logger.info("driver asked node %d to stop", self.cfg.node_index)
                    return Cause.STOPPED, ""
                if reply.dump > self._dumped:  # the driver wants the TF process's stacks (stall, dump_stacks)
                    self._dumped = reply.dump
                    threading.Thread(target=self.send_stacks, args=(reply.dump,), name="tfos-stacks",
                                     daemon=True).start()
            except (TFOSError, OSError) as e:
                if time.monotonic() - last_contact > c.heartbeat_timeout:
                    logger.error("lost the driver for %.0fs (%s); stopping the TF process", c.heartbeat_timeout, e)
                    return Cause.DRIVER_LOST, f"no contact with the driver for {c.heartbeat_timeout:.0f}s"
            self.wake.wait(c.heartbeat_interval)

    def told_to_go(self, cause: Cause, why: str) -> "tuple[float, Cause, str] | None":
        """This node must go (``why``): tell the driver. When the cluster saves first (every training
        rank checkpoints at one step, ``ctx.should_checkpoint``), the TF process runs on until the
        driver stops it or ``eviction_grace`` passes: returns (until when, cause, why); else None
        (stop it now)."""
        grace = self.cfg.cluster.eviction_grace
        if grace <= 0:
            return None
        try:
            save = self.driver.eviction_notice(grace, why, executor_gone=cause is Cause.EXECUTOR_LOST)
        except (TFOSError, OSError) as e:
            logger.warning("could not tell the driver that this node must go: %s", e)
            return None
        if not save:
            return None
        logger.warning("%s: the cluster saves first (up to %.0fs, eviction_grace)", why, grace)
        return time.monotonic() + grace, cause, why

    def send_stacks(self, request: int) -> None:
        """Have the TF process write every thread's stack (STACKS_SIGNAL) and send them to the driver
        with the log's last lines."""
        path = os.path.join(self.cfg.node_dir, processes.STACKS_FILE)
        pid = tf_process_pid(self.proc.pid)
        text = "(the TF process is not running)"
        if pid is not None:
            try:
                start = os.path.getsize(path)
            except OSError:
                start = 0
            try:
                os.kill(pid, processes.STACKS_SIGNAL)
                text = processes.read_new_output(path, start) or "(the TF process wrote no stacks within 3s)"
            except OSError as e:
                text = f"(could not signal the TF process {pid}: {e})"
        try:
            self.driver.node_stacks(request, text, processes.tail(self.log_path, 40))
        except (TFOSError, OSError) as e:
            logger.warning("could not send the TF process's stacks: %s", e)

    def report_exit(self, code: int, cause: Cause, reason: str = "", peak_rss_mb: int = 0, *,
                    memory_limit_mb: int = 0, oom_killed: bool = False) -> None:
        """Tell the driver how the TF process ended: retried for REPORT_EXIT_SECS, or tried once
        briefly when the driver was already lost (the agent must not linger for a dead driver)."""
        try:
            with open(self.error_path) as f:
                tb = f.read()
        except OSError:
            tb = ""
        retryable = not os.path.exists(os.path.join(self.cfg.node_dir, NONRETRYABLE_FILE))
        peer_failed = os.path.exists(os.path.join(self.cfg.node_dir, PEER_FAILED_FILE))
        driver_lost = cause is Cause.DRIVER_LOST
        deadline = Deadline(2.0 if driver_lost else REPORT_EXIT_SECS)
        attempt = 0
        while True:
            attempt += 1
            try:
                self.driver.node_exited(code, tb, processes.tail(self.log_path, 40), self.log_path,
                                        cause is Cause.STOPPED, reason, retryable=retryable, peak_rss_mb=peak_rss_mb,
                                        cause=cause, memory_limit_mb=memory_limit_mb, oom_killed=oom_killed,
                                        peer_failed=peer_failed,
                                        timeout=max(0.5, deadline.slice(10.0)))
                return
            except (TFOSError, OSError) as e:
                if deadline.remaining() <= 1.0:
                    logger.warning("could not report the exit to the driver (%d attempts): %s", attempt, e)
                    return
                time.sleep(1.0)


def tunnel_netns(cluster_env, env) -> str:
    """Pure: whether the tunnel tries a private network namespace ("auto") or uses the host's loopback
    ("off"): ``TFOS_TUNNEL_NETNS`` in reserve(env=...), else in the executor's environment. In a
    Kubernetes pod the default is "off": the pod's network namespace is already private to the
    pod's containers, and a pod may not make user namespaces (seccomp RuntimeDefault refuses them)."""
    value = cluster_env.get("TFOS_TUNNEL_NETNS", env.get("TFOS_TUNNEL_NETNS", "off" if in_pod(env) else "auto"))
    return "off" if value.lower() in ("0", "off", "false", "no") else "auto"


def in_pod(env) -> bool:
    """Pure: whether this process runs in a Kubernetes pod (the kubelet sets KUBERNETES_SERVICE_HOST
    in every container)."""
    return bool(env.get("KUBERNETES_SERVICE_HOST"))


def tf_process_pid(reaper_pid: int) -> int | None:
    """The TF process: the reaper's child that runs ``-m tfos.cluster.node`` (None once it ended)."""
    for pid, ppid in reaper.process_parents().items():
        if ppid == reaper_pid:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if TF_PROCESS_MODULE.encode() in f.read():
                        return pid
            except OSError:
                continue
    return None


def _reaper_dies_with_agent() -> None:
    """preexec_fn of the reaper: SIGTERM (which it handles by stopping the TF process and its
    descendants) when the agent dies."""
    processes.die_with_parent(signal.SIGTERM)


def _say(line: str) -> None:
    """Tell the barrier task how the start went, then detach from its pipe."""
    try:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    except OSError:
        pass


def main() -> int:
    cfg = M.decode(sys.stdin.buffer.readline())
    if not isinstance(cfg, M.NodeConfig):
        raise TFOSError(f"the node agent expects a NodeConfig on stdin, got {type(cfg).__name__}")
    logging.basicConfig(filename=os.path.join(cfg.node_dir, "agent.log"), level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    agent = NodeAgent(cfg)
    def stop(*_):
        agent.stop_event.set()
        agent.wake.set()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return agent.run()
