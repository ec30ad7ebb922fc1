"""The TF process's staging of directories TensorFlow cannot open (tfos.cluster.node.staging), on
a file:// "remote" (the HDFS side runs in tests/hadoop)."""

import os
import types

import pytest

from tfos.cluster.node import staging
from tfos.cluster.node.staging import Mirror, needs_staging, upload_order


@pytest.mark.parametrize("uri,staged", [
    ("hdfs://nn:8020/ckpt", True), ("hdfs:///user/me/ckpt", True), ("viewfs://c/x", True), ("s3://b/k", True),
    ("file:///tmp/x", False), ("/tmp/x", False), ("gs://b/x", False), ("", False), (None, False),
])
def test_needs_staging(uri, staged):
    assert needs_staging(uri) is staged


def test_state_files_go_last():
    names = ["checkpoint", "ckpt-2.index", "ckpt-2.data-00000-of-00001", "events.out", "sub/checkpoint"]
    assert upload_order(names) == ["ckpt-2.data-00000-of-00001", "events.out", "ckpt-2.index", "checkpoint",
                                   "sub/checkpoint"]


def _tree(root):
    return {os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), "rb").read()
            for d, _, files in os.walk(root) for f in files}


def test_mirror_restores_uploads_finished_files_and_deletes(tmp_path):
    remote, local = tmp_path / "remote", tmp_path / "local"
    (remote / "old").mkdir(parents=True)
    (remote / "old" / "ckpt-1.index").write_bytes(b"i1")
    m = Mirror(f"file://{remote}", str(local))
    assert m.restore() == 1 and _tree(local) == {"old/ckpt-1.index": b"i1"}
    (local / "ckpt-2.data").write_bytes(b"d" * (9 << 20))  # over one copy block
    (local / "checkpoint").write_bytes(b"state 2")
    assert m.sync() == 0  # seen once: not finished yet
    assert m.sync() == 2
    os.remove(local / "old" / "ckpt-1.index")  # max_to_keep: gone locally, so gone remotely
    (local / "late.txt").write_bytes(b"x")
    m.close()  # the last pass takes what was written just now
    assert _tree(remote) == {"ckpt-2.data": b"d" * (9 << 20), "checkpoint": b"state 2", "late.txt": b"x"}
    assert not [n for n in os.listdir(remote) if n.startswith(".tfos-upload-")]


def test_a_restore_only_mirror_never_writes(tmp_path):
    remote, local = tmp_path / "remote", tmp_path / "local"
    remote.mkdir()
    (remote / "checkpoint").write_bytes(b"s")
    m = Mirror(f"file://{remote}", str(local), upload=False).start()
    (local / "mine").write_bytes(b"rank 1's own file")
    m.close()
    assert _tree(remote) == {"checkpoint": b"s"}


def test_stage_points_ctx_at_local_dirs_and_splits_checkpoint_from_logs(tmp_path, monkeypatch):
    monkeypatch.setattr(staging, "STAGED_SCHEMES", ("file",))
    logs = tmp_path / "logs"
    (logs / "checkpoint").mkdir(parents=True)
    (logs / "checkpoint" / "ckpt-1.index").write_bytes(b"i")
    (logs / "events.rank0").write_bytes(b"e0")
    ctx = types.SimpleNamespace(checkpoint_dir=f"file://{logs}/checkpoint", log_dir=f"file://{logs}", is_chief=False)
    mirrors = staging.stage(ctx, str(tmp_path / "node"), interval=60)
    assert ctx.checkpoint_uri == f"file://{logs}/checkpoint" and ctx.log_uri == f"file://{logs}"
    assert ctx.log_dir == str(tmp_path / "node" / "staging" / "log_dir")
    assert ctx.checkpoint_dir == os.path.join(ctx.log_dir, "checkpoint")
    assert _tree(ctx.log_dir) == {"events.rank0": b"e0", "checkpoint/ckpt-1.index": b"i"}
    with open(os.path.join(ctx.log_dir, "events.rank1"), "wb") as f:
        f.write(b"e1")
    with open(os.path.join(ctx.checkpoint_dir, "ckpt-2.index"), "wb") as f:
        f.write(b"not the chief's")
    for m in mirrors:
        m.close()
    # this rank's logs went up; its checkpoint files did not (rank 0 writes checkpoints)
    assert _tree(logs) == {"events.rank0": b"e0", "events.rank1": b"e1", "checkpoint/ckpt-1.index": b"i"}
