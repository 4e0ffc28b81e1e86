"""`workload serve --listen NAME:PORT` with a name that resolves to IPv6 only: the up-front bind check takes the
family the name resolves to (not whether the host has a ':' in it), and the server binds the address it resolved
to (werkzeug alone would bind such a name as IPv4)."""

from __future__ import annotations

import socket

import pytest
from flask import Flask

from joulesched.pipelines.cli.workload import _check_can_listen
from joulesched.workloads.server import make_server

NAME = "v6only.test"


@pytest.fixture
def ipv6_only_name(monkeypatch):
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host == NAME:
            return [(socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("::1", port, 0, 0))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def test_a_name_that_resolves_to_ipv6_only_passes_and_is_served_on_ipv6(ipv6_only_name):
    host = _check_can_listen(NAME, 0, f"{NAME}:0")
    assert host == "::1"
    server = make_server(host, 0, Flask(__name__))
    try:
        assert server.socket.family == socket.AF_INET6 and server.socket.getsockname()[0] == "::1"
    finally:
        server.server_close()


def test_an_ipv4_name_and_address_are_served_as_given():
    assert _check_can_listen("localhost", 0, "localhost:0") == "localhost"
    assert _check_can_listen("127.0.0.1", 0, "127.0.0.1:0") == "127.0.0.1"


def test_a_name_that_resolves_to_both_families_is_served_on_ipv4_as_before(monkeypatch):
    # Where /etc/hosts gives localhost ::1 too, glibc may list it first: the app must stay on 127.0.0.1, where
    # werkzeug has always bound it and where its users reach it.
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host == "localhost":
            return [(socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("::1", port, 0, 0)),
                    (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    assert _check_can_listen("localhost", 0, "localhost:0") == "localhost"
