"""Building a ``kubernetes.client.ApiClient``: from a kubeconfig file, in-cluster, or the default kubeconfig.

TLS verification is whatever the kubeconfig says; joulesched never turns it off.
"""

from __future__ import annotations

import os

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from joulesched.core.errors import UsageError


class KubeConfigError(UsageError):
    """No usable cluster configuration."""


def _tune(cfg: k8s.Configuration) -> None:
    # Watches hold connections; binds, events and the lease share the rest. The default pool (5 per CPU) is
    # too small on a 2-CPU pod and urllib3 would then discard keep-alive connections.
    cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize or 0, 32)


def load_api_client(kubeconfig: str | None = None, context: str | None = None) -> k8s.ApiClient:
    """``kubeconfig`` given: that file. Otherwise in-cluster (service account), else ``$KUBECONFIG`` or
    ``~/.kube/config``. Raises :class:`KubeConfigError` with one line saying what is missing."""
    cfg = k8s.Configuration()
    if kubeconfig:
        if not os.path.isfile(kubeconfig):
            raise KubeConfigError(f"kubeconfig {kubeconfig} does not exist")
        try:
            k8s_config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
        except Exception as e:  # the loader raises ConfigException, ValueError, yaml errors...
            raise KubeConfigError(f"kubeconfig {kubeconfig}: {e}") from None
    else:
        try:
            k8s_config.load_incluster_config(client_configuration=cfg)
        except k8s_config.ConfigException:
            try:
                k8s_config.load_kube_config(context=context, client_configuration=cfg)
            except Exception as e:
                raise KubeConfigError(f"not running in a cluster and no usable kubeconfig ({e}); "
                                      "pass --kubeconfig") from None
    _tune(cfg)
    return k8s.ApiClient(cfg)


def api_client_for(url: str) -> k8s.ApiClient:
    """A client for a plain-HTTP loopback server such as the emulator (tests, benches)."""
    cfg = k8s.Configuration()
    cfg.host = url
    _tune(cfg)
    return k8s.ApiClient(cfg)
