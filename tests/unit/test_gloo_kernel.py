"""Whether a TF process uses tfos's Gloo op (tfos.tf.gloo_kernel) and how its build fails, decided
without loading one; and the build steps both native builds share (tfos.host.builds). The op
itself is built and run by tests/integration/test_keras_dist.py."""

import os

import pytest

from tfos.errors import TFOSError
from tfos.host import builds
from tfos.tf import gloo_kernel


@pytest.fixture
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TFOS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(gloo_kernel.ENV_SWITCH, raising=False)
    monkeypatch.setattr(gloo_kernel, "_tried", False)
    monkeypatch.setattr(gloo_kernel, "_loaded", None)
    return tmp_path


def test_without_a_build_and_first_use_builds_off_the_py_function_path_runs_and_nothing_is_written(cache,
                                                                                                    monkeypatch):
    monkeypatch.setenv(gloo_kernel.ENV_BUILD, "0")
    assert gloo_kernel.load() is None
    assert not (cache / "cache").exists()


def test_first_use_builds_it_and_a_failed_build_falls_back_saying_which_path_runs(cache, monkeypatch, tmp_path,
                                                                                caplog):
    pytest.importorskip("torch")
    pytest.importorskip("tensorflow")
    cxx = tmp_path / "bin" / "c++"
    cxx.parent.mkdir()
    cxx.write_text("#!/bin/sh\necho \"$@\" >> " + str(tmp_path / "calls") + "\necho 'op.cc:1: error: no' >&2\nexit 1\n")
    cxx.chmod(0o755)
    monkeypatch.setenv("CXX", str(cxx))
    monkeypatch.delenv(gloo_kernel.ENV_BUILD, raising=False)
    assert gloo_kernel.load() is None
    assert "bridge.cc" in (tmp_path / "calls").read_text()  # the first use tried to build it
    assert "could not be built here" in caplog.text and "go through tf.py_function" in caplog.text
    assert not gloo_kernel.built_path().exists()


def test_the_switch_turns_a_build_off(cache, monkeypatch):
    lib = gloo_kernel.built_path()
    lib.parent.mkdir(mode=0o700, parents=True)
    lib.write_bytes(b"\x7fELF")
    monkeypatch.setenv(gloo_kernel.ENV_SWITCH, "0")
    assert gloo_kernel.load() is None


def test_a_build_that_does_not_load_falls_back_with_a_warning(cache, caplog):
    pytest.importorskip("torch")
    lib = gloo_kernel.built_path()
    lib.parent.mkdir(mode=0o700, parents=True)
    lib.write_bytes(b"not a library")
    os.chmod(lib, 0o700)
    assert gloo_kernel.load() is None
    assert "does not load" in caplog.text and "gloo_kernel build" in caplog.text


def test_the_build_is_keyed_by_its_sources_and_versions():
    key = gloo_kernel.source_key("tensorflow-cpu==2.21.0 torch==2.13.0 python 3.11 in /v")
    assert key == gloo_kernel.source_key("tensorflow-cpu==2.21.0 torch==2.13.0 python 3.11 in /v")
    assert key != gloo_kernel.source_key("tensorflow-cpu==2.21.0 torch==2.14.0 python 3.11 in /v")
    assert key != gloo_kernel.source_key("tensorflow-cpu==2.21.0 torch==2.13.0 python 3.11 in /other")
    assert {p.name for p in gloo_kernel.SOURCE.glob("*.cc")} == {"bridge.cc", "op.cc", "reduction.cc"}


def test_a_failed_build_says_so_with_the_compilers_last_lines(cache, monkeypatch, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("tensorflow")
    cxx = tmp_path / "bin" / "c++"
    cxx.parent.mkdir()
    cxx.write_text("#!/bin/sh\necho 'bridge.cc:1: error: expected declaration' >&2\nexit 1\n")
    cxx.chmod(0o755)
    monkeypatch.setenv("CXX", str(cxx))
    with pytest.raises(gloo_kernel.KernelBuildError, match=r"(?s)c\+\+ exit 1.*expected declaration"):
        gloo_kernel.build()
    assert not gloo_kernel.built_path().exists()


class StepFailed(TFOSError):
    pass


def test_a_build_step_that_overruns_is_stopped_and_named(tmp_path):
    with open(tmp_path / "log", "wb") as log, pytest.raises(StepFailed, match="building the thing took over 0.5s"):
        builds.run_step(["sleep", "30"], log, 0.5, "the thing", StepFailed)


def test_build_once_builds_only_what_is_missing_and_installs_whole(cache, tmp_path):
    out = cache / "cache" / "thing-1" / "lib.so"
    calls = []

    def make():
        calls.append(1)
        built = tmp_path / "built.so"
        built.write_bytes(b"library")
        return builds.install(built, out)

    assert builds.build_once(out, "thing.lock", make) == str(out)
    assert builds.build_once(out, "thing.lock", make) == str(out)
    assert calls == [1] and out.read_bytes() == b"library"
    assert oct(out.stat().st_mode & 0o777) == "0o700" and oct(out.parent.stat().st_mode & 0o777) == "0o700"
    assert not out.with_suffix(".tmp").exists()


@pytest.mark.parametrize("env,refused", [
    ({}, None),
    ({"TFOS_GLOO_KERNEL_BUILD": "1"}, None),
    ({"TFOS_GLOO_KERNEL_BUILD": "0"}, "TFOS_GLOO_KERNEL_BUILD=0"),
    ({"CONTAINER_ID": "container_1795_0001_01_000002"}, "a YARN container"),
    ({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, "a Kubernetes pod"),
])
def test_first_use_builds_happen_on_hosts_not_in_containers(env, refused):
    got = builds.first_use_build_refused(env, "TFOS_GLOO_KERNEL_BUILD")
    assert (got is None) if refused is None else (refused in got)


def test_in_a_container_the_op_is_not_built_on_first_use(cache, monkeypatch, tmp_path, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="tfos")
    monkeypatch.delenv(gloo_kernel.ENV_BUILD, raising=False)
    monkeypatch.setenv("CONTAINER_ID", "container_1795_0001_01_000002")
    monkeypatch.setenv("CXX", str(tmp_path / "no-compiler-is-called"))
    assert gloo_kernel.load() is None
    assert "not built on first use (this process runs in a YARN container)" in caplog.text
    assert not (cache / "cache").exists()
