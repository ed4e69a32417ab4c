"""A Ray dashboard that misbehaves on purpose: a real HTTP server in a thread.

It answers the driver's routes as Ray 2.60's does (one whole node of 8 GPUs; a job RUNNING
forever) except those a test names, which hang, trickle, or answer a status, junk or JSON of the
wrong shape; every request is recorded so a test can count stops.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from miles_amd.recipe.plan import NODE_RESOURCE

ROUTES = ("version", "nodes", "submit", "status", "stop", "logs")


@dataclass(frozen=True)
class Reply:
    code: int = 200
    body: bytes = b""
    hang: bool = False
    trickle: bool = False  # a valid start, then one byte every 0.3 s until the server stops
    echo: bool = False  # append the request's body (a dashboard echoing the request)


@dataclass
class FakeDashboard:
    replies: dict[str, Reply] = field(default_factory=dict)
    requests: list[tuple[str, str, bytes]] = field(default_factory=list)
    authorizations: list[str] = field(default_factory=list)  # each request's header, in order
    status: str = "RUNNING"
    stopping: threading.Event = field(default_factory=threading.Event)
    address: str = ""

    def route(self, method: str, path: str) -> str:
        if path.startswith("/api/version"):
            return "version"
        if path.startswith("/api/v0/nodes"):
            return "nodes"
        if method == "POST" and path.rstrip("/") == "/api/jobs":
            return "submit"
        if method == "POST" and path.endswith("/stop"):
            return "stop"
        if path.endswith("/logs"):
            return "logs"
        return "status"

    def normal(self, route: str, path: str) -> Reply:
        job_id = (re.findall(r"/api/jobs/([^/]+)", path) or ["x"])[0]
        total = {NODE_RESOURCE: 1.0, "GPU": 8.0, "CPU": 2.0}
        node = dict(node_id="ab" * 28, node_ip="127.0.0.1", state="ALIVE", resources_total=total)
        answers: dict[str, object] = {
            "version": {"ray_version": "2.60.0", "version": "4", "session_name": "s"},
            "nodes": {"result": True, "data": {"result": {"result": [node]}}},
            "submit": {"job_id": "j", "submission_id": "j"},
            "status": {
                "type": "SUBMISSION",
                "job_id": job_id,
                "submission_id": job_id,
                "status": self.status,
                "entrypoint": "python train.py",
                "message": "",
            },
            "stop": {"stopped": True},
            "logs": {"logs": "started\n"},
        }
        return Reply(200, json.dumps(answers[route]).encode())

    def count(self, route: str) -> int:
        return sum(1 for method, path, _ in self.requests if self.route(method, path) == route)


def _handler(fake: FakeDashboard) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _answer(self, method: str) -> None:
            size = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(size) if size else b""
            fake.requests.append((method, self.path, body))
            fake.authorizations.append(self.headers.get("Authorization", ""))
            route = fake.route(method, self.path)
            reply = fake.replies.get(route) or fake.normal(route, self.path)
            if reply.hang:
                fake.stopping.wait(60)
                return
            if reply.trickle:
                self.send_response(200)
                self.send_header("Content-Length", "1000000")
                self.end_headers()
                while not fake.stopping.wait(0.3):
                    try:
                        self.wfile.write(b" ")
                        self.wfile.flush()
                    except OSError:  # the client gave up: what the test wants
                        return
                return
            payload = reply.body + (body if reply.echo else b"")
            self.send_response(reply.code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self) -> None:
            self._answer("GET")

        def do_POST(self) -> None:
            self._answer("POST")

    return Handler


@contextmanager
def fake_dashboard(replies: dict[str, Reply] | None = None) -> Iterator[FakeDashboard]:
    fake = FakeDashboard(replies=dict(replies or {}))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    server.daemon_threads = True
    server.handle_error = lambda *_: None  # type: ignore[method-assign]  # a client gave up
    fake.address = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="fake-dashboard", daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.stopping.set()
        server.shutdown()
        server.server_close()
