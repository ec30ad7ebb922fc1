"""tfos.keras_dist and tfos.tf without processes: module aliases, imports, rank/size and
coordination tables, communication options, compression, the implementation choice.
(tests/integration/test_keras_dist.py runs the collectives in real worker processes.)"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TF_MODULES = ("keras_dist", "distribute", "callbacks")


def test_the_public_modules_live_at_their_documented_names():
    """tfos.keras_dist, tfos.distribute and tfos.callbacks are the modules themselves (their
    ``__name__`` is what the README says, for IDEs and tracebacks); keras_dist's parts share one
    process state; the migration names are modules too, with no sys.modules swapping."""
    import importlib

    import tfos
    from tfos.keras_dist import DistributedOptimizer, _state
    from tfos.tf import optimizer, workers

    for name in TF_MODULES:
        module = importlib.import_module(f"tfos.{name}")
        assert module.__name__ == f"tfos.{name}" and module.__file__.endswith(f"tfos/{name}.py"), name
        assert getattr(tfos, name) is module and sys.modules[f"tfos.{name}"] is module, name
    assert not os.path.exists(os.path.join(ROOT, "tfos", "tf", "keras_dist.py"))
    assert DistributedOptimizer is optimizer.DistributedOptimizer and _state is workers._state
    for name in ("TFNode", "TFManager", "TFParallel", "pipeline", "dfutil", "compat"):
        module = importlib.import_module(f"tfos.{name}")
        assert module.__name__ == f"tfos.{name}", name
    from tfos import TFNode, compat
    from tfos.tf import compat as tf_compat

    assert compat.TFNode is TFNode and callable(TFNode.DataFeed)
    for name in ("export_saved_model", "disable_auto_shard", "is_gpu_available"):
        assert getattr(compat, name) is getattr(tf_compat, name), name


def test_keras_dist_callbacks_load_keras_only_when_named():
    code = ("import sys; from tfos import keras_dist; assert 'keras' not in sys.modules; "
            "cb = keras_dist.BroadcastInitialWeights(0); import keras; assert isinstance(cb, keras.callbacks.Callback); "
            "assert 'BackupAndRestore' in dir(keras_dist)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


def test_importing_tfos_tf_does_not_import_tensorflow():
    mods = ", ".join(["tfos.tf"] + [f"tfos.{m}" for m in TF_MODULES] + [f"tfos.tf.{m}" for m in (
        "collectives", "compression", "workers", "primitives", "optimizer")])
    code = f"import sys, {mods}; assert 'tensorflow' not in sys.modules, 'tensorflow imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


_CHIEF_WORKERS = {"chief": ["c:1"], "worker": ["w:1", "w:2"]}
_MASTER_WORKERS = {"master": ["m:1"], "worker": ["w:1", "w:2"], "ps": ["p:1"], "evaluator": ["e:1"]}
_WORKERS = {"worker": ["w:1", "w:2"]}


@pytest.mark.parametrize("cluster,task_type,index,expected", [
    ({"chief": ["c:1"]}, "chief", 0, (0, 1)),
    (_CHIEF_WORKERS, "chief", 0, (0, 3)),
    (_CHIEF_WORKERS, "worker", 0, (1, 3)),
    (_CHIEF_WORKERS, "worker", 1, (2, 3)),
    (_MASTER_WORKERS, "master", 0, (0, 3)),
    (_MASTER_WORKERS, "worker", 0, (1, 3)),
    (_MASTER_WORKERS, "worker", 1, (2, 3)),
    (_WORKERS, "worker", 0, (0, 2)),
    (_WORKERS, "worker", 1, (1, 2)),
    (_MASTER_WORKERS, "ps", 0, ValueError),
    (_MASTER_WORKERS, "evaluator", 0, ValueError),
])
def test_rank_and_size_table(cluster, task_type, index, expected):
    from tfos import keras_dist

    tf_config = {"cluster": cluster, "task": {"type": task_type, "index": index}}
    for cfg in (tf_config, json.dumps(tf_config)):
        if expected is ValueError:
            with pytest.raises(ValueError, match="have a rank"):
                keras_dist._task(cfg)
        else:
            assert keras_dist._task(cfg)[3:] == expected


def test_no_tf_config_is_rank_0_of_1(monkeypatch):
    from tfos import keras_dist

    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert keras_dist._task(None)[3:] == (0, 1)
    assert keras_dist._task({"cluster": _WORKERS})[3:] == (0, 1)  # no task: not part of a cluster


@pytest.mark.parametrize("cluster,expected", [
    (_CHIEF_WORKERS, [("chief", 1), ("worker", 2)]),
    (_MASTER_WORKERS, [("master", 1), ("worker", 2)]),  # no ps/evaluator; rank 0's job leads
    (_WORKERS, [("worker", 2)]),
])
def test_coordination_service_jobs(cluster, expected):
    from tfos import keras_dist

    assert keras_dist._coordinated_jobs(cluster) == expected


def test_communication_options():
    import tensorflow as tf

    from tfos.tf.collectives import communication_options

    impl = tf.distribute.experimental.CommunicationImplementation
    opts = communication_options("RING", bytes_per_pack=1024, timeout_seconds=5.0)
    assert (opts.implementation, opts.bytes_per_pack, opts.timeout_seconds) == (impl.RING, 1024, 5.0)
    assert communication_options().implementation == impl.AUTO
    assert communication_options("nccl").implementation == impl.NCCL
    with pytest.raises(ValueError, match="communication must be"):
        communication_options("gloo")


def test_fp16_compression_round_trip():
    import numpy as np
    import tensorflow as tf

    from tfos.tf import compression

    assert compression.check("none") is None and compression.check("fp16") == "fp16"
    with pytest.raises(ValueError, match="compression must be"):
        compression.check("int8")
    wires = []
    for rank in (0, 1):  # two replicas' float32 gradients
        wire, compressed = compression.compress(tf.constant([2.0, 40000.0 + 10000.0 * rank]), "fp16", 2)
        assert compressed and wire.dtype == tf.float16
        wires.append(wire)
    summed = wires[0] + wires[1]  # what the SUM all-reduce computes; fp16 (max 65504) summing
    # 40000 + 50000 would overflow: the pre-division makes it 20000 + 25000
    mean = compression.decompress(summed, tf.float32, 2)
    total = compression.decompress(summed, tf.float32, 2, average=False)
    assert mean.dtype == total.dtype == tf.float32
    np.testing.assert_allclose(mean.numpy(), [2.0, 45000.0], rtol=1e-3)
    np.testing.assert_allclose(total.numpy(), [4.0, 90000.0], rtol=1e-3)
    for t, comp in ((tf.constant([1, 2]), "fp16"), (tf.constant([1.0]), None)):
        assert compression.compress(t, comp, 2) == (t, False)


def test_no_autoshard():
    import tensorflow as tf

    from tfos.data.datasets import no_autoshard

    ds = no_autoshard(tf.data.Dataset.range(3))
    assert ds.options().experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.OFF
    assert list(ds.as_numpy_iterator()) == [0, 1, 2]


@pytest.mark.parametrize("requested,communication,installed,gpus,reducers,expected", [
    ("auto", "auto", True, 0, 0, "gloo"),   # CPU host with PyTorch: Gloo by default
    ("auto", "auto", False, 0, 0, "tf"),    # no PyTorch: TF's RING (and a hint in the log)
    ("auto", "auto", True, 2, 0, "tf"),     # GPU host: NCCL through TF
    ("auto", "ring", True, 0, 0, "tf"),     # an explicit TF communication asks for TF
    ("AUTO", "nccl", True, 0, 0, "tf"),
    ("tf", "auto", True, 0, 0, "tf"),
    ("gloo", "auto", True, 2, 0, "gloo"),   # forced, even on GPU hosts
    ("gloo", "auto", False, 0, 0, ValueError),
    ("mpi", "auto", True, 0, 0, ValueError),
    ("auto", "auto", True, 0, 2, "reduction_server"),  # the cluster has reducers: through them
    ("auto", "auto", False, 0, 2, "tf"),    # no PyTorch, no Gloo connections to reach them
    ("auto", "ring", True, 0, 2, "tf"),     # TF's collectives asked for by name
    ("gloo", "auto", True, 0, 2, "gloo"),   # a ring, reducers or not
    ("reduction_server", "auto", True, 0, 0, "reduction_server"),  # the group then says none are there
    ("Reduction_Server", "auto", False, 0, 2, ValueError),
])
def test_choose_implementation_table(requested, communication, installed, gpus, reducers, expected):
    from tfos.tf.collectives import choose_implementation

    if expected is ValueError:
        with pytest.raises(ValueError):
            choose_implementation(requested, communication, installed, gpus, reducers)
    else:
        assert choose_implementation(requested, communication, installed, gpus, reducers) == expected


def test_keras3_models_are_not_taken_for_keras2():
    """Keras 3 models carry some of Keras 2's private methods: compat.export_saved_model must still
    use Keras 3's export (model.save(save_format='tf') raises there)."""
    keras = pytest.importorskip("keras")
    from tfos.tf.compat import _is_keras2

    if not keras.__version__.startswith("3."):
        pytest.skip("Keras 3 only")
    assert not _is_keras2(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))


