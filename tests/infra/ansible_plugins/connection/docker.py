"""A minimal `docker` connection for the test harness: `docker exec` into a container of our own dockerd.

ansible-core has no docker connection (that is the community.docker collection, not installable from PyPI
alone). testinfra maps `ansible_connection: docker` to its own docker backend, so one inventory serves both.
"""

from __future__ import annotations

import shlex
import subprocess

from ansible.errors import AnsibleConnectionFailure, AnsibleError
from ansible.plugins.connection import ConnectionBase

DOCUMENTATION = """
name: docker
short_description: Run tasks in a local container with the docker CLI (joulesched test harness)
description:
  - Uses C(docker exec) against the daemon in DOCKER_HOST. Test-only; real hosts use ssh.
author: joulesched
options:
  remote_addr:
    description: Container name.
    default: inventory_hostname
    vars:
      - name: inventory_hostname
      - name: ansible_host
      - name: ansible_docker_host
"""


class Connection(ConnectionBase):
    transport = "docker"
    has_pipelining = True

    def _connect(self):
        self._connected = True
        return self

    def _container(self) -> str:
        return self.get_option("remote_addr")

    def exec_command(self, cmd, in_data=None, sudoable=False):
        super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
        argv = ["docker", "exec", "-i", self._container(), "/bin/sh", "-c", cmd]
        p = subprocess.run(argv, input=in_data, capture_output=True, timeout=1800)
        if p.returncode == 1 and b"No such container" in p.stderr:
            raise AnsibleConnectionFailure(p.stderr.decode(errors="replace"))
        return p.returncode, p.stdout, p.stderr

    def put_file(self, in_path, out_path):
        super().put_file(in_path, out_path)
        with open(in_path, "rb") as f:
            p = subprocess.run(["docker", "exec", "-i", self._container(), "/bin/sh", "-c",
                                f"cat > {shlex.quote(out_path)}"], stdin=f, capture_output=True, timeout=600)
        if p.returncode != 0:
            raise AnsibleError(f"put_file {out_path}: {p.stderr.decode(errors='replace')}")

    def fetch_file(self, in_path, out_path):
        super().fetch_file(in_path, out_path)
        with open(out_path, "wb") as f:
            p = subprocess.run(["docker", "exec", self._container(), "cat", in_path], stdout=f,
                               stderr=subprocess.PIPE, timeout=600)
        if p.returncode != 0:
            raise AnsibleError(f"fetch_file {in_path}: {p.stderr.decode(errors='replace')}")

    def close(self):
        self._connected = False
