"""joulesched.workloads: the load a cluster runs while it is measured.

Resource blockers (:mod:`.cpu`, :mod:`.memory`, :mod:`.disk`, :mod:`.network`, :mod:`.service` for the
combined one), the test app (:mod:`.testapp`) and the shop (:mod:`.shop`), served by :mod:`.server`; their
Kubernetes manifests (:mod:`.manifests`, rendered into k8s/); and the load drivers in :mod:`.load` (JMeter,
Locust). Images are built from docker/ by build.sh.
"""
