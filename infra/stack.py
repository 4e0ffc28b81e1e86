"""Reading a provisioned environment back: a Pulumi stack's outputs, through the Automation API.

`joulesched pipeline --stack NAME` runs on whatever `joulesched infra up --stack NAME` built. The stacks export
what the pipeline needs under these names (``infra/program.py``); any may be absent:

- ``kubeconfig``: a kubeconfig file path, or its YAML content (a secret output);
- ``kube_context``: the context to use in it (else its current context);
- ``prometheus_url``: the Prometheus that scrapes the power exporter;
- ``target_url``: the test app to drive load at;
- ``hosts``: SSH targets for host-side steps, a list of ``{name, address, port, user}``.

The Automation API drives the ``pulumi`` CLI, which is not packaged for Debian or PyPI; without it every entry
point here raises :class:`StackError` saying how to install it.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from joulesched.core.errors import UsageError

REPO = Path(__file__).resolve().parent.parent
PULUMI_INSTALL = ("the Pulumi CLI is not on PATH. Install it (it is not packaged for Debian or PyPI):\n"
                  "  curl -fsSL https://get.pulumi.com | sh      # or: brew install pulumi\n"
                  "then log in to a state backend, e.g. `pulumi login --local`, and rerun.")


class StackError(UsageError):
    """No Pulumi CLI, an unknown stack, or outputs of the wrong shape."""


def known_stacks(work_dir: Path = REPO) -> list[str]:
    return sorted(p.name[len("Pulumi."):-len(".yaml")] for p in Path(work_dir).glob("Pulumi.*.yaml"))


def _check(name: str, work_dir: Path) -> None:
    if shutil.which("pulumi") is None:
        raise StackError(PULUMI_INSTALL)
    if not (Path(work_dir) / f"Pulumi.{name}.yaml").is_file():
        raise StackError(f"no Pulumi.{name}.yaml; known stacks: {', '.join(known_stacks(work_dir))}")


def open_stack(name: str, work_dir: Path = REPO, *, create: bool = True):
    """The stack ``name`` of the project in ``work_dir`` (created when missing, unless ``create`` is False)."""
    _check(name, work_dir)
    from pulumi import automation as auto

    if create:
        return auto.create_or_select_stack(stack_name=name, work_dir=str(work_dir))
    try:
        return auto.select_stack(stack_name=name, work_dir=str(work_dir))
    except auto.errors.StackNotFoundError:
        raise StackError(f"stack {name!r} does not exist yet; run `joulesched infra up --stack {name}`") from None
    except auto.errors.CommandError as e:
        raise StackError(f"cannot select stack {name!r}: {_last_line(e)}") from None


def _last_line(e: Exception) -> str:
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else type(e).__name__


def stack_outputs(name: str, work_dir: Path = REPO) -> dict[str, Any]:
    """The plain values of the stack's outputs (secrets decrypted, for this process only)."""
    from pulumi.automation import errors

    stack = open_stack(name, work_dir, create=False)
    try:
        return {k: v.value for k, v in stack.outputs().items()}
    except errors.CommandError as e:
        raise StackError(f"cannot read the outputs of stack {name!r}: {_last_line(e)}") from None


@dataclass(frozen=True)
class SshHost:
    name: str
    address: str
    port: int = 22
    user: str | None = None


@dataclass(frozen=True)
class Environment:
    """What a pipeline run needs to know about a provisioned environment."""

    stack: str
    kubeconfig: str | None = None  # a path
    kubeconfig_content: str | None = None  # or the file itself
    kube_context: str | None = None
    prometheus_url: str | None = None
    target_url: str | None = None
    hosts: tuple[SshHost, ...] = field(default_factory=tuple)


def _str(outputs: dict, key: str, stack: str) -> str | None:
    v = outputs.get(key)
    if v is None or v == "":
        return None
    if not isinstance(v, str):
        raise StackError(f"stack {stack!r}: output {key} must be a string, got {type(v).__name__}")
    return v


def environment(stack: str, outputs: dict[str, Any]) -> Environment:
    """Interpret the outputs of ``stack`` (see the module docstring); a wrongly shaped one is a StackError."""
    kc = _str(outputs, "kubeconfig", stack)
    path, content = (None, kc) if kc and ("\n" in kc or kc.lstrip().startswith(("apiVersion", "{"))) else (kc, None)
    for key in ("prometheus_url", "target_url"):
        v = _str(outputs, key, stack)
        if v and not v.startswith(("http://", "https://")):
            raise StackError(f"stack {stack!r}: output {key} must be an http(s) URL, got {v!r}")
    raw_hosts = outputs.get("hosts") or []
    if not isinstance(raw_hosts, list):
        raise StackError(f"stack {stack!r}: output hosts must be a list of {{name, address, port, user}}")
    hosts = []
    for i, h in enumerate(raw_hosts):
        if not isinstance(h, dict) or not isinstance(h.get("address"), str) or not h.get("address"):
            raise StackError(f"stack {stack!r}: hosts[{i}] needs an address")
        try:
            port = int(h.get("port", 22))
        except (TypeError, ValueError):
            raise StackError(f"stack {stack!r}: hosts[{i}].port must be a number, got {h.get('port')!r}") from None
        hosts.append(SshHost(name=str(h.get("name") or h["address"]), address=h["address"], port=port,
                             user=h.get("user")))
    return Environment(stack=stack, kubeconfig=path, kubeconfig_content=content,
                       kube_context=_str(outputs, "kube_context", stack),
                       prometheus_url=_str(outputs, "prometheus_url", stack),
                       target_url=_str(outputs, "target_url", stack), hosts=tuple(hosts))
