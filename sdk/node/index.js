// drover SDK for Node: a server registers itself with a running drover as a member of
// one of its balancers, keeps the registration alive with heartbeats that carry its
// event-loop utilisation, and drains itself before it stops. `loadReporter()` reports
// the same utilisation on every response, which drover reads to balance by load.
//
// No dependencies; nothing here throws into the app once `register()` has returned:
// failures become 'warning'/'error' events on the handle (or log lines).
'use strict';

const http = require('node:http');
const https = require('node:https');
const os = require('node:os');
const { EventEmitter } = require('node:events');
const { performance } = require('node:perf_hooks');

// ORCA's header; drover strips it before the client sees the response.
const LOAD_HEADER = 'endpoint-load-metrics';
const DEFAULT_TTL_MS = 10_000;
// Without a TTL there is nothing to keep alive, but heartbeats still carry the load and
// notice a restarted drover (404), so they go on at this pace.
const NO_TTL_HEARTBEAT_MS = 5_000;
const REQUEST_TIMEOUT_MS = 5_000;
const BACKOFF_FIRST_MS = 250;
const BACKOFF_MAX_MS = 10_000;
// How long a shutdown waits for requests in flight before it exits anyway.
const DRAIN_TIMEOUT_MS = 30_000;
// The load in `loadReporter()`'s header is recomputed at most this often.
const LOAD_WINDOW_MS = 100;

/** Milliseconds from a duration: a number of seconds or "500ms", "10s", "2m", "1h". */
function parseDuration(value, what) {
  if (typeof value === 'number' && Number.isFinite(value) && value >= 0) return value * 1000;
  const m = typeof value === 'string' && /^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*$/.exec(value);
  if (!m) throw new TypeError(`${what}: ${JSON.stringify(value)} is not a duration like "10s" or "500ms"`);
  return Number(m[1]) * { ms: 1, s: 1000, m: 60_000, h: 3_600_000 }[m[2]];
}

/** A duration as drover's API takes it: whole seconds when exact, else milliseconds. */
function formatDuration(ms) {
  return ms % 1000 === 0 ? `${ms / 1000}s` : `${Math.round(ms)}ms`;
}

const clamp01 = (x) => (x >= 0 ? Math.min(x, 1) : 0); // NaN (no time elapsed) is 0 too

/** A function returning the event-loop utilisation since its previous call (0..1). */
function eluMeter() {
  let last = performance.eventLoopUtilization();
  return () => {
    const now = performance.eventLoopUtilization();
    const u = performance.eventLoopUtilization(now, last).utilization;
    last = now;
    return clamp01(u);
  };
}

// One window for the whole process: ELU is process-wide, and one sample shared by every
// reporter keeps the per-request cost at a clock read most of the time.
const recent = { meter: null, at: 0, value: 0 };
function recentElu() {
  const now = performance.now();
  if (recent.meter === null) {
    recent.meter = eluMeter();
    recent.at = now;
  } else if (now - recent.at >= LOAD_WINDOW_MS) {
    recent.value = recent.meter();
    recent.at = now;
  }
  return recent.value;
}

/** The header value for a utilisation, in ORCA's text format. */
function loadMetrics(utilisation) {
  return `TEXT named_metrics.elu=${clamp01(utilisation).toFixed(3)}`;
}

/**
 * Adds `endpoint-load-metrics: TEXT named_metrics.elu=X` to every response.
 *   app.use(loadReporter())                       Express/Connect middleware
 *   http.createServer(loadReporter(handler))      wraps a plain request handler
 */
function loadReporter(handler) {
  const stamp = (res) => {
    // Set before the app writes, so writeHead() merges it in with the app's headers.
    if (!res.headersSent) res.setHeader(LOAD_HEADER, loadMetrics(recentElu()));
  };
  if (typeof handler === 'function') {
    return function droverLoadReporter(req, res) {
      stamp(res);
      return handler.call(this, req, res);
    };
  }
  if (handler !== undefined) throw new TypeError('loadReporter(handler): handler must be a function');
  return function droverLoadReporter(req, res, next) {
    stamp(res);
    if (typeof next === 'function') next();
  };
}

/** Under `drover run`, drover started this process and already balances over it. */
function supervisedByDrover(env = process.env) {
  return env.DROVER_WORKER_ID !== undefined && env.DROVER_WORKER_ID !== '';
}

