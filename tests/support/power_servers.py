"""Real power-management servers on loopback for the actuator tests, each in its own process:

- :func:`redfish_emulator`: sushy-tools' ``sushy-emulator`` (a real Redfish HTTP server) with its fake systems
  driver and HTTP basic auth from a bcrypt htpasswd file made for the run;
- :func:`ipmi_bmc`: a BMC built on pyghmi's own server class (``pyghmi.ipmi.bmc.Bmc``, as pyghmi's fakebmc)
  bound to 127.0.0.1, speaking real IPMI 2.0 lanplus over UDP; run as ``python -m tests.support.power_servers
  ipmi PORT`` with the password in ``$BMC_PASSWORD``;
- :func:`moto_ec2`: moto's server mode (``ThreadedMotoServer``), which boto3 reaches through ``endpoint_url``.

Passwords are made per run and passed through files or the environment, never on a command line.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.support.procs import free_port, stop_process, wait_for

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def redfish_emulator(workdir: Path, systems: list[dict]) -> Iterator[tuple[str, str, str]]:
    """``(base URL, username, password)`` of a sushy-emulator serving ``systems`` (fake driver entries:
    ``{"uuid", "name", "power_state"}``) on 127.0.0.1."""
    import bcrypt

    workdir.mkdir(parents=True, exist_ok=True)
    user, password = "admin", secrets.token_urlsafe(12)
    htpasswd = workdir / "htpasswd"
    htpasswd.write_text(f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()}\n")
    port = free_port()
    config = workdir / "emulator.conf"
    config.write_text(f"SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\nSUSHY_EMULATOR_LISTEN_PORT = {port}\n"
                      f"SUSHY_EMULATOR_FAKE_DRIVER = True\nSUSHY_EMULATOR_FAKE_SYSTEMS = {systems!r}\n"
                      f"SUSHY_EMULATOR_AUTH_FILE = {str(htpasswd)!r}\n"
                      f"SUSHY_EMULATOR_STATE_DIR = {str(workdir / 'state')!r}\n")
    log = open(workdir / "sushy.log", "wb")
    exe = Path(sys.executable).with_name("sushy-emulator")
    proc = subprocess.Popen([str(exe), "--config", str(config), "--fake", "--interface", "127.0.0.1",
                             "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    try:
        import requests

        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"sushy-emulator exited: {(workdir / 'sushy.log').read_text()[-2000:]}")
            try:
                return requests.get(f"http://127.0.0.1:{port}/redfish/v1/", timeout=1).status_code in (200, 401)
            except requests.RequestException:
                return False

        wait_for(up, 30, "sushy-emulator", interval=0.1)
        yield f"127.0.0.1:{port}", user, password
    finally:
        stop_process(proc, timeout=10)
        log.close()


@contextlib.contextmanager
def ipmi_bmc(workdir: Path, user: str = "admin") -> Iterator[tuple[str, str, str, Path]]:
    """``(host:port, user, password, power state file)`` of a pyghmi BMC on 127.0.0.1 (UDP). The state file
    holds the managed system's power ("on"/"off"), so a test can see what the BMC did."""
    workdir.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(12)
    port = free_port()
    state = workdir / "power"
    state.write_text("on")
    env = {**os.environ, "BMC_USER": user, "BMC_PASSWORD": password, "BMC_STATE": str(state)}
    log = open(workdir / "bmc.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.power_servers", "ipmi", str(port)], env=env,
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        def up() -> bool:  # not asked over IPMI: a client session made here would linger in pyghmi's cache
            text = (workdir / "bmc.log").read_text(errors="replace")
            if proc.poll() is not None:
                raise RuntimeError(f"the BMC exited: {text[-2000:]}")
            return "listening" in text

        wait_for(up, 30, "the IPMI BMC", interval=0.1)
        yield f"127.0.0.1:{port}", user, password, state
    finally:
        stop_process(proc, timeout=10)
        log.close()


@contextlib.contextmanager
def moto_ec2() -> Iterator[str]:
    """The endpoint URL of a moto server on 127.0.0.1."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def _serve_ipmi(port: int) -> None:
    import pyghmi.ipmi.bmc as bmc
    from pyghmi.ipmi.private import serversession

    # pyghmi's server speaks cipher suite 3 only (RAKP-HMAC-SHA1) but answers a SHA-256 proposal with success,
    # which pyghmi's client takes as accepted (then fails on the hash length). A SHA-1-only BMC refuses the
    # proposal with "invalid authentication algorithm", as real ones do, and the client falls back to SHA-1.
    accept = serversession.ServerSession.create_open_session_response

    def sha1_only(self, request):
        if request[12] != 1:
            return bytearray([request[0], 0x11, 0, 0]) + bytearray(request[4:8])
        return accept(self, request)

    serversession.ServerSession.create_open_session_response = sha1_only

    state = Path(os.environ["BMC_STATE"])

    class FileBmc(bmc.Bmc):
        """pyghmi's fakebmc, bound to loopback, its system's power kept in a file."""

        def get_power_state(self):
            return state.read_text().strip()

        def power_off(self):
            state.write_text("off")

        def power_on(self):
            state.write_text("on")

        def power_shutdown(self):  # a clean OS shutdown: the system is off a moment later
            state.write_text("off")

        def power_reset(self):
            pass

        def is_active(self):
            return state.read_text().strip() == "on"

    server = FileBmc({os.environ["BMC_USER"]: os.environ["BMC_PASSWORD"]}, port=port, address="127.0.0.1")
    print(f"listening on 127.0.0.1:{port}/udp", flush=True)  # the socket is bound: clients may come
    server.listen()


if __name__ == "__main__":
    if sys.argv[1] == "ipmi":
        _serve_ipmi(int(sys.argv[2]))
