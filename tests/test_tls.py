"""Mutual TLS on every connection: a TLS cluster works, and plain, foreign-CA and
misconfigured peers are refused with errors that name the fix.

Certificates are made here with ``cryptography`` (in the ``test`` extra), so the tests
need no ``openssl`` binary; only the openssl commands of docs/security.md are checked with one.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from helpers_modules.clusters import no_leaked_processes, start_cluster

import ddlf_actors as ddlf
from ddlf_actors.runtime import config
from ddlf_actors.runtime.client import current
from ddlf_actors.runtime.errors import AuthenticationError, TLSConfigError
from ddlf_actors.runtime.wire import tls
from ddlf_actors.runtime.wire.connection import connect, serve
from ddlf_actors.runtime.wire.eventloop import new_event_loop

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TLS_VARS = (tls.ENV_CERT, tls.ENV_KEY, tls.ENV_CA)
# The cluster's servers drop a peer that has not finished both handshakes by then.
HANDSHAKE_S = 4.0


# -- certificates ----------------------------------------------------------------------------
def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(path, key) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _make_ca(folder, cn: str):
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    (folder / f"{cn}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert, key


def _make_leaf(folder, name: str, ca, *, expired: bool = False):
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    start = now - datetime.timedelta(days=10 if expired else 1)
    end = now - datetime.timedelta(days=1) if expired else now + datetime.timedelta(days=30)
    cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            # Every DDLF process is both a TLS server and a TLS client.
            .add_extension(x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    cert_path, key_path = folder / f"{name}.pem", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key_path, key)
    return str(cert_path), str(key_path)


class PKI:
    """The cluster's CA and certificate, and a foreign CA with a certificate of its own."""

    def __init__(self, folder):
        self.folder = folder
        ca = _make_ca(folder, "cluster-ca")
        other_ca = _make_ca(folder, "other-ca")
        self.ca = str(folder / "cluster-ca.pem")
        self.other_ca = str(folder / "other-ca.pem")
        self.cert, self.key = _make_leaf(folder, "node", ca)
        self.other_cert, self.other_key = _make_leaf(folder, "intruder", other_ca)
        self.expired_cert, self.expired_key = _make_leaf(folder, "expired", ca, expired=True)
        self.files = tls.TLSFiles(self.cert, self.key, self.ca)

    def env(self) -> dict:
        return {tls.ENV_CERT: self.cert, tls.ENV_KEY: self.key, tls.ENV_CA: self.ca}

    def der(self) -> bytes:
        with open(self.cert) as f:
            return ssl.PEM_cert_to_DER_cert(f.read())


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return PKI(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="class")
def tls_cluster(pki):
    """An embedded cluster started with only DDLF_TLS_* set, the driver using the same
    (class-scoped: one cluster for the tests of ``TestTLSCluster``, gone after them)."""
    saved = {k: os.environ.get(k) for k in (*TLS_VARS, "DDLF_HANDSHAKE_TIMEOUT_S")}
    os.environ.update(pki.env(), DDLF_HANDSHAKE_TIMEOUT_S=str(HANDSHAKE_S))
    try:
        with start_cluster(num_cpus=2) as info:
            yield info
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def no_tls_env(monkeypatch):
    for k in TLS_VARS:
        monkeypatch.delenv(k, raising=False)


@ddlf.remote
class Box:
    def add(self, a, b):
        return a + b

    def nbytes(self, arr):
        return int(arr.nbytes), float(arr[-1])


@ddlf.remote
def square(x):
    return x * x


# -- helpers ---------------------------------------------------------------------------------
class _Null:
    def frame_received(self, conn, segs):
        pass

    def connection_closed(self, conn, exc):
        pass