/** The admin API's base, from "http://127.0.0.1:9900", "127.0.0.1:9900" or "[::1]:9900". */
function parseAdmin(drover) {
  if (typeof drover !== 'string' || drover === '') {
    throw new TypeError('register: `drover` (the admin API address, e.g. "127.0.0.1:9900") is required');
  }
  const url = new URL(/^[a-z]+:\/\//i.test(drover) ? drover : `http://${drover}`);
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new TypeError(`register: drover ${drover}: only http:// and https:// are supported`);
  }
  return {
    lib: url.protocol === 'https:' ? https : http,
    hostname: url.hostname.replace(/^\[(.*)\]$/, '$1'),
    port: url.port || (url.protocol === 'https:' ? 443 : 80),
    base: url.pathname.replace(/\/+$/, ''),
    origin: url.origin,
  };
}

/** One JSON request to the admin API: resolves { status, body } for any status. */
function call(admin, token, method, path, body, timeoutMs) {
  return new Promise((resolve, reject) => {
    const payload = body === undefined ? null : Buffer.from(JSON.stringify(body));
    // A fresh connection each time: heartbeats are seconds apart, and a kept-alive one
    // may be closed by drover just as it is reused, which would look like an outage.
    const headers = { accept: 'application/json', connection: 'close' };
    if (payload) {
      headers['content-type'] = 'application/json';
      headers['content-length'] = payload.length;
    }
    if (token) headers.authorization = `Bearer ${token}`;
    const req = admin.lib.request(
      { hostname: admin.hostname, port: admin.port, path: admin.base + path, method, headers, agent: false },
      (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('error', reject);
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          let json = null;
          try {
            json = JSON.parse(text);
          } catch {
            // Not JSON: not drover answering (a proxy's error page); `text` says who.
          }
          resolve({ status: res.statusCode, body: json, text });
        });
      },
    );
    req.setTimeout(timeoutMs, () => req.destroy(new Error(`no answer within ${timeoutMs} ms`)));
    req.on('error', reject);
    req.end(payload);
  });
}

/** An Error for an answer drover refused; `level` says whether retrying may help. */
function refusal(what, res) {
  const why =
    res.body && typeof res.body.error === 'string'
      ? res.body.error
      : `not drover's answer: ${JSON.stringify(res.text.slice(0, 200))}`;
  const err = new Error(`${what}: ${res.status} ${why}`);
  err.status = res.status;
  // 5xx (the membership store is out of reach) pass; a 4xx is a mistake to fix.
  err.level = res.status >= 500 ? 'warning' : 'error';
  return err;
}

/** "host:port" for drover to connect to, from the listening address and `address`. */
function memberAddress(listening, override) {
  let port = null;
  let host = '127.0.0.1';
  if (listening && typeof listening === 'object') {
    port = listening.port;
    // A wildcard is no address to connect to; the loopback reaches the same socket.
    if (listening.address !== '0.0.0.0' && listening.address !== '::') host = listening.address;
  }
  if (override) {
    if (/^\[.*\]:\d+$/.test(override) || /^[^:]+:\d+$/.test(override)) return override;
    host = override.replace(/^\[(.*)\]$/, '$1'); // a bare host: the port is the server's
  }
  if (port === null) return null; // a unix socket, and no host:port given
  return host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
}

/** The default member id, reduced to what drover accepts (letters, digits, . _ - :). */
function defaultId(port) {
  return `${os.hostname()}-${process.pid}-${port}`.replace(/[^A-Za-z0-9._:-]/g, '-').slice(0, 128);
}

/**
 * The handle `register()` returns. Events: 'registered' (member, { created }),
 * 'heartbeat' (member), 'deregistered' (member or null), 'warning' (Error: transient,
 * retried), 'error' (Error: drover refused; retried too, in case it is fixed there).
 */
