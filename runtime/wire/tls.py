"""Mutual TLS for every DDLF connection: build the server and client ``SSLContext``\\ s.

A cluster with TLS gives every process three PEM files: its certificate, that
certificate's private key, and the cluster's CA certificate. ``ddlf-node start`` takes
them as ``--tls-cert/--tls-key/--tls-ca``; every other process (drivers, the embedded
cluster of ``ddlf.init()``, and the workers a node starts) reads them from
``DDLF_TLS_CERT``, ``DDLF_TLS_KEY`` and ``DDLF_TLS_CA``. Paths travel through the
environment, never a command line, like the token.

Both ends verify each other against the CA (``CERT_REQUIRED`` on both sides), so only
holders of a certificate signed by the cluster's CA can connect or serve. Host names are
*not* checked (``check_hostname = False``): a DDLF certificate names a cluster, not a
host. Workers listen on ephemeral ports of any host, nodes advertise whatever ``--host``
they were given (often an IP, sometimes a NAT address), so per-host names would make
every node need its own certificate with exactly the right IP SANs for no gain: trust is
pinned to the CA file alone (the system's CAs are never loaded). Hence: use a CA made
for this cluster only, never a public one, or any certificate it ever signed could join.

The token handshake still runs on top, unchanged: TLS adds encryption and a second,
independent proof of membership.
"""

from __future__ import annotations

import functools
import os
import ssl
from dataclasses import dataclass

from ..errors import TLSConfigError

__all__ = ["ENV_CERT", "ENV_KEY", "ENV_CA", "TLSFiles", "files_from_env", "files_from_args",
           "check", "server_context", "client_context", "to_env", "describe_ssl_error"]

ENV_CERT = "DDLF_TLS_CERT"
ENV_KEY = "DDLF_TLS_KEY"
ENV_CA = "DDLF_TLS_CA"
_ENV_NAMES = (ENV_CERT, ENV_KEY, ENV_CA)
_FLAG_NAMES = ("--tls-cert", "--tls-key", "--tls-ca")

# One command that makes a usable set, quoted in errors so the fix is one copy away.
_HOWTO = ("see 'TLS' in DDLF's docs/security.md for the three openssl commands that make a CA "
          "and a certificate")


@dataclass(frozen=True)
class TLSFiles:
    """Absolute paths of this process's certificate, its key and the cluster CA, plus the
    setting each came from (an environment variable or a flag), which errors name."""

    cert: str
    key: str
    ca: str
    names: tuple = _ENV_NAMES


def _collect(values, names) -> TLSFiles | None:
    given = [bool(v) for v in values]
    if not any(given):
        return None
    if not all(given):
        missing = [n for n, g in zip(names, given) if not g]
        have = [n for n, g in zip(names, given) if g]
        raise TLSConfigError(
            f"TLS needs all three of {', '.join(names)}, but only {', '.join(have)} {'is' if len(have) == 1 else 'are'} set: also "
            f"set {' and '.join(missing)} (or unset them all to run without TLS)")
    cert, key, ca = (os.path.abspath(os.path.expanduser(v)) for v in values)
    return TLSFiles(cert, key, ca, tuple(names))


def files_from_env(environ=None) -> TLSFiles | None:
    """The files named by ``DDLF_TLS_*``; ``None`` if none is set. Raises on a partial set."""
    env = os.environ if environ is None else environ
    return _collect([env.get(n, "").strip() for n in _ENV_NAMES], _ENV_NAMES)


def files_from_args(cert: str | None, key: str | None, ca: str | None) -> TLSFiles | None:
    """The files given as ``--tls-cert/--tls-key/--tls-ca``; ``None`` if none is."""
    return _collect([cert or "", key or "", ca or ""], _FLAG_NAMES)


def to_env(files: TLSFiles | None) -> dict:
    """``DDLF_TLS_*`` for a child process (absolute paths, so a child's cwd does not matter)."""
    if files is None:
        return {}
    return dict(zip(_ENV_NAMES, (files.cert, files.key, files.ca)))


