"""TensorFlowOnSpark names after the rename, without Spark: TFNode, TFManager + DataFeed, pipeline
Params and Namespace, dfutil's Example conversions, TFParallel's barrier wait (pure tables)."""

import getpass
import os

import numpy as np
import pytest

from tfos import TFManager, TFNode
from tfos.errors import ConfigError


@pytest.mark.parametrize("fs", ["file://", "file:///", "hdfs://", "viewfs://"])
@pytest.mark.parametrize("path", ["hdfs://foo/bar", "viewfs://foo/bar", "file://foo/bar", "/foo/bar", "foo/bar"])
def test_hdfs_path_reads_only_default_fs_and_working_dir(fs, path):
    """TensorFlowOnSpark's results for each defaultFS form; any object with defaultFS and
    working_dir will do (TensorFlowOnSpark's own test passes a bare class)."""
    cwd = os.getcwd()
    ctx = type("OlderContext", (), {"defaultFS": fs, "working_dir": cwd})
    scheme = fs.split(":")[0]
    if "://" in path:
        want = path
    elif path.startswith("/"):
        want = f"{scheme}://{path}"
    else:
        want = f"file://{cwd}/{path}" if scheme == "file" else f"{scheme}:///user/{getpass.getuser()}/{path}"
    assert TFNode.hdfs_path(ctx, path) == want


def test_local_manager_feeds_a_datafeed_like_tensorflowonspark():
    mgr = TFManager.start(b"abc", ["input", "output"], "local")
    q = mgr.get_queue("input")
    for i in range(10):
        q.put(i)
    q.put(None)
    feed = TFNode.DataFeed(mgr, train_mode=False)
    sizes = []
    while not feed.done_feeding:
        batch = feed.next_batch(4)
        sizes.append(len(batch))
        if batch:
            feed.batch_results(np.square(np.asarray(batch)))
    assert sizes == [4, 4, 2] and feed.should_stop() and feed.closed
    out = mgr.get_queue("output")
    results = [out.get_nowait() for _ in range(out.qsize())]
    assert results == [i * i for i in range(10)] and {type(r) for r in results} == {np.int64}
    mgr.set("state", "running")
    assert mgr.get("state") == "running"


def test_manager_forms_that_do_not_exist_say_so():
    with pytest.raises(ConfigError, match="mode='local'"):
        TFManager.start(b"k", ["input"], "remote")
    with pytest.raises(ConfigError, match="ctx.mgr"):
        TFManager.connect(("127.0.0.1", 1), b"k")


@pytest.mark.parametrize("name,args", [("start_cluster_server", (None,)), ("export_saved_model", (None, "d", "serve", {})),
                                       ("next_batch", (None, 1)), ("batch_results", (None, [])), ("terminate", (None,))])
def test_tf1_helpers_refuse_with_the_replacement(name, args):
    with pytest.raises(ConfigError, match="use "):
        getattr(TFNode, name)(*args)


def test_namespace_and_merged_params():
    from tfos.pipeline import HasBatchSize, HasSteps, Namespace, TFParams

    d = {"string": "foo", "integer": 1, "map": {"a": 1}}
    n = Namespace(Namespace(d))
    assert (n.string, n.integer, n.map) == ("foo", 1, {"a": 1}) and "string" in n and "extra" not in n
    assert Namespace(["--foo", "1"]).argv == ["--foo", "1"] and list(Namespace(["--x"])) == ["--x"]
    with pytest.raises(ConfigError):
        Namespace(42)

    class Foo(TFParams, HasBatchSize, HasSteps):
        def __init__(self, args):
            super().__init__()
            self.args = args

    merged = Foo(Namespace({"a": 1})).setBatchSize(10).setSteps(100).merge_args_params()
    assert merged == Namespace({"a": 1, "batch_size": 10, "steps": 100})


