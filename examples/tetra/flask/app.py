#!/usr/bin/env python3
"""The fifth post's tetration app on Flask (see ../README.md).

    GET /          "OK, no problema!"
    GET /tetra/x   x**x as a decimal integer (Python ints are exact); x: 1 to 4 ASCII
                   digits, at most 1000, else 400 "x must be an integer in 0..1000"
    GET /health    200 "ok"

Reads PORT (default 3000) and binds 127.0.0.1:PORT, or serves the socket drover's
shared mode passes as fd 3 (LISTEN_FDS; LISTEN_PID, when set, must be this pid).
Served by werkzeug's threaded server (Flask's own), which is enough for an example.
Every response carries `x-worker`: DROVER_WORKER_ID, or the pid without it.
On SIGTERM or SIGINT it stops accepting, finishes the requests in hand and exits 0.
"""

import logging
import os
import re
import signal
import socket
import sys
import threading

from flask import Flask
from werkzeug.serving import make_server

PORT = int(os.environ.get("PORT", "3000"))
WORKER = os.environ.get("DROVER_WORKER_ID") or str(os.getpid())
# 1000**1000 has 3001 digits: bounded work and a bounded answer per request, and
# under Python's default limit of 4300 digits for int-to-str conversion.
MAX_X = 1000
TEXT = {"Content-Type": "text/plain; charset=utf-8"}

app = Flask(__name__)
# drover logs requests; a line per request here would only add noise.
logging.getLogger("werkzeug").setLevel(logging.WARNING)


@app.after_request
def x_worker(response):
    # after_request also sees Flask's own 404s and 405s.
    response.headers["x-worker"] = WORKER
    return response


@app.get("/")
def index():
    return "OK, no problema!", TEXT


@app.get("/health")
def health():
    return "ok", TEXT


@app.get("/tetra/<x>")
def tetra(x):
    # The same grammar in all five apps: int() alone would take " 7", "1_0" or
    # non-ASCII digits.
    if not re.fullmatch("[0-9]{1,4}", x) or int(x) > MAX_X:
        return f"x must be an integer in 0..{MAX_X}", 400, TEXT
    n = int(x)
    return str(n**n), TEXT


def inherited_fd():
    """3 if drover passed a socket meant for this process. A LISTEN_PID of another
    process means the variables leaked through a wrapper (a shell script)."""
    fds = os.environ.get("LISTEN_FDS", "")
    if not re.fullmatch("[0-9]+", fds) or int(fds) < 1:
        return None
    pid = os.environ.get("LISTEN_PID")
    if pid is not None and pid != str(os.getpid()):
        return None
    return 3


def main():
    fd = inherited_fd()
    # With fd, werkzeug serves that socket instead of binding (host and port then only
    # pick the address family).
    server = make_server("127.0.0.1", PORT, app, threaded=True, fd=fd)
    if fd is not None:
        # Every worker waits on the same socket and all wake for one connection; the
        # losers must get EAGAIN from accept() (which serve_forever shrugs off) rather
        # than block in it, deaf to shutdown.
        server.socket.setblocking(False)

    def on_signal(_signum, _frame):
        # shutdown() waits for serve_forever(), which runs in this thread.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    host, port = server.socket.getsockname()[:2]
    how = "" if fd is None else " (fd 3 from LISTEN_FDS)"
    print(f"tetra (flask) worker {WORKER} (pid {os.getpid()}) "
          f"listening on {host}:{port}{how}", flush=True)
    server.serve_forever()
    server.server_close()
    sys.exit(0)


if __name__ == "__main__":
    main()
