"""Locust user for the joulesched drivers: GET one path as fast as each user can, log every request.

Configured by environment (set by `joulesched load locust`):
    JOULESCHED_LOCUST_PATH     path and query to GET (default /work?ms=5)
    JOULESCHED_LOCUST_SAMPLES  CSV file that gets one row per request: start_ms,elapsed_ms,ok
    JOULESCHED_LOCUST_TIMEOUT  seconds after which an unanswered request fails (default 5, as the JMeter plan)
Per-request rows (rather than Locust's rounded percentile CSV) let both drivers compute the same statistics.
"""

import os
import time

from locust import HttpUser, constant, events, task

PATH = os.environ.get("JOULESCHED_LOCUST_PATH", "/work?ms=5")
TIMEOUT_S = float(os.environ.get("JOULESCHED_LOCUST_TIMEOUT", "5"))
_samples = open(os.environ.get("JOULESCHED_LOCUST_SAMPLES", os.devnull), "w", buffering=1 << 16)
_samples.write("start_ms,elapsed_ms,ok\n")


@events.request.add_listener
def _record(request_type, name, response_time, response_length, exception, **kwargs):
    start_ms = time.time() * 1000 - response_time
    _samples.write(f"{start_ms:.3f},{response_time:.3f},{'false' if exception else 'true'}\n")


@events.quitting.add_listener
def _close(environment, **kwargs):
    _samples.flush()
    _samples.close()


class TestAppUser(HttpUser):
    # No think time: the driver measures the app at the offered concurrency, as the JMeter plan does.
    wait_time = constant(0)

    @task
    def get_path(self):
        # A timeout, or a hung request would never end: killed at the run's end it would leave no row at all.
        self.client.get(PATH, name="GET test app", timeout=TIMEOUT_S)
