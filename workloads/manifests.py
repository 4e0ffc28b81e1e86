"""Kubernetes Deployment + Service for each workload app, built from labels defined once.

The pods run as a non-root user with a read-only root filesystem; what must be writable (the disk
blocker's scratch files, the shop's database, /tmp) is an emptyDir with a size limit. Every container has
requests (what the scheduler reserves) and limits (what the kubelet enforces; the blockers read their cgroup's
and refuse loads beyond them). `schedulerName` is a parameter so the same manifests run under kube-scheduler or
joulesched.
"""

from __future__ import annotations

import decimal
import re
from decimal import Decimal
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


# Limits: room for the load a blocker is told to make (cpu and memory blockers up to 4 cores / 4 GiB, so the
# defaults serve a typical node), and a ceiling on what a runaway test app or shop can take from its neighbours.
DEFAULT_LIMITS: dict[str, tuple[str, str]] = {
    "cpu": ("4", "128Mi"),
    "memory": ("500m", "4Gi"),
    "disk": ("1", "512Mi"),  # page cache of the unpaced prefill is charged to the cgroup until written back
    "network": ("2", "128Mi"),
    "combined": ("4", "4Gi"),
    "testapp": ("2", "128Mi"),
    "shop": ("2", "256Mi"),
    "shop-catalogue": ("1", "128Mi"),
    "shop-cart": ("1", "128Mi"),
    "shop-orders": ("1", "128Mi"),
}

#: emptyDir size limits (the kubelet evicts a pod past them). /scratch holds the disk blocker's read and write
#: files, at most params.MAX_DISK_FILE_MIB (4 GiB) each, plus slack; /data the shop's SQLite database.
SIZE_LIMITS = {"tmp": "64Mi", "scratch": "9Gi", "data": "1Gi"}


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


_SUFFIXES = {"": 1, "m": Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
             "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity(value: str, what: str) -> Decimal:
    """The number a Kubernetes quantity stands for (``500m`` -> 0.5, ``1Gi`` -> 1073741824), above 0; else
    ValueError naming ``what``."""
    m = _QUANTITY.match(check_quantity(value, what))
    assert m is not None
    suffix = m[3] or ""
    try:
        # "E" and "Ei" are exa and exbi; only an e or E followed by digits is an exponent
        v = Decimal(m[1]) * _SUFFIXES[suffix] if suffix in _SUFFIXES else Decimal(m[1]).scaleb(int(suffix[1:]))
    except decimal.DecimalException:
        raise ValueError(f"{what} {value!r} is too large a quantity") from None
    if v <= 0:
        raise ValueError(f"{what} {value!r} asks for nothing; give a quantity above 0 (or leave the option out for "
                         "the default)")
    return v


def check_scheduler_name(value: str, what: str = "--scheduler-name") -> str:
    """``value`` if Kubernetes takes it as spec.schedulerName (a DNS-1123 subdomain), else ValueError naming it."""
    if not (0 < len(value) <= 253 and all(is_dns_label(part) for part in value.split("."))):
        raise ValueError(f"{what} {value!r} is not a valid scheduler name: a DNS-1123 subdomain of at most 253 "
                         "characters, lowercase letters, digits, '-' and '.', each dot-separated part starting and "
                         "ending with a letter or digit (e.g. default-scheduler or joulesched)")
    return value


def _resources(app: str, cpu_request: str | None, memory_request: str | None, cpu_limit: str | None,
               memory_limit: str | None) -> dict[str, dict[str, str]]:
    """requests and limits: the app's defaults where not given; ValueError for a request above its limit, which
    the apiserver would refuse for every pod of the Deployment."""
    out: dict[str, dict[str, str]] = {"requests": {}, "limits": {}}
    given = {"cpu": (cpu_request, cpu_limit), "memory": (memory_request, memory_limit)}
    for i, res in enumerate(("cpu", "memory")):
        request, limit = given[res]
        request_q = request or DEFAULT_REQUESTS[app][i]
        limit_q = limit or DEFAULT_LIMITS[app][i]
        # Defaults are positive; what was given must be too.
        req_v, lim_v = quantity(request_q, f"--{res}-request"), quantity(limit_q, f"--{res}-limit")
        if req_v > lim_v:
            whose = f"--{res}-limit {limit_q}" if limit else f"the default {res} limit {limit_q} (see --{res}-limit)"
            raise ValueError(f"--{res}-request {request_q} is more than {whose}: Kubernetes needs a request at most "
                             "its limit")
        out["requests"][res], out["limits"][res] = request_q, limit_q
    return out


def _empty_dir(name: str) -> dict[str, Any]:
    return {"name": name, "emptyDir": {"sizeLimit": SIZE_LIMITS[name]}}


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
    cpu_limit: str | None = None,
    memory_limit: str | None = None,
) -> list[dict[str, Any]]:
    if app not in APPS:
        raise ValueError(f"unknown app {app!r}; expected one of {', '.join(APPS)}")
    check_scheduler_name(scheduler_name)
    check_namespace(namespace)
    if image is not None:
        check_image(image)
    if app.startswith("shop") and replicas > 1:
        raise ValueError(f"--replicas {replicas}: {app} keeps its state in a SQLite file of its own pod (carts, "
                         "stock and orders would differ from one replica to the next); use 0 or 1")
    resources = _resources(app, cpu_request, memory_request, cpu_limit, memory_limit)
    if app in ("disk", "combined"):
        # The scratch files live on the node's disk: schedulers must find the room for them (and the kubelet keep
        # it), or the blocker's writes push the node into disk-pressure evictions of its neighbours.
        scratch = SIZE_LIMITS["scratch"]
        resources["requests"]["ephemeral-storage"] = resources["limits"]["ephemeral-storage"] = scratch
    name = f"joulesched-{app}"
    lab = labels(app)
    volumes = [_empty_dir("tmp")]
    mounts = [{"name": "tmp", "mountPath": "/tmp"}]
    if app in ("disk", "combined"):
        volumes.append(_empty_dir("scratch"))
        mounts.append({"name": "scratch", "mountPath": "/scratch"})
    if app.startswith("shop"):
        volumes.append(_empty_dir("data"))
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
                            "resources": resources,
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
