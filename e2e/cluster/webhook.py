"""Alertmanager webhook receiver for the e2e tests (stdlib only).

POST any path: the JSON body is appended, one line per notification, to the output file.
GET /alerts: the notifications received so far, as a JSON list. GET /healthz: "ok".
Usage: python webhook.py --listen 127.0.0.1:PORT --out FILE
"""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def read_notifications(path: Path) -> list[dict[str, Any]]:
    """The notifications in `path`, skipping a last line still being written."""
    if not path.exists():
        return []
    complete_lines = path.read_text().split("\n")[:-1]
    return [json.loads(line) for line in complete_lines if line]


def make_handler(out: Path) -> type[BaseHTTPRequestHandler]:
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            line = json.dumps(json.loads(body or b"{}"))
            with lock, out.open("a") as f:
                f.write(line + "\n")
            self._reply(200, b"{}")

        def do_GET(self) -> None:
            if self.path == "/healthz":
                self._reply(200, b"ok")
            elif self.path == "/alerts":
                self._reply(200, json.dumps(read_notifications(out)).encode())
            else:
                self._reply(404, b"not found")

        def _reply(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            print(f"{self.address_string()} {format % args}", flush=True)

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", required=True, help="HOST:PORT")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    host, port = args.listen.rsplit(":", 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    ThreadingHTTPServer((host, int(port)), make_handler(args.out)).serve_forever()


if __name__ == "__main__":
    main()
