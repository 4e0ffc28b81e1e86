"""The kubeadm bootstrap secrets: a cluster CA made before any guest boots, and a bootstrap token.

Making the CA ourselves lets workers join with `--discovery-token-ca-cert-hash` (the CA pinned by hash) instead
of the unsafe `--discovery-token-unsafe-skip-ca-verification`. Nothing here is ever written to the repo: under
Pulumi it lives in the stack state as secrets; `joulesched infra kvm up` makes a fresh set per run.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
import string
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

_TOKEN_ALPHABET = string.ascii_lowercase + string.digits


@dataclass(frozen=True)
class KubeadmPki:
    ca_cert_pem: str
    ca_key_pem: str
    ca_cert_hash: str  # sha256:<hex of the CA's SubjectPublicKeyInfo>, what `kubeadm join` pins
    token: str  # [a-z0-9]{6}.[a-z0-9]{16}


def new_token() -> str:
    pick = lambda n: "".join(secrets.choice(_TOKEN_ALPHABET) for _ in range(n))  # noqa: E731
    return f"{pick(6)}.{pick(16)}"


def ca_cert_hash(cert_pem: str) -> str:
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    spki = cert.public_key().public_bytes(serialization.Encoding.DER,
                                          serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(spki).hexdigest()


def generate(common_name: str = "kubernetes", days: int = 3650) -> KubeadmPki:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=True, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .sign(key, hashes.SHA256()))
    cert_pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                serialization.NoEncryption()).decode()
    return KubeadmPki(cert_pem, key_pem, ca_cert_hash(cert_pem), new_token())