def _split(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


def _run(coro):
    loop = new_event_loop()  # uvloop, as in the cluster's processes
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def _try_connect(address: str, token, ctx, timeout: float = 15.0):
    """Connect with ``ctx`` (None: plain TCP); return ``(error or None, seconds)``."""
    host, port = _split(address)

    async def go():
        conn = await connect(host, port, token, _Null(), timeout=timeout, tls_context=ctx)
        conn.close()

    t0 = time.monotonic()
    try:
        _run(go())
    except AuthenticationError as e:
        return e, time.monotonic() - t0
    return None, time.monotonic() - t0


def _client_ctx(cert=None, key=None, ca=None) -> ssl.SSLContext:
    """A hand-built client context: tls.py refuses to build the broken ones tested here."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    if ca:
        ctx.load_verify_locations(ca)
    else:
        ctx.verify_mode = ssl.CERT_NONE
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx


def _server_cert(address: str, ctx: ssl.SSLContext) -> bytes:
    """The DER certificate the server at ``address`` presents in a TLS handshake."""
    host, port = _split(address)
    with socket.create_connection((host, port), timeout=10) as raw:
        with ctx.wrap_socket(raw) as s:
            return s.getpeercert(binary_form=True)


def _addresses() -> dict:
    """Head, node and one live actor's listening addresses."""
    core = current.get_core()
    a = Box.remote()
    assert ddlf.get(a.add.remote(1, 1), timeout=30) == 2
    actor_addr = next(v["address"] for v in core.head_call("list_actors")
                      if v["actor_id"] == a._actor_id)
    return {"head": core.head_address, "node": ddlf.nodes()[0]["address"], "actor": actor_addr}


def _still_works() -> None:
    b = Box.remote()
    assert ddlf.get(b.add.remote(20, 22), timeout=30) == 42
    assert ddlf.get(square.remote(7), timeout=30) == 49
    ddlf.kill(b)


class TestTLSCluster:
    """(1)-(3) against one embedded TLS cluster."""

    # -- (1) a TLS cluster works end to end
    def test_tls_cluster_end_to_end(self, tls_cluster, pki):
        a = Box.remote()
        assert ddlf.get([a.add.remote(i, 1) for i in range(50)], timeout=60) == list(range(1, 51))
        assert ddlf.get([square.remote(i) for i in range(20)], timeout=60) == [i * i for i in range(20)]
        arr = np.arange(10 * 1024 * 1024 // 4, dtype=np.float32)   # 10 MB through put -> actor
        ref = ddlf.put(arr)
        assert ddlf.get(a.nbytes.remote(ref), timeout=60) == (arr.nbytes, float(arr[-1]))
        # It really is TLS: head, node and actor each present the cluster's certificate.
        ctx = tls.client_context(pki.files)
        for role, address in _addresses().items():
            assert _server_cert(address, ctx) == pki.der(), role
        assert current.get_core().head.transport.get_extra_info("ssl_object").version() in (
            "TLSv1.2", "TLSv1.3")


    def test_tls_paths_reach_children_through_env_not_argv(self, tls_cluster, pki):
        ddlf.get(Box.remote().add.remote(0, 0), timeout=30)   # at least one actor worker is up
        # This cluster's tree only (another test's long-lived child may be ours too).
        procs = []
        for child in current.get_core().cluster.procs:
            p = psutil.Process(child.pid)
            procs += [p, *p.children(recursive=True)]
        assert len(procs) >= 3   # head, node, workers
        for p in procs:
            assert pki.cert not in " ".join(p.cmdline()), p.cmdline()
        workers = [p for p in procs if "runtime.head" not in " ".join(p.cmdline())
                   and "runtime.node" not in " ".join(p.cmdline())]
        assert workers, [p.cmdline() for p in procs]
        for p in workers:
            assert p.environ().get(tls.ENV_CERT) == pki.cert


    # -- (2) a plain-TCP client is refused, promptly, and the cluster survives
    def test_plain_client_is_refused(self, tls_cluster):
        for role, address in _addresses().items():
            err, took = _try_connect(address, tls_cluster.token, None)
            assert err is not None, f"a plain-TCP client got into the {role}"
            assert "requires TLS" in str(err), err
            assert took < HANDSHAKE_S + 3, f"{role}: refused only after {took:.1f} s"
        # A client that speaks first (anything but a ClientHello) is dropped at once.
        host, port = _split(tls_cluster.address)
        with socket.create_connection((host, port), timeout=10) as s:
            t0 = time.monotonic()
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(64))
            s.settimeout(10)
            try:
                while s.recv(4096):
                    pass
            except ConnectionResetError:
                pass
            assert time.monotonic() - t0 < 2
        _still_works()


    def test_silent_tcp_peer_is_dropped_at_the_handshake_deadline(self, tls_cluster):
        host, port = _split(tls_cluster.address)
        with socket.create_connection((host, port), timeout=10) as s:
            t0 = time.monotonic()
            s.settimeout(HANDSHAKE_S + 5)
            try:
                assert s.recv(4096) == b""
            except ConnectionResetError:
                pass
            took = time.monotonic() - t0
        assert HANDSHAKE_S - 0.5 < took < HANDSHAKE_S + 3, took
        _still_works()


    # -- (3) a certificate from another CA is refused (in both directions)
    def test_client_certificate_from_another_ca_is_refused(self, tls_cluster, pki):
        addresses = _addresses()
        cases = {
            # A foreign certificate, even one that trusts our CA: the server refuses it.
            "foreign cert": _client_ctx(pki.other_cert, pki.other_key, pki.ca),
            "no client cert": _client_ctx(ca=pki.ca),
            # A foreign cluster's client: it refuses our server, we refuse it.
            "foreign cluster": _client_ctx(pki.other_cert, pki.other_key, pki.other_ca),
            "expired cert": _client_ctx(pki.expired_cert, pki.expired_key, pki.ca),
        }
        for role, address in addresses.items():
            for case, ctx in cases.items():
                err, took = _try_connect(address, tls_cluster.token, ctx)
                assert err is not None, f"{case} got into the {role}"
                assert "TLS" in str(err) or "certificate" in str(err), err
                assert took < 5, f"{case} vs {role}: {took:.1f} s"
            # Positive control: the cluster's own certificate, same token, gets in.
            err, _ = _try_connect(address, tls_cluster.token, tls.client_context(pki.files))
            assert err is None, err
        _still_works()


def test_server_with_certificate_from_another_ca_is_refused(pki, no_tls_env):
    """mTLS both ways: our client does not talk to an impostor server that knows the token."""
    impostor = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    impostor.load_cert_chain(pki.other_cert, pki.other_key)

    async def go():
        srv = await serve("127.0.0.1", 0, "tok", _Null(), tls_context=impostor)
        port = srv.sockets[0].getsockname()[1]
        try:
            with pytest.raises(AuthenticationError, match="does not accept"):
                await connect("127.0.0.1", port, "tok", _Null(), timeout=5,
                              tls_context=tls.client_context(pki.files))
        finally:
            srv.close()

    _run(go())


def test_tls_client_against_plain_server_says_so(pki, no_tls_env):
    async def go():
        srv = await serve("127.0.0.1", 0, "tok", _Null(), tls_context=None)
        port = srv.sockets[0].getsockname()[1]
        try:
            t0 = time.monotonic()
            with pytest.raises(AuthenticationError, match="does not speak TLS"):
                await connect("127.0.0.1", port, "tok", _Null(), timeout=5,
                              tls_context=tls.client_context(pki.files))
            assert time.monotonic() - t0 < 2
        finally:
            srv.close()

    _run(go())


def test_tls_handshake_is_bounded_by_the_handshake_deadline(pki, monkeypatch):
    """A peer that starts TLS but never finishes it is dropped at HANDSHAKE_TIMEOUT_S."""
    monkeypatch.setattr(config, "HANDSHAKE_TIMEOUT_S", 0.5)

    async def go():
        srv = await serve("127.0.0.1", 0, "tok", _Null(), tls_context=tls.server_context(pki.files))
        port = srv.sockets[0].getsockname()[1]
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"\x16\x03\x01\x00\x50")   # the first bytes of a ClientHello, then silence
            t0 = time.monotonic()
            assert await asyncio.wait_for(reader.read(), 5) == b""
            writer.close()
            return time.monotonic() - t0
        finally:
            srv.close()

    took = _run(go())
    assert took < 2, took