# -- building the contexts -----------------------------------------------------------------
def _read_pem(path: str, name: str, what: str, marker: str, fix: str) -> str:
    if not os.path.exists(path):
        raise TLSConfigError(f"the TLS {what} {path} (from {name}) does not exist: point {name} "
                             f"at the PEM file ({_HOWTO})")
    if not os.path.isfile(path):
        raise TLSConfigError(f"the TLS {what} {path} (from {name}) is not a file: point {name} "
                             "at the PEM file itself")
    try:
        with open(path, "rb") as f:
            text = f.read(1 << 20).decode("ascii", errors="replace")
    except OSError as e:
        raise TLSConfigError(f"cannot read the TLS {what} {path} (from {name}): {e.strerror}; "
                             f"make it readable by uid {os.getuid()}") from None
    if marker not in text:
        raise TLSConfigError(f"the TLS {what} {path} (from {name}) is not in PEM format (no "
                             f"'{marker}' line): {fix}")
    return text


def _no_passphrase():
    # Without a callback OpenSSL would prompt on the terminal, which hangs a daemon.
    raise TLSConfigError("encrypted key")


def _load_pair(ctx: ssl.SSLContext, files: TLSFiles) -> None:
    cname, kname, aname = files.names
    _read_pem(files.cert, cname, "certificate", "-----BEGIN CERTIFICATE-----",
              f"convert a DER certificate with `openssl x509 -inform der -in {files.cert} "
              "-out cert.pem`")
    key_text = _read_pem(files.key, kname, "private key", "PRIVATE KEY-----",
                         f"convert a DER key with `openssl pkey -inform der -in {files.key} "
                         "-out key.pem`")
    if "ENCRYPTED" in key_text:
        raise TLSConfigError(
            f"the TLS private key {files.key} (from {kname}) is encrypted, and a DDLF process "
            f"cannot ask for its passphrase: decrypt it once with `openssl pkey -in {files.key} "
            "-out key.pem` and keep the result readable by you only (chmod 600)")
    _read_pem(files.ca, aname, "CA certificate", "-----BEGIN CERTIFICATE-----",
              "give the CA's certificate (ca.pem), not its key")
    try:
        ctx.load_cert_chain(files.cert, files.key, password=_no_passphrase)
    except ssl.SSLError as e:
        if getattr(e, "reason", None) == "KEY_VALUES_MISMATCH":   # OpenSSL's code, not its text
            raise TLSConfigError(
                f"the TLS private key {files.key} (from {kname}) does not belong to the "
                f"certificate {files.cert} (from {cname}): give the key that was generated "
                "together with that certificate") from None
        raise TLSConfigError(f"cannot load the TLS certificate {files.cert} (from {cname}) with "
                             f"the key {files.key} (from {kname}): {e}") from None
    try:
        ctx.load_verify_locations(cafile=files.ca)
    except ssl.SSLError as e:
        raise TLSConfigError(f"cannot load the TLS CA certificate {files.ca} (from {aname}): "
                             f"{e}") from None


def _new(purpose: int, files: TLSFiles) -> ssl.SSLContext:
    ctx = ssl.SSLContext(purpose)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    # Mutual: a server refuses a client without a CA-signed certificate, and a client
    # refuses a server without one. Hostnames are not checked: see the module docstring.
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    _load_pair(ctx, files)
    return ctx


