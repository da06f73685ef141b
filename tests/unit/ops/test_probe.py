"""What hicache_probe (plugins/modules/hicache_probe.py) answers, against a server on 127.0.0.1: the shape the judges
read from ansible.builtin.uri (hicachectl/ops/verify.py _status, _json, the metrics' content), since status.yml and
verify.yml ask through it instead of one uri task per endpoint."""

from __future__ import annotations

import importlib.util
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from support import ROOT

spec = importlib.util.spec_from_file_location("hicache_probe", ROOT / "plugins/modules/hicache_probe.py")
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, body, kind):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self.reply(200, "", "text/plain")
        elif self.path == "/server_info":
            self.reply(200, json.dumps({"page_size": 16, "admin_api_key": "k"}), "application/json; charset=utf-8")
        elif self.path == "/slow":
            time.sleep(0.3)
            self.reply(200, "late", "text/plain")
        elif self.path == "/metrics":
            self.reply(200, "sglang:num_requests_total 3\n", "text/plain; version=0.0.4")
        elif self.path == "/hicache/storage-backend":
            key = self.headers.get("Authorization")
            if key != "Bearer admin":
                self.reply(400, json.dumps({"error": "no admin key"}), "application/json")
            else:
                self.reply(200, json.dumps({"backend": "file"}), "application/json")
        else:
            self.reply(404, "not here", "text/plain")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.reply(200, json.dumps({"echo": body, "type": self.headers.get("Content-Type")}), "application/json")


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_answers_have_uris_shape(server):
    answers = probe.ask_all([
        {"name": "health", "url": f"{server}/health"},
        {"name": "info", "url": f"{server}/server_info", "after": "health"},
        {"name": "metrics", "url": f"{server}/metrics", "return_content": True},
        {"name": "chat", "url": f"{server}/v1/chat/completions", "method": "POST", "body": {"messages": [{"role": "user", "content": "hi"}]}},
        {"name": "missing", "url": f"{server}/nowhere"},
    ])
    assert answers["health"]["status"] == 200 and "json" not in answers["health"] and "content" not in answers["health"]
    assert answers["info"]["status"] == 200 and answers["info"]["json"] == {"page_size": 16, "admin_api_key": "k"}
    assert answers["metrics"]["content"] == "sglang:num_requests_total 3\n" and "json" not in answers["metrics"]
    assert answers["chat"]["json"] == {"echo": {"messages": [{"role": "user", "content": "hi"}]}, "type": "application/json"}
    assert answers["missing"]["status"] == 404 and answers["missing"]["content"] == "not here"  # a non-2xx body is kept


def test_an_error_answer_keeps_its_json_and_its_text(server):
    """verify.py's storage-backend check reads the error of a 400 from its JSON or its content."""
    refused = probe.ask_all([{"name": "sb", "url": f"{server}/hicache/storage-backend"}])["sb"]
    assert refused["status"] == 400 and refused["json"] == {"error": "no admin key"} and "no admin key" in refused["content"]
    allowed = probe.ask_all([{"name": "sb", "url": f"{server}/hicache/storage-backend", "headers": {"Authorization": "Bearer admin"}}])["sb"]
    assert allowed["status"] == 200 and allowed["json"] == {"backend": "file"}


def test_nothing_answering_is_minus_one_and_what_comes_after_it_is_not_asked():
    url = f"http://127.0.0.1:{closed_port()}"
    answers = probe.ask_all([{"name": "health", "url": f"{url}/health", "timeout": 5},
                             {"name": "info", "url": f"{url}/server_info", "after": "health"}])
    assert answers["health"]["status"] == -1 and "Request failed" in answers["health"]["msg"]
    assert answers["info"] == {"skipped": True, "msg": "not asked: health did not answer 200"}


def test_files_and_paths(tmp_path):
    (tmp_path / "deployed.json").write_text('{"config_hash": "ab"}')
    assert probe.read_file(str(tmp_path / "deployed.json")) == '{"config_hash": "ab"}'
    assert probe.read_file(str(tmp_path / "absent.json")) is None
    assert probe.look_at(str(tmp_path)) == {"exists": True, "isdir": True, "writeable": True}
    assert probe.look_at(str(tmp_path / "absent")) == {"exists": False, "isdir": False, "writeable": False}


def test_an_answer_that_is_not_http_or_is_cut_short_is_minus_one_not_a_failed_probe():
    """Another process on the server's port, or a server dying mid-answer: ansible.builtin.uri gave -1 (fetch_url
    catches every error), and the judges say so; a crash of the probe would hide every other answer of the host."""
    replies = [b"SSH-2.0-OpenSSH_9.2\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nContent-Type: application/json\r\n\r\n{\"a\""]
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]

        def serve():
            for reply in replies:
                conn, _ = listener.accept()
                conn.recv(65536)
                conn.sendall(reply)
                conn.close()
        threading.Thread(target=serve, daemon=True).start()
        answers = probe.ask_all([{"name": "junk", "url": f"http://127.0.0.1:{port}/health", "timeout": 10},
                                 {"name": "cut", "url": f"http://127.0.0.1:{port}/server_info", "timeout": 10}])
    assert answers["junk"]["status"] == -1 and "Request failed" in answers["junk"]["msg"], answers
    assert answers["cut"]["status"] == -1 and "IncompleteRead" in answers["cut"]["msg"], answers


def test_each_answer_says_how_long_it_took_and_a_slow_one_takes_longer(server):
    """verify times the proof prompt's prefill against its answer from L3 with these `seconds` (is L3 worth it?)."""
    answers = probe.ask_all([{"name": "fast", "url": f"{server}/health"}, {"name": "slow", "url": f"{server}/slow"}])
    assert 0 < answers["fast"]["seconds"] < answers["slow"]["seconds"] and answers["slow"]["seconds"] >= 0.3  # its sleep, at least
    url = f"http://127.0.0.1:{closed_port()}"
    assert "seconds" not in probe.ask_all([{"name": "none", "url": url, "timeout": 5}])["none"]  # nothing answered: no time
