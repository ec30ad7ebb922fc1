"""Building the tunnel (``rust/``, with cargo) and the shim (``shim.c``, with the C compiler).

``python -m tfos.tunnel build`` builds both once per source into this user's cache
(``$TFOS_CACHE_DIR``); the node agent calls :func:`require`, which builds them on first use where the
toolchains are installed and otherwise says how to get them. ``TFOS_TUNNEL_DIR`` names a directory
holding both, built elsewhere (a shared path, or shipped to executors that have no cargo or whose
containers have no usable home, as YARN's). Only files that this user (or root) alone can change are
ever executed or preloaded (:func:`tfos.host.private.check_trusted_file`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import shutil
from pathlib import Path

from tfos.errors import ConfigError, TFOSError
from tfos.host.builds import build_once, command, first_use_build_refused, install, run_step
from tfos.host.private import check_trusted_file, user_cache_dir, user_cache_root

logger = logging.getLogger(__name__)

HERE = Path(__file__).parent
CRATE = HERE / "rust"
SHIM_SOURCE = HERE / "shim.c"
BINARY = "tfos-tunnel"
SHIM = "libtfos_tunnel_shim.so"
BUILD_TIMEOUT = 1200.0
ENV_DIR = "TFOS_TUNNEL_DIR"
ENV_BUILD = "TFOS_TUNNEL_BUILD"  # "0": never build on first use (nor in a YARN container or a pod)
HOW = ("build it on every host with 'python -m tfos.tunnel build' (needs cargo and a C compiler) as the user the "
       f"executors run as, or point {ENV_DIR} at a directory holding a build ('python -m tfos.tunnel path' says where "
       "it is), or reserve the cluster with encrypt=False to run without tfos's protection of TensorFlow's and Gloo's "
       "traffic")


class TunnelBuildError(TFOSError):
    """The tunnel or the shim could not be built."""


class TunnelUnavailable(ConfigError):
    """Encryption is on but this host has no tunnel build and cannot make one."""


@functools.lru_cache(maxsize=1)
def source_key() -> str:
    """What a build depends on: every source file, and the machine."""
    h = hashlib.sha256(platform.machine().encode())
    files = [SHIM_SOURCE, CRATE / "Cargo.toml", CRATE / "Cargo.lock"] + sorted((CRATE / "src").rglob("*.rs"))
    for p in files:
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def built_dir() -> Path:
    return Path(user_cache_root()) / f"tunnel-{source_key()}"


def built_paths() -> tuple[str, str]:
    """The tunnel binary's and the shim's paths (whether or not they exist; nothing is created): in
    ``$TFOS_TUNNEL_DIR`` when it is set, else in this user's cache."""
    d = Path(os.environ[ENV_DIR]) if os.environ.get(ENV_DIR) else built_dir()
    return str(d / BINARY), str(d / SHIM)


def _cargo() -> str | None:
    found = shutil.which("cargo") or os.path.expanduser("~/.cargo/bin/cargo")
    return found if os.path.isfile(found) else None


def _cc() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def build(timeout: float = BUILD_TIMEOUT) -> tuple[str, str]:
    """Build whichever of the two is missing, in this user's cache; returns their paths."""
    binary, shim = built_dir() / BINARY, built_dir() / SHIM
    build_once(shim, "tunnel-shim.lock", lambda: _build_shim(shim, timeout))
    build_once(binary, "tunnel.lock", lambda: _build_tunnel(binary, timeout))
    return str(binary), str(shim)


def _build_shim(out: Path, timeout: float) -> str:
    cc = _cc()
    if not cc:
        raise TunnelBuildError("a C compiler is needed to build tfos's network shim: install gcc (or set CC)")
    work = Path(user_cache_dir(out.parent.name))
    tmp = out.with_suffix(".tmp")
    with open(work / "shim-build.log", "wb") as log:
        run_step([cc, "-O2", "-fPIC", "-shared", "-Wall", "-o", str(tmp), str(SHIM_SOURCE), "-ldl"], log, timeout,
                 "tfos's network shim", TunnelBuildError)
    return install(tmp, out)


def _build_tunnel(out: Path, timeout: float) -> str:
    cargo = _cargo()
    if not cargo:
        raise TunnelBuildError("cargo is needed to build tfos's node tunnel: install Rust (rustup)")
    env = dict(os.environ, CARGO_TARGET_DIR=user_cache_dir("tunnel-target"))
    log = Path(user_cache_dir(out.parent.name)) / "tunnel-build.log"
    logger.info("building tfos's node tunnel (cargo, about a minute once); log: %s", log)
    with open(log, "wb") as f:
        run_step([cargo, "build", "--release", "--locked", "--manifest-path", str(CRATE / "Cargo.toml")], f, timeout,
                 "tfos's node tunnel", TunnelBuildError, env=env)
    return install(Path(env["CARGO_TARGET_DIR"]) / "release" / BINARY, out)


def require() -> tuple[str, str]:
    """The tunnel's and the shim's paths, built now if they are not yet and the toolchains are here;
    TunnelUnavailable (naming the fix and the opt-out) if they cannot be."""
    binary, shim = built_paths()
    if os.environ.get(ENV_DIR) and not (os.path.isfile(binary) and os.path.isfile(shim)):
        raise TunnelUnavailable(f"{ENV_DIR}={os.environ[ENV_DIR]} holds no tunnel build ({BINARY}, {SHIM}): {HOW}")
    how = f"prebuilt in {os.path.dirname(binary)} ({ENV_DIR}); nothing is compiled here" if os.environ.get(ENV_DIR) \
        else f"from this user's cache ({os.path.dirname(binary)})"
    if not (os.path.isfile(binary) and os.path.isfile(shim)):
        refused = first_use_build_refused(os.environ, ENV_BUILD)
        if refused:
            raise TunnelUnavailable(f"tfos's node tunnel is not built here ({binary}) and is not compiled on first use, "
                                    f"since {refused}: ship it in the image or container and set {ENV_DIR}; {HOW}")
        if not (_cargo() and _cc()):
            raise TunnelUnavailable(f"tfos's node tunnel is not built on this host ({binary}): {HOW}")
        try:
            build()
        except TunnelBuildError as e:
            raise TunnelUnavailable(f"tfos's node tunnel could not be built on this host: {e}; {HOW}") from e
        how = f"built on first use into {os.path.dirname(binary)}"
    for path in (binary, shim):
        check_trusted_file(path)
    logger.info("tfos's node tunnel and shim: %s", how)
    return binary, shim


main = command("python -m tfos.tunnel", "tfos's node tunnel and network shim", build, built_paths,
               "the tunnel and its shim")
