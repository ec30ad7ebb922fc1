"""Kubernetes' own binaries, built with Go from the source module ``k8s.io/kubernetes`` (the Go
module proxy serves it; no release binaries are downloaded) into this user's cache, by version.

The source module's go.mod points its ``k8s.io/*`` staging modules at ``./staging/...``, which
the module zip leaves out; a build module of ours requires ``k8s.io/kubernetes`` and replaces
each of them with the published module of the same release (``v0.X.Y`` for ``v1.X.Y``).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

from tfos.errors import TFOSError
from tfos.host.private import user_cache_dir

log = logging.getLogger(__name__)

VERSION = "v1.34.2"
COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl", "etcd")
#: the etcd server that k8s.io/kubernetes at VERSION requires (its go.mod): Debian 12's etcd 3.4 is too old
#: for the API server's watch streams ("RequestWatchProgress is disabled")
ETCD_VERSION = "v3.6.4"
ETCD_MAIN = """// etcd at the version Kubernetes requires, from go.etcd.io/etcd/server/v3 (built by tfos's tests).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
"""
#: the staging modules of k8s.io/kubernetes at VERSION (its go.mod's ./staging replaces)
STAGING = ("api", "apiextensions-apiserver", "apimachinery", "apiserver", "cli-runtime", "client-go",
           "cloud-provider", "cluster-bootstrap", "code-generator", "component-base", "component-helpers",
           "controller-manager", "cri-api", "cri-client", "csi-translation-lib", "dynamic-resource-allocation",
           "endpointslice", "externaljwt", "kms", "kube-aggregator", "kube-controller-manager", "kube-proxy",
           "kube-scheduler", "kubectl", "kubelet", "metrics", "mount-utils", "pod-security-admission",
           "sample-apiserver", "sample-cli-plugin", "sample-controller")
BUILD_TIMEOUT = 3600.0


class BuildError(TFOSError):
    """Kubernetes' binaries could not be built."""


def go_mod(version: str = VERSION) -> str:
    """Pure: the build module's go.mod."""
    staging = "v0." + version.split(".", 1)[1]
    lines = ["module tfos.local/k8sbuild", "", "go 1.24.0", "", f"require k8s.io/kubernetes {version}", "", "replace ("]
    lines += [f"\tk8s.io/{m} => k8s.io/{m} {staging}" for m in STAGING]
    return "\n".join(lines + [")", ""])


def ldflags(version: str = VERSION) -> str:
    """Pure: the linker flags that give the binaries their release's version (servers and kubectl
    report it; without them they say v0.0.0-master)."""
    major, minor = version.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {pkg}.gitVersion={version}", f"-X {pkg}.gitMajor={major}", f"-X {pkg}.gitMinor={minor}",
                  f"-X {pkg}.gitTreeState=clean"]
    return " ".join(flags)


def bin_dir(version: str = VERSION) -> Path:
    return Path(user_cache_dir(f"kubernetes-{version}")) / "bin"


def build(version: str = VERSION) -> Path:
    """The directory holding every command of ``COMMANDS``, built unless already there."""
    out = bin_dir(version)
    stamp = out / ".built"
    if stamp.is_file() and stamp.read_text() == ldflags(version) + ETCD_VERSION and all((out / c).is_file() for c in COMMANDS):
        return out
    go = shutil.which("go")
    if go is None:
        raise BuildError("building Kubernetes needs Go (1.24 or later) on PATH")
    src = out.parent / "src"
    src.mkdir(exist_ok=True)
    (src / "go.mod").write_text(go_mod(version))
    (src / "cmd" / "etcd").mkdir(parents=True, exist_ok=True)
    (src / "cmd" / "etcd" / "main.go").write_text(ETCD_MAIN)
    env = {**os.environ, "GOMODCACHE": str(Path(user_cache_dir("go-mod"))), "GOFLAGS": "-mod=mod",
           "CGO_ENABLED": "1"}
    start = time.monotonic()
    log.info("building Kubernetes %s (%s) with Go: minutes, once", version, ", ".join(COMMANDS))
    kube = [c for c in COMMANDS if c != "etcd"]
    steps = [[go, "get", *(f"k8s.io/kubernetes/cmd/{c}@{version}" for c in kube),
              f"go.etcd.io/etcd/server/v3@{ETCD_VERSION}"],
             [go, "build", "-trimpath", "-ldflags", ldflags(version), "-o", str(out) + "/",
              *(f"k8s.io/kubernetes/cmd/{c}" for c in kube)],
             [go, "build", "-trimpath", "-ldflags", "-s -w", "-o", str(out / "etcd"), "./cmd/etcd"]]
    out.mkdir(exist_ok=True)
    for argv in steps:
        done = subprocess.run(argv, cwd=src, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
        if done.returncode != 0:
            raise BuildError(f"{' '.join(argv[:2])} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    stamp.write_text(ldflags(version) + ETCD_VERSION)
    log.info("Kubernetes %s built in %.0f s", version, time.monotonic() - start)
    return out
