"""joulesched.cluster.kube: a ClusterState kept current from a real (or emulated) Kubernetes API.

List/watch informers (:mod:`.informer`), pod and node parsing with kube-scheduler's request rules
(:mod:`.objects`), the cache with assumed pods (:mod:`.cache`), the Prometheus usage and power feed
(:mod:`.metrics_feed`) and the API client (:mod:`.client`). The live scheduler in :mod:`joulesched.live`
reads it; see docs/live.md.
"""

from joulesched.cluster.kube.cache import KubeCache, kube_unschedulable_message
from joulesched.cluster.kube.client import KubeConfigError, load_api_client
from joulesched.cluster.kube.metrics_feed import FeedConfig
from joulesched.cluster.kube.objects import CurveResolver, ObjectError, load_profiles, pod_request

__all__ = ["KubeCache", "kube_unschedulable_message", "KubeConfigError", "load_api_client",
           "FeedConfig", "CurveResolver", "ObjectError", "load_profiles", "pod_request"]
