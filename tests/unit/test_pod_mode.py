"""Kubernetes pods, decided from tables: the tunnel's mode in a pod, the first-use build refused
there, the preStop hook's choice of processes, and the test cluster's build module."""

import os
import subprocess
import sys

import pytest

from tfos.cluster.agent.node_agent import in_pod, tunnel_netns
from tfos.tunnel.agent import pod_mode


@pytest.mark.parametrize("cluster_env,env,want", [
    ({}, {}, "auto"),
    ({}, {"KUBERNETES_SERVICE_HOST": "198.18.128.1"}, "off"),  # a pod: its own namespace, no user namespaces
    ({"TFOS_TUNNEL_NETNS": "auto"}, {"KUBERNETES_SERVICE_HOST": "198.18.128.1"}, "auto"),  # asked for
    ({}, {"TFOS_TUNNEL_NETNS": "off"}, "off"),
    ({"TFOS_TUNNEL_NETNS": "0"}, {}, "off"),
])
def test_tunnel_netns(cluster_env, env, want):
    assert tunnel_netns(cluster_env, env) == want
    assert in_pod(env) == ("KUBERNETES_SERVICE_HOST" in env)


@pytest.mark.parametrize("ready,pod,want", [
    ((7000, "loopback", "EPERM"), True, (7000, "pod", "the pod's own network namespace")),
    ((7000, "loopback", "EPERM"), False, (7000, "loopback", "EPERM")),  # a host's loopback stays a warning
    ((7000, "netns", ""), True, (7000, "netns", "")),
])
def test_pod_mode(ready, pod, want):
    assert pod_mode(*ready, pod) == want


def test_a_pod_never_builds_the_tunnel(monkeypatch, tmp_path):
    from tfos.tunnel import build

    monkeypatch.setenv("TFOS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TFOS_TUNNEL_DIR", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "198.18.128.1")
    build.source_key.cache_clear() if hasattr(build.source_key, "cache_clear") else None
    with pytest.raises(build.TunnelUnavailable, match="runs in a Kubernetes pod.*TFOS_TUNNEL_DIR"):
        build.require()


def test_prestop_finds_only_this_users_agents(tmp_path):
    from tfos.cluster.agent.evict import agent_pids

    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "-m", "tfos.cluster.agent"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        found = agent_pids()
        assert agent.pid in found and other.pid not in found
        assert agent_pids(uid=os.getuid() + 12345) == []
    finally:
        for p in (agent, other):
            p.kill()
            p.wait()


def test_the_build_module_replaces_every_staging_module():
    from tfos.testing.kubernetes.binaries import STAGING, go_mod, ldflags

    text = go_mod("v1.34.2")
    assert "require k8s.io/kubernetes v1.34.2" in text
    assert all(f"k8s.io/{m} => k8s.io/{m} v0.34.2" in text for m in STAGING)
    assert "-X k8s.io/component-base/version.gitVersion=v1.34.2" in ldflags("v1.34.2")
