"""The Gloo all-reduce as a TensorFlow op: ``TfosGlooAllReduce``, C++ calling PyTorch's Gloo.

:mod:`tfos.tf.gloo` enters Gloo from a ``tf.py_function``. In a ``tf.function`` that costs a
Python call per all-reduce on one of TF's threads (the GIL, tensor wrapping): 0.86-0.94x of torch's
own call at 16 MiB on this machine (bench/README, all-reduce). The op in ``gloo_cc/`` does the same
work without Python:

- ``op.cc`` (built against TensorFlow's headers) is the kernel. Each input is reduced in its own
  buffer when TF forwards it to the output (nothing else reads it: a gradient), else in a copy
  (a variable's value, an argument the caller keeps). This is TF's own buffer forwarding,
  ``forward_input_or_allocate_output``.
- ``bridge.cc`` (built against PyTorch's headers) keeps the Gloo process groups that Python made,
  by handle. It runs their all-reduces on the kernel's buffers and averages after the last. The
  two halves meet through one C function, so each keeps its own headers and C++ ABI.

``python -m tfos.tf.gloo_kernel build`` compiles it with the system's C++ compiler (``$CXX``, else
g++; ~30 s, once per source, TensorFlow, PyTorch and Python version) into ``$TFOS_CACHE_DIR``.
:func:`load` brings it into a process, building it on first use when it is not built yet (under a
file lock, once per host and environment; not in a YARN container or a Kubernetes pod, whose memory
is the job's, nor with ``TFOS_GLOO_KERNEL_BUILD=0``), and
:class:`tfos.tf.gloo.Group` uses it in ``tf.function``. Without it (no compiler, a failed build,
or ``TFOS_GLOO_KERNEL=0``) the ``tf.py_function`` path runs, with the same results, and the log says
which path runs. Runs in the TF process; code is loaded only from files that this user or
root alone can change.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import logging
import os
import shutil
import sys
import threading
from pathlib import Path

from tfos.errors import TFOSError
from tfos.host.builds import build_once, command, first_use_build_refused, install, run_command, run_step
from tfos.host.private import check_trusted_file, user_cache_dir, user_cache_root

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("gloo_cc")
LIBRARY = "_tfos_gloo.so"
MODULE = "_tfos_gloo"  # bridge.cc's PYBIND11_MODULE name
ENV_SWITCH = "TFOS_GLOO_KERNEL"
ENV_BUILD = "TFOS_GLOO_KERNEL_BUILD"  # "0": never build on first use (a build takes a minute)
BUILD_TIMEOUT = 900.0

_lock = threading.Lock()
_loaded: "Kernel | None" = None
_tried = False
_bridge = None  # load_bridge's module


class KernelBuildError(TFOSError):
    """The Gloo op could not be built (no compiler, no PyTorch or TensorFlow, a compile error)."""


@dataclasses.dataclass(frozen=True)
class Kernel:
    """The loaded op: ``all_reduce(inputs, handle=, average=, context=)`` (TF's generated wrapper),
    and the bridge's ``register(process_group) -> handle`` and ``unregister(handle)``; for the
    reduction server (:mod:`tfos.tf.reduction`) ``register_reduction(process_group, workers, names)``,
    ``unregister_reduction(handle)`` and the reducer's ``serve(handle, step_timeout_ms, lookahead)``."""
    all_reduce: object
    register: object
    unregister: object
    path: str
    register_reduction: object = None
    unregister_reduction: object = None
    serve: object = None


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for names in (("tensorflow-cpu", "tensorflow", "tf-nightly"), ("torch",)):
        for name in names:
            try:
                found.append(f"{name}=={version(name)}")
                break
            except PackageNotFoundError:
                continue
        else:
            found.append(f"{names[0]} missing")
    # the environment too: the library's rpaths point into it
    return " ".join(found) + f" python {sys.version_info[0]}.{sys.version_info[1]} in {sys.prefix}"


@functools.lru_cache(maxsize=4)
def source_key(versions: str) -> str:
    """What a build depends on: the sources, and the TensorFlow, PyTorch and Python (environment) it is
    built for."""
    h = hashlib.sha256(versions.encode())
    for p in sorted([*SOURCE.glob("*.cc"), *SOURCE.glob("*.h")]):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def built_path() -> Path:
    """Where the build for these sources and versions is (whether or not it exists; nothing is created)."""
    return Path(user_cache_root()) / f"gloo-kernel-{source_key(_versions())}" / LIBRARY


def build(timeout: float = BUILD_TIMEOUT) -> str:
    """Compile the op unless built for these sources and versions; returns the library's path."""
    out = built_path()
    return build_once(out, "gloo-kernel.lock", lambda: _build(out, timeout))


def compile_commands(workdir: Path, out: Path) -> list[list[str]]:
    """The compiler runs: bridge.cc and reduction.cc with PyTorch's headers and ABI, op.cc with
    TensorFlow's flags, and the link (rpaths to both libraries' directories)."""
    import sysconfig

    try:
        import tensorflow as tf
        import torch
        from torch.utils import cpp_extension
    except ImportError as e:
        raise KernelBuildError(f"the Gloo op is built against TensorFlow and PyTorch: {e}. "
                               "pip install 'tfos[tf,gloo]'") from None
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise KernelBuildError("a C++ compiler is needed to build the Gloo op: install g++ (or set CXX)")
    torch_libs = list(cpp_extension.library_paths())
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    bridge = [cxx, "-O2", "-fPIC", "-std=c++20", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
              *(f"-I{p}" for p in cpp_extension.include_paths()), f"-I{sysconfig.get_paths()['include']}",
              "-c", str(SOURCE / "bridge.cc"), "-o", str(workdir / "bridge.o")]
    reduction = [*bridge[:-4], "-c", str(SOURCE / "reduction.cc"), "-o", str(workdir / "reduction.o")]
    op = [cxx, "-O2", "-fPIC", "-w", *tf.sysconfig.get_compile_flags(), "-c", str(SOURCE / "op.cc"),
          "-o", str(workdir / "op.o")]
    link = [cxx, "-shared", str(workdir / "bridge.o"), str(workdir / "reduction.o"), str(workdir / "op.o"), "-o", str(out),
            *(f"-L{p}" for p in torch_libs), "-ltorch_cpu", "-lc10", "-ltorch_python", *tf.sysconfig.get_link_flags(),
            *(f"-Wl,-rpath,{p}" for p in torch_libs + [tf.sysconfig.get_lib()])]
    return [bridge, reduction, op, link]


def _build(out: Path, timeout: float) -> str:
    work = Path(user_cache_dir(out.parent.name))
    tmp = out.with_suffix(".tmp")
    log = work / "build.log"
    logger.info("building the Gloo op for TensorFlow (C++, about a minute once); log: %s", log)
    with open(log, "wb") as f:
        for args in compile_commands(work, tmp):
            f.write((" ".join(args) + "\n").encode())
            f.flush()
            run_step(args, f, timeout, "the Gloo op", KernelBuildError)
    return install(tmp, out)


def _usable_path() -> Path | None:
    """The built library, built now on first use where allowed; None (logged) when there is none."""
    path = built_path()
    refused = first_use_build_refused(os.environ, ENV_BUILD) if not path.is_file() else None
    if not path.is_file() and refused is None:
        try:  # on first use, as PyTorch's cpp_extension.load does: once per host and environment, under a lock
            build()
        except (TFOSError, OSError) as e:  # no compiler, an unwritable cache: the py_function path runs
            logger.warning("the Gloo op could not be built here (%s): all-reduces in tf.function go through "
                           "tf.py_function (slower per call)", e)
    if not path.is_file():
        logger.info("the Gloo op is not built here%s: all-reduces in tf.function go through tf.py_function "
                    "(slower per call); build it on each host with 'tfos build gloo'",
                    f" and is not built on first use ({refused})" if refused else "")
        return None
    check_trusted_file(str(path))
    return path


def load_bridge():
    """Only the bridge's Python module (no TensorFlow import: a reducer of :mod:`tfos.tf.reduction`
    needs ``register_reduction`` and ``serve`` alone), loaded once; None when not built here."""
    global _bridge
    with _lock:
        if _bridge is None and os.environ.get(ENV_SWITCH, "1") != "0":
            path = _usable_path()
            if path is not None:
                import torch.distributed  # noqa: F401  (PyTorch's libraries first: the bridge links them)

                spec = importlib.util.spec_from_file_location(MODULE, path)
                _bridge = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(_bridge)
        return _bridge


def load() -> Kernel | None:
    """The op in this process (loaded once), or None: not built, switched off (``TFOS_GLOO_KERNEL=0``),
    or it would not load (logged; the ``tf.py_function`` path then runs)."""
    global _loaded, _tried
    with _lock:
        if _tried:
            return _loaded
        _tried = True
        if os.environ.get(ENV_SWITCH, "1") == "0":
            return None
        path = _usable_path()
        if path is None:
            return None
        try:
            import tensorflow as tf
            import torch.distributed  # noqa: F401  (PyTorch's libraries first: the bridge links them)

            ops = tf.load_op_library(str(path))  # first: TF sees the op register as the library loads
            spec = importlib.util.spec_from_file_location(MODULE, path)
            bridge = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(bridge)
        except Exception as e:  # a build for another environment: fall back, say why
            logger.warning("the Gloo op %s does not load (%s); all-reduces go through tf.py_function. Rebuild "
                           "it with 'python -m tfos.tf.gloo_kernel build'", path, e)
            return None
        _loaded = Kernel(ops.tfos_gloo_all_reduce, bridge.register, bridge.unregister, str(path),
                         bridge.register_reduction, bridge.unregister_reduction, bridge.serve)
        logger.info("Gloo all-reduces in tf.function run in tfos's op %s", path)
        return _loaded


main = command("python -m tfos.tf.gloo_kernel", "tfos's Gloo all-reduce as a TensorFlow op", build,
               lambda: str(built_path()), "the op")

if __name__ == "__main__":
    run_command(main)
