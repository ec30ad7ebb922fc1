"""The Hadoop test cluster itself: HDFS and YARN up through the written HADOOP_CONF_DIR."""

import json
import urllib.request

import pytest

from tfos.testing.hadoop import YARN_NODE, HadoopCluster, HadoopClusterError


def test_hdfs_through_the_written_conf(hadoop, tmp_path):
    """`hdfs dfs -ls /` and friends, by Hadoop's FsShell with DIR/conf: fs.defaultFS is the NameNode."""
    conf = (hadoop.conf_dir / "core-site.xml").read_text()
    assert hadoop.default_fs in conf and hadoop.default_fs.startswith("hdfs://")
    src = tmp_path / "hello.txt"
    src.write_text("hello hdfs\n")
    hadoop.fs("-mkdir", "-p", "/user/test")
    hadoop.fs("-put", "-f", str(src), "/user/test/hello.txt")
    assert "/user/test/hello.txt" in hadoop.fs("-ls", "-R", "/").stdout
    assert hadoop.fs("-cat", "/user/test/hello.txt").stdout == "hello hdfs\n"
    assert hadoop.fs("-stat", "%r", "/user/test/hello.txt").stdout.strip() == "2"  # both DataNodes hold it
    url = f"http://{hadoop.webhdfs_address}/webhdfs/v1/user/test/hello.txt?op=OPEN"
    with urllib.request.urlopen(url, timeout=30) as r:  # WebHDFS redirects to a DataNode
        assert r.read() == b"hello hdfs\n"


def test_yarn_has_both_nodemanagers_running(hadoop):
    with urllib.request.urlopen(f"http://{hadoop.rm_webapp_address}/ws/v1/cluster/nodes", timeout=30) as r:
        nodes = json.load(r)["nodes"]["node"]
    assert [n["state"] for n in nodes] == ["RUNNING", "RUNNING"]
    assert all(n["totalResource"]["memory"] >= 2048 for n in nodes)
    assert "RUNNING" in hadoop.hadoop_cli([YARN_NODE, "-list", "-all"]).stdout
    assert hadoop.missing() == ""


def test_a_second_start_in_the_same_dir_is_refused(hadoop):
    with pytest.raises(HadoopClusterError, match="already runs"):
        HadoopCluster(hadoop.dir).start()
