"""joulesched.live: the daemons that act on a real cluster.

The secondary scheduler (:mod:`~joulesched.live.scheduler`), the kube-scheduler extender
(:mod:`~joulesched.live.extender`), the hardened HTTP server under both (:mod:`~joulesched.live.httpd`), leader
election over a Lease (:mod:`~joulesched.live.leader`) and the wiring that builds them from options
(:mod:`~joulesched.live.daemon`). They read the cluster through :class:`joulesched.cluster.kube.KubeCache`
and decide with any :class:`joulesched.agent.policy.Policy`.
"""
