"""joulesched.core: what every layer may use and that uses nothing of joulesched.

The domain exception root (:mod:`~joulesched.core.errors`), atomic file writes (:mod:`~joulesched.core.fsio`),
listen-address parsing (:mod:`~joulesched.core.net`), held signals (:mod:`~joulesched.core.signals`) and YAML that
refuses a key given twice (:mod:`~joulesched.core.yamlio`).
"""
