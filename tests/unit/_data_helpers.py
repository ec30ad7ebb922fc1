"""Helpers shared by the tfos.data unit tests (test_data.py, test_data_readers.py)."""

import pytest


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


def _uri(path) -> str:
    return "file://" + str(path)


def _touch(path, size=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)


def _take_all(ds):
    return [{k: v.numpy() for k, v in b.items()} if isinstance(b, dict) else b.numpy() for b in ds]


def _policy_off(tf, ds):
    return ds.options().experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.OFF