# -- (4) bad paths and bad files give clear errors -------------------------------------------
def _init_error(monkeypatch, env: dict, address=None) -> str:
    for k in TLS_VARS:
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with no_leaked_processes():
        with pytest.raises(TLSConfigError) as e:
            ddlf.init(address=address) if address else ddlf.init(num_cpus=1)
    assert not ddlf.is_initialized()
    return str(e.value)


def test_missing_file_names_the_variable_and_path(pki, monkeypatch, tmp_path):
    missing = str(tmp_path / "no-such-cert.pem")
    msg = _init_error(monkeypatch, {**pki.env(), tls.ENV_CERT: missing})
    assert missing in msg and tls.ENV_CERT in msg and "does not exist" in msg
    # A driver joining a cluster gets the same error before any connection is tried.
    msg = _init_error(monkeypatch, {**pki.env(), tls.ENV_CA: missing}, address="127.0.0.1:9")
    assert missing in msg and tls.ENV_CA in msg


def test_bad_files_say_what_is_wrong(pki, monkeypatch, tmp_path):
    cases = [
        ({tls.ENV_KEY: pki.other_key}, "does not belong to the certificate"),
        ({tls.ENV_CA: pki.other_ca}, "would be refused"),
        ({tls.ENV_CERT: pki.expired_cert, tls.ENV_KEY: pki.expired_key}, "expired"),
        ({tls.ENV_CERT: pki.key}, "not in PEM format"),
        ({tls.ENV_CA: str(tmp_path)}, "is not a file"),
    ]
    for change, expected in cases:
        msg = _init_error(monkeypatch, {**pki.env(), **change})
        assert expected in msg, (change, msg)
        bad = next(iter(change.values()))
        assert bad in msg, msg


