"""Client for a running blocker app: start a load, wait for it, stop it (replaces the seed's resource_blocker.py)."""

from __future__ import annotations

import time
from typing import Any

import requests

from joulesched.workloads.load.results import DriverError

TIMEOUT_S = 10.0


def _call(method: str, url: str, **kw: Any) -> dict[str, Any]:
    try:
        r = requests.request(method, url, timeout=TIMEOUT_S, **kw)
    except requests.RequestException as exc:
        raise DriverError(f"cannot reach {url}: {exc}") from None
    try:
        body = r.json()
    except ValueError:
        body = {"error": r.text[:200]}
    if r.status_code >= 400:
        raise DriverError(f"{url} answered {r.status_code}: {body.get('error', body)}")
    return body


def start(target: str, params: dict[str, Any]) -> dict[str, Any]:
    return _call("POST", target.rstrip("/") + "/start", json=params)


def stop(target: str) -> dict[str, Any]:
    return _call("POST", target.rstrip("/") + "/stop")


def status(target: str) -> dict[str, Any]:
    return _call("GET", target.rstrip("/") + "/status")


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
