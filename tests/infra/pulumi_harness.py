"""Run Pulumi programs under `pulumi.runtime.set_mocks` (no CLI, no engine) and record every resource."""

from __future__ import annotations

import json
import runpy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pulumi
import yaml

REPO = Path(__file__).resolve().parents[2]
DYNAMIC = "pulumi-python:dynamic:Resource"
#: What a mocked kvm master "prints" as its CA hash (a real one reads it from the serial console).
MASTER_CA_HASH = "sha256:" + "5e" * 32


@dataclass
class Recorded:
    typ: str
    name: str
    inputs: dict
    outputs: dict


@dataclass
class Recording(pulumi.runtime.Mocks):
    resources: list[Recorded] = field(default_factory=list)
    exports: dict = field(default_factory=dict)

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        outputs = dict(args.inputs)
        if args.typ == DYNAMIC and "common_name" in args.inputs:  # KubeadmPki: the real provider, it is fast
            from joulesched.infra.dynamic import KubeadmPkiProvider

            outputs.update(KubeadmPkiProvider().create(dict(args.inputs)).outs)
        elif args.typ == DYNAMIC:
            outputs.update(uuid=f"uuid-{args.name}", resolved_virt_type="qemu", ca_cert_hash="")
            if args.inputs.get("wait_ca_hash_s"):  # a master: the hash it would print on its console
                outputs["ca_cert_hash"] = MASTER_CA_HASH
        elif args.typ == "aws:ec2/instance:Instance":
            outputs.update(private_ip="10.0.1.10", public_ip="203.0.113.10")
        elif args.typ == "aws:ssm/parameter:Parameter":  # AWS's ARN of a parameter named /a/b: ...:parameter/a/b
            outputs.update(arn=f"arn:aws:ssm:eu-central-1:123456789012:parameter{args.inputs['name']}")
        self.resources.append(Recorded(args.typ, args.name, dict(args.inputs), outputs))
        return f"{args.name}-id", outputs

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}

    # ----------------------------------------------------------------------------------------- queries
    def of_type(self, typ: str) -> list[Recorded]:
        return [r for r in self.resources if r.typ == typ]

    def named(self, name: str) -> Recorded:
        hits = [r for r in self.resources if r.name == name]
        assert len(hits) == 1, f"expected one resource named {name}, got {[r.name for r in self.resources]}"
        return hits[0]

    def by_k8s_name(self, typ: str, name: str) -> Recorded:
        hits = [r for r in self.of_type(typ) if r.inputs.get("metadata", {}).get("name") == name]
        assert len(hits) == 1, f"expected one {typ} named {name}; have {[r.name for r in self.of_type(typ)]}"
        return hits[0]


def run(build: Callable[[], Any], config: dict[str, Any] | None = None) -> Recording:
    """Run `build()` as a Pulumi program with mocks and the given config; return what it registered."""
    rec = Recording()
    pulumi.runtime.set_mocks(rec, project="joulesched", stack="test", preview=False)
    pulumi.runtime.set_all_config({k: v if isinstance(v, str) else json.dumps(v) for k, v in (config or {}).items()})

    @pulumi.runtime.test
    def _program():
        return build()

    _program()
    return rec


def stack_config(stack: str, **extra: Any) -> dict[str, Any]:
    """The committed Pulumi.<stack>.yaml config plus per-user settings a test adds (keys without prefix)."""
    doc = yaml.safe_load((REPO / f"Pulumi.{stack}.yaml").read_text())["config"]
    doc = {k: v for k, v in doc.items() if k.startswith(("joulesched:", "aws:"))}
    doc.update({f"joulesched:{k}": v for k, v in extra.items()})
    return doc


def run_main(config: dict[str, Any]) -> Recording:
    """Run infra/__main__.py itself, as `pulumi up` would."""
    exports: dict = {}

    def _build():
        orig = pulumi.export
        pulumi.export = lambda k, v: exports.__setitem__(k, v)  # type: ignore[assignment]
        try:
            runpy.run_path(str(REPO / "infra" / "__main__.py"), run_name="__main__")
        finally:
            pulumi.export = orig  # type: ignore[assignment]
        return pulumi.Output.all(**exports) if exports else None

    rec = run(_build, config)
    rec.exports = exports
    return rec
