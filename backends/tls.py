"""Throw-away TLS material for the tests that speak TLS to real servers: a CA and certificates made by openssl.

Everything is made at test time in a temporary directory and lives two days; nothing here is a secret worth
keeping. ``openssl`` comes from Debian's package (``backends/install.sh`` checks it).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["ca", "key_and_csr", "server_certificate", "sign"]

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def key_and_csr(d: Path, stem: str, cn: str) -> None:
    """``stem.key`` and a signing request ``stem.csr`` for the common name ``cn``."""
    _openssl("req", *_EC, "-keyout", f"{stem}.key", "-out", f"{stem}.csr", "-subj", f"/CN={cn}", cwd=d)


def ca(d: Path, stem: str) -> None:
    """A self-signed CA: ``stem.key`` and ``stem.pem``."""
    _openssl("req", "-x509", *_EC, "-keyout", f"{stem}.key", "-out", f"{stem}.pem", "-days", "2",
             "-subj", f"/CN=lockkit test {stem}", cwd=d)  # fmt: skip


def sign(d: Path, stem: str, extensions: str) -> None:
    """``stem.pem``: ``stem.csr`` signed by ``ca.pem`` with the given X.509 v3 extensions."""
    (d / f"{stem}.ext").write_text(extensions)
    _openssl("x509", "-req", "-in", f"{stem}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{stem}.pem", "-days", "2", "-extfile", f"{stem}.ext", cwd=d)  # fmt: skip


def server_certificate(d: Path, stem: str, alt_names: str) -> None:
    """A server certificate ``stem.pem``/``stem.key`` signed by ``ca.pem``, for ``alt_names`` (a SAN list)."""
    key_and_csr(d, stem, "localhost")
    sign(d, stem, f"subjectAltName={alt_names}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
