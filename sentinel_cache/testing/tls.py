"""Throwaway certificates for a TLS topology (:class:`TLSFiles`)."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sentinel_cache.testing.processes import HOST

__all__ = ["TLSFiles"]


@dataclass(frozen=True)
class TLSFiles:
    """PEM files for a TLS topology, e.g. from :meth:`generate`.

    The servers present ``server_cert`` to clients and also as the client certificate of their
    own links (replication, sentinel to node, sentinel to sentinel); ``client_cert`` is for
    applications that want to present one (mutual TLS). Both are signed by ``ca_cert``.
    """

    ca_cert: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str

    @classmethod
    def generate(
        cls,
        directory: str | os.PathLike[str],
        *,
        hosts: Sequence[str] = (HOST, "localhost"),
        days: int = 2,
        openssl: str = "openssl",
    ) -> TLSFiles:
        """A throwaway CA plus server and client certificates (P-256 keys) made with the
        ``openssl`` command line tool, valid for ``hosts`` (IP addresses or DNS names).

        Raises :class:`RuntimeError` if ``openssl`` is missing or fails.
        """
        binary = shutil.which(openssl)
        if binary is None:
            raise RuntimeError(f"TLSFiles.generate needs the {openssl!r} command line tool")
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        names = ",".join(f"IP:{h}" if _is_ip(h) else f"DNS:{h}" for h in hosts)

        def run(*args: str) -> None:
            result = subprocess.run(
                [binary, *args], capture_output=True, text=True, timeout=30, check=False
            )
            if result.returncode != 0:
                raise RuntimeError(f"openssl {args[0]} failed: {result.stderr.strip()}")

        key_args = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        ca_key, ca_cert = str(out / "ca.key"), str(out / "ca.crt")
        run(
            "req", "-x509", *key_args, "-keyout", ca_key, "-out", ca_cert, "-days", str(days),
            "-subj", "/CN=sentinel-cache throwaway test CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip
        files: dict[str, str] = {}
        for role, usage in (("server", "serverAuth,clientAuth"), ("client", "clientAuth")):
            key, csr, cert = (str(out / f"{role}.{ext}") for ext in ("key", "csr", "crt"))
            extensions = out / f"{role}.ext"
            extensions.write_text(
                "basicConstraints=critical,CA:FALSE\n"
                "keyUsage=critical,digitalSignature,keyEncipherment\n"
                f"extendedKeyUsage={usage}\n"
                f"subjectAltName={names}\n"
                "subjectKeyIdentifier=hash\n"
                "authorityKeyIdentifier=keyid\n"
            )
            run("req", "-new", *key_args, "-keyout", key, "-out", csr, "-subj", f"/CN={role}")
            run(
                "x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key,
                "-CAcreateserial", "-out", cert, "-days", str(days),
                "-extfile", str(extensions),
            )  # fmt: skip
            files[f"{role}_cert"], files[f"{role}_key"] = cert, key
        return cls(ca_cert=ca_cert, **files)

    def client_kwargs(self, *, client_cert: bool = False) -> dict[str, Any]:
        """redis-py keyword arguments for a verified TLS connection to the topology."""
        kwargs: dict[str, Any] = {
            "ssl": True,
            "ssl_ca_certs": self.ca_cert,
            "ssl_check_hostname": True,
        }
        if client_cert:
            kwargs.update(ssl_certfile=self.client_cert, ssl_keyfile=self.client_key)
        return kwargs

    def server_args(self) -> list[str]:
        """Server options (TLS for clients and for the servers' own outgoing links)."""
        return [
            "--tls-cert-file", self.server_cert,
            "--tls-key-file", self.server_key,
            "--tls-ca-cert-file", self.ca_cert,
            "--tls-replication", "yes",
            # Clients may present a certificate (verified if they do) but need not.
            "--tls-auth-clients", "optional",
        ]  # fmt: skip


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
