#!/usr/bin/python3
"""Fetch the cluster CA's private key from SSM Parameter Store through the instance role, before kubeadm init.

joulesched (infra/cloud-init/fetch-ca-key.py) puts this script, not the key, into the first control-plane
node's EC2 user-data: user-data is readable by anyone with ec2:DescribeInstanceAttribute and by every process
that reaches the metadata service, so only the parameter's name travels there. The key is a SecureString that
only this node's instance role may read (ssm:GetParameter on that one parameter).

It is written 0600 in a 0700 folder, through a temporary file and a rename, and never printed. Retries for a
while: a fresh instance profile can take some seconds to be usable. Needs python3-boto3.
"""

import argparse
import os
import sys
import tempfile
import time

import boto3
from botocore.exceptions import BotoCoreError, ClientError


def fetch(name: str, region: str, attempts: int, wait_max: float) -> str:
    ssm = boto3.client("ssm", region_name=region)
    last: Exception | None = None
    for i in range(attempts):
        try:
            return ssm.get_parameter(Name=name, WithDecryption=True)["Parameter"]["Value"]
        except ClientError as e:
            last = e
            if e.response.get("Error", {}).get("Code") == "ParameterNotFound":
                break
        except BotoCoreError as e:
            last = e
        time.sleep(min(wait_max, 2 ** i))
    raise SystemExit(f"joulesched-fetch-ca-key: cannot read SSM parameter {name} in {region}: {last}")


def write_private(path: str, text: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".ca.key.")  # 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parameter", required=True, help="SSM parameter holding the PEM key (SecureString)")
    p.add_argument("--region", required=True)
    p.add_argument("--out", default="/etc/kubernetes/pki/ca.key")
    p.add_argument("--attempts", type=int, default=30)
    p.add_argument("--wait-max", type=float, default=10.0)
    a = p.parse_args(argv)
    key = fetch(a.parameter, a.region, a.attempts, a.wait_max)
    if not (key.lstrip().startswith("-----BEGIN") and " PRIVATE " in key.splitlines()[0]):
        raise SystemExit(f"joulesched-fetch-ca-key: {a.parameter} does not hold a PEM private key")
    write_private(a.out, key if key.endswith("\n") else key + "\n")
    print(f"joulesched-fetch-ca-key: wrote {a.out} (0600) from {a.parameter}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
