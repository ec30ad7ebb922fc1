"""Images for the test Kubernetes, built here and never pulled.

* ``tfos.local/pause``: the pod sandbox's process (a static C program that waits for a signal);
* ``tfos.local/spark-tfos``: a Debian 12 root file system (``mmdebstrap``: Java 17, Python 3.11)
  with a virtualenv holding pyspark, TensorFlow and tfos at the host's versions, tfos's native
  parts built ahead (``tfos build``: the tunnel and its shim; a pod never runs cargo or a
  compiler), Spark's entry point for driver and executor pods, and the user ``spark`` (uid 185).

Their layers are uncompressed tars kept in the cache, keyed by what they are built from; an image
is streamed into the cluster's containerd as an OCI image layout (``ctr images import -``, which
unpacks it), never written out whole. The tfos image has two layers: the root file system with the
virtualenv of tfos's dependencies (rebuilt only when a package version changes: minutes), and tfos
itself with its native parts, the examples and the entry point (rebuilt on every source change:
seconds).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from tfos.errors import TFOSError
from tfos.host.private import user_cache_dir

log = logging.getLogger(__name__)

PAUSE_IMAGE = "tfos.local/pause:1"
#: containerd's snapshotter for the CRI plugin (the cluster's containerd config) and for the imports
SNAPSHOTTER = "overlayfs"
IMAGE_REPO = "tfos.local/spark-tfos"
SPARK_UID = 185
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
IMAGE_PACKAGES = ("openjdk-17-jre-headless", "python3", "python3-venv", "procps", "tini", "bash", "coreutils",
                  "ca-certificates")
#: tfos's extras installed in the image
IMAGE_EXTRAS = ("tf", "spark", "examples")
#: where things live in the image
VENV = "/opt/tfos/venv"
NATIVE = "/opt/tfos/native"
ENTRYPOINT = "/opt/tfos/entrypoint.sh"
EXAMPLES = "/opt/tfos/examples"  # the repository's examples/ (cluster mode runs local:// files of the image)

PAUSE_C = r"""
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
  signal(SIGINT, stop);
  signal(SIGTERM, stop);
  signal(SIGCHLD, reap);
  for (;;) pause();
}
"""


class ImageError(TFOSError):
    """An image for the test Kubernetes could not be built or imported."""


def _run(argv, what: str, timeout: float = 1800, **kw) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if done.returncode != 0:
        raise ImageError(f"{what} failed ({argv[0]} exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")


# ---------------------------------------------------------------------- OCI layout

def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Layer:
    """An uncompressed layer tar in the cache and its digest (kept beside it, so a large layer is
    hashed once, when it is built)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        digest = self.path.with_name(self.path.name + ".sha256")
        if not digest.exists():  # just built: hashed once, the digest put in place last (see ready)
            tmp = digest.with_name(digest.name + ".partial")
            tmp.write_text(_sha256_file(self.path))
            os.replace(tmp, digest)
        self.digest = digest.read_text().strip()
        self.size = self.path.stat().st_size

    @staticmethod
    def ready(path: Path) -> bool:
        return path.exists() and path.with_name(path.name + ".sha256").exists()