class Registration extends EventEmitter {
  constructor(opts) {
    super();
    if (!opts || typeof opts !== 'object') throw new TypeError('register(options): options are required');
    const { server } = opts;
    if (!server || typeof server.address !== 'function' || typeof server.on !== 'function') {
      throw new TypeError('register: `server` must be a net.Server or http.Server');
    }
    this.server = server;
    this.supervised = supervisedByDrover();
    this.balancer = opts.balancer ?? process.env.DROVER_BALANCER;
    this.id = opts.id ?? null;
    this.address = null;
    this.member = null;
    this.registered = false;
    // Whether drover may hold a registration to drain on close(): also while a PUT's
    // answer is unknown (it timed out), not after drover refused or forgot it.
    this._mayBeKnown = false;

    const ttl = opts.ttl === undefined ? DEFAULT_TTL_MS : opts.ttl ? parseDuration(opts.ttl, 'ttl') : null;
    this._ttl = ttl;
    this._interval =
      opts.heartbeat !== undefined ? parseDuration(opts.heartbeat, 'heartbeat') : ttl ? ttl / 3 : NO_TTL_HEARTBEAT_MS;
    this._timeout = opts.timeout !== undefined ? parseDuration(opts.timeout, 'timeout') : REQUEST_TIMEOUT_MS;
    this._drainTimeout =
      opts.drainTimeout !== undefined ? parseDuration(opts.drainTimeout, 'drainTimeout') : DRAIN_TIMEOUT_MS;
    this._weight = opts.weight;
    this._meta = opts.meta;
    this._addressOption = opts.address;
    this._token = opts.token ?? process.env.DROVER_ADMIN_TOKEN;
    this._load = typeof opts.load === 'function' ? opts.load : null;
    this._logger = opts.logger === false ? null : opts.logger ?? console;
    this._closed = false;
    this._timer = null;
    this._running = Promise.resolve();
    this._failures = 0;
    this._lastProblem = null;
    this._meter = null;
    this._closing = null;
    let ready;
    /** Resolves with the member at the first registration, or null once closed first. */
    this.ready = new Promise((resolve) => (ready = resolve));
    this._ready = ready;

    if (!this.supervised) {
      this._admin = parseAdmin(opts.drover ?? process.env.DROVER_ADMIN);
      if (typeof this.balancer !== 'string' || this.balancer === '') {
        throw new TypeError('register: `balancer` (the name of a balancer of that drover) is required');
      }
    }

    if (opts.signals !== false) {
      this._onSignal = () => this._shutdown();
      process.on('SIGTERM', this._onSignal);
      process.on('SIGINT', this._onSignal);
    }
    // A server that stops serving must not stay in the pool until its TTL lapses.
    this._onServerClose = () => this.close();
    server.once('close', this._onServerClose);

    if (this.supervised) {
      // drover run already balances over this process; the middleware still reports load.
      this._ready(null);
      return;
    }
    // Started on a later turn either way, so the caller can attach listeners first.
    this._onListening = () => this._start();
    if (server.listening) setImmediate(this._onListening);
    else server.once('listening', this._onListening);
  }

  _start() {
    if (this._closed) return;
    const listening = this.server.address();
    this.address = memberAddress(listening, this._addressOption);
    if (this.address === null) {
      this._report('error', new Error('the server listens on a unix socket: pass `address` ("host:port") to register it'));
      return;
    }
    if (this.id === null) this.id = defaultId(listening?.port ?? this.address.replace(/^.*:/, ''));
    this._path = `/v1/balancers/${encodeURIComponent(this.balancer)}/members/${encodeURIComponent(this.id)}`;
    this._schedule(0);
  }

  _schedule(ms) {
    if (this._closed) return;
    this._timer = setTimeout(() => {
      this._timer = null;
      this._running = this._step();
    }, ms);
    // The server keeps the process alive, not its registration.
    this._timer.unref();
  }

  /** One registration or heartbeat; schedules the next. Never rejects. */
  async _step() {
    let next = this._interval;
    try {
      next = this.registered ? await this._heartbeat() : await this._register();
      this._failures = 0;
    } catch (err) {
      if (this._closed) return;
      this._failures++;
      this._report(err.level ?? 'warning', err);
      // Exponential, with jitter so a fleet restarted together does not retry together.
      const backoff = Math.min(BACKOFF_FIRST_MS * 2 ** (this._failures - 1), BACKOFF_MAX_MS);
      next = backoff * (0.8 + 0.4 * Math.random());
    }
    this._schedule(next);
  }

  _send(method, path, body) {
    return call(this._admin, this._token, method, path, body, this._timeout).catch((err) => {
      // Unreachable or timed out: a warning, retried.
      throw new Error(`drover at ${this._admin.origin} is unreachable (${method} ${path}): ${err.message}`);
    });
  }

  async _register() {
    const body = { address: this.address };
    if (this._ttl) body.ttl = formatDuration(this._ttl);
    if (this._weight !== undefined) body.weight = this._weight;
    if (this._meta !== undefined) body.meta = this._meta;
    this._mayBeKnown = true;
    const res = await this._send('PUT', this._path, body);
    if (res.status !== 200 && res.status !== 201) {
      this._mayBeKnown = false;
      throw refusal(`registering ${this.id} as ${this.address}`, res);
    }
    if (this._closed) return this._interval; // close() drains it right after
    this.registered = true;
    this.member = res.body;
    this._lastProblem = null;
    // The first heartbeat reports the load since the registration.
    this._meter = eluMeter();
    this.emit('registered', res.body, { created: res.status === 201 });
    this._ready(res.body);
    return this._interval;
  }

