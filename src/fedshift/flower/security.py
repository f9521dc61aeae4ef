"""Transport security for fedshift on a real Flower deployment (a SuperLink and SuperNodes).

Models and data summaries travel between SuperLink and SuperNodes; off the loopback they must
be encrypted. Here: :func:`make_certificates` (a private CA, the SuperLink's TLS certificate,
SuperNode keys), the rule checked before connecting (:func:`check_transport`), the command lines
of Flower's processes (:func:`superlink_argv`, :func:`supernode_argv`) and a Flower
``config.toml`` connection. ``cryptography`` (installed with Flower) is imported lazily.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedshift.core.errors import FedshiftError
from fedshift.core.files import ensure_writable_dir

CERTS_HINT = "create them with `fedshift deploy certs`"
CA_SUBJECT, SERVER_SUBJECT = "CN=fedshift CA", "CN=fedshift SuperLink"
_NODE_KEY = re.compile(r"node\d+(\.pub)?")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DNS_NAME = re.compile(rf"(\*\.)?{_LABEL}(\.{_LABEL})*\.?")


def _write(path: Path, data: bytes, private: bool) -> Path:
    """Write ``data`` to ``path``; a private key is created (and kept) with mode 0600."""
    mode = 0o600 if private else 0o644
    with open(path, "wb", opener=lambda p, flags: os.open(p, flags, mode)) as f:
        f.write(data)
    os.chmod(path, mode)
    return path


def _certificate(key: Any, ca_key: Any, days: int, hosts: Sequence[str] | None) -> Any:
    """The CA's self-signed certificate (``hosts`` None) or the SuperLink's TLS certificate with a
    subjectAltName per host (IPAddress or DNSName) and serverAuth, signed with ``ca_key``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID

    def san(host: str) -> x509.GeneralName:
        try:
            return x509.IPAddress(ipaddress.ip_address(host.strip("[]")))
        except ValueError:
            return x509.DNSName(host)

    ca, now = hosts is None, dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name.from_rfc4514_string(CA_SUBJECT if ca else SERVER_SUBJECT))
        .issuer_name(x509.Name.from_rfc4514_string(CA_SUBJECT))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=days))
    )
    # positional KeyUsage: digital_signature, content_commitment, key_encipherment,
    # data_encipherment, key_agreement, key_cert_sign, crl_sign, encipher_only, decipher_only
    extensions = [
        (x509.BasicConstraints(ca=ca, path_length=0 if ca else None), True),
        (x509.KeyUsage(True, False, False, False, False, ca, ca, False, False), True),
        (x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False),
        (x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False),
    ]
    if hosts is not None:
        extensions.append((x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False))
        extensions.append((x509.SubjectAlternativeName([san(h) for h in hosts]), False))
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(ca_key, hashes.SHA256())


