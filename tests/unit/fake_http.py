"""A local HTTP server for the unit tests' fakes of SGLang (real sockets, port picked by the kernel).

    class Handler(JSONHandler):
        def do_POST(self):
            self.reply(200, {"echo": self.json_body()})

    with serving(ThreadingHTTPServer(("127.0.0.1", 0), Handler)) as server:
        port = server.server_address[1]

``serving`` starts ``serve_forever`` in a daemon thread (activating a server built with
``bind_and_activate=False`` first only when asked: ``activate=True``) and always shuts it down.
"""

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler


class JSONHandler(BaseHTTPRequestHandler):
    """Quiet handler with JSON in and out."""

    def log_message(self, *args):
        pass

    def json_body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"null")

    def reply(self, status, payload=None):
        body = json.dumps(payload).encode() if payload is not None else b""
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def start(server):
    """Serve in a daemon thread; the caller shuts the server down (``stop``)."""
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


def stop(server):
    server.shutdown()
    server.server_close()


@contextlib.contextmanager
def serving(server):
    start(server)
    try:
        yield server
    finally:
        stop(server)