def test_estimator_defaults_and_refusals():
    from tfos import InputMode
    from tfos.pipeline import TFEstimator, TFModel

    est = TFEstimator(lambda args, ctx: None, {"lr": 0.1})
    merged = est.merge_args_params()
    assert (merged.lr, merged.cluster_size, merged.num_ps, merged.batch_size, merged.epochs, merged.master_node,
            merged.input_mode, merged.grace_secs) == (0.1, 1, 0, 100, 1, "chief", 1, 30)
    assert est.setInputMode(InputMode.SPARK).getInputMode() == 1
    with pytest.raises(ConfigError, match="TENSORFLOW"):
        est.setInputMode(InputMode.TENSORFLOW)
    with pytest.raises(ConfigError, match="export_fn"):
        TFEstimator(lambda a, c: None, {}, export_fn=lambda a: None)
    model = TFModel({"x": 1}).setInputMapping({"c": "t"}).setOutputMapping({"t": "o"}).setTagSet("serve")
    assert (model.getInputMapping(), model.getOutputMapping(), model.getTagSet(), model.getSignatureDefKey(),
            model.getBatchSize()) == ({"c": "t"}, {"t": "o"}, "serve", None, 100)


@pytest.mark.parametrize("described,expected", [
    ({"dense": ("float32", 2)}, "cout array<double>"),
    ({"dense": ("float32", 1)}, "cout double"),
    ({"dense": ("int64", 1)}, "cout bigint"),
    ({"dense": ("bool", 1)}, "cout boolean"),
    ({"dense": ("string", 1)}, "cout binary"),
    ({"dense": ("float16", 3)}, "cout array<array<double>>"),
])
def test_model_output_types_follow_the_signature(described, expected):
    from tfos.pipeline import _output_schema

    schema = _output_schema(described, [("dense", "cout")])
    assert ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in schema.fields) == expected


def test_model_output_mapping_must_name_signature_outputs():
    from tfos.pipeline import _output_schema

    with pytest.raises(ConfigError, match="signature's outputs are"):
        _output_schema({"dense": ("float32", 2)}, [("logits", "cout")])


def test_dfutil_example_conversions_round_trip():
    from pyspark.sql import Row

    from tfos import dfutil
    from tfos.data.example import Example

    dtypes = [("a", "string"), ("b", "bigint"), ("c", "array<int>"), ("d", "double"), ("e", "array<float>"),
              ("f", "binary"), ("g", "boolean")]
    row = Row(a="text", b=1, c=[2, 3], d=-1.5, e=[0.5, 0.25], f=bytearray(b"\xff\x00"), g=True)
    [(record, none)] = dfutil.toTFExample(dtypes)([row])
    assert isinstance(record, bytearray) and none is None
    schema = dfutil.infer_schema(Example.FromString(bytes(record)), binary_features=["f"])
    assert [(f.name, f.dataType.simpleString()) for f in schema.fields] == [
        ("a", "string"), ("b", "bigint"), ("c", "array<bigint>"), ("d", "double"), ("e", "array<double>"),
        ("f", "binary"), ("g", "bigint")]
    [back] = dfutil.fromTFExample([(record, None)], binary_features=["f"])
    assert back.asDict() == {"a": "text", "b": 1, "c": [2, 3], "d": -1.5, "e": [0.5, 0.25],
                             "f": bytearray(b"\xff\x00"), "g": 1}
    with pytest.raises(ConfigError, match="timestamp"):
        dfutil.toTFExample([("t", "timestamp")])