def _self_test(server: ssl.SSLContext, client: ssl.SSLContext, files: TLSFiles) -> None:
    """Handshake with ourselves in memory, so a certificate our peers would refuse (signed
    by another CA, expired, made for servers only) fails here, naming the file, instead of
    on every peer as an anonymous handshake error."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    cli = client.wrap_bio(c_in, c_out, server_side=False)
    srv = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    try:
        for _ in range(8):
            for side, obj, out, peer_in in (("client", cli, c_out, s_in),
                                            ("server", srv, s_out, c_in)):
                if not done[side]:
                    try:
                        obj.do_handshake()
                        done[side] = True
                    except ssl.SSLWantReadError:
                        pass
                data = out.read()
                if data:
                    peer_in.write(data)
            if all(done.values()):
                return
    except ssl.SSLError as e:
        why = getattr(e, "verify_message", None) or e.reason or str(e)
        cname, _, aname = files.names
        raise TLSConfigError(
            f"the TLS certificate {files.cert} (from {cname}) would be refused by the cluster's "
            f"other processes: {why}. It must be signed by the CA in {files.ca} (from {aname}), "
            "be valid now, and be usable for both TLS servers and clients "
            f"(no extendedKeyUsage, or both serverAuth and clientAuth); {_HOWTO}") from None
    raise TLSConfigError(f"TLS self-test with {files.cert} did not complete")


def _stamp(files: TLSFiles) -> tuple:
    """The files plus their modification times: a replaced certificate is picked up by the
    next connection, while an unchanged one is never parsed twice."""
    out: list[int | None] = []
    for p in (files.cert, files.key, files.ca):
        try:
            out.append(os.stat(p).st_mtime_ns)
        except OSError:
            out.append(None)  # _read_pem reports it
    return (files, *out)


@functools.lru_cache(maxsize=8)
def _contexts(stamp: tuple) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    files = stamp[0]
    server = _new(ssl.PROTOCOL_TLS_SERVER, files)
    client = _new(ssl.PROTOCOL_TLS_CLIENT, files)
    _self_test(server, client, files)
    return server, client


_FROM_ENV = object()


def check(files: TLSFiles | None = _FROM_ENV) -> TLSFiles | None:  # type: ignore[assignment]
    """Raise :class:`TLSConfigError` unless ``files`` (default: ``DDLF_TLS_*``) make working
    contexts. Called before starting processes, so a bad path fails here, not in a child."""
    if files is _FROM_ENV:
        files = files_from_env()
    if files is not None:
        _contexts(_stamp(files))
    return files


def server_context(files: TLSFiles | None = _FROM_ENV) -> ssl.SSLContext | None:  # type: ignore[assignment]
    """The context for a listening socket (default: from ``DDLF_TLS_*``); ``None`` without TLS."""
    if files is _FROM_ENV:
        files = files_from_env()
    return None if files is None else _contexts(_stamp(files))[0]


def client_context(files: TLSFiles | None = _FROM_ENV) -> ssl.SSLContext | None:  # type: ignore[assignment]
    """The context for an outgoing connection (default: from ``DDLF_TLS_*``); ``None`` without TLS."""
    if files is _FROM_ENV:
        files = files_from_env()
    return None if files is None else _contexts(_stamp(files))[1]


_NOT_TLS = {"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG",
            "UNKNOWN_PROTOCOL", "HTTP_REQUEST", "UNEXPECTED_RECORD"}


def describe_ssl_error(exc: ssl.SSLError, peer) -> str:
    """Turn a failed TLS handshake into a message that says which side to fix."""
    where = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer)
    reason = getattr(exc, "reason", None) or ""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (f"TLS: the server at {where} presented a certificate our CA ({ENV_CA}) does not "
                f"accept ({exc.verify_message}): it belongs to another cluster, or {ENV_CA} "
                "names the wrong CA file")
    if reason in _NOT_TLS:
        return (f"TLS: the peer at {where} does not speak TLS ({reason}): that cluster runs "
                f"without TLS; unset {ENV_CERT}, {ENV_KEY} and {ENV_CA} to join it, or restart it "
                "with --tls-cert/--tls-key/--tls-ca")
    if "ALERT" in reason or "CERTIFICATE_REQUIRED" in reason:
        return (f"TLS: the peer at {where} refused our certificate ({reason}): {ENV_CERT} must "
                f"be signed by the CA the cluster trusts; check that {ENV_CA} is the cluster's CA "
                "and the certificate was issued by it")
    return f"TLS handshake with {where} failed: {exc}"
