"""Client for a running blocker app: start a load, wait for it, stop it (replaces the seed's resource_blocker.py)."""

from __future__ import annotations

import time
from typing import Any

import requests

from joulesched.workloads.load.results import DriverError
from joulesched.workloads.params import KINDS

TIMEOUT_S = 10.0


def _call(method: str, url: str, **kw: Any) -> dict[str, Any]:
    try:
        r = requests.request(method, url, timeout=TIMEOUT_S, **kw)
    except requests.RequestException as exc:
        raise DriverError(f"cannot reach {url}: {exc}") from None
    try:
        body = r.json()
    except ValueError:  # a blocker answers JSON, errors too: this is another app (its HTML page), or a proxy's
        kind = r.headers.get("Content-Type") or "no Content-Type"
        raise DriverError(f"{url} does not look like a blocker app: it answered {r.status_code} ({kind}), not JSON")
    if r.status_code >= 400:
        reason = body.get("error", body) if isinstance(body, dict) else body
        raise DriverError(f"{url} answered {r.status_code}: {reason}")
    return body


def _status(target: str, body: Any) -> dict[str, Any]:
    """``body`` if it has the shape of a blocker's status; else DriverError: some other app answered (a wrong
    port, the shop, a proxy), and reading its reply as a status would fail later with a KeyError."""
    if not (isinstance(body, dict) and body.get("kind") in KINDS and body.get("state") in ("idle", "running")):
        shown = repr(body)
        raise DriverError(f"{target} does not look like a blocker app (it answered {shown[:120]}"
                          f"{'...' if len(shown) > 120 else ''}, not a blocker status with kind and state)")
    return body


def start(target: str, params: dict[str, Any]) -> dict[str, Any]:
    return _status(target, _call("POST", target.rstrip("/") + "/start", json=params))


def stop(target: str) -> dict[str, Any]:
    return _status(target, _call("POST", target.rstrip("/") + "/stop"))


def status(target: str) -> dict[str, Any]:
    return _status(target, _call("GET", target.rstrip("/") + "/status"))


def wait_idle(target: str, timeout_s: float, poll_s: float = 0.5) -> dict[str, Any]:
    """Poll /status until the run ended; DriverError after `timeout_s`."""
    end = time.monotonic() + timeout_s
    while True:
        st = status(target)
        if st["state"] == "idle":
            return st
        if time.monotonic() >= end:
            raise DriverError(f"{target} still running after {timeout_s:.0f} s")
        time.sleep(poll_s)
