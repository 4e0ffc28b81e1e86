"""Credentials for BMCs and hosts, read from a file: a Kubernetes Secret mounted as a volume, or a file with
mode 0600 outside a cluster. Never from the command line (it would show in ``ps``) and never logged.

The file is YAML (or JSON)::

    default: {username: admin, password: ...}          # any host not listed below
    hosts:
      10.0.0.5:623: {username: ipmiuser, password: ...}  # by HOST[:PORT] of the power address
      bmc-7.example: {username: root, password: ...}

A directory (a Secret mounted with one key per file) holds ``username`` and ``password`` files instead,
used as the default.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

import yaml

from joulesched.core.errors import UsageError


class CredentialsError(UsageError):
    """The credentials file is missing, unreadable, malformed or readable by others."""


@dataclass(frozen=True)
class Login:
    username: str
    password: str = ""

    def __repr__(self) -> str:  # never print a password, even in a traceback
        return f"Login(username={self.username!r}, password=<hidden>)"

    __str__ = __repr__


class Credentials:
    """Logins by host. ``Credentials.load(path)``; ``for_host("10.0.0.5:623")``."""

    def __init__(self, default: Login | None = None, hosts: dict[str, Login] | None = None) -> None:
        self.default, self.hosts = default, dict(hosts or {})

    def __repr__(self) -> str:
        return f"Credentials(hosts={sorted(self.hosts)}, default={'set' if self.default else 'none'})"

    def for_host(self, host: str) -> Login | None:
        if host in self.hosts:
            return self.hosts[host]
        bare = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
        return self.hosts.get(bare, self.default)

    @classmethod
    def load(cls, path: str | Path | None) -> "Credentials":
        if not path:
            return cls()
        p = Path(path)
        if p.is_dir():
            try:
                user = (p / "username").read_text().strip()
                pw = (p / "password").read_text().strip() if (p / "password").exists() else ""
            except OSError as e:
                raise CredentialsError(f"credentials directory {p}: {e.strerror}: needs a 'username' file "
                                       "(and 'password')") from None
            return cls(Login(user, pw))
        try:
            st = p.stat()
            text = p.read_text(encoding="utf-8")
        except OSError as e:
            raise CredentialsError(f"credentials file {p}: {e.strerror}") from None
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO) and not _secret_volume(p):
            raise CredentialsError(f"credentials file {p} is readable by other users (mode "
                                   f"{stat.S_IMODE(st.st_mode):o}); chmod 600 it")
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError:
            raise CredentialsError(f"credentials file {p} is not YAML") from None  # no echo of its content
        if not isinstance(data, dict):
            raise CredentialsError(f"credentials file {p}: expected a mapping with 'default' and/or 'hosts'")

        def login(v: object, where: str) -> Login:
            if not isinstance(v, dict) or not isinstance(v.get("username"), str):
                raise CredentialsError(f"credentials file {p}: {where} needs a 'username' string")
            pw = v.get("password", "")
            if not isinstance(pw, str):
                raise CredentialsError(f"credentials file {p}: {where}.password must be a string")
            return Login(v["username"], pw)

        unknown = set(data) - {"default", "hosts"}
        if unknown:
            raise CredentialsError(f"credentials file {p}: unknown key {sorted(unknown)[0]!r} (default, hosts)")
        hosts = data.get("hosts") or {}
        if not isinstance(hosts, dict):
            raise CredentialsError(f"credentials file {p}: 'hosts' must be a mapping of host to login")
        return cls(login(data["default"], "default") if "default" in data else None,
                   {str(h): login(v, f"hosts.{h}") for h, v in hosts.items()})


def _secret_volume(p: Path) -> bool:
    """Kubernetes mounts Secret keys as symlinks into a ..data directory, mode set by defaultMode: trust it."""
    return os.path.islink(p) and "..data" in os.readlink(p)
