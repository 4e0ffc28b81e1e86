"""Credentials for BMCs and hosts, read from a file: a Kubernetes Secret mounted as a volume, or a file with
mode 0600 outside a cluster. Never from the command line (it would show in ``ps``) and never logged.

The file is YAML (or JSON)::

    nodes:                                               # by node name: the first place looked
      worker-7: {username: root, password: ...}
    hosts:
      10.0.0.5:623: {username: ipmiuser, password: ...}  # by HOST[:PORT] of the power address
      bmc-7.example: {username: root, password: ...}
    default: {username: admin, password: ...}           # only for addresses from the operator's address map

``default`` is never handed to an address that came from a node's annotation: such an address gets a login
only where the operator named its node or its host. A directory (a Secret mounted with one key per file)
holds ``username`` and ``password`` files instead, used as that default.

Permissions: a plain file must not be readable by group or others (chmod 600). A key of a mounted Secret (a
symlink into the volume's own ``..data`` directory, mode from ``defaultMode``) may be group-readable (the
pod's ``fsGroup``) but never world-readable; a symlink that leaves its directory is not trusted.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

import yaml

from joulesched.core import yamlio
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
    """Logins by node and by host. ``Credentials.load(path)``; ``login(target)``."""

    def __init__(self, default: Login | None = None, hosts: dict[str, Login] | None = None,
                 nodes: dict[str, Login] | None = None) -> None:
        self.default, self.hosts, self.nodes = default, dict(hosts or {}), dict(nodes or {})

    def __repr__(self) -> str:
        return (f"Credentials(nodes={sorted(self.nodes)}, hosts={sorted(self.hosts)}, "
                f"default={'set' if self.default else 'none'})")

    def for_host(self, host: str, *, node: str = "", use_default: bool = True) -> Login | None:
        """The login for ``node`` or ``host`` (HOST[:PORT], then the bare HOST); ``default`` only when
        ``use_default``."""
        if node and node in self.nodes:
            return self.nodes[node]
        if host in self.hosts:
            return self.hosts[host]
        bare = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
        return self.hosts.get(bare, self.default if use_default else None)

    def login(self, target) -> Login | None:
        """The login for a :class:`~joulesched.live.actuators.base.Target`: by node, by host, and the default
        only for an address from the operator's map."""
        return self.for_host(target.address.host, node=target.node, use_default=target.source != "annotation")

    @classmethod
    def load(cls, path: str | Path | None) -> "Credentials":
        if not path:
            return cls()
        p = Path(path)
        if p.is_dir():
            try:
                _check_mode(p / "username")
                user = (p / "username").read_text(encoding="utf-8").strip()
                pw = ""
                if (p / "password").exists():
                    _check_mode(p / "password")
                    pw = (p / "password").read_text(encoding="utf-8").strip()
            except OSError as e:
                raise CredentialsError(f"credentials directory {p}: {e.strerror}: needs a 'username' file "
                                       "(and 'password')") from None
            except UnicodeDecodeError:  # no echo of the bytes: they may be a password
                raise CredentialsError(f"credentials directory {p}: username and password must be UTF-8 "
                                       "text") from None
            return cls(Login(user, pw))
        try:
            _check_mode(p)
            text = p.read_text(encoding="utf-8")
        except OSError as e:
            raise CredentialsError(f"credentials file {p}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise CredentialsError(f"credentials file {p}: not UTF-8 text") from None
        try:
            data = yamlio.load(text) or {}
        except yamlio.DuplicateKeyError as e:  # its lines only: nothing of the file's text reaches a log
            raise CredentialsError(f"credentials file {p}: a key is given twice (lines {e.lines[0]} and "
                                   f"{e.lines[1]})") from None
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

        unknown = set(data) - {"default", "hosts", "nodes"}
        if unknown:
            raise CredentialsError(f"credentials file {p}: unknown key {sorted(unknown)[0]!r} (nodes, hosts, "
                                   "default)")
        sections = {}
        for key, what in (("hosts", "host"), ("nodes", "node name")):
            sec = data.get(key) or {}
            if not isinstance(sec, dict):
                raise CredentialsError(f"credentials file {p}: '{key}' must be a mapping of {what} to login")
            sections[key] = {str(h): login(v, f"{key}.{h}") for h, v in sec.items()}
        return cls(login(data["default"], "default") if "default" in data else None, **sections)


def _secret_volume(p: Path) -> bool:
    """A key of a mounted Secret: a symlink whose real file lies inside the same directory's ``..data`` (the
    kubelet's atomic writer), not merely a link whose text contains "..data"."""
    if not os.path.islink(p):
        return False
    data = os.path.realpath(p.parent / "..data")
    return os.path.realpath(p).startswith(data + os.sep) and os.path.islink(p.parent / "..data")


def _check_mode(p: Path) -> None:
    """Refuse a credentials file others can read (group too, unless it is a Secret volume's key)."""
    mode = stat.S_IMODE(os.stat(p).st_mode)
    bad = stat.S_IRWXO | (0 if _secret_volume(p) else stat.S_IRWXG)
    if mode & bad:
        raise CredentialsError(f"credentials file {p} is readable by other users (mode {mode:o}); chmod 600 it")
