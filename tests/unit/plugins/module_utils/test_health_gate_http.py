"""ServiceIO.request against real sockets: what the gate's rules read from a request that failed (the
error's words) or answered (status, parsed JSON), and that the key is sent only when asked for."""

import socket
import time
from http.server import ThreadingHTTPServer

import pytest
from fake_http import JSONHandler, serving

from ansible_collections.ddtree.sglang.plugins.module_utils.health_gate import ServiceIO


class Handler(JSONHandler):
    def do_POST(self):
        body = self.json_body()
        self.server.seen.append((self.path, self.headers.get("Authorization"), body))
        if self.path == "/slow":
            time.sleep(1.0)
        if self.path == "/hang-up":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.reply(401 if self.path == "/secret" else 200, {"echo": body, "key": "sk-abc"})


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.seen = []
    with serving(httpd):
        yield httpd


def io(port):
    return ServiceIO(None, "systemctl", "journalctl", "sglang-x.service", "0.0.0.0", port, api_key="sk-abc")


def test_an_answer_is_parsed_and_the_key_goes_only_where_asked_and_never_back_out(server):
    answer = io(server.server_address[1]).request("POST", "/v1/chat/completions", {"q": 1}, timeout=5, auth=True)
    assert answer["status"] == 200 and answer["error"] is None and answer["data"]["echo"] == {"q": 1}
    assert "sk-abc" not in answer["text"]  # redacted in what the gate returns
    io(server.server_address[1]).request("POST", "/health", {}, timeout=5)
    assert [(path, key) for path, key, _body in server.seen] == [
        ("/v1/chat/completions", "Bearer sk-abc"),
        ("/health", None),
    ]


def test_an_http_error_is_a_status_with_its_body(server):
    answer = io(server.server_address[1]).request("POST", "/secret", {}, timeout=5)
    assert answer["status"] == 401 and answer["error"] is None and answer["data"]["echo"] == {}


def test_a_closed_port_a_timeout_and_a_hang_up_are_errors_in_words_the_rules_read(server):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    refused = io(port).request("POST", "/x", {}, timeout=5)
    assert refused["status"] is None and refused["error"].startswith("ConnectionRefusedError:")
    slow = io(server.server_address[1]).request("POST", "/slow", {}, timeout=0.2)
    assert slow["status"] is None and slow["error"] == "timed out after 0.2 s" and slow["seconds"] < 1.0
    hung_up = io(server.server_address[1]).request("POST", "/hang-up", {}, timeout=5)
    assert hung_up["status"] is None and hung_up["error"].startswith("RemoteDisconnected:"), hung_up
