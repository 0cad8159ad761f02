"""An HTTPS front for the dev server on loopback, and the self-signed certificate (a private CA of one) it
presents: for the tests of TLS verification and --ca-bundle, in the parent's loop client and the blocking one."""

from __future__ import annotations

import http.server
import ssl
import subprocess
import threading
from pathlib import Path

import requests


def self_signed_cert(folder: Path) -> tuple[str, str]:
    """Make a certificate for 127.0.0.1, valid a day, with the openssl command; return (cert, key) paths."""
    cert, key = str(folder / "cert.pem"), str(folder / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=30)
    return cert, key


class _TlsProxy(http.server.ThreadingHTTPServer):
    daemon_threads = True


def forward(handler: http.server.BaseHTTPRequestHandler, upstream: str) -> None:
    """Send the request `handler` holds to `upstream` and its answer back (the key and content type, the
    status, the content type and Retry-After, the body)."""
    body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
    headers = {k: v for k, v in handler.headers.items() if k.lower() in ("authorization", "content-type")}
    r = requests.request(handler.command, upstream + handler.path, data=body, headers=headers, timeout=10)
    handler.send_response(r.status_code)
    for k, v in r.headers.items():
        if k.lower() in ("content-type", "retry-after"):
            handler.send_header(k, v)
    handler.send_header("Content-Length", str(len(r.content)))
    handler.end_headers()
    handler.wfile.write(r.content)


def tls_proxy(cert: str, key: str, upstream: str) -> tuple[_TlsProxy, int]:
    """An HTTPS front for `upstream` presenting `cert`, served by a thread; return it and its port (the
    caller shuts it down and closes it)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _forward(self):
            forward(self, upstream)

        do_GET = do_POST = _forward

    server = _TlsProxy(("127.0.0.1", 0), Handler)  # the OS picks the port: no race with another test's
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]