class Image:
    """An image as its name, its layers (lowest first) and its ``config`` section (Entrypoint,
    Env, User, ...)."""

    def __init__(self, name: str, layers: list[Layer], config: dict):
        self.name, self.layers, self.config = name, layers, config

    def write_oci(self, fileobj) -> None:
        """The image as an OCI image layout tar, written to ``fileobj`` as a stream."""
        image_config = json.dumps({
            "architecture": "amd64", "os": "linux", "config": self.config,
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{la.digest}" for la in self.layers]}}).encode()
        config_digest = hashlib.sha256(image_config).hexdigest()
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": f"sha256:{config_digest}",
                       "size": len(image_config)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": f"sha256:{la.digest}",
                        "size": la.size} for la in self.layers]}).encode()
        manifest_digest = hashlib.sha256(manifest).hexdigest()
        index = json.dumps({"schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": f"sha256:{manifest_digest}",
            "size": len(manifest), "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"org.opencontainers.image.ref.name": self.name,
                            "io.containerd.image.name": self.name}}]}).encode()
        with tarfile.open(fileobj=fileobj, mode="w|") as tar:
            def add_bytes(arcname: str, data: bytes) -> None:
                info = tarfile.TarInfo(arcname)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

            add_bytes("oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
            add_bytes("index.json", index)
            add_bytes(f"blobs/sha256/{config_digest}", image_config)
            add_bytes(f"blobs/sha256/{manifest_digest}", manifest)
            for la in self.layers:
                tar.add(str(la.path), arcname=f"blobs/sha256/{la.digest}")

    def import_into(self, containerd_sock: Path) -> None:
        """Stream the image into containerd (namespace k8s.io) and unpack it into the snapshotter the
        CRI plugin uses, so that a pod's start never waits for the unpacking (the cluster imports
        while its control plane starts)."""
        argv = ["ctr", "--address", str(containerd_sock), "-n", "k8s.io", "images", "import",
                f"--snapshotter={SNAPSHOTTER}", "-"]
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=err, stderr=err)
            try:
                try:
                    self.write_oci(proc.stdin)
                finally:
                    proc.stdin.close()
                code = proc.wait(timeout=900)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            if code != 0:
                err.seek(0)
                raise ImageError(f"importing {self.name} failed (ctr exit {code}):\n"
                                 f"{err.read().decode(errors='replace')[-3000:]}")


# ---------------------------------------------------------------------- pause

def pause_image() -> Image:
    """The sandbox image (its layer built once per source)."""
    key = hashlib.sha256(PAUSE_C.encode()).hexdigest()[:12]
    cache = Path(user_cache_dir(f"k8s-pause-{key}"))
    layer = cache / "layer.tar"
    if not Layer.ready(layer):
        (cache / "pause.c").write_text(PAUSE_C)
        _run(["gcc", "-static", "-O2", "-o", str(cache / "pause"), str(cache / "pause.c")], "compiling pause")
        tmp = cache / "layer.tar.partial"
        with tarfile.open(tmp, "w") as tar:
            info = tar.gettarinfo(str(cache / "pause"), arcname="pause")
            info.uid = info.gid = 0
            info.mode = 0o755
            with open(cache / "pause", "rb") as f:
                tar.addfile(info, f)
        os.replace(tmp, layer)
    return Image(PAUSE_IMAGE, [Layer(layer)], {"Entrypoint": ["/pause"], "User": "65535:65535"})


# ---------------------------------------------------------------------- the tfos image

def _versions() -> dict[str, str]:
    """The host's versions of what the image installs: the image runs what the driver runs."""
    from importlib import metadata

    out = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and name.lower() not in ("tfos",) and not name.lower().startswith(("nvidia-", "torch", "triton")):
            out[name.lower()] = dist.version
    return out


#: the deps layer's recipe: change it when the way that layer is made changes
DEPS_RECIPE = "2: debian + venv of tfos[tf,spark,examples]'s dependencies, tfos uninstalled; user spark"


def deps_key(repo_root: Path) -> str:
    """What the dependencies layer is built from: the host's package versions, tfos's declared
    dependencies and those of the image's extras (pyproject.toml), the Debian packages and the
    recipe; not tfos's sources."""
    import tomllib

    project = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})
    declared = {"": project.get("dependencies", [])} | {e: extras.get(e, []) for e in IMAGE_EXTRAS}
    h = hashlib.sha256(json.dumps(declared, sort_keys=True).encode())
    h.update(json.dumps(sorted(_versions().items())).encode())
    h.update(" ".join(IMAGE_PACKAGES).encode() + DEBIAN_SUITE.encode() + DEPS_RECIPE.encode())
    return h.hexdigest()[:12]


def image_key(repo_root: Path) -> str:
    """What the tfos image is built from: its dependencies layer, the tfos sources, the examples
    and this module (the entry point)."""
    h = hashlib.sha256(deps_key(repo_root).encode())
    for p in sorted((repo_root / "tfos").rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".so"):
            h.update(str(p.relative_to(repo_root)).encode() + b"\0" + p.read_bytes())
    for p in sorted((repo_root / "examples" / "digits").glob("*.py")):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    for p in (repo_root / "pyproject.toml", repo_root / "setup.py"):
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