def make_certificates(
    out: Path,
    hosts: Sequence[str] = ("127.0.0.1", "localhost"),
    nodes: int = 0,
    days: int = 365,
    *,
    overwrite: bool = False,
) -> dict[str, Path]:
    """Write a CA (``ca.crt``/``ca.key``, ECDSA P-256, PEM), the SuperLink's certificate signed by
    it for ``hosts`` (``server.pem``/``server.key``) and ``nodes`` SuperNode keys into ``out``.

    SuperNode keys (``node<i>``, ``node<i>.pub``) are ECDSA P-384 in OpenSSH formats (the private
    key PEM-armored ``OPENSSH PRIVATE KEY``, not PKCS#8): Flower 1.41 reads it with
    ``load_ssh_private_key`` and wants an EC key (``flwr/supernode/cli/flower_supernode.py``,
    ``_try_setup_client_authentication``); ``flwr supernode register`` reads the public key with
    ``load_ssh_public_key``, NIST curves only (``flwr/cli/supernode/register.py``,
    ``try_load_public_key``). Private keys are unencrypted, mode 0600. Returns name -> path.
    A host that is neither an IP address nor a DNS name (:func:`host_fault`) and a folder that
    cannot be written are refused before anything is written.
    """
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric import ec

    if nodes < 0 or days < 1 or not hosts:
        raise FedshiftError("make_certificates needs nodes >= 0, days >= 1 and at least one host")
    for host in hosts:
        if why := host_fault(host):
            raise FedshiftError(
                f"--host {host!r}: {why}; give the SuperLink's IP address or DNS name as its "
                "nodes dial it (e.g. --host 192.168.1.20 --host superlink.example.org)"
            )
    out = ensure_writable_dir(out, "certificate folder", "give a folder that you can write to")
    fixed = ("ca.crt", "ca.key", "server.pem", "server.key")
    held = sorted(p.name for p in out.glob("*") if p.name in fixed or _NODE_KEY.fullmatch(p.name))
    if held and not overwrite:
        raise FedshiftError(
            f"{out} already holds {', '.join(held)} (a deployment's CA or keys): pass "
            "--overwrite to replace them, or choose another folder"
        )
    pem, plain = ser.Encoding.PEM, ser.NoEncryption()
    ca_key, server_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(2))
    ca = _certificate(ca_key, ca_key, days, None)
    server = _certificate(server_key, ca_key, days, hosts)
    pkcs8, ssh = ser.PrivateFormat.PKCS8, ser.PrivateFormat.OpenSSH
    files = [  # (name, file, bytes, private)
        ("ca", "ca.crt", ca.public_bytes(pem), False),
        ("ca_key", "ca.key", ca_key.private_bytes(pem, pkcs8, plain), True),
        ("server_cert", "server.pem", server.public_bytes(pem), False),
        ("server_key", "server.key", server_key.private_bytes(pem, pkcs8, plain), True),
    ]
    for i in range(nodes):
        key = ec.generate_private_key(ec.SECP384R1())
        public = key.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH)
        files.append((f"node{i}", f"node{i}", key.private_bytes(pem, ssh, plain), True))
        files.append((f"node{i}_pub", f"node{i}.pub", public + b"\n", False))
    return {name: _write(out / file, data, private) for name, file, data, private in files}


def host_fault(host: str) -> str | None:
    """What keeps ``host`` from naming the SuperLink in its certificate (None: nothing): it
    must be an IP address (``[v6]`` too) or a DNS name (labels of letters, digits and inner
    hyphens, a ``*.`` wildcard first at most), never empty, a URL or ``host:port``."""
    if not host.strip():
        return "empty: a certificate for no host matches no SuperLink"
    try:
        ipaddress.ip_address(host.strip("[]"))
        return None
    except ValueError:
        pass
    if not _DNS_NAME.fullmatch(host) or len(host.rstrip(".")) > 253:
        return "neither an IP address nor a DNS name (no scheme, port, path or spaces)"
    return None


def _host(address: str) -> str:
    """The host part of ``host:port``, ``[v6]:port``, ``host`` or ``scheme://host:port/path``."""
    text = address.strip().split("://", 1)[-1].split("/", 1)[0]
    if text.startswith("["):
        return text[1:].split("]", 1)[0]
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text


def is_loopback(address: str) -> bool:
    """True when ``address`` names this machine only: 127.0.0.0/8, ::1 or ``localhost``."""
    host = _host(address).lower().rstrip(".")
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host == "localhost"
    return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback


def check_transport(
    address: str, root_certificates: str | None, insecure: bool, allow_insecure_remote: bool = False
) -> None:
    """The rule applied before connecting to a SuperLink at ``address``: TLS with a CA
    certificate file, or ``insecure`` on the loopback (elsewhere only when explicitly allowed)."""
    if insecure and root_certificates:
        raise FedshiftError("--insecure and --root-certificates contradict: pass only one of them")
    if insecure and not is_loopback(address) and not allow_insecure_remote:
        raise FedshiftError(
            f"--insecure to non-loopback {address} would send models and data summaries across "
            "the network in clear text: use TLS (--root-certificates) or --allow-insecure-remote"
        )
    missing = not (root_certificates and Path(root_certificates).expanduser().is_file())
    if not insecure and missing:
        what = f"{root_certificates} not found" if root_certificates else "no CA certificate"
        raise FedshiftError(
            f"connecting to {address} needs TLS ({what}): pass the CA certificate file as "
            "--root-certificates (ca.crt from `fedshift deploy certs`), or --insecure on loopback"
        )


