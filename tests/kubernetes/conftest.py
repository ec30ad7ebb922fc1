"""The Kubernetes suite's cluster (``pytest --kubernetes``): one real Kubernetes for the session,
started by tfos.testing.kubernetes (root: its kubelet and containerd need it)."""

import os
import shutil

import pytest


@pytest.fixture(scope="session")
def k8s(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the test Kubernetes runs a kubelet and containerd: root only")
    from tfos.testing.kubernetes import binaries
    from tfos.testing.kubernetes.cluster import KubernetesCluster

    base = "/tmp/tfos-k8s-tests"  # short: containerd's unix sockets live under it
    cluster = KubernetesCluster(base, binaries.build())
    if cluster.running():
        cluster.destroy()
    shutil.rmtree(base, ignore_errors=True)
    cluster.start()
    yield cluster
    if os.environ.get("TFOS_K8S_KEEP"):  # keep the logs and the job directories to read after a failure
        cluster.stop()
    else:
        cluster.destroy()
