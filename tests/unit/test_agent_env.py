"""The node agent's pure decisions about its TF process: memory environment, where its log goes."""

import pytest


@pytest.mark.parametrize("env,added", [
    ({}, True),
    ({"PATH": "/bin", "MALLOC": "x"}, True),
    ({"MALLOC_ARENA_MAX": "2"}, False),             # the user tunes malloc: theirs alone
    ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"}, False),
    ({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, False),  # another allocator
    ({"LD_PRELOAD": ""}, True),
])
def test_malloc_environment_of_the_tf_process(env, added):
    from tfos.cluster.agent.node_agent import MALLOC_DEFAULTS, malloc_environment

    assert malloc_environment(env) == (MALLOC_DEFAULTS if added else {})


@pytest.mark.parametrize("env,expected", [
    ({}, {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "TF_CPU_ALLOCATOR_USE_BFC"}),
    ({"MALLOC_ARENA_MAX": "2"}, {"TF_CPU_ALLOCATOR_USE_BFC"}),  # the user's malloc, TF's BFC
    ({"TF_CPU_ALLOCATOR_USE_BFC": "false"}, {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"}),
    ({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2", "TF_CPU_ALLOCATOR_USE_BFC": ""}, set()),
])
def test_memory_environment_of_the_tf_process(env, expected):
    from tfos.cluster.agent.node_agent import memory_environment

    added = memory_environment(env)
    assert set(added) == expected
    if "TF_CPU_ALLOCATOR_USE_BFC" in expected:
        assert added["TF_CPU_ALLOCATOR_USE_BFC"] == "true"


@pytest.mark.parametrize("env,expected", [
    ({}, "/tmp/n/node-3.log"),
    ({"LOG_DIRS": ""}, "/tmp/n/node-3.log"),
    ({"LOG_DIRS": "/nm/logs/application_1_0001/container_1_0001_01_000002"},  # a YARN container
     "/nm/logs/application_1_0001/container_1_0001_01_000002/tfos-node-3.log"),
    ({"LOG_DIRS": "/d1/logs/c2,/d2/logs/c2"}, "/d1/logs/c2/tfos-node-3.log"),
])
def test_the_node_log_goes_to_the_yarn_container_log_dir_or_the_kept_logs(env, expected):
    from tfos.cluster.agent.node_agent import node_log_path

    assert node_log_path("/tmp/n", 3, env) == expected


def test_kept_logs_keep_the_newest_clusters(tmp_path, monkeypatch):
    import os
    import tempfile

    from tfos.cluster.agent import node_agent as S

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(S, "KEEP_CLUSTER_LOGS", 3)
    made = []
    for i in range(5):
        made.append(S.kept_logs_dir(f"c{i}"))
        os.utime(made[-1], (1000 + i, 1000 + i))
    left = sorted(os.listdir(tmp_path / f"tfos-{os.getuid()}" / "logs"))
    assert left == ["c2", "c3", "c4"] and oct(os.stat(made[-1]).st_mode & 0o777) == "0o700"
