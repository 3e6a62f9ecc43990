#!/usr/bin/env python3
"""A stand-in for llama-server's slot endpoints, for timing `kvsnap restore --server` alone.

Answers GET /health, /props (a build_info, so restores target a current build), /slots (slot 0
idle) and POST /slots/N?action=... with a success reply, without reading the slot file. What
`restore --server` does up to the server's load (the read + convert + write phase, the commit)
runs as against a real server; the server's own load of the file (19-24 ms for the bench slot,
docs/performance.md "End to end") is not part of the figures. Nothing here asserts anything.

  bench/slot_stub_server.py PORT [BUILD_INFO]      # default BUILD_INFO b10361-3f2a1bc
"""
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BUILD = sys.argv[2] if len(sys.argv) > 2 else "b10361-3f2a1bc"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, obj, code=200):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path.startswith("/health"):
            return self.reply({"status": "ok"})
        if self.path.startswith("/props"):
            return self.reply({"build_info": BUILD, "model_path": ""})
        if self.path.startswith("/slots"):
            return self.reply([{"id": 0, "is_processing": False}])
        return self.reply({"error": "not found"}, 404)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        return self.reply({"id_slot": 0, "n_restored": 0, "n_read": 0, "timings": {"restore_ms": 0.0}})


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
