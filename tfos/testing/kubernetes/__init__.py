"""A real Kubernetes for tfos's tests, started on this machine (``python -m tfos.testing.kubernetes
up|down``): the control plane and a kubelet built with Go from Kubernetes' own sources
(:mod:`.binaries`), containerd and runc from Debian's packages, images built here (:mod:`.images`).
"""

from tfos.testing.kubernetes.cluster import KubernetesCluster, KubernetesError, NAMESPACE, NODE_IP

__all__ = ["KubernetesCluster", "KubernetesError", "NAMESPACE", "NODE_IP"]