@pytest.mark.parametrize("conf,seconds", [({}, 600.0),
                                          ({"spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "3"}, 45.0),
                                          ({"spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "2min"}, 4800.0),
                                          ({"spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "500ms",
                                            "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "4"}, 2.0)])
def test_tfparallel_waits_as_long_as_sparks_barrier_check(conf, seconds):
    from tfos.cluster.driver.tfparallel import barrier_check_seconds

    assert barrier_check_seconds(conf.get) == seconds


def test_tfparallel_refuses_a_bad_count():
    from tfos import TFParallel

    with pytest.raises(ConfigError, match="num_executors"):
        TFParallel.run(None, print, {}, 0)


@pytest.mark.parametrize("argv,expected", [
    (["train.py"], ("train.py", [], 1, 0, "none")),  # workers only: what TF's tutorials expect
    (["--num-executors", "4", "--num-ps", "1", "t.py", "--epochs", "3", "--num-ps", "9"],
     ("t.py", ["--epochs", "3", "--num-ps", "9"], 4, 1, "none")),
    (["--master-node", "chief", "--env", "A=b=c", "t.py"], ("t.py", [], 1, 0, "chief")),
])
def test_tfos_run_arguments(argv, expected):
    """Everything after the script belongs to the script, even options tfos.run also has."""
    from tfos.run import parse_args

    a = parse_args(argv)
    assert (a.script, a.script_args, a.num_executors, a.num_ps, a.master_node) == expected


@pytest.mark.parametrize("argv", [[], ["--env", "novalue", "t.py"]])
def test_tfos_run_refuses_bad_arguments(argv):
    from tfos.run import parse_args

    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2


def test_script_command():
    from tfos.cluster.node.script_process import script_command

    assert script_command("/py", "/d/script-t.py", ["--a", 1]) == ["/py", "-u", "/d/script-t.py", "--a", "1"]


@pytest.mark.parametrize("args,present,expected", [
    ({}, True, 1), ({}, False, 0), ({"num_gpus": 2}, False, 2), ({"num_gpus": 0}, True, 0),
    (__import__("argparse").Namespace(num_gpus=3), True, 3), (__import__("argparse").Namespace(), True, 1),
    ({"num_gpus": "x"}, True, 0),
])
def test_single_node_gpus_as_tensorflowonspark_chose(args, present, expected):
    """tf_args.num_gpus when given, else one GPU if the host has any (TFParallel, single_node_env)."""
    from tfos.cluster.executor.instance import requested_gpus

    assert requested_gpus(args, present) == expected


@pytest.mark.parametrize("fs,expected", [("file:///", "file://"), ("file://", "file://"), ("", "file://"),
                                         ("hdfs://nn:8020", "hdfs://nn:8020"), ("hdfs://", "hdfs://"),
                                         ("viewfs://c/", "viewfs://c/")])
def test_ctx_default_fs_as_tensorflowonspark_gave_it(fs, expected):
    from tfos.data.paths import context_default_fs

    assert context_default_fs(fs) == expected


def test_argv_namespace_contains_searches_the_argv():
    from tfos.pipeline import Namespace

    n = Namespace(["--num_gpus", "2"])
    assert "--num_gpus" in n and "num_gpus" not in n


def test_local_manager_results_go_through_the_wire_format():
    """What a main_fun unit-tested locally gets back is what cluster.inference() would give."""
    mgr = TFManager.start(b"k", ["input", "output"])
    q = mgr.get_queue("input")
    for i in range(3):
        q.put((i, [float(i)] * 2))
    q.put(None)
    feed = TFNode.DataFeed(mgr, train_mode=False)
    rows = feed.next_batch(3)
    feed.batch_results([np.float32(r[0]) for r in rows[:1]] + [np.float64(r[0]) for r in rows[1:]])
    out = mgr.get_queue("output")
    results = [out.get_nowait() for _ in range(out.qsize())]
    assert results == [0.0, 1.0, 2.0] and {type(r) for r in results} == {float}  # mixed numpy types: Python


def test_pickled_train_fn_is_loaded_only_from_files_only_this_user_can_write(tmp_path):
    from tfos.ml.persistence import check_owned_by_me

    d = tmp_path / "train_fn"
    d.mkdir()
    (d / "part-0.parquet").write_bytes(b"x")
    os.chmod(d / "part-0.parquet", 0o644)
    check_owned_by_me(str(d))
    check_owned_by_me("s3a://bucket/x/train_fn")  # object stores have no owners: their policies apply
    with pytest.raises(ConfigError, match="no JVM"):  # HDFS is checked through a classic session's Hadoop client
        check_owned_by_me("hdfs://nn/x/train_fn")
    os.chmod(d / "part-0.parquet", 0o666)
    with pytest.raises(ConfigError, match="writable by others"):
        check_owned_by_me("file://" + str(d))
    os.chmod(d / "part-0.parquet", 0o644)
    os.symlink("/etc/hostname", d / "link")
    with pytest.raises(ConfigError, match="a link"):
        check_owned_by_me(str(d))