  async _heartbeat() {
    const load = this._load ? this._load() : this._meter();
    const body = typeof load === 'number' && Number.isFinite(load) ? { load: clamp01(load) } : undefined;
    const res = await this._send('PUT', `${this._path}/heartbeat`, body);
    if (res.status === 200) {
      this.member = res.body;
      this._lastProblem = null;
      this.emit('heartbeat', res.body);
      return this._interval;
    }
    if (res.status === 404) {
      // Its TTL lapsed (a long pause, drover out of reach) or drover restarted: join again.
      this.registered = false;
      this._mayBeKnown = false;
      this._report('warning', refusal(`heartbeat of ${this.id}; registering again`, res));
      return 0;
    }
    if (res.status === 409) {
      // Someone drained it through the API. Heartbeats go on: once the drain is over
      // drover answers 404 and the member registers again; to leave for good, stop it.
      this._report('warning', refusal(`heartbeat of ${this.id}`, res));
      return this._interval;
    }
    throw refusal(`heartbeat of ${this.id}`, res);
  }

  /**
   * Stops heartbeats and drains the member (DELETE): drover sends it no new requests,
   * and those in flight finish. Resolves with drover's answer (state "draining" or
   * "removed"), or null when it was not registered or drover could not be reached.
   * The server is left running. Idempotent.
   */
  close() {
    if (this._closing) return this._closing;
    this._closed = true;
    if (this._timer) clearTimeout(this._timer);
    if (this._onSignal) {
      process.removeListener('SIGTERM', this._onSignal);
      process.removeListener('SIGINT', this._onSignal);
    }
    this.server.removeListener('close', this._onServerClose);
    if (this._onListening) this.server.removeListener('listening', this._onListening);
    this._ready(null);
    this._closing = this._deregister();
    return this._closing;
  }

  async _deregister() {
    await this._running; // a registration under way may still succeed: drain after it
    let member = null;
    if (this._mayBeKnown) {
      try {
        const res = await this._send('DELETE', this._path);
        // 404: drover no longer knows it (TTL lapsed, drover restarted): nothing to drain.
        if (res.status === 200) member = res.body;
        else if (res.status !== 404) this._report('warning', refusal(`draining ${this.id}`, res));
      } catch (err) {
        this._report('warning', err);
      }
    }
    this.registered = false;
    this._mayBeKnown = false;
    this.emit('deregistered', member);
    return member;
  }

  /** SIGTERM/SIGINT: drain, then close the server (requests in flight finish), exit. */
  async _shutdown() {
    if (this._shuttingDown) process.exit(1); // a second signal: do not wait any more
    this._shuttingDown = true;
    // close() removes the handlers, and without one a second signal would kill the
    // process with its default action; keep one that exits at once instead.
    process.once('SIGTERM', () => process.exit(1));
    process.once('SIGINT', () => process.exit(1));
    await this.close();
    const clean = await closeServer(this.server, this._drainTimeout);
    process.exit(clean ? 0 : 1);
  }

  _report(level, err) {
    // The same failure over and over (drover down for a minute) is said once.
    if (err.message === this._lastProblem) return;
    this._lastProblem = err.message;
    if (this.listenerCount(level) > 0) this.emit(level, err);
    else if (this._logger) this._logger[level === 'error' ? 'error' : 'warn'](`drover-sdk: ${err.message}`);
  }
}

/** Stops accepting and waits for requests in flight; false when `timeoutMs` ran out. */
function closeServer(server, timeoutMs) {
  return new Promise((resolve) => {
    if (!server.listening) return resolve(true);
    // Keep-alive connections idle between requests would hold close() open; once
    // drained, drover sends nothing more on them, so they may go.
    const idle = setInterval(() => server.closeIdleConnections?.(), 100);
    const timer = setTimeout(() => {
      clearInterval(idle);
      server.closeAllConnections?.();
      resolve(false);
    }, timeoutMs);
    server.close(() => {
      clearInterval(idle);
      clearTimeout(timer);
      resolve(true);
    });
    server.closeIdleConnections?.();
  });
}

/**
 * Registers `server` with drover's balancer `balancer` once it listens, and keeps it
 * registered. Under `drover run` it does nothing (drover already balances over its
 * workers) except the shutdown on signals.
 */
function register(options) {
  return new Registration(options);
}

module.exports = {
  register,
  loadReporter,
  loadMetrics,
  eventLoopUtilization: recentElu,
  supervisedByDrover,
  Registration,
  LOAD_HEADER,
  // For tests and tools.
  _internal: { parseDuration, formatDuration, memberAddress, parseAdmin, defaultId },
};
