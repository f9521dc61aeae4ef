"""fedshift.flower.security: certificates a real TLS handshake accepts, SuperNode keys Flower's
own loaders read, the insecure-transport rule, and command lines / config Flower parses back."""

from __future__ import annotations

import argparse
import socket
import ssl
import stat
import threading
import tomllib
from pathlib import Path

import pytest

from fedshift.core.errors import FedshiftError
from fedshift.flower.security import (
    check_transport,
    flower_connection_toml,
    host_fault,
    is_loopback,
    make_certificates,
    node_config_arg,
    superlink_argv,
    supernode_argv,
)
from tests.conftest import require_extra

require_extra("flwr", "flower")
require_extra("cryptography", "flower")

from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID  # noqa: E402


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_certificates(tmp_path_factory.mktemp("certs") / "tls", nodes=2)


def test_certificates_chain_to_the_ca(certs: dict[str, Path]) -> None:
    expected = {"ca", "ca_key", "server_cert", "server_key", "node0", "node0_pub"}
    assert expected | {"node1", "node1_pub"} == set(certs)
    assert all(path.is_file() for path in certs.values())
    ca = x509.load_pem_x509_certificate(certs["ca"].read_bytes())
    server = x509.load_pem_x509_certificate(certs["server_cert"].read_bytes())
    assert server.issuer == ca.subject and server.subject != ca.subject
    ca.public_key().verify(
        server.signature, server.tbs_certificate_bytes, ec.ECDSA(server.signature_hash_algorithm)
    )
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    eku = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in eku
    from cryptography.x509.verification import PolicyBuilder, Store

    verifier = PolicyBuilder().store(Store([ca])).build_server_verifier(x509.DNSName("localhost"))
    assert verifier.verify(server, [])[-1] == ca  # RFC 5280 path validation up to the CA


def test_private_keys_are_0600(certs: dict[str, Path]) -> None:
    for name in ("ca_key", "server_key", "node0", "node1"):
        assert stat.S_IMODE(certs[name].stat().st_mode) == 0o600, name
    assert stat.S_IMODE(certs["node0_pub"].stat().st_mode) == 0o644


def test_supernode_keys_load_with_flowers_own_readers(certs: dict[str, Path]) -> None:
    from flwr.cli.supernode.register import try_load_public_key
    from flwr.supernode.cli.flower_supernode import _try_setup_client_authentication

    args = argparse.Namespace(
        auth_supernode_private_key=str(certs["node0"]), auth_supernode_public_key=None
    )
    private, public = _try_setup_client_authentication(args)  # type: ignore[misc]
    assert isinstance(private, ec.EllipticCurvePrivateKey)
    pem = try_load_public_key(certs["node0_pub"])
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    assert pem == public_key_to_bytes(public)  # the registered key is the node's own
    assert try_load_public_key(certs["node1_pub"]) != pem


def test_existing_ca_is_not_overwritten(tmp_path: Path) -> None:
    make_certificates(tmp_path)
    before = (tmp_path / "ca.key").read_bytes()
    with pytest.raises(FedshiftError, match="overwrite"):
        make_certificates(tmp_path)
    assert (tmp_path / "ca.key").read_bytes() == before
    make_certificates(tmp_path, overwrite=True)
    assert (tmp_path / "ca.key").read_bytes() != before


def _serve(server: socket.socket, context: ssl.SSLContext, n: int) -> None:
    for _ in range(n):
        conn, _ = server.accept()
        try:
            with context.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(b"ok")
        except (ssl.SSLError, OSError):
            pass  # the client refused our certificate


