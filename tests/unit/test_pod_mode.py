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
    from tfos.cluster.executor.bootstrap import AGENT_MODULE

    # the module it runs as (python -m tfos.cluster.agent.evict) looks for the agents' module itself
    found = subprocess.run([sys.executable, "-c", "import runpy; runpy.run_module('tfos.cluster.agent.evict', "
                            "run_name='__main__', alter_sys=True)", "--help"], capture_output=True, text=True)
    assert found.returncode == 0
    import tfos.cluster.agent.evict as evict

    assert evict.AGENT_MODULE == AGENT_MODULE

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


def test_cgroup_memory_files():
    from tfos.host.cgroup import parse_limit, parse_oom_kills

    assert parse_limit("2147483648\n") == 2 << 30 and parse_limit("max\n") is None
    assert parse_limit("9223372036854771712\n") is None  # cgroup v1's "no limit"
    assert parse_oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n") == 3  # v1 memory.oom_control
    assert parse_oom_kills("low 0\nhigh 0\nmax 5\noom 1\noom_kill 1\n") == 1  # v2 memory.events
    assert parse_oom_kills("") == 0


def test_an_oom_kill_in_a_container_names_its_limit_and_the_setting():
    from tfos.cluster.driver.lifecycle import exit_reason

    said = exit_reason(-9, False, "", 1900, memory_limit_mb=2048, oom_killed=True)
    assert "OOM killer" in said and "memory limit of 2048 MiB" in said and "spark.executor.memoryOverhead" in said
    assert "likely" in exit_reason(-9, False, "", 1900)  # no count from a cgroup: a guess, said as one
