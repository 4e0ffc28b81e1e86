"""Kubernetes Deployment + Service for each workload app, built from labels defined once.

The pods run as a non-root user with a read-only root filesystem; what must be writable (the disk
blocker's scratch files, the shop's database, /tmp) is an emptyDir. `schedulerName` is a parameter so the
same manifests run under kube-scheduler or joulesched.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from joulesched.core.names import is_dns_label

#: Apps with an image of their own (workloads/docker/Dockerfile.APP).
IMAGES = ("cpu", "memory", "disk", "network", "combined", "testapp", "shop")
#: The shop split into its three services; they run the shop image with --part.
SHOP_PARTS = ("shop-catalogue", "shop-cart", "shop-orders")
APPS = IMAGES + SHOP_PARTS
PORT = 8080
UID = 10001
IMAGE_PREFIX = "joulesched"

# Requests the scheduler reserves; a blocker asks for little and then uses what it is told to (that is the point).
DEFAULT_REQUESTS: dict[str, tuple[str, str]] = {
    "cpu": ("100m", "64Mi"),
    "memory": ("50m", "64Mi"),
    "disk": ("50m", "64Mi"),
    "network": ("50m", "64Mi"),
    "combined": ("100m", "128Mi"),
    "testapp": ("250m", "64Mi"),
    "shop": ("100m", "96Mi"),
    "shop-catalogue": ("50m", "64Mi"),
    "shop-cart": ("50m", "64Mi"),
    "shop-orders": ("50m", "64Mi"),
}


def _url(app: str) -> str:
    """In-cluster URL of an app's Service (same namespace)."""
    return f"http://joulesched-{app}:{PORT}"


def image_of(app: str) -> str:
    return "shop" if app in SHOP_PARTS else app


def labels(app: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": f"joulesched-{app}",
        "app.kubernetes.io/part-of": "joulesched",
        "app.kubernetes.io/component": "testapp" if app.startswith(("testapp", "shop")) else "blocker",
    }


def container_args(app: str) -> list[str]:
    """Arguments after `python3 -m joulesched.pipelines.cli.workload serve` (the image's ENTRYPOINT); the same the image's CMD holds."""
    args = [image_of(app), "--listen", f"0.0.0.0:{PORT}"]
    if app in ("disk", "combined"):
        args += ["--scratch-dir", "/scratch"]
    if app.startswith("shop"):
        args += ["--db", "/data/shop.db"]
    if app in SHOP_PARTS:
        part = app.removeprefix("shop-")
        args += ["--part", part]
        if part in ("cart", "orders"):
            args += ["--catalogue-url", _url("shop-catalogue")]
        if part == "orders":
            args += ["--cart-url", _url("shop-cart")]
    return args


#: A Kubernetes resource quantity (apimachinery's resource.Quantity): a decimal number with an optional
#: binary (Ki..Ei), decimal (m, k, M..E) or exponent suffix.
_QUANTITY = re.compile(r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?\Z")


def check_quantity(value: str, what: str) -> str:
    """``value`` if it is a valid Kubernetes quantity (``500m``, ``2``, ``1Gi``), else ValueError naming it."""
    if not _QUANTITY.match(value):
        raise ValueError(f"{what} {value!r} is not a Kubernetes quantity (e.g. 500m or 2 for cpu, 512Mi or 1Gi for "
                         "memory)")
    return value


def check_namespace(value: str, what: str = "--namespace") -> str:
    """``value`` if Kubernetes takes it as a namespace (an RFC 1123 label), else ValueError naming ``what``."""
    if not is_dns_label(value):
        raise ValueError(f"{what} {value!r} is not a valid namespace: an RFC 1123 label of at most 63 characters, "
                         "lowercase letters, digits and '-', starting and ending with a letter or digit")
    return value


# An image reference as the container runtimes parse it (github.com/distribution/reference):
# [HOST[:PORT]/]PATH[:TAG][@DIGEST], where the repository PATH is lowercase.
_HOST_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_HOST_PART}(?:\.{_HOST_PART})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(rf"(?P<name>(?:{_HOST}/)?{_PATH_PART}(?:/{_PATH_PART})*)(?::[\w][\w.-]{{0,127}})?"
                    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?", re.ASCII)


def check_image(value: str, what: str = "--image") -> str:
    """``value`` if it is a valid image reference (``joulesched/cpu:latest``, ``registry.example:5000/team/cpu:1``,
    ``...@sha256:HEX``), else ValueError naming ``what``."""
    m = _IMAGE.fullmatch(value)
    if m is None or len(m["name"]) > 255:
        raise ValueError(f"{what} {value!r} is not a valid image reference: [HOST[:PORT]/]PATH[:TAG][@DIGEST] "
                         "without spaces, the repository PATH in lowercase (e.g. joulesched/cpu:latest or "
                         "registry.example:5000/team/cpu:1.0)")
    return value


def render(
    app: str,
    *,
    scheduler_name: str = "default-scheduler",
    image: str | None = None,
    namespace: str = "default",
    replicas: int = 1,
    cpu_request: str | None = None,
    memory_request: str | None = None,
) -> list[dict[str, Any]]:
    if app not in APPS:
        raise ValueError(f"unknown app {app!r}; expected one of {', '.join(APPS)}")
    if not scheduler_name:
        raise ValueError("scheduler_name must not be empty")
    check_namespace(namespace)
    if image is not None:
        check_image(image)
    if cpu_request is not None:
        check_quantity(cpu_request, "--cpu-request")
    if memory_request is not None:
        check_quantity(memory_request, "--memory-request")
    name = f"joulesched-{app}"
    lab = labels(app)
    cpu, mem = DEFAULT_REQUESTS[app]
    volumes = [{"name": "tmp", "emptyDir": {}}]
    mounts = [{"name": "tmp", "mountPath": "/tmp"}]
    if app in ("disk", "combined"):
        volumes.append({"name": "scratch", "emptyDir": {}})
        mounts.append({"name": "scratch", "mountPath": "/scratch"})
    if app.startswith("shop"):
        volumes.append({"name": "data", "emptyDir": {}})
        mounts.append({"name": "data", "mountPath": "/data"})
    probe = {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 5}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": lab},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "template": {
                "metadata": {"labels": lab},
                "spec": {
                    "schedulerName": scheduler_name,
                    "automountServiceAccountToken": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": UID,
                        "runAsGroup": UID,
                        "fsGroup": UID,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": app,
                            "image": image or f"{IMAGE_PREFIX}/{image_of(app)}:latest",
                            "imagePullPolicy": "IfNotPresent",
                            "args": container_args(app),
                            "ports": [{"name": "http", "containerPort": PORT}],
                            "resources": {"requests": {"cpu": cpu_request or cpu, "memory": memory_request or mem}},
                            "readinessProbe": probe,
                            "livenessProbe": probe | {"periodSeconds": 15},
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]},
                            },
                            "volumeMounts": mounts,
                        }
                    ],
                    "volumes": volumes,
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": lab},
        "spec": {
            "selector": {"app.kubernetes.io/name": name},
            "ports": [{"name": "http", "port": PORT, "targetPort": "http"}],
        },
    }
    return [deployment, service]


class _NoAliases(yaml.SafeDumper):
    # Shared label dicts would otherwise come out as &id001 anchors, which people misread.
    def ignore_aliases(self, data: Any) -> bool:
        return True


def render_yaml(app: str, **kw: Any) -> str:
    return yaml.dump_all(render(app, **kw), Dumper=_NoAliases, sort_keys=False)
