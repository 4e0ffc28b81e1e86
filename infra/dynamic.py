"""Pulumi dynamic providers: libvirt guests (libvirt-python; pulumi-libvirt is deprecated) and kubeadm PKI.

Both are thin: the work is in `infra.libvirt_guests` and `infra.pki`, which `joulesched infra kvm` calls
directly. Any input change replaces the resource (a guest is cattle: new seed, new guest).
"""

from __future__ import annotations

from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, Resource, ResourceProvider

from joulesched.infra.libvirt_guests import GuestSpec, create_guest, delete_guest

GUEST_OUTPUTS = ("uuid", "disk", "seed", "console_log", "resolved_virt_type")


class LibvirtGuestProvider(ResourceProvider):
    def create(self, props: dict[str, Any]) -> CreateResult:
        spec = GuestSpec.from_dict(props)
        info = create_guest(spec)
        return CreateResult(id_=f"{spec.uri}#{spec.name}", outs={
            **props, "uuid": info.uuid, "disk": info.disk, "seed": info.seed, "console_log": info.console_log,
            "resolved_virt_type": info.virt_type})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = [k for k in GuestSpec.__dataclass_fields__ if olds.get(k) != news.get(k)]
        return DiffResult(changes=bool(changed), replaces=changed, delete_before_replace=True)

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        return ReadResult(id_, props)

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        delete_guest(props["uri"], props["name"], props["pool_dir"])


class LibvirtGuest(Resource):
    """One libvirt domain with its overlay disk and NoCloud seed."""

    uuid: pulumi.Output[str]
    disk: pulumi.Output[str]
    console_log: pulumi.Output[str]
    resolved_virt_type: pulumi.Output[str]

    def __init__(self, name: str, spec: dict[str, pulumi.Input[Any]], opts: pulumi.ResourceOptions | None = None):
        super().__init__(LibvirtGuestProvider(), name, {**spec, **{k: None for k in GUEST_OUTPUTS}}, opts)


class KubeadmPkiProvider(ResourceProvider):
    def create(self, props: dict[str, Any]) -> CreateResult:
        from joulesched.infra.pki import generate

        pki = generate(props.get("common_name") or "kubernetes")
        return CreateResult(id_=pki.ca_cert_hash, outs={
            **props, "ca_cert_pem": pki.ca_cert_pem, "ca_key_pem": pki.ca_key_pem,
            "ca_cert_hash": pki.ca_cert_hash, "token": pki.token})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = olds.get("common_name") != news.get("common_name")
        return DiffResult(changes=changed, replaces=["common_name"] if changed else [])


class KubeadmPki(Resource):
    """The cluster CA and bootstrap token, made once per stack and kept (as secrets) in its state."""

    ca_cert_pem: pulumi.Output[str]
    ca_key_pem: pulumi.Output[str]
    ca_cert_hash: pulumi.Output[str]
    token: pulumi.Output[str]

    def __init__(self, name: str, common_name: str = "kubernetes", opts: pulumi.ResourceOptions | None = None):
        secret = pulumi.ResourceOptions(additional_secret_outputs=["ca_key_pem", "token"])
        super().__init__(KubeadmPkiProvider(), name, {"common_name": common_name, "ca_cert_pem": None,
                                                      "ca_key_pem": None, "ca_cert_hash": None, "token": None},
                         pulumi.ResourceOptions.merge(opts, secret))
