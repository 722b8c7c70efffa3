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

Reads PORT (default 3000), or serves the listening socket drover passes as fd 3 when
LISTEN_FDS is set (systemd's convention; LISTEN_PID, when set, must be this pid).
Every response carries an `x-worker` header: DROVER_WORKER_ID, or the pid without it.
On SIGTERM or SIGINT it finishes the request in hand, stops accepting, and exits 0.
"""

import json
import os
import random
import re
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import parse_qs

PORT = int(os.environ.get("PORT", "3000"))
WORKER = os.environ.get("DROVER_WORKER_ID")
WORKER_HEADER = WORKER if WORKER is not None else str(os.getpid())
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


def digits(raw):
    """`raw` as an int if it is ASCII digits only, as the Node and Go servers read it
    (int() alone would also take " 7", "1_000" or Arabic-Indic digits); else None."""
    if not re.fullmatch("[0-9]+", raw):
        return None
    try:
        return int(raw)
    except ValueError:  # more digits than int() converts (sys.set_int_max_str_digits)
        return None


class Handler(BaseHTTPRequestHandler):
    server_version = "pi-server.py"

    def do_GET(self):
        # Split by hand: urlsplit would read a path starting with "//" as a host name.
        path, _, raw_query = self.path.partition("?")
        query = parse_qs(raw_query, keep_blank_values=True)
        if path == "/health":
            return self.send(200, b"ok", "text/plain")
        if path in ("/", "/pi"):
            raw = query.get("iterations", [str(DEFAULT_ITERATIONS)])[0]
            iterations = digits(raw)
            if iterations is None or not 1 <= iterations <= MAX_ITERATIONS:
                msg = f"iterations must be an integer in 1..{MAX_ITERATIONS}\n"
                return self.send(400, msg.encode(), "text/plain")
            return self.pi(iterations, {})
        if path == "/mixed":
            n = query.get("n", [None])[0]
            if n is not None and not re.fullmatch("-?[0-9]+", n):
                return self.send(400, b"n must be an integer\n", "text/plain")
            expensive = random.random() < 0.1 if n is None else n.endswith("0")
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
        self.send_header("x-worker", WORKER_HEADER)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):
        pass  # drover logs requests; per-request lines here would only add noise


class Server(HTTPServer):
    def get_request(self):
        conn, addr = self.socket.accept()
        # The listening socket may be non-blocking (see inherited_socket); a request
        # is still read and answered with plain blocking calls.
        conn.setblocking(True)
        return conn, addr


def inherited_socket():
    """The socket drover passed as fd 3, if it was meant for this process.

    A LISTEN_PID of another process means the variables leaked through a wrapper
    (a shell script, a launcher), and that process, not this one, owns the socket.
    """
    fds = os.environ.get("LISTEN_FDS", "")
    if not re.fullmatch("[0-9]+", fds) or int(fds) < 1:
        return None
    pid = os.environ.get("LISTEN_PID")
    if pid is not None and pid != str(os.getpid()):
        return None
    sock = socket.socket(fileno=3)
    # Every worker waits on the same socket, and all of them wake for one connection;
    # the losers must get EAGAIN from accept() (which serve_forever shrugs off) rather
    # than block in it, deaf to shutdown, until the next connection.
    sock.setblocking(False)
    return sock


def make_server():
    sock = inherited_socket()
    if sock is None:
        return Server(("127.0.0.1", PORT), Handler), ""
    server = Server(sock.getsockname()[:2], Handler, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    server.server_name, server.server_port = sock.getsockname()[:2]
    return server, " (fd 3 from LISTEN_FDS)"


def main():
    server, how = make_server()

    def on_signal(signum, _frame):
        # serve_forever() runs in this thread, and shutdown() waits for it to stop, so it
        # has to be called from another thread. The loop finishes the request in hand.
        print(f"pi-server.py {WORKER or ''} (pid {os.getpid()}): "
              f"{signal.Signals(signum).name}, draining", flush=True)
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    host, port = server.socket.getsockname()[:2]
    host = f"[{host}]" if ":" in host else host
    print(f"pi-server.py worker {WORKER or '-'} (pid {os.getpid()}) "
          f"listening on {host}:{port}{how}", flush=True)
    server.serve_forever()
    server.server_close()
    sys.exit(0)


if __name__ == "__main__":
    main()
