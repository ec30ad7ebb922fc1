"""TensorFlow's own ``hdfs://`` and ``viewfs://``: a TensorFlow modular filesystem plugin.

TF 2.21 has no HDFS filesystem and tensorflow-io, which had one, stopped at TF 2.16. The plugin in
``hdfs_tf/`` (Rust, TensorFlow's C filesystem API over the hdfs-native crate: the same HDFS client
as tfos's fs layer, so no JVM and no libhdfs; Kerberos, delegation tokens and NameNode HA from
``$HADOOP_CONF_DIR``) gives TF the schemes itself: ``tf.io.gfile``, ``TFRecordDataset``,
checkpoints, TensorBoard writers and SavedModel on ``hdfs://`` paths, in any TF program.

- ``python -m tfos.data.tfhdfs build`` compiles it with cargo (once per source and TF version;
  kept in ``$TFOS_CACHE_DIR``) and prints the library's path; ``register()`` loads it into this
  process (the TF process does so when a built plugin is there).
- ``TFOS_HDFS_TF_PLUGIN=/path/libtfos_hdfs_tf.so``: a plugin built elsewhere (shipped to the
  executors of a cluster without cargo); ``TFOS_HDFS_TF=0`` turns it off (tfos then reads
  hdfs:// through its own fs layer, as without the plugin).

A library that runs code only from files that this user or root alone can change. Runs in the TF
process and wherever a user calls ``register``.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import threading
from pathlib import Path

from tfos.errors import HadoopConfigError, TFOSError
from tfos.host.builds import build_once, command, first_use_build_refused, install, run_command, run_step
from tfos.host.private import check_trusted_file, user_cache_dir, user_cache_root

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("hdfs_tf")
LIBRARY = "libtfos_hdfs_tf.so"
ENV_PLUGIN = "TFOS_HDFS_TF_PLUGIN"
ENV_SWITCH = "TFOS_HDFS_TF"
ENV_BUILD = "TFOS_HDFS_TF_BUILD"  # "0": never build on first use (a build takes minutes)
BUILD_TIMEOUT = 1800.0

_lock = threading.Lock()
_registered: str | None = None


class PluginBuildError(TFOSError):
    """The plugin could not be built (no cargo, a compile error, a timeout)."""


def _sources() -> list[Path]:
    return sorted([SOURCE / "Cargo.toml", SOURCE / "Cargo.lock", SOURCE / "build.rs", *(SOURCE / "src").glob("*.rs")])


@functools.lru_cache(maxsize=4)
def source_key(tf_version: str) -> str:
    """What a build depends on: the plugin's sources and the TF it links against."""
    h = hashlib.sha256(tf_version.encode())
    for p in _sources():
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def _tf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("tensorflow-cpu", "tensorflow", "tf-nightly"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    raise HadoopConfigError("TensorFlow is not installed here; the hdfs:// plugin is built against it")


def built_path() -> Path:
    """Where this source and TF version's build is (whether or not it exists yet; nothing is created)."""
    return Path(user_cache_root()) / f"hdfs-tf-{source_key(_tf_version())}" / LIBRARY


def plugin_path() -> str | None:
    """The plugin this process loads: ``$TFOS_HDFS_TF_PLUGIN``, else this user's build, else None."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None
    given = os.environ.get(ENV_PLUGIN)
    if given:
        if not os.path.isfile(given):
            raise HadoopConfigError(f"{ENV_PLUGIN}={given}: no such file; build it with "
                                    "'python -m tfos.data.tfhdfs build' and ship it, or unset the variable")
        check_trusted_file(given)
        return given
    path = built_path()
    if not path.is_file():
        return None
    check_trusted_file(str(path))
    return str(path)


def build(timeout: float = BUILD_TIMEOUT) -> str:
    """Compile the plugin unless this source and TF version's build is there; returns its path.
    The build tree and the library stay in this user's cache (``$TFOS_CACHE_DIR``); the crates in
    cargo's own (``~/.cargo``)."""
    out = built_path()
    return build_once(out, "hdfs-tf.lock", lambda: _build(out, timeout))


def _tf_lib() -> str:
    """TensorFlow's package directory (``tf.sysconfig.get_lib()``: libtensorflow_framework.so.2),
    found without importing TensorFlow."""
    import importlib.util

    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        raise HadoopConfigError("TensorFlow is not installed here; the hdfs:// plugin is built against it")
    return list(spec.submodule_search_locations)[0]


def _build(out: Path, timeout: float) -> str:
    cargo = shutil.which("cargo") or os.path.expanduser("~/.cargo/bin/cargo")
    if not os.path.isfile(cargo):
        raise PluginBuildError("cargo is needed to build the hdfs:// plugin for TensorFlow: install Rust "
                               f"(rustup), or point {ENV_PLUGIN} at a plugin built elsewhere")
    cache = user_cache_dir()
    env = dict(os.environ, TFOS_TF_LIB=_tf_lib(), CARGO_TARGET_DIR=user_cache_dir("hdfs-tf-target"))
    log = Path(cache) / "hdfs-tf-build.log"
    args = [cargo, "build", "--release", "--locked", "--manifest-path", str(SOURCE / "Cargo.toml")]
    logger.info("building the hdfs:// plugin for TensorFlow (cargo, a few minutes once); log: %s", log)
    with open(log, "wb") as f:
        run_step(args, f, timeout, "the hdfs:// plugin", PluginBuildError, env=env)
    return install(Path(env["CARGO_TARGET_DIR"]) / "release" / LIBRARY, out)


def registered() -> str | None:
    """The plugin loaded into this process, if any."""
    return _registered


def register(required: bool = False, build_missing: bool = False) -> bool:
    """Load the plugin into this process's TensorFlow (once); True when TF now opens hdfs://.

    Without a plugin (none built, none given, ``TFOS_HDFS_TF=0``) it returns False, or raises
    HadoopConfigError naming the fix when ``required``. When ``required`` or ``build_missing`` (a
    node of a job whose default filesystem is HDFS), a missing plugin is built first, once per host
    and TensorFlow version under the build lock, except in a YARN container or a Kubernetes pod or
    with ``TFOS_HDFS_TF_BUILD=0`` (``tfos.host.builds.first_use_build_refused``); the log says which
    path runs."""
    global _registered
    with _lock:
        if _registered:
            return True
        path = plugin_path()
        refused = first_use_build_refused(os.environ, ENV_BUILD) if path is None else None
        if path is None and (required or build_missing) and os.environ.get(ENV_SWITCH, "1") != "0" and refused:
            logger.info("tfos's hdfs:// plugin is not built here and is not built on first use (%s): build it on "
                        "each host with 'tfos build hdfs', or ship one and name it in %s", refused, ENV_PLUGIN)
        elif path is None and (required or build_missing) and os.environ.get(ENV_SWITCH, "1") != "0":
            try:
                path = build()
            except (TFOSError, OSError) as e:
                if required:
                    raise HadoopConfigError(f"TensorFlow cannot open hdfs:// without tfos's plugin, and building it "
                                            f"here failed: {e}") from None
                logger.warning("tfos's hdfs:// plugin could not be built here (%s): TensorFlow cannot open hdfs:// "
                               "in this process; tfos.data reads it through pyarrow instead", e)
                return False
        if path is None:
            if required:
                raise HadoopConfigError("TensorFlow cannot open hdfs:// without tfos's plugin: build it with "
                                        f"'python -m tfos.data.tfhdfs build' (or set {ENV_PLUGIN})")
            return False
        import tensorflow as tf

        try:
            tf.experimental.register_filesystem_plugin(path)
        except tf.errors.AlreadyExistsError:  # another plugin (tensorflow-io) has the scheme
            logger.warning("TensorFlow already has an hdfs:// filesystem; tfos's plugin %s is not loaded", path)
            return False
        _set_default_url(path)
        _registered = path
        logger.info("TensorFlow opens hdfs:// through tfos's plugin %s", path)
        return True


def _set_default_url(path: str) -> None:
    """With a token file, ``hdfs:///`` (fs.defaultFS) connects where ``tfos.data.hdfs.client_url``
    says; the plugin applies the same rule itself to a URI that names its NameNode."""
    tokens = os.environ.get("HADOOP_TOKEN_FILE_LOCATION")
    if not tokens:
        return
    from tfos.data.hadoop_conf import hadoop_core_site
    from tfos.data.hdfs import client_url

    url = client_url("hdfs://", hadoop_core_site(), tokens)
    if url:
        ctypes.CDLL(path).tfos_hdfs_set_client_url(b"hdfs://", url.encode())


main = command("python -m tfos.data.tfhdfs", "TensorFlow's hdfs:// and viewfs:// through tfos's plugin", build,
               plugin_path, "the plugin")

if __name__ == "__main__":
    run_command(main)
