"""Failures that name their cause: what the driver adds to a node failure from Spark's view of the
executor it lost, and arguments that cannot reach the executors, refused on the driver."""

import argparse
import threading

import pytest

from tfos.errors import ConfigError


def _removed(executor_id, host, reason, t=100.0):
    from tfos.cluster.driver.spark import RemovedExecutor

    return RemovedExecutor(executor_id, host, reason, t)


YARN_PMEM = ("Container killed by YARN for exceeding physical memory limits. 2.4 GB of 2.2 GB physical memory "
             "used. Consider boosting spark.executor.memoryOverhead.")


@pytest.mark.parametrize("cause,removed,expect", [
    ("RAISED", [_removed("2", "h1", YARN_PMEM)], []),   # not a loss: nothing to add
    ("EXITED", [_removed("2", "h1", YARN_PMEM)], []),
    ("STOPPED", [_removed("2", "h1", YARN_PMEM)], []),
    ("EXECUTOR_LOST", [_removed("2", "h1", YARN_PMEM)], ["executor 2 on h1", "exceeding physical memory",
                                                          "raise spark.executor.memoryOverhead"]),
    ("AGENT_LOST", [_removed("3", "h2", "Executor heartbeat timed out"),
                    _removed("2", "h1", "Command exited with code 1")],
     ["executor 2 on h1: Command exited with code 1", "!h2", "!memoryOverhead"]),  # the node's host only
    ("AGENT_LOST", [_removed("3", "h2", "OOMKilled")], ["executor 3 on h2", "memoryOverhead"]),
    ("AGENT_LOST", [_removed("2", "h1", YARN_PMEM, t=10.0)], []),  # before this attempt
    ("AGENT_LOST", [], []),
    ("KILLED", [_removed("2", "h1", YARN_PMEM)], ["raise spark.executor.memoryOverhead"]),
    ("EVICTED", [_removed("2", "h1", "Executor decommission.")], ["executor 2 on h1: Executor decommission"]),
])
def test_an_executor_loss_explains_a_node_failure(cause, removed, expect):
    from tfos.cluster.driver.lifecycle import explain_executor_loss
    from tfos.errors import Cause

    text = explain_executor_loss("h1", Cause[cause], removed, since=50.0)
    if not expect:
        assert text == ""
    for e in expect:
        assert (e[1:] not in text) if e.startswith("!") else (e in text), text


@pytest.mark.parametrize("code,raised,agent,expected", [
    (0, False, "EXITED", "EXITED"), (1, False, "EXITED", "EXITED"), (1, True, "EXITED", "RAISED"),
    (-9, False, "EXITED", "KILLED"), (-15, False, "EVICTED", "EVICTED"), (-15, True, "STOPPED", "STOPPED"),
    (-15, False, "EXECUTOR_LOST", "EXECUTOR_LOST"), (-15, False, "DRIVER_LOST", "DRIVER_LOST"),
])
def test_failure_cause_table(code, raised, agent, expected):
    from tfos.cluster.driver.lifecycle import failure_cause
    from tfos.errors import Cause

    assert failure_cause(code, raised, Cause[agent]) is Cause[expected]


def test_the_cause_travels_typed_and_a_bad_one_is_refused():
    from tfos.errors import Cause, ProtocolError
    from tfos.wire import messages as M

    msg = M.NodeExited("c", 1, -15, "", "", "", False, "the node agent received a termination signal",
                       cause=Cause.EVICTED)
    data = M.encode(msg)
    assert b'"cause":"evicted"' in data and M.decode(data) == msg and M.decode(data).cause is Cause.EVICTED
    with pytest.raises(ProtocolError, match="NodeExited.cause: not a Cause"):
        M.decode(data.replace(b'"evicted"', b'"gone fishing"'))


def _fine(args, ctx):
    return args


def _notebook_main_fun():
    """A main_fun as a notebook defines it (module __main__, pickled by value with its globals),
    using a lock the notebook made."""
    ns = {"__name__": "__main__"}
    exec("import threading\nLOCK = threading.Lock()\ndef main_fun(args, ctx):\n    with LOCK:\n        return args\n",
         ns)
    return ns["main_fun"]


def _closure_main_fun():
    lock = threading.Lock()

    def main_fun(args, ctx):
        with lock:
            return args
    return main_fun


class _SparkContextLike:
    def __reduce__(self):
        raise RuntimeError("It appears that you are attempting to reference SparkContext from a broadcast variable")


@pytest.mark.parametrize("main_fun,args,named", [
    (_fine, {"lr": 0.1}, None),
    (_notebook_main_fun(), None, "main_fun's global 'LOCK' (_thread.lock)"),
    (_closure_main_fun(), None, "main_fun's closure variable 'lock' (_thread.lock)"),
    (_fine, argparse.Namespace(epochs=2, sc=_SparkContextLike()), "args.sc (test_failure_messages._SparkContextLike)"),
    (_fine, {"opts": {"pool": [1, threading.RLock()]}}, "args['opts']['pool'][1] (_thread.RLock)"),
])
def test_what_cannot_reach_the_executors_is_named_on_the_driver(main_fun, args, named):
    from tfos.cluster.driver.settings import check_picklable

    if named is None:
        check_picklable(main_fun, args)
        return
    with pytest.raises(ConfigError) as info:
        check_picklable(main_fun, args)
    assert str(info.value).startswith(named + " cannot be pickled"), str(info.value)
    assert "inside main_fun" in str(info.value)


