"""The local cluster's certificates and its kubeconfig: the API server's CA and serving certificate,
the service-account signing key, etcd's own CA and certificates, and the client certificate a real
node's kubelet trusts the API server by. Every CA key but the API server's is discarded once used."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

KUBELET_CLIENT_CERT, KUBELET_CLIENT_KEY = "kubelet-client.crt", "kubelet-client.key"
# A local cluster lives as long as its checkout (`make up` never replaces it), so do its certificates;
# `ensure` renews the API server's in place when they come this close to expiring.
CERT_DAYS = 3650
RENEW_WITHIN = dt.timedelta(days=7)


def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def new_ca(common_name: str, days: int) -> tuple[ec.EllipticCurvePrivateKey, x509.Name, x509.Certificate]:
    """A self-signed CA: its key, its name and its certificate."""
    now = dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, name, cert


def write_pki(d: Path, *, days: int = CERT_DAYS, keep_signing_key: bool = False) -> None:
    """A CA of its own (its key is not kept), the API server's serving certificate and, unless kept
    (a renewal: service-account tokens stay valid), the service-account signing key."""
    now = dt.datetime.now(dt.UTC)
    ca_key, ca_name, ca = new_ca("skyscan-local-ca", days)
    key = ec.generate_private_key(ec.SECP256R1())
    sans = x509.SubjectAlternativeName(
        [
            x509.DNSName("localhost"),
            x509.DNSName("kubernetes.default.svc"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(sans, critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    files = {
        "ca.crt": ca.public_bytes(serialization.Encoding.PEM),
        "apiserver.crt": cert.public_bytes(serialization.Encoding.PEM),
        "apiserver.key": pem_key(key),
    }
    if not keep_signing_key:
        sa_key = ec.generate_private_key(ec.SECP256R1())
        files["sa.key"] = pem_key(sa_key)
        files["sa.pub"] = sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    for name, data in files.items():
        (d / name).write_bytes(data)
        (d / name).chmod(0o600)


def pki_expires(d: Path) -> dt.datetime:
    """When the first of the API server's CA and serving certificate expires (clusters made before
    CERT_DAYS had 30 days)."""
    certs = [x509.load_pem_x509_certificate((d / name).read_bytes()) for name in ("ca.crt", "apiserver.crt")]
    return min(cert.not_valid_after_utc for cert in certs)


def _signed(
    subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name, issuer_key: ec.EllipticCurvePrivateKey
) -> x509.Certificate:
    """A loopback server and client certificate (etcd's own members are both)."""
    now = dt.datetime.now(dt.UTC)
    usage = [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH, x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]
    sans = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=CERT_DAYS))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        .sign(issuer_key, hashes.SHA256())
    )


def write_etcd_pki(d: Path) -> None:
    """etcd's own CA (its key is not kept), its serving certificate, and the one client certificate
    that CA signs: the API server's. Any other local user is refused by etcd, Secrets and all."""
    ca_key, ca_name, ca = new_ca("skyscan-local-etcd-ca", CERT_DAYS)
    files = {"etcd-ca.crt": ca.public_bytes(serialization.Encoding.PEM)}
    for name in ("etcd-server", "etcd-client"):
        key = ec.generate_private_key(ec.SECP256R1())
        files[f"{name}.crt"] = _signed(name, key, ca_name, ca_key).public_bytes(serialization.Encoding.PEM)
        files[f"{name}.key"] = pem_key(key)
    for name, data in files.items():
        (d / name).write_bytes(data)
        (d / name).chmod(0o600)


def kubeconfig(server: str, ca_file: Path, token: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "skyscan-local",
                    "cluster": {"server": server, "certificate-authority": str(ca_file)},
                }
            ],
            "users": [{"name": "admin", "user": {"token": token}}],
            "contexts": [{"name": "skyscan-local", "context": {"cluster": "skyscan-local", "user": "admin"}}],
            "current-context": "skyscan-local",
        }
    )


def write_kubelet_client_pki(cluster_dir: Path, ca_file: Path) -> None:
    """A CA of the node's own and the one client certificate it signs, the API server's (system:masters,
    so the kubelet's webhook authorisation allows logs and exec); the CA's key is never written."""
    now = dt.datetime.now(dt.UTC)
    ca_key, ca_name, ca = new_ca("skyscan-kubelet-client-ca", CERT_DAYS)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
            x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver-kubelet-client"),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=CERT_DAYS))
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    for path, data in (
        (cluster_dir / KUBELET_CLIENT_KEY, pem_key(key)),
        (cluster_dir / KUBELET_CLIENT_CERT, cert.public_bytes(serialization.Encoding.PEM)),
        (ca_file, ca.public_bytes(serialization.Encoding.PEM)),
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(0o600)
