"""A test CA and a server certificate for 127.0.0.1 and localhost, as PEM files (trustme)."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import trustme


@dataclass(frozen=True, slots=True)
class TLSFiles:
    ca_bundle: Path  # the CA certificate: what a client must trust
    cert: Path  # the server's certificate chain
    key: Path  # the server's private key

    def server_certificate_der(self) -> bytes:
        """The server's own certificate (the chain's first), DER-encoded."""
        end = "-----END CERTIFICATE-----"
        return ssl.PEM_cert_to_DER_cert(self.cert.read_text().split(end)[0] + end + "\n")

    def client_context(self) -> ssl.SSLContext:
        """A verifying client context that trusts this CA (for test helpers)."""
        return ssl.create_default_context(cafile=str(self.ca_bundle))


def make_tls_files(directory: Path) -> TLSFiles:
    """A fresh CA and a server certificate it signed, written under ``directory``."""
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    files = TLSFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    ca.cert_pem.write_to_path(str(files.ca_bundle))
    server.private_key_pem.write_to_path(str(files.key))
    for number, blob in enumerate(server.cert_chain_pems):
        blob.write_to_path(str(files.cert), append=number > 0)
    return files


def served_certificate_der(url: str) -> bytes:
    """The certificate the server at ``url`` presents (unverified), DER-encoded."""
    address = urlsplit(url)
    served = ssl.get_server_certificate((address.hostname or "", address.port or 443))
    return ssl.PEM_cert_to_DER_cert(served)