ENTRYPOINT_SH = r"""#!/bin/bash
# Spark's pods: "driver" runs spark-submit in client mode inside the driver pod, "executor" runs
# the executor backend, anything else runs as given. Spark sets the variables named here.
set -eo pipefail
export SPARK_HOME=__SPARK_HOME__
export PYSPARK_PYTHON=__VENV__/bin/python PYSPARK_DRIVER_PYTHON=__VENV__/bin/python
export PATH=__VENV__/bin:$PATH
case "$1" in
  driver)
    shift
    # tfos's control service listens on the driver pod's own address (executors reach the pod by IP)
    export TFOS_SERVER_HOST="${TFOS_SERVER_HOST:-$SPARK_DRIVER_BIND_ADDRESS}"
    exec "$SPARK_HOME/bin/spark-submit" --conf "spark.driver.bindAddress=$SPARK_DRIVER_BIND_ADDRESS" \
      --deploy-mode client "$@" ;;
  executor)
    shift
    opts=()
    while IFS= read -r -d '' line; do opts+=("$line"); done < <(env -0 | grep -z '^SPARK_JAVA_OPT_' | sort -z -t_ -k4 -n | sed -z 's/^[^=]*=//')
    exec java "${opts[@]}" -Xms"$SPARK_EXECUTOR_MEMORY" -Xmx"$SPARK_EXECUTOR_MEMORY" \
      -cp "$SPARK_HOME/conf::$SPARK_HOME/jars/*${SPARK_CLASSPATH:+:$SPARK_CLASSPATH}" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "$SPARK_DRIVER_URL" --executor-id "$SPARK_EXECUTOR_ID" --cores "$SPARK_EXECUTOR_CORES" \
      --app-id "$SPARK_APPLICATION_ID" --hostname "$SPARK_EXECUTOR_POD_IP" \
      --resourceProfileId "$SPARK_RESOURCE_PROFILE_ID" --podName "$SPARK_EXECUTOR_POD_NAME" ;;
  *)
    exec "$@" ;;
esac
"""


def _mounts(rootfs: Path):
    for src, dst in (("/proc", "proc"), ("/dev", "dev"), ("/sys", "sys")):
        target = rootfs / dst
        target.mkdir(exist_ok=True)
        subprocess.run(["mount", "--rbind", src, str(target)], check=True)
        subprocess.run(["mount", "--make-rslave", str(target)], check=True)


def _umounts(rootfs: Path):
    for dst in ("sys", "dev", "proc"):
        subprocess.run(["umount", "-R", "-l", str(rootfs / dst)], capture_output=True)


def build_tfos_image(repo_root: Path) -> Image:
    """The tfos image, its layers built unless the cache has them for these sources."""
    repo_root = Path(repo_root).resolve()
    cache = Path(user_cache_dir("k8s-image"))
    dkey, key = deps_key(repo_root), image_key(repo_root)
    deps = cache / f"deps-{dkey}.layer.tar"
    top = cache / f"tfos-{key}.layer.tar"
    with tempfile.TemporaryDirectory(prefix="tfos-wheel-", dir=cache) as wheels:
        wheel = None
        if not Layer.ready(deps) or not Layer.ready(top):
            _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", wheels, str(repo_root)],
                 "building the tfos wheel")
            wheel = next(Path(wheels).glob("tfos-*.whl"))
        if not Layer.ready(deps):
            _evict(cache, "deps-*.layer.tar*")
            _build_deps_layer(cache, wheel, deps)
        if not Layer.ready(top):
            _evict(cache, "tfos-*.layer.tar*")
            _build_tfos_layer(repo_root, cache, wheel, top)
    return Image(f"{IMAGE_REPO}:{key}", [Layer(deps), Layer(top)], {
        "Entrypoint": ["/usr/bin/tini", "-s", "--", ENTRYPOINT], "User": f"{SPARK_UID}",
        "WorkingDir": "/opt/tfos/work",
        "Env": [f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                f"SPARK_HOME={_spark_home_in_image()}", f"TFOS_TUNNEL_DIR={NATIVE}/tunnel",
                "JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64", "HOME=/opt/tfos/work", "LANG=C.UTF-8"]})


