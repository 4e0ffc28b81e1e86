"""joulesched.cluster: the clusters a policy decides for, simulated or real.

* :mod:`~joulesched.cluster.state`: ClusterState, what every policy reads (numpy arrays over nodes);
* :mod:`~joulesched.cluster.backend`: the Backend protocol (the seam) and its Decision;
* :mod:`~joulesched.cluster.twin`: the event-driven digital twin, a Backend, and its TwinMeter;
* :mod:`~joulesched.cluster.scenario` and :mod:`~joulesched.cluster.workload`: validated scenario files,
  trace CSVs and the synthetic workload generator;
* :mod:`~joulesched.cluster.kube`: the Kubernetes cache (list + watch, the Prometheus feed) behind the live
  scheduler.
"""
