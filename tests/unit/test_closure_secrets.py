"""What tfos hands Spark as task functions holds no secret (issue 53): Spark ships a task's closure
as a broadcast block, which its block managers serve to anyone while spark.authenticate is off.
The barrier stage gets the secret as its partitions' data, the feeding tasks from the file a node
left in this user's private directory on the host. (The attack itself, on a real application:
tests/integration/test_security.py.)"""

import os
import pickle

import pytest
from pyspark import cloudpickle

from tfos.cluster.executor.bootstrap import arrow_bootstrap, make_bootstrap
from tfos.errors import FeedError
from tfos.feed.executor.credentials import task_config
from tfos.feed.executor.producer import make_inference_feeder, make_train_feeder
from tfos.host import private
from tfos.wire import messages as M

SECRET = "5e" * 32


@pytest.fixture
def tmpdir_private(tmp_path, monkeypatch):
    """This user's private directory under a fresh temp dir."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def cluster(encrypt=True):
    return M.ClusterConfig("c0ffee", M.ChannelKey(SECRET, encrypt), "10.0.0.1", 4000, (("worker", 0), ("worker", 1)),
                           1, 600.0, "/logs", "file:///")


def feed_config():
    return M.FeedConfig("c0ffee", M.ChannelKey(SECRET, True), "10.0.0.1", 4000, "f1", "input", 60.0, (0, 1),
                        ((0, "10.0.0.2", 5000), (1, "10.0.0.3", 5000)))


def main_fun(args, ctx):
    return args


def holds(blob: bytes) -> bool:
    return SECRET.encode() in blob or bytes.fromhex(SECRET) in blob


def test_the_barrier_stage_function_pickles_without_the_secret_which_travels_as_its_partitions():
    boot = make_bootstrap(cluster(), main_fun, {"lr": 0.1}, None)
    for shipped in (boot, arrow_bootstrap(boot)):  # classic RDD stage; Spark Connect's mapInArrow
        assert not holds(cloudpickle.dumps(shipped))
    assert boot.rows(3) == [SECRET] * 3  # the stage's data, sent in the task launch messages
    assert boot.keyed().key == M.ChannelKey(SECRET, True)  # for stages that stay in this process
    copy = pickle.loads(cloudpickle.dumps(boot))
    assert copy.cluster.key == M.ChannelKey("", True) and copy.keyed().key.secret == ""
    assert copy.program[1] == {"lr": 0.1} and boot.cluster.roles == cluster().roles


def test_the_barrier_task_refuses_a_partition_without_the_secret():
    from tfos.errors import ConfigError

    with pytest.raises(ConfigError, match="no cluster secret"):
        next(make_bootstrap(cluster(), main_fun, None, None)(iter(())))


@pytest.mark.parametrize("arrow_input", [True, False])
def test_feeding_functions_pickle_without_the_secret(arrow_input):
    cfg = feed_config()
    assert not holds(cloudpickle.dumps(make_train_feeder(cfg, arrow_input)))
    assert not holds(cloudpickle.dumps(make_inference_feeder(cfg, arrow_input)))
    assert cfg.key.secret == SECRET  # the driver's own copy keeps it


def test_a_feeding_task_takes_the_secret_a_node_left_on_its_host(tmpdir_private):
    sealed = M.FeedConfig(**{**feed_config().__dict__, "key": M.ChannelKey("", True)})
    with pytest.raises(FeedError, match="no node of tfos cluster c0ffee ran on this host.*Spark Connect.*reserve a node on every"):
        task_config(sealed)
    private.store_cluster_secret("c0ffee", SECRET)
    path = os.path.join(private.private_dir("c0ffee"), private.SECRET_FILE)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert task_config(sealed).key == M.ChannelKey(SECRET, True)
    private.store_cluster_secret("c0ffee", SECRET)  # a second node on the host: replaced, not refused
    assert private.load_cluster_secret("c0ffee") == SECRET


@pytest.mark.parametrize("planted", ["group-readable", "symlink"])
def test_a_secret_file_that_is_not_private_is_refused(tmpdir_private, planted):
    directory = private.private_dir("c0ffee")
    path = os.path.join(directory, private.SECRET_FILE)
    if planted == "symlink":
        other = os.path.join(str(tmpdir_private), "elsewhere")
        with open(other, "w") as f:
            f.write("ff" * 32)
        os.symlink(other, path)
    else:
        with open(path, "w") as f:
            f.write("ff" * 32)
        os.chmod(path, 0o640)
    with pytest.raises(private.UnsafeDirectoryError):
        private.load_cluster_secret("c0ffee")


def test_the_secret_leaves_the_host_with_its_last_node(tmpdir_private):
    directory = private.private_dir("c0ffee")
    nodes = [private.fresh_dir(directory, f"node-{i}") for i in range(2)]
    private.store_cluster_secret("c0ffee", SECRET)
    private.remove_tree(nodes[0])
    private.release_cluster_secret(directory)
    assert private.load_cluster_secret("c0ffee") == SECRET  # node 1 still runs here
    private.remove_tree(nodes[1])
    private.release_cluster_secret(directory)
    assert private.load_cluster_secret("c0ffee") is None and not os.path.exists(directory)
