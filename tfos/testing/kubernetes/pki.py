"""The test cluster's keys and certificates (``cryptography``): one CA, a serving certificate for
the API server, a client certificate per component (its user and groups are the subject's CN and
O, as Kubernetes reads them) and the service-account signing key. Each is written 0600 into the
cluster's private directory; a kubeconfig names the CA and one client's certificate."""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_DAYS = 30


def _write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(cn: str, orgs=()) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn),
                      *(x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs)])


class PKI:
    """Keys and certificates under ``directory`` (made on first use, kept for the cluster's life)."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.ca_cert = self.dir / "ca.crt"
        if not self.ca_cert.exists():
            self._make_ca()
        self._ca_key = serialization.load_pem_private_key((self.dir / "ca.key").read_bytes(), None)
        self._ca = x509.load_pem_x509_certificate(self.ca_cert.read_bytes())

    def _make_ca(self) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        name = _name("tfos-test-kubernetes-ca")
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=_DAYS))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False, data_encipherment=False,
                                             key_agreement=False, encipher_only=False, decipher_only=False),
                               critical=True)
                .sign(key, hashes.SHA256()))
        _write(self.dir / "ca.key", _key_pem(key))
        _write(self.ca_cert, cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, cn: str, orgs=(), *, server_names=(), server_ips=(), client=True) -> tuple[Path, Path]:
        """``<name>.crt`` and ``<name>.key``, signed by the CA (made once)."""
        crt, key_path = self.dir / f"{name}.crt", self.dir / f"{name}.key"
        if crt.exists() and key_path.exists():
            return crt, key_path
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        usages = ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else []) + (
            [ExtendedKeyUsageOID.SERVER_AUTH] if server_names or server_ips else [])
        builder = (x509.CertificateBuilder().subject_name(_name(cn, orgs)).issuer_name(self._ca.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=_DAYS))
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
        if server_names or server_ips:
            sans = [x509.DNSName(n) for n in server_names] + [x509.IPAddress(ipaddress.ip_address(i)) for i in server_ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._ca_key, hashes.SHA256())
        _write(key_path, _key_pem(key))
        _write(crt, cert.public_bytes(serialization.Encoding.PEM))
        return crt, key_path

    def service_account_key(self) -> tuple[Path, Path]:
        """The key pair that signs and checks service-account tokens."""
        priv, pub = self.dir / "sa.key", self.dir / "sa.pub"
        if not priv.exists():
            key = ec.generate_private_key(ec.SECP256R1())
            _write(priv, _key_pem(key))
            _write(pub, key.public_key().public_bytes(serialization.Encoding.PEM,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo))
        return priv, pub

    def kubeconfig(self, name: str, server: str, cn: str, orgs=()) -> Path:
        """A kubeconfig for ``server`` as the client ``cn`` (groups ``orgs``)."""
        crt, key = self.issue(name, cn, orgs)
        path = self.dir / f"{name}.kubeconfig"
        _write(path, f"""apiVersion: v1
kind: Config
clusters:
- name: tfos
  cluster:
    server: {server}
    certificate-authority: {self.ca_cert}
users:
- name: {name}
  user:
    client-certificate: {crt}
    client-key: {key}
contexts:
- name: {name}
  context:
    cluster: tfos
    user: {name}
current-context: {name}
""".encode())
        return path
