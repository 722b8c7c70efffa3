#!/usr/bin/env python3
"""A demo backend for drover, standard library only: the same routes as tetra-server.js.

Tetration, the power tower

    x↑↑n = x^(x^(...^x))   (n copies of x, evaluated from the top down; x↑↑0 = 1)

computed in 64-bit floats with n calls to pow. There is no shortcut when the tower
converges (for e^-e <= x <= e^(1/e) it does), so the height n is also the cost knob.

    GET /tetra/:x[?n=N]        x↑↑N (default N = 4): {x, n, value, worker, pid, ms}
                               x: a positive finite decimal number (1.5, 2e-3);
                               N: an integer in 0..10000000; anything else is a 400
                               naming the parameter, and a tower beyond the largest
                               double (2↑↑5 = 2^65536) is a 422
    GET /mixed[?n=K]           90% cheap (1.2↑↑1e4), 10% expensive (1.2↑↑5e5, ~50x);
                               with n, request K is expensive when K % 10 == 0
    GET /health                200 "ok"

Single-threaded (plain HTTPServer, HTTP/1.0, one connection per request), like one
Node process. Reads PORT (default 3000), or serves the listening socket drover passes
as fd 3 when LISTEN_FDS is set (systemd's convention; LISTEN_PID, when set, must be
this pid). Every response carries an `x-worker` header: DROVER_WORKER_ID, or the pid
without it. On SIGTERM or SIGINT it finishes the request in hand, stops accepting, and
exits 0.
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
DEFAULT_HEIGHT = 4
# Bounds the CPU one request may ask for (about a second here).
MAX_HEIGHT = 10_000_000
# 1.2 lies in the convergent range, so even the expensive tower stays finite.
MIXED_X = 1.2
CHEAP = 10_000
EXPENSIVE = 500_000
# ASCII digits only, the same grammar in all three languages: each one's own number
# parser accepts different extras (float() takes "inf", "1_0", surrounding blanks).
DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def tower(x, n):
    """x↑↑n, or None when it overflows a double."""
    t = 1.0
    try:
        for _ in range(n):
            t = x ** t
    except OverflowError:  # where JavaScript and Go would give Infinity
        return None
    return t


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
    server_version = "tetra-server.py"

    def do_GET(self):
        # Split by hand: urlsplit would read a path starting with "//" as a host name.
        path, _, raw_query = self.path.partition("?")
        query = parse_qs(raw_query, keep_blank_values=True)
        if path == "/health":
            return self.send(200, b"ok", "text/plain")
        if path == "/mixed":
            n = query.get("n", [None])[0]
            if n is not None and not re.fullmatch("-?[0-9]+", n):
                return self.send(400, b"n must be an integer\n", "text/plain")
            # The last digit decides, as in the other servers.
            expensive = random.random() < 0.1 if n is None else n.endswith("0")
            kind = "expensive" if expensive else "cheap"
            height = EXPENSIVE if expensive else CHEAP
            return self.tetra(MIXED_X, str(MIXED_X), height, {"kind": kind})
        if path.startswith("/tetra/") and "/" not in path[7:]:
            raw_x = path[7:]
            x = float(raw_x) if DECIMAL.fullmatch(raw_x) else float("nan")
            if not 0 < x < float("inf"):
                msg = f'x must be a positive finite decimal number, got "{raw_x}"\n'
                return self.send(400, msg.encode(), "text/plain")
            raw_n = query.get("n", [None])[0]
            n = DEFAULT_HEIGHT if raw_n is None else digits(raw_n)
            if n is None or n > MAX_HEIGHT:
                msg = f'n must be an integer in 0..{MAX_HEIGHT}, got "{raw_n}"\n'
                return self.send(400, msg.encode(), "text/plain")
            return self.tetra(x, raw_x, n, {})
        return self.send(404, b"not found\n", "text/plain")

    def tetra(self, x, label, n, extra):
        """`label` is x as the client wrote it, so error text matches the other servers."""
        started = time.perf_counter()
        value = tower(x, n)
        ms = (time.perf_counter() - started) * 1000
        if value is None:
            msg = f"{label}^^{n} overflows a 64-bit float (it exceeds 1.8e308)\n"
            return self.send(422, msg.encode(), "text/plain")
        body = {"x": x, "n": n, "value": value, "worker": WORKER,
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
        print(f"tetra-server.py {WORKER or ''} (pid {os.getpid()}): "
              f"{signal.Signals(signum).name}, draining", flush=True)
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    host, port = server.socket.getsockname()[:2]
    host = f"[{host}]" if ":" in host else host
    print(f"tetra-server.py worker {WORKER or '-'} (pid {os.getpid()}) "
          f"listening on {host}:{port}{how}", flush=True)
    server.serve_forever()
    server.server_close()
    sys.exit(0)


if __name__ == "__main__":
    main()
