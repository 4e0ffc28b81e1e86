"""Pulumi dynamic providers: libvirt guests (libvirt-python; pulumi-libvirt is deprecated) and kubeadm PKI.

Both are thin: the work is in `infra.libvirt_guests` and `infra.pki`, which `joulesched infra kvm` calls
directly. Any input change replaces the resource (a guest is cattle: new seed, new guest).
"""

from __future__ import annotations

from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, Resource, ResourceProvider

from joulesched.infra.libvirt_guests import GuestSpec, create_guest, delete_guest, domain_active

GUEST_OUTPUTS = ("uuid", "disk", "seed", "console_log", "resolved_virt_type", "ca_cert_hash")


class LibvirtGuestProvider(ResourceProvider):
    def create(self, props: dict[str, Any]) -> CreateResult:
        from joulesched.infra.cloudinit import CaHashTimeout, wait_for_ca_hash

        spec = GuestSpec.from_dict(props)
        info = create_guest(spec)
        ca_hash = ""
        if props.get("wait_ca_hash_s"):  # a kubeadm master: its workers need the hash it prints
            try:
                ca_hash = wait_for_ca_hash(info.console_log, float(props["wait_ca_hash_s"]),
                                           alive=lambda: domain_active(spec.uri, spec.name))
            except CaHashTimeout:
                delete_guest(spec.uri, spec.name, spec.pool_dir)
                raise
        return CreateResult(id_=f"{spec.uri}#{spec.name}", outs={
            **props, "uuid": info.uuid, "disk": info.disk, "seed": info.seed, "console_log": info.console_log,
            "resolved_virt_type": info.virt_type, "ca_cert_hash": ca_hash})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = [k for k in (*GuestSpec.__dataclass_fields__, "wait_ca_hash_s") if olds.get(k) != news.get(k)]
        return DiffResult(changes=bool(changed), replaces=changed, delete_before_replace=True)

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        return ReadResult(id_, props)

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        delete_guest(props["uri"], props["name"], props["pool_dir"])


class LibvirtGuest(Resource):
    """One libvirt domain with its overlay disk and NoCloud seed. ``wait_ca_hash_s`` > 0 (a kubeadm master):
    creating it also waits for the CA hash the master prints on its serial console (output ``ca_cert_hash``)."""

    uuid: pulumi.Output[str]
    disk: pulumi.Output[str]
    console_log: pulumi.Output[str]
    resolved_virt_type: pulumi.Output[str]
    ca_cert_hash: pulumi.Output[str]

    def __init__(self, name: str, spec: dict[str, pulumi.Input[Any]], wait_ca_hash_s: int = 0,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__(LibvirtGuestProvider(), name,
                         {**spec, "wait_ca_hash_s": wait_ca_hash_s, **{k: None for k in GUEST_OUTPUTS}}, opts)


class KubeadmPkiProvider(ResourceProvider):
    def create(self, props: dict[str, Any]) -> CreateResult:
        from joulesched.infra.pki import generate, new_token

        if props.get("with_ca") is False:  # the CA is made on the master itself (the kvm target)
            token = new_token()
            return CreateResult(id_=f"token-{token.split('.')[0]}", outs={
                **props, "ca_cert_pem": "", "ca_key_pem": "", "ca_cert_hash": "", "token": token})
        pki = generate(props.get("common_name") or "kubernetes")
        return CreateResult(id_=pki.ca_cert_hash, outs={
            **props, "ca_cert_pem": pki.ca_cert_pem, "ca_key_pem": pki.ca_key_pem,
            "ca_cert_hash": pki.ca_cert_hash, "token": pki.token})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = [k for k in ("common_name", "with_ca") if olds.get(k) != news.get(k)]
        return DiffResult(changes=bool(changed), replaces=changed)


class KubeadmPki(Resource):
    """The bootstrap token and, unless ``with_ca=False``, a cluster CA, made once per stack and kept (as
    secrets) in its state. The CA key never goes into user-data: the aws target stores it in SSM."""

    ca_cert_pem: pulumi.Output[str]
    ca_key_pem: pulumi.Output[str]
    ca_cert_hash: pulumi.Output[str]
    token: pulumi.Output[str]

    def __init__(self, name: str, common_name: str = "kubernetes", with_ca: bool = True,
                 opts: pulumi.ResourceOptions | None = None):
        secret = pulumi.ResourceOptions(additional_secret_outputs=["ca_key_pem", "token"])
        super().__init__(KubeadmPkiProvider(), name, {"common_name": common_name, "with_ca": with_ca,
                                                      "ca_cert_pem": None, "ca_key_pem": None,
                                                      "ca_cert_hash": None, "token": None},
                         pulumi.ResourceOptions.merge(opts, secret))
