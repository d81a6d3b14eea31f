# ingressapp.py is the web app the ingress gateway tests run in a sandbox,
# with nothing but Python's standard library. It listens on every port
# named on its command line and serves:
#
#   GET  /, /index.html  a page whose script (app.js, a relative URL) fetches
#                        asset.json (relative too) and writes its word into
#                        the page: a browser shows "rendered by js: WORD"
#   GET  /headers        the request as the app saw it, as JSON
#   POST /echo           the request body back
#   GET  /sse?n=N&ms=M   N server-sent events, M ms apart, each flushed
#   GET  /big?n=BYTES    BYTES zero bytes, streamed in 1 MiB writes
#   GET  /ws             a WebSocket that echoes text and binary messages
#
# WORD comes from the environment (APP_WORD), so a test knows a page came
# from this sandbox and not from a cache or a stand-in.
import base64
import hashlib
import http.server
import json
import os
import struct
import sys
import threading
import time
import urllib.parse

WORD = os.environ.get("APP_WORD", "unset")
WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

PAGE = b"""<!doctype html>
<html><head><meta charset="utf-8"><title>ingress app</title>
<script src="app.js"></script></head>
<body><h1>ingress app</h1><p id="status">static html</p></body></html>
"""

SCRIPT = b"""document.addEventListener('DOMContentLoaded', async () => {
  const status = document.getElementById('status');
  try {
    const r = await fetch('asset.json');
    const j = await r.json();
    status.textContent = 'rendered by js: ' + j.word;
  } catch (e) {
    status.textContent = 'asset failed: ' + e;
  }
  document.title = 'done';
});
"""

ZEROS = bytes(1 << 20)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def reply(self, status, ctype, body):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        q = urllib.parse.parse_qs(url.query)
        if url.path in ("/", "/index.html"):
            self.reply(200, "text/html; charset=utf-8", PAGE)
        elif url.path == "/app.js":
            self.reply(200, "text/javascript", SCRIPT)
        elif url.path == "/asset.json":
            self.reply(200, "application/json", json.dumps({"word": WORD}).encode())
        elif url.path == "/headers":
            body = {"path": self.path, "host": self.headers.get("Host", ""),
                    "port": self.server.server_address[1],
                    "headers": {k: v for k, v in self.headers.items()}}
            self.reply(200, "application/json", json.dumps(body).encode())
        elif url.path == "/sse":
            self.sse(int(q.get("n", ["3"])[0]), int(q.get("ms", ["400"])[0]))
        elif url.path == "/big":
            self.big(int(q.get("n", ["0"])[0]))
        elif url.path == "/ws":
            self.websocket()
        else:
            self.reply(404, "text/plain", b"not found in the app\n")

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(n)
        self.reply(200, "application/octet-stream", body)

    def sse(self, n, ms):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        for i in range(n):
            if i:
                time.sleep(ms / 1000)
            self.wfile.write(("id: %d\ndata: event %d of %s\n\n" % (i, i, WORD)).encode())
            self.wfile.flush()

    def big(self, n):
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(n))
        self.end_headers()
        view = memoryview(ZEROS)
        while n > 0:
            k = min(n, len(ZEROS))
            self.wfile.write(view[:k])
            n -= k

    def websocket(self):
        key = self.headers.get("Sec-WebSocket-Key", "")
        if self.headers.get("Upgrade", "").lower() != "websocket" or not key:
            self.reply(400, "text/plain", b"not a websocket handshake\n")
            return
        accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            op, n = head[0] & 0x0F, head[1] & 0x7F
            if n == 126:
                n = struct.unpack(">H", self.rfile.read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self.rfile.read(8))[0]
            mask = self.rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            data = bytearray(self.rfile.read(n))
            for i in range(len(data)):
                data[i] ^= mask[i % 4]
            if op == 0x8:  # close: answer it and end
                self.frame(0x8, bytes(data[:2]))
                return
            if op == 0x9:  # ping
                self.frame(0xA, bytes(data))
            elif op in (0x1, 0x2):
                self.frame(op, bytes(data))

    def frame(self, op, data):
        n = len(data)
        if n < 126:
            head = struct.pack(">BB", 0x80 | op, n)
        elif n < 1 << 16:
            head = struct.pack(">BBH", 0x80 | op, 126, n)
        else:
            head = struct.pack(">BBQ", 0x80 | op, 127, n)
        self.wfile.write(head + data)
        self.wfile.flush()


def serve(port):
    http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler).serve_forever()


if __name__ == "__main__":
    ports = [int(p) for p in sys.argv[1:]] or [8080]
    for p in ports[1:]:
        threading.Thread(target=serve, args=(p,), daemon=True).start()
    serve(ports[0])
