"""AWS EC2 with ``boto3``: sleep = ``StopInstances`` (with ``Hibernate=True`` where the instance was launched
with hibernation configured), wake = ``StartInstances``. Address ``aws://INSTANCE-ID[?region=R]``.

Credentials come from boto3's own chain (an IAM role for the service account, or environment variables and a
shared credentials file from a Secret), never from the address or the command line. ``endpoint_url`` points
it elsewhere (moto's server in the tests, a VPC endpoint).

Bounded: connect and read timeouts (5 s and 15 s by default), two attempts per request, at most ``max_clients`` regional
clients kept; an error's text is reduced to its code (the full message, with ARNs, goes to DEBUG)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from joulesched.live.actuators.base import (OFF, ON, TRANSITIONING, UNKNOWN, ActuatorError, Target, after_power_off,
                                            marked)


class AwsActuator:
    name = "aws"

    def __init__(self, *, region: str | None = None, endpoint_url: str | None = None, timeout_s: float = 600.0,
                 poll_s: float = 5.0, max_clients: int = 16, connect_timeout_s: float = 5.0,
                 request_timeout_s: float = 15.0) -> None:
        self.region, self.endpoint_url, self.timeout_s, self.poll_s = region, endpoint_url, timeout_s, poll_s
        self.max_clients = max_clients
        self._clients: OrderedDict[str | None, object] = OrderedDict()
        self._lock = threading.Lock()
        self._config = Config(connect_timeout=connect_timeout_s, read_timeout=request_timeout_s,
                              retries={"max_attempts": 2, "mode": "standard"})

    def _ec2(self, target: Target):
        region = target.address.params.get("region") or self.region
        with self._lock:
            if region not in self._clients:
                self._clients[region] = boto3.client("ec2", region_name=region, endpoint_url=self.endpoint_url,
                                                     config=self._config)
                while len(self._clients) > self.max_clients:
                    self._clients.popitem(last=False)
            self._clients.move_to_end(region)
            return self._clients[region]

    def _instance(self, target: Target) -> dict:
        target.checkpoint()
        try:
            r = self._ec2(target).describe_instances(InstanceIds=[target.address.host])
            return r["Reservations"][0]["Instances"][0]
        except (ClientError, BotoCoreError, IndexError, KeyError) as e:
            raise ActuatorError(f"{target.node}: EC2 {target.address.host}: {_code(e)}") from None

    def sleep(self, target: Target) -> None:
        inst = self._instance(target)
        if inst["State"]["Name"] in ("stopped", "stopping"):
            return
        hibernate = bool((inst.get("HibernationOptions") or {}).get("Configured"))
        target.checkpoint()
        try:
            self._ec2(target).stop_instances(InstanceIds=[target.address.host], Hibernate=hibernate)
        except ClientError as e:  # EC2 answered, and refused
            raise ActuatorError(f"{target.node}: EC2 stop {target.address.host}: {_code(e)}") from None
        except BotoCoreError as e:  # no answer (a read timing out, retries spent): the stop may have been done
            raise marked(ActuatorError(f"{target.node}: EC2 stop {target.address.host}: {_code(e)}")) from None
        deadline = time.monotonic() + self.timeout_s
        with after_power_off():  # DescribeInstances may read "running" for a moment after an accepted stop
            while self.state(target) != OFF:
                if time.monotonic() >= deadline:
                    raise ActuatorError(f"{target.node}: EC2 {target.address.host} not stopped after "
                                        f"{self.timeout_s:g} s")
                target.pause(self.poll_s)

    def wake(self, target: Target) -> None:
        target.checkpoint()
        try:
            self._ec2(target).start_instances(InstanceIds=[target.address.host])
        except (ClientError, BotoCoreError) as e:
            raise ActuatorError(f"{target.node}: EC2 start {target.address.host}: {_code(e)}") from None

    def state(self, target: Target) -> str:
        name = self._instance(target)["State"]["Name"]
        return {"running": ON, "stopped": OFF, "pending": TRANSITIONING, "stopping": TRANSITIONING,
                "shutting-down": TRANSITIONING}.get(name, UNKNOWN)


def _code(e: Exception) -> str:
    """An AWS error reduced to its code (``InvalidInstanceID.NotFound``), without the message's ARNs."""
    if isinstance(e, ClientError):
        return str((e.response.get("Error") or {}).get("Code") or "ClientError")
    return type(e).__name__
