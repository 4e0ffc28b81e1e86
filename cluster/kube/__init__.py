"""Live Kubernetes backend: list/watch informers, pod and node parsing, the Prometheus feed, leader election.

See docs/live.md. The same ClusterState and Policy seam as the twin, fed by a real (or emulated) apiserver.
"""

from cluster.kube.backend import KubeBackend, kube_unschedulable_message
from cluster.kube.client import KubeConfigError, load_api_client
from cluster.kube.leader import LeaderElector
from cluster.kube.metrics_feed import FeedConfig
from cluster.kube.objects import CurveResolver, ObjectError, load_profiles, pod_request

__all__ = ["KubeBackend", "kube_unschedulable_message", "KubeConfigError", "load_api_client", "LeaderElector",
           "FeedConfig", "CurveResolver", "ObjectError", "load_profiles", "pod_request"]
