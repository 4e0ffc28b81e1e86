"""One node power controller replica in a process of its own, so that a test can SIGKILL it in the middle of
an action: ``python -m tests.support.nodepower_proc CONFIG.json``. The config holds the apiserver URL, the
actuator (``auto``, with a credentials file), the address map, the policy and NodePowerConfig overrides.
Prints ``synced`` once its cache has synced; SIGTERM stops it cleanly."""

from __future__ import annotations

import json
import signal
import sys
import threading


def main(path: str) -> None:
    from joulesched.cluster.kube.client import api_client_for
    from joulesched.cluster.nodepower import PowerPolicy
    from joulesched.live.actuators import ActuatorOptions, make_actuator
    from joulesched.live.actuators.credentials import Credentials
    from joulesched.live.nodepower import NodePowerConfig, NodePowerController

    with open(path, encoding="utf-8") as f:
        c = json.load(f)
    act = make_actuator(c.get("actuator", "auto"),
                        ActuatorOptions(credentials=Credentials.load(c.get("credentials")), poll_s=0.05,
                                        graceful_timeout_s=5, request_timeout_s=2, connect_timeout_s=1))
    cfg = NodePowerConfig(policy=PowerPolicy(**c.get("policy", {})), addresses=c.get("addresses", {}),
                          **c.get("config", {}))
    ctl = NodePowerController(api_client_for(c["url"]), act, cfg).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not ctl.synced and not stop.wait(0.02):
        pass
    print("synced", flush=True)
    stop.wait()
    ctl.stop()


if __name__ == "__main__":
    main(sys.argv[1])