@pytest.mark.parametrize("code,raised,agent_reason,peak,expect", [
    (1, False, "", 0, ["TF process exited with code 1", "!OOM"]),
    (3, True, "", 0, ["the TF process raised an exception", "!OOM"]),
    (-9, False, "", 2300, ["killed by signal 9", "likely by the kernel's OOM killer (peak RSS 2300 MB)",
                           "spark.executor.memoryOverhead", "dmesg"]),
    (-9, False, "", 0, ["likely by the kernel's OOM killer:", "!peak RSS"]),
    (-9, False, "the executor JVM (pid 7) is gone", 900, ["!OOM", "the node agent stopped it: the executor JVM"]),
    (-15, False, "", 900, ["killed by signal 15", "!OOM"]),
])
def test_a_tf_process_killed_by_sigkill_is_named_a_likely_oom_kill(code, raised, agent_reason, peak, expect):
    from tfos.cluster.driver.lifecycle import exit_reason

    text = exit_reason(code, raised, agent_reason, peak)
    for e in expect:
        assert (e[1:] not in text) if e.startswith("!") else (e in text), text



def test_the_peak_memory_of_a_waited_for_grandchild_is_seen():
    """The agent's view: its child (the reaper) waited for the TF process, which used ~200 MB."""
    import subprocess
    import sys

    from tfos.host import processes

    grandchild = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'x = bytearray(200 << 20)'])"
    subprocess.run([sys.executable, "-c", grandchild], check=True)
    assert processes.children_peak_rss_mb() >= 200


def _failure(node, reason, tb="", peer_failed=False):
    from tfos.errors import NodeFailure

    return NodeFailure(node, "worker", node, "h", reason, 1, tb, peer_failed=peer_failed)


COLLECTIVE = ("tensorflow.python.framework.errors_impl.UnavailableError: Collective ops is aborted by: "
              "task /job:worker/replica:0/task:2 stopped sending heartbeats")


@pytest.mark.parametrize("arrived,expected", [
    # (node, traceback, its TF process found a peer's failure behind it)
    ([(0, COLLECTIVE, True), (2, "ValueError: rank 2's own bug", False), (1, COLLECTIVE, True)], [2, 0, 1]),
    ([(1, "ValueError: a", False), (0, "KeyError: b", False)], [1, 0]),    # two own errors: in arrival order
    ([(0, "DistBackendError: Connection reset by peer", True), (1, "", False)], [1, 0]),  # 1 killed: no traceback
    ([(0, COLLECTIVE, True)], [0]),                                      # nothing better is known: it still shows
    ([(0, "ValueError: mentions UnavailableError in its text", False), (1, COLLECTIVE, True)], [0, 1]),  # types, not text
])
def test_the_first_cause_leads_and_the_rest_follow_as_then(arrived, expected):
    from tfos.cluster.driver.lifecycle import first_cause_first
    from tfos.errors import NodeFailedError

    ordered = first_cause_first([_failure(n, "TF process exited with code 1", tb, peer) for n, tb, peer in arrived])
    assert [f.node_index for f in ordered] == expected
    text = str(NodeFailedError(ordered))
    assert text.startswith(f"[node {expected[0]} ")
    assert text.count("\nthen [node ") == len({f.traceback or f.reason for f in ordered}) - 1


def _raised(exc, cause=None, context=None):
    """``exc`` as raised: from ``cause``, or while ``context`` was being handled."""
    try:
        if context is not None:
            try:
                raise context
            except BaseException:
                raise exc
        raise exc from cause
    except BaseException as e:
        return e


def _tf_errors():
    import tensorflow as tf

    return tf.errors


