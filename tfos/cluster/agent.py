"""The node agent: one per node, a detached process started by the Spark barrier task.

It owns the node's TF process: picks its GPUs, starts it with TF_CONFIG inputs, GPU pinning and
the user's environment, captures its output in the node log, reports to the driver, and stops
it (SIGTERM, grace period, SIGKILL) when the driver asks, when the driver is unreachable, or
when the executor JVM is gone. The TF process dies with the agent (PR_SET_PDEATHSIG + a pipe
watchdog), so no TF process outlives its supervisor.

Run as ``python -m tfos.cluster.agent`` with the node configuration as one JSON line on stdin.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from tfos import protocol as P
from tfos.cluster import decisions, host
from tfos.errors import TFOSError

logger = logging.getLogger("tfos.cluster.agent")


def _smi_gpus() -> list[tuple[str, int, int]]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run([exe, "--query-gpu=index,memory.used,utilization.gpu",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return decisions.parse_nvidia_smi(out.stdout) if out.returncode == 0 else []


def pick_gpus(cfg: dict) -> list[str]:
    """Spark-assigned GPUs, else free GPUs from nvidia-smi claimed under a host-wide lock."""
    if cfg["spark_gpus"]:
        return list(cfg["spark_gpus"])
    if not cfg.get("num_gpus"):
        return []
    with host.claims() as reg:
        gpus = decisions.choose_gpus(cfg["num_gpus"], None, _smi_gpus(), reg["gpus"].keys())
        for g in gpus:
            reg["gpus"][g] = os.getpid()
    return gpus


class NodeAgent:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.driver = (cfg["driver_host"], cfg["driver_port"])
        self.stop_event = threading.Event()
        self.proc: subprocess.Popen | None = None
        self.log_path = os.path.join(cfg["node_dir"], "node.log")
        self.error_path = os.path.join(cfg["node_dir"], "error.txt")

    def _call(self, msg, timeout=10.0):
        return P.call(self.driver, self.cfg["secret"], msg, timeout=timeout, what="tfos driver")

    def start_tf_process(self, gpus: list[str]) -> None:
        cfg = self.cfg
        watch_r, watch_w = os.pipe()
        self._watch_w = watch_w  # held open for the TF process's lifetime; closes when we die
        env = dict(os.environ)
        env.update({k: str(v) for k, v in (cfg.get("env") or {}).items()})
        env.update(decisions.gpu_environment(gpus))
        env["PYTHONUNBUFFERED"] = "1"
        tf_cfg = dict(cfg, gpus=gpus, watchdog_fd=watch_r)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(decisions.tf_process_command(cfg["python"]), stdin=subprocess.PIPE,
                                         stdout=log, stderr=subprocess.STDOUT, pass_fds=(watch_r,),
                                         cwd=cfg["working_dir"], env=env, start_new_session=True,
                                         preexec_fn=host.die_with_parent)
        os.close(watch_r)
        self.proc.stdin.write((json.dumps(tf_cfg) + "\n").encode())
        self.proc.stdin.close()

    def run(self) -> int:
        cfg = self.cfg
        try:
            gpus = pick_gpus(cfg)
            self.start_tf_process(gpus)
            self._call(P.AgentStarted(cfg["cluster_id"], cfg["node_index"], cfg["host"], os.getpid(),
                                      self.proc.pid, self.log_path))
        except Exception as e:
            logger.exception("node agent failed to start the TF process")
            _say(f"FAILED {type(e).__name__}: {e}")
            if self.proc:
                host.terminate(self.proc, 0, "TF process")
            return 1
        _say(f"STARTED tf_pid={self.proc.pid} gpus={','.join(gpus) or 'none'}")
        logger.info("TF process %d started for node %d (%s:%d), gpus=%s", self.proc.pid, cfg["node_index"],
                    cfg["job_name"], cfg["task_index"], gpus or "none")
        why = "error in the node agent"
        try:
            why = self.supervise()
        finally:
            code = host.terminate(self.proc, cfg["stop_grace_secs"], "TF process")
        code = -9 if code is None else code
        logger.info("TF process of node %d exited with code %s (%s)", cfg["node_index"], code, why or "finished")
        self.report_exit(code, why == "driver", "" if why in ("", "driver") else why)
        return 0

    def supervise(self) -> str:
        """Watch the TF process until it exits ("") or must be stopped: "driver" when the driver asked,
        else a description of why the agent stopped it."""
        cfg = self.cfg
        last_contact = time.monotonic()
        interval = cfg["heartbeat_interval"]
        while True:
            if self.proc.poll() is not None:
                return ""
            if self.stop_event.is_set():
                logger.warning("node agent received a termination signal; stopping the TF process")
                return "the node agent received a termination signal"
            if cfg.get("jvm_pid") and not host._alive(cfg["jvm_pid"]):
                logger.error("executor JVM %d is gone; stopping the TF process", cfg["jvm_pid"])
                return f"the executor JVM (pid {cfg['jvm_pid']}) is gone"
            try:
                reply = self._call(P.Heartbeat(cfg["cluster_id"], cfg["node_index"]), timeout=5.0)
                last_contact = time.monotonic()
                if reply.stop:
                    logger.info("driver asked node %d to stop", cfg["node_index"])
                    return "driver"
            except (TFOSError, OSError) as e:
                if time.monotonic() - last_contact > cfg["heartbeat_timeout"]:
                    logger.error("lost the driver for %.0fs (%s); stopping the TF process",
                                 cfg["heartbeat_timeout"], e)
                    return f"no contact with the driver for {cfg['heartbeat_timeout']:.0f}s"
            self.stop_event.wait(interval)

    def report_exit(self, code: int, stopped_by_driver: bool, reason: str = "") -> None:
        cfg = self.cfg
        try:
            with open(self.error_path) as f:
                tb = f.read()
        except OSError:
            tb = ""
        msg = P.NodeExited(cfg["cluster_id"], cfg["node_index"], code, tb, host.tail(self.log_path, 40),
                           self.log_path, stopped_by_driver, reason)
        for attempt in range(3):
            try:
                self._call(msg, timeout=10.0)
                return
            except (TFOSError, OSError) as e:
                logger.warning("could not report the exit to the driver (attempt %d): %s", attempt + 1, e)
                time.sleep(1.0)


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
    cfg = json.loads(sys.stdin.readline())
    logging.basicConfig(filename=os.path.join(cfg["node_dir"], "agent.log"), level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    agent = NodeAgent(cfg)
    signal.signal(signal.SIGTERM, lambda *_: agent.stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: agent.stop_event.set())
    return agent.run()


if __name__ == "__main__":
    raise SystemExit(main())
