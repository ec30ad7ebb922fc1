"""Who may talk to a tfos job: the decisions of ``reserve(encrypt=..., allow_unprotected=...)``
(runs on the driver; pure functions, tested from tables).

* :func:`encryption`: whether the cluster's channels are encrypted (and TF's and Gloo's traffic
  carried by the node tunnels), from the argument and Spark's own security settings.
* :func:`refusal`: with encryption on, a backend whose traffic tfos cannot protect (Horovod's own
  collectives, NCCL) is refused unless the user accepts it.
* :func:`spark_rpc_exposure`: what Spark's own RPC, which carries the cluster's secret to the
  barrier tasks, leaves open under the application's settings; said once at start and by the doctor.
* :func:`exposure`: hosts that gave a node no private network namespace, said once at start.
* :func:`plain_http_elsewhere`: an MLflow tracking server reached in clear over the network.
"""

from __future__ import annotations

from typing import Mapping, Sequence
from urllib.parse import urlparse

from tfos.cluster.driver.options import check

#: Encrypted unless reserve(encrypt=False): the encrypted feed keeps >= 0.9x of the clear one
#: (bench/README, security), so the protection costs little enough to be the default everywhere.
ENCRYPT_BY_DEFAULT = True

#: Spark settings that say the application authenticates or encrypts its own traffic.
SPARK_SECURITY = ("spark.authenticate", "spark.network.crypto.enabled", "spark.ssl.enabled", "spark.ssl.rpc.enabled")

OPT_OUT = "reserve(..., encrypt=False) turns tfos's protection off for the whole cluster"
ACCEPT = "allow_unprotected=True"


def spark_secured(conf: Mapping[str, str | None]) -> list[str]:
    """The Spark security settings that are on."""
    return [k for k in SPARK_SECURITY if str(conf.get(k) or "").strip().lower() == "true"]


def encryption(encrypt: bool | None, conf: Mapping[str, str | None]) -> tuple[bool, str]:
    """Whether the cluster is encrypted, and a sentence for the log when it is worth one."""
    check({"encrypt": encrypt})
    secured = spark_secured(conf)
    if encrypt is None:
        return ENCRYPT_BY_DEFAULT or bool(secured), ""
    if not encrypt and secured:
        return False, (f"encrypt=False although Spark secures its own traffic ({', '.join(secured)}): tfos's "
                       "channels (fed rows, results, control) and TensorFlow's and Gloo's traffic go in clear and "
                       "TensorFlow's servers accept any client")
    return encrypt, ""


#: Spark's settings that make its RPC, and so the barrier tasks' launch messages, safe to carry the secret
SPARK_RPC_FIX = "spark.authenticate=true with spark.network.crypto.enabled=true"


def spark_rpc_exposure(conf: Mapping[str, str | None], encrypt: bool) -> str:
    """What an encrypted cluster's secret is still open to, in one sentence ("" for nothing). tfos
    keeps the secret out of every closure and block Spark serves (docs/security.md); it reaches the
    barrier tasks inside their launch messages, on Spark's RPC, which is as safe as Spark's own
    settings make it."""
    if not encrypt:
        return ""
    secured = set(spark_secured(conf))
    wire = bool(secured & {"spark.network.crypto.enabled", "spark.ssl.enabled", "spark.ssl.rpc.enabled"})
    if "spark.authenticate" in secured and wire:
        return ""
    if "spark.authenticate" in secured:
        what = ("Spark authenticates its RPC but sends it in clear, so someone on the network path between the "
                "driver and the executors")
    else:
        what = ("Spark's RPC takes any peer and sends in clear (spark.authenticate is off, Spark's default), so "
                "someone on the network path between the driver and the executors, or a process posing as an "
                "executor,")
    return (f"{what} can read the cluster's secret in the barrier tasks' launch messages and then join the "
            f"cluster's channels; tfos keeps the secret out of every closure and block Spark serves. Set "
            f"{SPARK_RPC_FIX} for the Spark application to close this")


def refusal(unprotected: Sequence[str], encrypt: bool, allow_unprotected: bool) -> tuple[str | None, str]:
    """``(error, warning)``: with encryption on, traffic that tfos cannot protect (what the backend's
    ``unprotected()`` named) is an error unless ``allow_unprotected``, then a warning."""
    if not encrypt or not unprotected:
        return None, ""
    what = "; ".join(unprotected)
    if allow_unprotected:
        return None, f"tfos cannot protect this traffic, which travels in clear ({ACCEPT}): {what}"
    return (f"with encryption on, tfos refuses traffic it cannot protect: {what}. Pass {ACCEPT} to run it in "
            f"clear anyway (tfos's own channels stay encrypted), or {OPT_OUT}"), ""


def exposure(nodes: Sequence, allow_unprotected: bool) -> str:
    """One warning for the nodes (NodeInfo) whose host gave them no private network namespace: their
    TF and Gloo listen on the host's loopback, where other users of that host can connect (what
    crosses hosts is still encrypted). "" when there are none or the user accepted it."""
    hosts = sorted({n.host for n in nodes if n.tunnel_mode == "loopback"})
    if not hosts or allow_unprotected:
        return ""
    return (f"on host(s) {', '.join(hosts)} the kernel gave tfos no private network namespace (unprivileged user "
            "namespaces are off there; each node's tunnel.log says why): TensorFlow's and Gloo's ports listen on "
            "the host's loopback, where other users of that host can connect and run TensorFlow operations in "
            "the job. Traffic between hosts stays encrypted. Allow user namespaces on those hosts "
            f"(sysctl user.max_user_namespaces), or pass {ACCEPT} to accept this")


def plain_http_elsewhere(uri: str | None) -> bool:
    """True for an http:// tracking URI whose host is not this machine's loopback."""
    if not uri:
        return False
    parsed = urlparse(uri)
    return parsed.scheme == "http" and (parsed.hostname or "") not in ("localhost", "127.0.0.1", "::1")
