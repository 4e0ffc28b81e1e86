"""The live daemons' HTTP server: the hardened base of :mod:`joulesched.core.httpd`, shared with the power
exporter and the workload apps. The scheduler's status endpoint and the extender use it from here."""

from __future__ import annotations

from joulesched.core.httpd import (
    DEFAULT_LIMITS,
    BackgroundHTTPServer,
    HardenedHandlerMixin,
    Limits,
    harden,
    reply,
)

__all__ = ["BackgroundHTTPServer", "DEFAULT_LIMITS", "HardenedHandlerMixin", "Limits", "harden", "reply"]