def _evict(cache: Path, pattern: str) -> None:
    """Layers built from older sources (and a build that stopped half way): the cache keeps one."""
    for old in cache.glob(pattern):
        old.unlink()
    for old in cache.glob("spark-tfos-*.oci.tar"):  # whole images, as this module once kept them
        old.unlink()


def _spark_home_in_image() -> str:
    return f"{VENV}/lib/python3.11/site-packages/pyspark"


def _debian_base(cache: Path) -> Path:
    base = cache / f"base-{hashlib.sha256(' '.join(IMAGE_PACKAGES).encode()).hexdigest()[:12]}.tar"
    if not base.exists():
        log.info("building the image's Debian root file system (mmdebstrap %s)", DEBIAN_SUITE)
        _run(["mmdebstrap", "--mode=root", "--format=tar", "--variant=minbase", f"--include={','.join(IMAGE_PACKAGES)}",
              DEBIAN_SUITE, str(base) + ".partial", f"deb {DEBIAN_MIRROR} {DEBIAN_SUITE} main",
              f"deb {DEBIAN_MIRROR} {DEBIAN_SUITE}-updates main",
              f"deb http://deb.debian.org/debian-security {DEBIAN_SUITE}-security main"], "mmdebstrap")
        os.replace(str(base) + ".partial", base)
    return base


