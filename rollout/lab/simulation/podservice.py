"""The API as a pod of the lab reaches it: `https://KUBERNETES_SERVICE_HOST:PORT` with the
lab's own CA, answering ServiceAccount tokens as a real server does (no token: anonymous).

The lab's administrator endpoint is plain http without credentials; the Job pods of the
rollout image (jobpods.py) get this one instead, on the same registry, so rollout's
in-cluster code runs exactly as in a real pod: the token, CA and namespace from the standard
service-account directory, TLS verified against the CA, RBAC applied to its account.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from rollout.lab.apiserver.authentication import Authenticator
from rollout.lab.apiserver.rbac import ANONYMOUS
from rollout.lab.apiserver.registry import Registry
from rollout.lab.apiserver.resources import SERVICEACCOUNTS
from rollout.lab.apiserver.server import ApiServer

# A pod's projected token lives about an hour; the kubelet rotates it, the lab's runs are short.
TOKEN_LIFETIME_S = 3600
CERTIFICATE_LIFETIME = datetime.timedelta(days=7)


@dataclass(frozen=True)
class LabCertificate:
    """A self-signed CA certificate for the service's address, and a server context with it."""

    ca_pem: bytes
    context: ssl.SSLContext

    @classmethod
    def for_address(cls, host: str) -> LabCertificate:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rollout-lab-kubernetes")])
        now = datetime.datetime.now(datetime.UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + CERTIFICATE_LIFETIME)
            .add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]),
                critical=False,
            )
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256())
        )
        pem = certificate.public_bytes(serialization.Encoding.PEM)
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        # load_cert_chain reads files only: a private directory, gone once loaded
        with tempfile.TemporaryDirectory(prefix="rollout-lab-tls-") as directory:
            cert_file, key_file = Path(directory, "tls.crt"), Path(directory, "tls.key")
            cert_file.write_bytes(pem)
            key_file.write_bytes(key_pem)
            context.load_cert_chain(cert_file, key_file)
        return cls(pem, context)


class PodService:
    """The in-cluster endpoint, started on first use and stopped with the simulation."""

    def __init__(self, registry: Registry, host: str) -> None:
        self.registry = registry
        self.host = host
        self._authenticator = Authenticator(anonymous=ANONYMOUS)
        self._server: ApiServer | None = None
        self._certificate: LabCertificate | None = None
        self._lock = threading.Lock()

    def address(self) -> tuple[str, int, bytes]:
        """(host, port, CA PEM) of the running endpoint; started now if it is not yet."""
        with self._lock:
            if self._server is None or self._certificate is None:
                self._certificate = LabCertificate.for_address(self.host)
                self._server = ApiServer.start(
                    self.registry,
                    self.host,
                    0,
                    authenticator=self._authenticator,
                    tls=self._certificate.context,
                )
            return self._server.host, self._server.port, self._certificate.ca_pem

    def issue_token(self, namespace: str, account: str) -> str | None:
        """A bearer token of the ServiceAccount, as the kubelet's TokenRequest gets one; None
        when the account does not exist."""
        found: Any = self.registry.find(SERVICEACCOUNTS, namespace, account)
        if found is None:
            return None
        request = {"spec": {"expirationSeconds": TOKEN_LIFETIME_S}}
        answer = self._authenticator.request_token(found, request)
        return str(answer["status"]["token"])

    def close(self) -> None:
        with self._lock:
            if self._server is not None:
                self._server.stop()
            self._server = None