def superlink_argv(
    certs: Path | None,
    insecure: bool,
    host: str = "127.0.0.1",
    port: int = 8000,
    auth: bool | None = None,
    database: str | None = None,
    exe: str = "flower-superlink",
    allow_insecure_remote: bool = False,
) -> list[str]:
    """The command line that starts Flower's SuperLink (its HTTP API on ``host:port``): TLS with
    the files in ``certs`` and SuperNode authentication unless ``auth`` is False, or ``insecure``
    (Flower refuses authentication without TLS; a non-loopback host needs allow_insecure_remote)."""
    argv = [exe]
    if insecure:
        if certs is not None or auth:
            raise FedshiftError("--insecure excludes certificates and SuperNode auth: drop one")
        check_transport(host, None, True, allow_insecure_remote)
        argv.append("--insecure")
    elif certs is None:
        raise FedshiftError(f"a TLS SuperLink needs certificates: {CERTS_HINT}, or use --insecure")
    else:
        files = {"--ssl-ca-certfile": "ca.crt", "--ssl-certfile": "server.pem"}
        for flag, file in {**files, "--ssl-keyfile": "server.key"}.items():
            path = Path(certs).expanduser() / file
            if not path.is_file():
                raise FedshiftError(f"{path} is missing: {CERTS_HINT}")
            argv += [flag, str(path)]
        argv += [] if auth is False else ["--enable-supernode-auth"]
    argv += ["--disable-runtime-dependency-installation", "--host", host, "--port", str(port)]
    return argv + (["--database", database] if database else [])


def _toml_value(key: str, value: str | int | float) -> str:
    """``value`` as the TOML literal that Flower's node-config parser reads back unchanged
    (``key`` must be a bare or dotted TOML key; a string must not contain a double quote)."""
    if not _BARE_KEY.fullmatch(key):
        raise FedshiftError(f"node-config key {key!r} is invalid: use letters, digits, _ - .")
    if isinstance(value, int | float):
        return str(value).lower() if isinstance(value, bool) else repr(value)
    if '"' in value:
        raise FedshiftError(f"node-config value of {key!r} contains a double quote: remove it")
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def node_config_arg(node_config: dict[str, str | int | float]) -> str:
    """``node_config`` as one ``--node-config`` string of space-separated ``key=value`` pairs,
    strings double-quoted (Flower's ``parse_config_args`` reads each value as TOML)."""
    return " ".join(f"{k}={_toml_value(k, v)}" for k, v in node_config.items())


def supernode_argv(
    superlink: str,
    node_config: dict[str, str | int | float],
    root_certificates: str | None,
    auth_key: str | None,
    insecure: bool,
    port: int,
    allow_insecure_remote: bool = False,
    exe: str = "flower-supernode",
) -> list[str]:
    """The command line that starts a Flower SuperNode connecting to ``superlink``; ``port`` is
    the SuperNode's own API port (every SuperNode on one machine needs its own)."""
    check_transport(superlink, root_certificates, insecure, allow_insecure_remote)
    argv = [exe, "--superlink", superlink]
    argv += ["--insecure"] if insecure else ["--root-certificates", str(root_certificates)]
    if auth_key and insecure:
        raise FedshiftError("Flower's SuperNode authentication needs TLS: drop --insecure")
    if auth_key and not Path(auth_key).expanduser().is_file():
        raise FedshiftError(f"SuperNode key {auth_key} not found: {CERTS_HINT} (with nodes)")
    argv += ["--auth-supernode-private-key", auth_key] if auth_key else []
    argv += ["--port", str(port)]
    return argv + (["--node-config", node_config_arg(node_config)] if node_config else [])


def flower_connection_toml(
    name: str, address: str, root_certificates: str | None, insecure: bool
) -> str:
    """The text of a Flower ``$FLWR_HOME/config.toml`` whose default SuperLink connection is
    ``[superlink.<name>]`` at ``address``: TLS with ``root_certificates`` (made absolute, as
    Flower requires) or ``insecure = true``."""
    if not re.fullmatch(r"[A-Za-z0-9_-]+", name) or name == "default":
        raise FedshiftError(f"connection name {name!r} is invalid: use letters, digits, _ or -")
    check_transport(address, root_certificates, insecure, allow_insecure_remote=True)
    root = "" if insecure else str(Path(str(root_certificates)).expanduser().resolve())
    tls = "insecure = true" if insecure else f"root-certificates = {json.dumps(root)}"
    head = f'[superlink]\ndefault = "{name}"\n\n[superlink.{name}]\n'
    return f"{head}address = {json.dumps(address)}\n{tls}\n"
