"""The test cluster's manifests (YAML as text; kubectl reads JSON as YAML): the namespace under
PodSecurity "restricted", the Spark driver's service account and its role, and pod templates."""

from __future__ import annotations

import json

#: What Spark's driver does with the API (spark-on-k8s: executor pods, the driver's service and
#: config maps, on-demand volume claims): its role in the job's namespace, nothing cluster-wide.
DRIVER_RULES = [
    {"apiGroups": [""], "resources": ["pods", "services", "configmaps", "persistentvolumeclaims"],
     "verbs": ["create", "get", "list", "watch", "delete", "deletecollection", "patch", "update"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    # Spark 4.3 writes a NetworkPolicy per application (its pods accept only each other)
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
     "verbs": ["create", "get", "list", "watch", "delete", "patch", "update"]},
]
SERVICE_ACCOUNT = "spark"


def _doc(items) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=1)


def namespace_manifests(namespace: str) -> str:
    """The namespace (PodSecurity "restricted" enforced, audited and warned), the ``spark``
    service account, its Role and RoleBinding."""
    labels = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "audit", "warn")}
    labels.update({f"pod-security.kubernetes.io/{mode}-version": "latest" for mode in ("enforce", "audit", "warn")})
    return _doc([
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": labels}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SERVICE_ACCOUNT, "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "spark-driver", "namespace": namespace}, "rules": DRIVER_RULES},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "spark-driver", "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "spark-driver"},
         "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": namespace}]},
    ])


#: PodSecurity "restricted", as a container's securityContext
RESTRICTED = {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
              "seccompProfile": {"type": "RuntimeDefault"}}
