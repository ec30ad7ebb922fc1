"""What this process runs: tfos's own version and the installed TensorFlow's, read without importing
TensorFlow (driver and barrier task), and the check that they match across the cluster."""

from __future__ import annotations

import importlib.metadata

#: tfos's version (``tfos.__version__``)
TFOS_VERSION = "0.1.0"
#: TensorFlow's distributions, any of which provides ``import tensorflow``
TF_DISTRIBUTIONS = ("tensorflow-cpu", "tensorflow", "tensorflow-gpu", "tf-nightly", "tensorflow-macos")


def local_versions() -> dict[str, str]:
    """``{"tfos": ..., "tensorflow": ...}`` of this Python ("" when TensorFlow is not installed)."""
    tf = ""
    for dist in TF_DISTRIBUTIONS:
        try:
            tf = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    return {"tfos": TFOS_VERSION, "tensorflow": tf}


def version_mismatch(driver: dict, here: dict, host: str, python: str) -> str | None:
    """Pure: why this executor cannot run the driver's cluster (a different tfos, or a different
    TensorFlow when both have one), naming both versions and the fix; None when they match."""
    problems = []
    for name in ("tfos", "tensorflow"):
        want, have = driver.get(name, ""), here.get(name, "")
        if want and have and want != have:
            problems.append(f"{name} {want} on the driver but {name} {have} on executor host {host}")
        elif name == "tfos" and want and not have:
            problems.append(f"tfos {want} on the driver but no tfos on executor host {host}")
    if not problems:
        return None
    return ("; ".join(problems) + f" (Python {python}). Install the same versions on the driver and every executor "
            "(the same Python environment: spark.pyspark.python, or a packed environment through spark.archives; "
            "see docs/hadoop.md)")
