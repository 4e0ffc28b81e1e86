"""Actuators that ask the BMC's owner instead of talking to the BMC: Metal3 and Tinkerbell Rufio.

On clusters where the Bare Metal Operator or Rufio already drive the BMCs, a second client of the same BMC
fights them (each sees the other's power changes as drift). These actuators only write the owner's custom
resources through the Kubernetes API, with the controller's own credentials (its ServiceAccount, or the
kubeconfig it was given); the owner does the rest. Addresses name the object, ``SCHEME://NAMESPACE/NAME``.

:class:`CustomObjects` is the shared part: one lazily made API client, every request bounded by the action's
deadline, errors reduced to a one-line :class:`ActuatorError` (HTTP status and reason, never a body).
"""

from __future__ import annotations

import threading
from typing import Any

from joulesched.live.actuators.base import ActuatorError, NoAnswer, Target


class CustomObjects:
    """The namespaced custom objects of one ``group/version`` through the Kubernetes API.

    :param api_client: a ``kubernetes.client.ApiClient``; None = made on first use from ``kubeconfig`` and
        ``context`` (None: in-cluster service account, else ``$KUBECONFIG``).
    :param request_timeout_s: cap of each request (the action's deadline may cut it shorter).
    """

    def __init__(self, group: str, version: str, *, api_client: Any = None, kubeconfig: str | None = None,
                 context: str | None = None, request_timeout_s: float = 15.0) -> None:
        self.group, self.version = group, version
        self._api_client, self.kubeconfig, self.context = api_client, kubeconfig, context
        self.request_timeout_s = request_timeout_s
        self._api = None
        self._lock = threading.Lock()

    def _custom(self):
        from kubernetes import client as k8s

        with self._lock:
            if self._api is None:
                if self._api_client is None:
                    from joulesched.cluster.kube.client import load_api_client

                    self._api_client = load_api_client(self.kubeconfig, self.context)
                self._api = k8s.CustomObjectsApi(self._api_client)
            return self._api

    def call(self, target: Target, what: str, method: str, *args: Any, missing_ok: bool = False, **kw: Any) -> dict:
        """``CustomObjectsApi.<method>(group, version, *args)`` after a checkpoint, bounded by the deadline
        (``missing_ok``: a 404 answers ``{}``)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        target.checkpoint()
        try:
            return getattr(self._custom(), method)(self.group, self.version, *args,
                                                   _request_timeout=target.budget(self.request_timeout_s), **kw)
        except ApiException as e:
            if missing_ok and e.status == 404:
                return {}
            raise ActuatorError(f"{target.node}: {what}: HTTP {e.status} {e.reason}") from None
        except (HTTPError, OSError) as e:  # no answer: the apiserver may have carried the request out
            raise NoAnswer(f"{target.node}: {what}: {type(e).__name__}") from None

    def get(self, target: Target, plural: str, name: str, missing_ok: bool = False) -> dict:
        return self.call(target, f"get {plural} {target.address.host}/{name}", "get_namespaced_custom_object",
                         target.address.host, plural, name, missing_ok=missing_ok)

    def list(self, target: Target, plural: str, label_selector: str = "") -> list[dict]:
        """The objects of ``plural`` in the target's namespace (with ``label_selector``)."""
        out = self.call(target, f"list {plural} in {target.address.host}", "list_namespaced_custom_object",
                        target.address.host, plural, label_selector=label_selector)
        return [o for o in out.get("items") or [] if isinstance(o, dict)]

    def patch(self, target: Target, plural: str, name: str, body: dict) -> dict:
        """A JSON merge patch (only the fields given change; the owner keeps the rest)."""
        return self.call(target, f"patch {plural} {target.address.host}/{name}", "patch_namespaced_custom_object",
                         target.address.host, plural, name, body, _content_type="application/merge-patch+json")

    def create(self, target: Target, plural: str, body: dict) -> dict:
        return self.call(target, f"create {plural} in {target.address.host}", "create_namespaced_custom_object",
                         target.address.host, plural, body)

    def delete(self, target: Target, plural: str, name: str, missing_ok: bool = False) -> None:
        self.call(target, f"delete {plural} {target.address.host}/{name}", "delete_namespaced_custom_object",
                  target.address.host, plural, name, missing_ok=missing_ok)
