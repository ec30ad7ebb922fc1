"""Which hdfs:// plugin a TF process loads (tfos.data.tfhdfs), decided without building or loading
one: the switch, a plugin named by the environment, and the build's cache key."""

import os

import pytest

from tfos.data import tfhdfs
from tfos.errors import HadoopConfigError
from tfos.host.private import UnsafeDirectoryError


@pytest.fixture
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TFOS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(tfhdfs.ENV_PLUGIN, raising=False)
    monkeypatch.delenv(tfhdfs.ENV_SWITCH, raising=False)
    return tmp_path


def test_without_a_build_there_is_no_plugin(cache):
    assert tfhdfs.plugin_path() is None
    assert tfhdfs.built_path().parent.parent == cache / "cache"


def test_a_build_in_the_cache_is_found_and_the_switch_turns_it_off(cache, monkeypatch):
    lib = tfhdfs.built_path()
    lib.parent.mkdir(mode=0o700, parents=True)
    lib.write_bytes(b"\x7fELF")
    assert tfhdfs.plugin_path() == str(lib)
    monkeypatch.setenv(tfhdfs.ENV_SWITCH, "0")
    assert tfhdfs.plugin_path() is None


def test_a_plugin_named_by_the_environment_must_exist_and_be_safe(cache, monkeypatch, tmp_path):
    monkeypatch.setenv(tfhdfs.ENV_PLUGIN, str(tmp_path / "missing.so"))
    with pytest.raises(HadoopConfigError, match="python -m tfos.data.tfhdfs build"):
        tfhdfs.plugin_path()
    given = tmp_path / "shipped" / "libtfos_hdfs_tf.so"
    given.parent.mkdir(mode=0o755)
    os.chmod(given.parent, 0o755)
    given.write_bytes(b"\x7fELF")
    os.chmod(given, 0o644)
    monkeypatch.setenv(tfhdfs.ENV_PLUGIN, str(given))
    assert tfhdfs.plugin_path() == str(given)
    os.chmod(given, 0o666)
    with pytest.raises(UnsafeDirectoryError):
        tfhdfs.plugin_path()


def test_the_build_is_keyed_by_its_sources_and_tensorflow():
    key = tfhdfs.source_key("2.21.0")
    assert key == tfhdfs.source_key("2.21.0") and key != tfhdfs.source_key("2.22.0")
    assert {p.name for p in tfhdfs._sources()} >= {"Cargo.toml", "Cargo.lock", "build.rs", "lib.rs"}


def test_without_a_plugin_register_says_how_to_get_one(cache, monkeypatch):
    monkeypatch.setenv(tfhdfs.ENV_BUILD, "0")
    assert tfhdfs.register() is False
    with pytest.raises(HadoopConfigError, match="tfos.data.tfhdfs build"):
        tfhdfs.register(required=True)


def test_a_failed_build_says_so_with_cargos_last_lines(cache, monkeypatch, tmp_path):
    """The build runs cargo (here one that fails at once) and reports its output; nothing is cached."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    cargo = bin_dir / "cargo"
    cargo.write_text("#!/bin/sh\necho 'error[E0425]: cannot find value' >&2\nexit 101\n")
    cargo.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    with pytest.raises(tfhdfs.PluginBuildError, match=r"(?s)cargo exit 101.*cannot find value"):
        tfhdfs.build()
    assert tfhdfs.plugin_path() is None
    # on first use: a node of an HDFS job tries the build, then says TF cannot open hdfs:// here;
    # a reader that needs TF's hdfs:// fails naming the build's error
    monkeypatch.delenv(tfhdfs.ENV_BUILD, raising=False)
    assert tfhdfs.register(build_missing=True) is False
    with pytest.raises(HadoopConfigError, match=r"(?s)building it here failed.*cannot find value"):
        tfhdfs.register(required=True)
    assert tfhdfs.plugin_path() is None


def test_looking_for_a_plugin_writes_nothing(cache):
    """Every TF process looks at start-up; where its HOME is not its own (a YARN container) a
    lookup that created the cache would fail the node."""
    assert tfhdfs.plugin_path() is None
    assert not (cache / "cache").exists()
