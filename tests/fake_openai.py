"""A tiny OpenAI-compatible server for tests: /v1/models and /v1/completions on a free loopback port, in a thread
(http.server), each completion's reply decided by the test (`reply(body) -> (status, payload)` or `(status,
payload, seconds to wait first)`). It records every request and how many were in flight at once, and can die
(`kill`: every connection dropped, the port closed) and come back on the same port (`start`)."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, List, Optional


def completion(text: str, token_ids: Optional[List[int]] = None, finish: str = "stop") -> dict:
    """A /v1/completions body with one choice (token_ids as vLLM's return_token_ids gives them)."""
    choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return {"id": "cmpl-test", "object": "text_completion", "model": "served", "choices": [choice]}


class FakeServer:
    def __init__(self, reply: Callable, owned_by: str = "vllm", models=("served",), key: Optional[str] = None):
        self.reply, self.owned_by, self.models, self.key = reply, owned_by, list(models), key
        self.requests: List[dict] = []
        """Every request: path, headers, body (JSON), time."""
        self.in_flight = self.most_in_flight = 0
        self.lock = threading.Lock()
        self.dead = False
        self.httpd: Optional[ThreadingHTTPServer] = None
        self.port = 0
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def completions(self, probe: bool = False) -> List[dict]:
        """The /v1/completions bodies received (the one-token probe left out unless `probe`)."""
        return [r["body"] for r in self.requests if r["path"] == "/v1/completions"
                and (probe or r["body"].get("max_tokens") != 1)]

    def start(self) -> "FakeServer":
        self.dead = False
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def kill(self) -> None:
        """Die: open connections are dropped on their next request, new ones refused."""
        self.dead = True
        self.httpd.shutdown()
        self.httpd.server_close()


def _handler(server: FakeServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def _send(self, status: int, payload) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            given = self.headers.get("Authorization")
            if server.key is None or given == f"Bearer {server.key}":
                return True
            # a careless server that echoes what it got: the client must not repeat it anywhere
            self._send(401, {"error": {"message": f"bad key {given}", "type": "auth"}})
            return False

        def do_GET(self):
            if server.dead:
                self.close_connection = True
                return
            server.requests.append({"path": self.path, "headers": dict(self.headers), "body": None,
                                    "time": time.monotonic()})
            if not self._authorized():
                return
            if self.path != "/v1/models":
                return self._send(404, {"error": {"message": "no such route"}})
            self._send(200, {"object": "list", "data": [{"id": name, "object": "model", "owned_by": server.owned_by}
                                                        for name in server.models]})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if server.dead:
                self.close_connection = True
                return
            server.requests.append({"path": self.path, "headers": dict(self.headers), "body": body,
                                    "time": time.monotonic()})
            if not self._authorized():
                return
            with server.lock:
                server.in_flight += 1
                server.most_in_flight = max(server.most_in_flight, server.in_flight)
            try:
                status, payload, *wait = server.reply(body)
                time.sleep(wait[0] if wait else 0.0)
                if server.dead:
                    self.close_connection = True
                    return
                self._send(status, payload)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting
                self.close_connection = True
            finally:
                with server.lock:
                    server.in_flight -= 1

    return Handler