class _T:
    """What packs() reads of a tensor: its dtype and static shape."""

    def __init__(self, dtype, n):
        import tensorflow as tf

        self.dtype, self.shape = tf.as_dtype(dtype), tf.TensorShape([n])


@pytest.mark.parametrize("tensors, bytes_per_pack, alone, expected", [
    # no limits: one pack per dtype, in first-appearance order
    ([("float32", 10), ("int64", 3), ("float32", 5)], 0, 0, [[0, 2], [1]]),
    # bytes_per_pack closes a pack before it would overflow
    ([("float32", 256)] * 3, 2048, 0, [[0, 1], [2]]),
    # alone: a 1 MiB float32 goes on its own (reduced in its own memory), the small ones packed around it
    ([("float32", 10), ("float32", 1 << 18), ("float32", 7)], 0, 1 << 20, [[1], [0, 2]]),
    # just under the threshold is packed
    ([("float32", (1 << 18) - 1), ("float32", 1)], 0, 1 << 20, [[0, 1]]),
    # every tensor big: no concat at all
    ([("float32", 1 << 20), ("float32", 1 << 19)], 0, 1 << 20, [[0], [1]]),
    # both limits together, per dtype
    ([("float16", 600), ("float16", 600), ("float16", 1 << 20), ("float16", 600)], 2600, 1 << 20,
     [[2], [0, 1], [3]]),
])
def test_packs_table(tensors, bytes_per_pack, alone, expected):
    from tfos.tf.collectives import packs

    got = packs([_T(d, n) for d, n in tensors], bytes_per_pack, alone_bytes=alone)
    assert sorted(got) == sorted(expected)