def test_encrypted_key_and_partial_settings(pki, tmp_path):
    key = serialization.load_pem_private_key(open(pki.key, "rb").read(), None)
    enc = tmp_path / "encrypted.key"
    enc.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.BestAvailableEncryption(b"secret")))
    with pytest.raises(TLSConfigError, match="encrypted"):
        tls.check(tls.TLSFiles(pki.cert, str(enc), pki.ca))
    with pytest.raises(TLSConfigError, match=f"also set {tls.ENV_KEY} and {tls.ENV_CA}"):
        tls.files_from_env({tls.ENV_CERT: pki.cert})
    assert tls.files_from_env({}) is None
    assert tls.client_context(None) is None and tls.server_context(None) is None


def test_cli_start_with_a_bad_tls_flag_starts_nothing(pki, session_dir, tmp_path, no_leaks):
    missing = str(tmp_path / "missing.pem")
    r = subprocess.run([sys.executable, "-m", "ddlf_actors.runtime.cli", "start", "--head",
                        "--port", "0", "--tls-cert", missing, "--tls-key", pki.key,
                        "--tls-ca", pki.ca], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r
    assert "--tls-cert" in r.stderr and missing in r.stderr
    r = subprocess.run([sys.executable, "-m", "ddlf_actors.runtime.cli", "start", "--head",
                        "--port", "0", "--tls-cert", pki.cert], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "--tls-key and --tls-ca" in r.stderr, r.stderr
    assert not list(session_dir.glob("procs/*.json"))   # nothing was started


# -- the CLI flags, end to end ---------------------------------------------------------------
def test_cli_flags_start_a_tls_cluster(pki, session_dir, no_leaks, no_tls_env, monkeypatch):
    # No DDLF_TLS_* here: the flags alone turn TLS on for the head, the node and its workers.
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddlf_actors.runtime.cli", "start", "--head", "--port", "0",
         "--num-cpus", "1", "--block", "--tls-cert", pki.cert, "--tls-key", pki.key,
         "--tls-ca", pki.ca], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        deadline = time.monotonic() + 60
        while "DDLF head started" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
        assert "(mutual TLS)" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        address = line.split("DDLF head started at ")[1].split()[0]
        token = open(session_dir / f"head-{_split(address)[1]}" / "token").read().strip()
        # Without TLS settings a driver is refused, with them it works.
        err, _ = _try_connect(address, token, None)
        assert err is not None and "requires TLS" in str(err)
        for k, v in pki.env().items():
            monkeypatch.setenv(k, v)
        ddlf.init(address=address, token=token)
        try:
            b = Box.remote()
            assert ddlf.get(b.add.remote(1, 2), timeout=30) == 3
            assert ddlf.get(square.remote(5), timeout=30) == 25
            assert _server_cert(address, tls.client_context(pki.files)) == pki.der()
        finally:
            ddlf.shutdown()
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


# -- the openssl commands of docs/security.md make files DDLF accepts ------------------------
@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl binary")
def test_the_security_page_openssl_commands_make_a_working_set(tmp_path):
    with open(os.path.join(ROOT, "docs", "security.md")) as f:
        page = f.read()
    section = page.split("## TLS", 1)[1]
    commands = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    assert commands.count("openssl ") == 3
    subprocess.run(["bash", "-euc", commands], cwd=tmp_path, check=True, capture_output=True,
                   timeout=60)
    files = tls.TLSFiles(str(tmp_path / "node.pem"), str(tmp_path / "node.key"),
                         str(tmp_path / "ca.pem"))
    assert tls.check(files) == files