def test_real_tls_handshake(certs: dict[str, Path]) -> None:
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(certs["server_cert"], certs["server_key"])
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(10)
        port = server.getsockname()[1]
        thread = threading.Thread(target=_serve, args=(server, server_ctx, 3), daemon=True)
        thread.start()
        trusting = ssl.create_default_context(cafile=str(certs["ca"]))
        for name in ("127.0.0.1", "localhost"):
            raw = socket.create_connection(("127.0.0.1", port), timeout=10)
            with trusting.wrap_socket(raw, server_hostname=name) as tls:
                assert tls.recv(2) == b"ok"
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        with raw, pytest.raises(ssl.SSLCertVerificationError):
            ssl.create_default_context().wrap_socket(raw, server_hostname="localhost")
        thread.join(10)


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1:9092", True),
        ("127.5.6.7", True),
        ("localhost:8000", True),
        ("LOCALHOST", True),
        ("[::1]:9092", True),
        ("::1", True),
        ("0.0.0.0:9092", False),
        ("[::]:9092", False),
        ("10.0.0.5:9092", False),
        ("192.168.1.2", False),
        ("example.org:443", False),
        ("localhost.example.org", False),
        ("128.0.0.1", False),
    ],
)
def test_is_loopback(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_check_transport(certs: dict[str, Path], tmp_path: Path) -> None:
    ca = str(certs["ca"])
    check_transport("10.0.0.5:8000", ca, insecure=False)
    check_transport("127.0.0.1:8000", None, insecure=True)
    check_transport("10.0.0.5:8000", None, insecure=True, allow_insecure_remote=True)
    with pytest.raises(FedshiftError, match="deploy certs"):
        check_transport("10.0.0.5:8000", None, insecure=False)
    with pytest.raises(FedshiftError, match="not found"):
        check_transport("10.0.0.5:8000", str(tmp_path / "nope.crt"), insecure=False)
    with pytest.raises(FedshiftError, match="clear text.*--allow-insecure-remote"):
        check_transport("10.0.0.5:8000", None, insecure=True)
    with pytest.raises(FedshiftError, match="contradict"):
        check_transport("127.0.0.1:8000", ca, insecure=True)


def test_superlink_argv(certs: dict[str, Path], tmp_path: Path) -> None:
    folder = certs["ca"].parent
    argv = superlink_argv(folder, False, host="0.0.0.0", port=9000, database="state.db")
    from flwr.superlink.cli.flower_superlink import _parse_args_run_superlink

    args = _parse_args_run_superlink().parse_args(argv[1:])  # Flower's own flags
    assert argv[0] == "flower-superlink" and not args.insecure
    assert args.ssl_ca_certfile == str(certs["ca"]) and args.ssl_keyfile == str(certs["server_key"])
    assert args.ssl_certfile == str(certs["server_cert"]) and args.enable_supernode_auth
    assert (args.host, args.port, args.database) == ("0.0.0.0", 9000, "state.db")
    assert "--disable-runtime-dependency-installation" in argv
    assert "--enable-supernode-auth" not in superlink_argv(folder, False, auth=False)
    insecure = superlink_argv(None, True)
    assert "--insecure" in insecure and "--enable-supernode-auth" not in insecure
    assert not any(a.startswith("--ssl") for a in insecure)
    with pytest.raises(FedshiftError, match="--insecure"):
        superlink_argv(None, True, auth=True)
    with pytest.raises(FedshiftError, match="clear text"):
        superlink_argv(None, True, host="0.0.0.0")
    assert "--insecure" in superlink_argv(None, True, host="0.0.0.0", allow_insecure_remote=True)
    for name in ("ca", "server_cert"):
        (tmp_path / certs[name].name).write_bytes(certs[name].read_bytes())
    with pytest.raises(FedshiftError, match=r"server\.key is missing.*deploy certs"):
        superlink_argv(tmp_path, False)


def test_supernode_argv_round_trips_node_config(certs: dict[str, Path]) -> None:
    from flwr.common.config import parse_config_args
    from flwr.supernode.cli.flower_supernode import _parse_args_run_supernode

    config = {"partition-id": 3, "data.path": "/my data/part 3", "name": "abc", "lr": 0.05}
    config |= {"num-partitions": 10, "tag": "x=1 y", "debug": True, "win": r"C:\tmp\n"}
    argv = supernode_argv(
        "10.0.0.5:9092", config, str(certs["ca"]), str(certs["node0"]), False, port=9095
    )
    args = _parse_args_run_supernode().parse_args(argv[1:])
    assert (args.superlink, args.root_certificates, args.port) == (
        "10.0.0.5:9092",
        str(certs["ca"]),
        9095,
    )
    assert args.auth_supernode_private_key == str(certs["node0"]) and not args.insecure
    assert parse_config_args([args.node_config]) == config
    assert '"/my data/part 3"' in node_config_arg(config) and "partition-id=3" in argv[-1]
    insecure = supernode_argv("127.0.0.1:9092", {}, None, None, True, port=9094)
    assert "--insecure" in insecure and "--node-config" not in insecure
    with pytest.raises(FedshiftError, match="clear text"):
        supernode_argv("10.0.0.5:9092", {}, None, None, True, port=9094)
    with pytest.raises(FedshiftError, match="needs TLS"):
        supernode_argv("127.0.0.1:9092", {}, None, str(certs["node0"]), True, port=9094)
    with pytest.raises(FedshiftError, match="not found"):
        supernode_argv("10.0.0.5:9092", {}, str(certs["ca"]), "/no/key", False, port=9094)
    with pytest.raises(FedshiftError, match="double quote"):
        node_config_arg({"name": 'a"b'})


def test_flower_connection_toml(certs: dict[str, Path], tmp_path: Path, monkeypatch) -> None:
    from flwr.cli.flower_config import read_superlink_connection

    text = flower_connection_toml("fedshift", "10.0.0.5:8000", str(certs["ca"]), insecure=False)
    table = tomllib.loads(text)["superlink"]
    assert table["default"] == "fedshift"
    assert table["fedshift"] == {"address": "10.0.0.5:8000", "root-certificates": str(certs["ca"])}
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    (tmp_path / "config.toml").write_text(text)
    conn = read_superlink_connection()  # Flower's own reader, through the default entry
    assert (conn.name, conn.address, conn.insecure) == ("fedshift", "10.0.0.5:8000", False)
    assert conn.root_certificates == str(certs["ca"])
    local = flower_connection_toml("local-dev", "127.0.0.1:8000", None, insecure=True)
    (tmp_path / "config.toml").write_text(local)
    conn = read_superlink_connection("local-dev")
    assert conn.insecure and conn.root_certificates is None
    with pytest.raises(FedshiftError, match="contradict"):
        flower_connection_toml("x", "127.0.0.1:8000", str(certs["ca"]), insecure=True)
    with pytest.raises(FedshiftError, match="invalid"):
        flower_connection_toml("default", "127.0.0.1:8000", None, insecure=True)


def test_certs_refuse_a_folder_holding_a_ca_certificate_or_node_keys_without_its_key(
    tmp_path: Path,
) -> None:
    """`fedshift deploy certs DIR` into a folder with ca.crt and node keys but no ca.key (the CA
    key kept elsewhere) refuses with one line and leaves the files as they were."""
    from typer.testing import CliRunner

    from fedshift.cli import app as cli_app

    make_certificates(tmp_path, nodes=2)
    (tmp_path / "ca.key").unlink()
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    res = CliRunner().invoke(cli_app, ["deploy", "certs", str(tmp_path), "--nodes", "2"])
    assert res.exit_code != 0
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "already holds ca.crt, node0, node0.pub" in lines[0], res.output
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
    with pytest.raises(FedshiftError, match="node1.pub"):
        make_certificates(tmp_path, nodes=0)  # it would write no node key, still refused


def test_certs_into_a_path_that_cannot_be_a_folder_is_one_line(tmp_path: Path, cli) -> None:
    (tmp_path / "afile").write_text("not a folder")
    line = cli("deploy", "certs", "afile/certs").error()
    assert "certificate folder 'afile/certs' cannot be created or written (afile is a file)" in line
    assert "is a file, not a folder" in cli("deploy", "certs", "afile").error()
    assert not list(tmp_path.glob("**/*.key"))


def test_certs_into_a_read_only_folder_is_one_line(tmp_path: Path, cli, read_only_dir) -> None:
    line = cli("deploy", "certs", "ro/certs").error()
    assert "cannot be created or written (Permission denied)" in line, line


@pytest.mark.parametrize(
    "host, why",
    [
        ("", "empty"),
        ("  ", "empty"),
        ("a b", "neither an IP address nor a DNS name"),
        ("http://x", "neither an IP address nor a DNS name"),
        ("superlink:8000", "neither an IP address nor a DNS name"),
        ("-x.org", "neither an IP address nor a DNS name"),
        (" 10.0.0.1", "neither an IP address nor a DNS name"),
    ],
)
def test_certs_refuse_a_host_that_no_certificate_can_name(tmp_path: Path, cli, host, why) -> None:
    line = cli("deploy", "certs", "tls", "--host", "127.0.0.1", "--host", host).error()
    assert f"--host {host!r}: {why}" in line and "give the SuperLink's IP address" in line, line
    assert not (tmp_path / "tls").exists()  # nothing written


def test_hosts_a_certificate_can_name() -> None:
    for host in ("127.0.0.1", "::1", "[::1]", "localhost", "superlink.example.org", "*.lan", "a."):
        assert host_fault(host) is None, host
