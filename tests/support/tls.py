"""A throwaway certificate authority for tests of TLS and mTLS servers (the autoscaler provider's gRPC):
a CA, and server or client certificates it signs, written as PEM files under a test's tmp path."""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: Path, key, cert) -> tuple[Path, Path]:
    path.mkdir(parents=True, exist_ok=True)
    kp, cp = path / "tls.key", path / "tls.crt"
    kp.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()))
    kp.chmod(0o600)
    cp.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cp, kp


class TestCA:
    """``TestCA(dir, "name").issue("server", server=True)`` -> (cert path, key path); ``.cert`` is the CA's PEM."""

    __test__ = False  # not a pytest class

    def __init__(self, root: Path, cn: str = "joulesched test CA") -> None:
        now = datetime.datetime.now(datetime.timezone.utc)
        self.root = root
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.ca = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn))
                   .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=1)).not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                   .sign(self.key, hashes.SHA256()))
        self.cert, _ = _write(root / "ca", self.key, self.ca)

    def issue(self, cn: str, *, server: bool) -> tuple[Path, Path]:
        now = datetime.datetime.now(datetime.timezone.utc)
        key = ec.generate_private_key(ec.SECP256R1())
        b = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(self.ca.subject)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=1)).not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                                   else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
        if server:
            import ipaddress

            b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                             x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                critical=False)
        return _write(self.root / cn, key, b.sign(self.key, hashes.SHA256()))