@pytest.mark.parametrize("make,peer", [
    (lambda: ValueError("rank 1's own bug"), False),
    (lambda: ValueError("Connection reset by peer (only the text says so)"), False),
    (lambda: ConnectionResetError(104, "Connection reset by peer"), True),
    (lambda: BrokenPipeError(32, "Broken pipe"), True),
    (lambda: __import__("tfos.errors").errors.CollectiveError("Gloo all-reduce failed"), True),
    (lambda: _raised(RuntimeError("step failed"), cause=ConnectionRefusedError(111, "refused")), True),
    (lambda: _raised(KeyError("x"), context=ConnectionResetError(104, "reset")), True),  # raised while handling one
    (lambda: __import__("tfos.errors").errors.NonRetryable("bad input"), False),
    (lambda: _tf_errors().UnavailableError(None, None, "Collective ops is aborted by: task 2"), True),
    (lambda: _tf_errors().CancelledError(None, None, "cancelled"), True),
    (lambda: _tf_errors().InvalidArgumentError(None, None, "shapes"), False),
])
def test_the_tf_process_tells_a_peers_failure_from_its_own_by_type(make, peer, tmp_path):
    from tfos.cluster.node.exits import caused_by_a_peer, write_error
    from tfos.errors import NONRETRYABLE_FILE, PEER_FAILED_FILE, NonRetryable

    exc = make()
    assert caused_by_a_peer(exc) is peer
    write_error(str(tmp_path), "Traceback ...", exc)
    assert (tmp_path / "error.txt").read_text() == "Traceback ..."
    assert (tmp_path / PEER_FAILED_FILE).exists() is peer
    assert (tmp_path / NONRETRYABLE_FILE).exists() is isinstance(exc, NonRetryable)


def test_a_tfos_collective_ops_error_in_a_tf_function_reaches_main_fun_as_collective_error():
    """In a tf.function a tfos op can raise only TF's own errors: the TF process raises one whose
    message carries COLLECTIVE_ERROR as CollectiveError (a peer's failure, by type)."""
    from tfos.cluster.node.exits import caused_by_a_peer
    from tfos.cluster.node.runtime import run_main
    from tfos.errors import COLLECTIVE_ERROR, CollectiveError

    class Hooks:
        @staticmethod
        def run(main_fun, args, ctx):
            return main_fun(args, ctx)

    def main_fun(_args, _ctx):
        raise _tf_errors().InternalError(None, None, f"{COLLECTIVE_ERROR}Gloo all-reduce failed on rank 0 of 2 "
                                                     "(a peer died or stopped answering): Read error")

    with pytest.raises(CollectiveError, match=r"^Gloo all-reduce failed on rank 0 of 2") as got:
        run_main(Hooks, main_fun, None, None)
    assert caused_by_a_peer(got.value)


@pytest.mark.parametrize("driver,here,expected", [
    ({"tfos": "0.1.0", "tensorflow": "2.21.0"}, {"tfos": "0.1.0", "tensorflow": "2.21.0"}, None),
    ({"tfos": "0.1.0", "tensorflow": ""}, {"tfos": "0.1.0", "tensorflow": "2.15.1"}, None),  # no TF on the driver
    ({"tfos": "0.2.0", "tensorflow": "2.21.0"}, {"tfos": "0.1.0", "tensorflow": "2.21.0"},
     "tfos 0.2.0 on the driver but tfos 0.1.0 on executor host h7 (Python /env/bin/python). Install the same"),
    ({"tfos": "0.1.0", "tensorflow": "2.21.0"}, {"tfos": "0.1.0", "tensorflow": "2.15.1"},
     "tensorflow 2.21.0 on the driver but tensorflow 2.15.1 on executor host h7"),
    ({}, {"tfos": "0.1.0", "tensorflow": "2.15.1"}, None),  # an older driver sends none: nothing to compare
])
def test_version_mismatch_names_both_versions(driver, here, expected):
    from tfos.host.versions import version_mismatch

    got = version_mismatch(driver, here, "h7", "/env/bin/python")
    assert (got is None) if expected is None else (expected in got and "spark.archives" in got), got


@pytest.mark.parametrize("num,smi,claimed,match", [
    (1, [], [], r"node needs 1 GPU\(s\) on host h3, but nvidia-smi is not there or shows no GPU"),
    (2, [("0", 2500, 90), ("1", 10, 0)], ["1"], r"node needs 2 GPU\(s\) on host h3 and 0 of 2 are free: GPU 0 "
                                                r"\(2500 MiB in use: held by another job\), GPU 1 \(claimed by "
                                                r"another tfos node\)"),
])
def test_gpu_shortage_names_the_host_what_it_saw_and_what_it_needed(num, smi, claimed, match):
    from tfos.errors import ConfigError
    from tfos.host.gpus import choose_gpus

    with pytest.raises(ConfigError, match=match):
        choose_gpus(num, None, smi, claimed, host="h3")


@pytest.mark.parametrize("text,expected", [
    ("ValueError: Attempt to convert a value (PerReplica:{0: <tf.Tensor ...>}) with an unsupported type",
     "Keras 3's model.fit cannot run under"),
    ("RuntimeError: Collective ops must be configured at program startup", "call ctx.strategy() (or create"),
    ("    <tf.Tensor: shape=(64, 28, 28)>\n}) with an unsupported type (<class "
     "'tensorflow.python.distribute.values.PerReplica'>) to a Tensor.", "Keras 3's model.fit cannot run under"),
    ("ValueError: something else entirely", ""),
])
def test_hints_name_the_fix_for_failures_whose_message_does_not(text, expected):
    from tfos.cluster.node.hints import hint

    got = hint("Traceback (most recent call last):\n  ...\n" + text)
    assert (expected in got) if expected else got == ""