def _build_deps_layer(cache: Path, wheel: Path, out: Path) -> None:
    """Debian, the virtualenv with tfos's dependencies at the host's versions (from the host's pip
    cache where it has them; tfos itself installed for its requirements, then removed: it is the
    layer above), the user ``spark`` and its working directory."""
    log.info("building the image's dependencies layer (a virtualenv of TensorFlow, pyspark, ...: minutes)")
    base = _debian_base(cache)
    work = Path(tempfile.mkdtemp(prefix="tfos-image-", dir=cache))
    rootfs = work / "rootfs"
    try:
        rootfs.mkdir()
        _run(["tar", "-C", str(rootfs), "-xpf", str(base)], "unpacking the base")
        versions = _versions()
        pins = [f"{n}=={versions[n]}" for n in ("tensorflow-cpu", "tensorboard", "pyspark", "pandas", "numpy",
                                                "pyarrow", "protobuf", "cryptography", "google-crc32c", "tqdm",
                                                "keras", "scikit-learn", "tf-keras", "scipy") if n in versions]
        tmp = rootfs / "tmp"
        (tmp / "wheels").mkdir()
        shutil.copy(wheel, tmp / "wheels" / wheel.name)
        (tmp / "constraints.txt").write_text("\n".join(pins) + "\n")
        # this host's CA bundle for pip's index (a registry behind a proxy with its own CA): build time only
        ca = Path(os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE") or "/etc/ssl/certs/ca-certificates.crt")
        shutil.copy(ca, tmp / "host-ca.crt")
        pip_cache = Path.home() / ".cache" / "pip"
        (tmp / "pip-cache").mkdir()
        _mounts(rootfs)
        try:
            if pip_cache.is_dir():
                subprocess.run(["mount", "--bind", str(pip_cache), str(tmp / "pip-cache")], check=True)
            _run(["chroot", str(rootfs), "/usr/bin/python3", "-m", "venv", VENV], "the image's virtualenv",
                 env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
            # the image's environment, not this host's (whose CA variables name files the image lacks)
            env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
                   "PIP_CERT": "/tmp/host-ca.crt", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_DEFAULT_TIMEOUT": "180"}
            pip = ["chroot", str(rootfs), f"{VENV}/bin/pip"]
            _run(pip + ["install", "-q", "--no-compile", "--cache-dir", "/tmp/pip-cache", "-c", "/tmp/constraints.txt",
                        f"/tmp/wheels/{wheel.name}[{','.join(IMAGE_EXTRAS)}]"], "pip install in the image", env=env)
            _run(pip + ["uninstall", "-q", "-y", "tfos"], "removing tfos from the dependencies layer", env=env)
        finally:
            subprocess.run(["umount", "-l", str(tmp / "pip-cache")], capture_output=True)
            _umounts(rootfs)
        for junk in ("wheels", "pip-cache", "constraints.txt", "host-ca.crt"):
            path = tmp / junk
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        with open(rootfs / "etc" / "passwd", "a") as f:
            f.write(f"spark:x:{SPARK_UID}:{SPARK_UID}:spark:/opt/tfos/work:/bin/bash\n")
        with open(rootfs / "etc" / "group", "a") as f:
            f.write(f"spark:x:{SPARK_UID}:\n")
        work_dir = rootfs / "opt" / "tfos" / "work"
        work_dir.mkdir(parents=True)
        os.chown(work_dir, SPARK_UID, SPARK_UID)
        os.chmod(work_dir, 0o700)
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            shutil.rmtree(rootfs / junk, ignore_errors=True)
        layer = work / "layer.tar"
        _run(["tar", "--numeric-owner", "--xattrs", "-C", str(rootfs), "-cf", str(layer), "."], "packing the layer")
        os.replace(layer, out)
        Layer(out)  # its digest
    finally:
        _umounts(rootfs)
        shutil.rmtree(work, ignore_errors=True)


def _build_tfos_layer(repo_root: Path, cache: Path, wheel: Path, out: Path) -> None:
    """tfos in the image's virtualenv (this host's Python 3.11 installs the wheel there: the same
    minor version as the image's), its native parts built on this host (the same Debian 12 glibc),
    the examples and Spark's entry point; every file owned by root."""
    work = Path(tempfile.mkdtemp(prefix="tfos-layer-", dir=cache))
    try:
        stage = work / "stage"
        _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--ignore-installed",
              "--disable-pip-version-check", "--root", str(stage), "--prefix", VENV, str(wheel)],
             "installing tfos for the image")
        for script in (stage / VENV.lstrip("/") / "bin").iterdir():  # console scripts: the image's interpreter
            lines = script.read_bytes().split(b"\n", 1)
            if lines[0].startswith(b"#!"):
                script.write_bytes(f"#!{VENV}/bin/python".encode() + b"\n" + (lines[1] if len(lines) > 1 else b""))
        from tfos.tunnel import build as tunnel_build

        native = stage / NATIVE.lstrip("/") / "tunnel"
        native.mkdir(parents=True)
        for path in tunnel_build.build():
            shutil.copy2(path, native / Path(path).name)
            os.chmod(native / Path(path).name, 0o755)
        shutil.copytree(repo_root / "examples" / "digits", stage / EXAMPLES.lstrip("/") / "digits",
                        ignore=shutil.ignore_patterns("__pycache__"))
        entry = stage / ENTRYPOINT.lstrip("/")
        entry.write_text(ENTRYPOINT_SH.replace("__SPARK_HOME__", _spark_home_in_image()).replace("__VENV__", VENV))
        os.chmod(entry, 0o755)

        def as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if info.isdir():
                info.mode = 0o755
            else:
                info.mode = 0o755 if info.mode & 0o100 else 0o644
            return info

        layer = work / "layer.tar"
        with tarfile.open(layer, "w", format=tarfile.PAX_FORMAT) as tar:
            for top in sorted(stage.iterdir()):
                tar.add(str(top), arcname=top.name, filter=as_root)
        os.replace(layer, out)
        Layer(out)  # its digest
    finally:
        shutil.rmtree(work, ignore_errors=True)


def import_images(cluster, repo_root: Path | None = None) -> str:
    """Import the pause and tfos images into the cluster's containerd; the tfos image's name."""
    repo_root = repo_root or Path(__file__).resolve().parents[3]
    image = build_tfos_image(repo_root)
    for img in (pause_image(), image):
        img.import_into(cluster.containerd_sock)
    (cluster.dir / "image").write_text(image.name)
    return image.name
