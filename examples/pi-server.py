#!/usr/bin/env python3
"""A demo backend for drover, standard library only: the same routes as pi-server.js.

    GET /                      same as /pi
    GET /pi?iterations=N       estimate pi from N random points (default 100000)
    GET /mixed[?n=K]           90% cheap (1e4 points), 10% expensive (5e5 points);
                               with n, request K is expensive when K % 10 == 0
    GET /health                200 "ok"

It is deliberately single-threaded (plain HTTPServer, HTTP/1.0, one connection per
request), like one Node process: a slow request holds up everything behind it, which
is exactly what a load-aware balancer in front of several workers should route around.

Reads PORT (default 3000). On SIGTERM or SIGINT it finishes the request in hand, stops
accepting, and exits 0.
"""

import json
import os
import random
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import parse_qs, urlsplit

PORT = int(os.environ.get("PORT", "3000"))
WORKER = os.environ.get("DROVER_WORKER_ID")
DEFAULT_ITERATIONS = 100_000
CHEAP = 10_000
EXPENSIVE = 500_000
MAX_ITERATIONS = 100_000_000


def estimate_pi(iterations):
    rand = random.random
    inside = 0
    for _ in range(iterations):
        x, y = rand(), rand()
        if x * x + y * y <= 1.0:
            inside += 1
    return 4.0 * inside / iterations


class Handler(BaseHTTPRequestHandler):
    server_version = "pi-server.py"

    def do_GET(self):
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        if url.path == "/health":
            return self.send(200, b"ok", "text/plain")
        if url.path in ("/", "/pi"):
            raw = query.get("iterations", [str(DEFAULT_ITERATIONS)])[0]
            try:
                iterations = int(raw)
            except ValueError:
                iterations = 0
            if not 1 <= iterations <= MAX_ITERATIONS:
                msg = f"iterations must be an integer in 1..{MAX_ITERATIONS}\n"
                return self.send(400, msg.encode(), "text/plain")
            return self.pi(iterations, {})
        if url.path == "/mixed":
            n = query.get("n", [None])[0]
            if n is not None and n.lstrip("-").isdigit():
                expensive = int(n) % 10 == 0
            else:
                expensive = random.random() < 0.1
            kind = "expensive" if expensive else "cheap"
            return self.pi(EXPENSIVE if expensive else CHEAP, {"kind": kind})
        return self.send(404, b"not found\n", "text/plain")

    def pi(self, iterations, extra):
        started = time.perf_counter()
        pi = estimate_pi(iterations)
        ms = (time.perf_counter() - started) * 1000
        body = {"pi": pi, "iterations": iterations, "worker": WORKER,
                "pid": os.getpid(), "ms": ms, **extra}
        self.send(200, (json.dumps(body) + "\n").encode(), "application/json")

    def send(self, status, body, content_type):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):
        pass  # drover logs requests; per-request lines here would only add noise


def main():
    server = HTTPServer(("127.0.0.1", PORT), Handler)

    def on_signal(signum, _frame):
        # serve_forever() runs in this thread, and shutdown() waits for it to stop, so it
        # has to be called from another thread. The loop finishes the request in hand.
        print(f"pi-server.py {WORKER or ''} (pid {os.getpid()}): "
              f"{signal.Signals(signum).name}, draining", flush=True)
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"pi-server.py worker {WORKER or '-'} (pid {os.getpid()}) "
          f"listening on 127.0.0.1:{PORT}", flush=True)
    server.serve_forever()
    server.server_close()
    sys.exit(0)


if __name__ == "__main__":
    main()
