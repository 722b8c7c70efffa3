#!/usr/bin/env node
// Idle keep-alive client for bench/idle.sh (no npm dependencies).
//
//   node bench/idle/client.js --port P --conns N [--concurrency 64] [--hold-ms 300000]
//                             [--timeout-ms 120000] [--path /] [--close]
//                             [--tls [--tls-version 1.3|1.2]] [--websocket]
//
// Opens N connections to 127.0.0.1:P, at most --concurrency of them connecting or waiting
// for their answer at a time, sends ONE keep-alive `GET PATH` on each and reads the whole
// answer (Content-Length or chunked). Then it prints one JSON line
//   {"event":"ready","ok":N,"failed":F,"closed_by_peer":C,"ms":T}
// and keeps every connection open and idle (it sends nothing more), until SIGTERM or
// SIGINT or --hold-ms pass, when it prints
//   {"event":"end","open":O,"closed_by_peer":C,"unexpected_bytes":B,"held_ms":H}
// and exits. `closed_by_peer` counts connections the proxy closed after their answer: any
// of them before the measurement means the proxy did not hold N idle connections.
// With --close it exits right after the "ready" line (a warm-up). With --tls every
// connection is HTTPS (a full handshake each, no session resumption, the certificate not
// verified: bench/tls.sh's idle TLS connections), TLS 1.3 unless --tls-version 1.2.
// With --websocket each connection upgrades instead (`GET /ws`, a WebSocket handshake,
// answered 101) and stays open as a WebSocket; bytes the backend sends on it later
// (bench/matrix/backend.js ticks once a second) are counted as unexpected_bytes.
'use strict';
const net = require('net');
const tls = require('tls');

function arg(name, dflt) {
  const i = process.argv.indexOf(`--${name}`);
  if (i < 0) return dflt;
  const v = process.argv[i + 1];
  if (v === undefined) throw new Error(`--${name} needs a value`);
  return v;
}
const port = Number(arg('port'));
const conns = Number(arg('conns', 10000));
const concurrency = Number(arg('concurrency', 64));
const holdMs = Number(arg('hold-ms', 300000));
const timeoutMs = Number(arg('timeout-ms', 120000));
const path = arg('path', '/');
const closeAfter = process.argv.includes('--close');
const useTls = process.argv.includes('--tls');
const tlsVersion = `TLSv${arg('tls-version', '1.3')}`;
const websocket = process.argv.includes('--websocket');
for (const [k, v] of Object.entries({ port, conns, concurrency, holdMs, timeoutMs })) {
  if (!Number.isInteger(v) || v < 1) {
    process.stderr.write(`idle client: ${k} must be a positive integer\n`);
    process.exit(2);
  }
}

const request = Buffer.from(websocket
  ? `GET /ws HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nUser-Agent: drover-idle-bench\r\n` +
    'Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n' +
    'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n'
  : `GET ${path} HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nUser-Agent: drover-idle-bench\r\n\r\n`);
const sockets = [];
let started = 0, ok = 0, failed = 0, closedByPeer = 0, unexpectedBytes = 0, inFlight = 0;
let readyAt = 0, phaseDone = false;
const t0 = Date.now();
const errors = {};

// True once buf holds a whole response; throws on a malformed one.
function complete(buf) {
  const end = buf.indexOf('\r\n\r\n');
  if (end < 0) return false;
  const head = buf.subarray(0, end).toString('latin1');
  const lines = head.split('\r\n');
  const m = /^HTTP\/1\.[01] (\d{3})/.exec(lines[0]);
  if (!m) throw new Error(`bad status line: ${lines[0].slice(0, 80)}`);
  if (websocket) {
    if (m[1] !== '101') throw new Error(`status ${m[1]}`);
    return true;
  }
  if (m[1] !== '200') throw new Error(`status ${m[1]}`);
  let len = null, chunked = false;
  for (const l of lines.slice(1)) {
    const c = l.indexOf(':');
    const name = l.slice(0, c).trim().toLowerCase(), value = l.slice(c + 1).trim();
    if (name === 'content-length') len = Number(value);
    if (name === 'transfer-encoding' && /chunked/i.test(value)) chunked = true;
    if (name === 'connection' && /close/i.test(value)) throw new Error('connection: close');
  }
  const body = buf.length - (end + 4);
  if (chunked) return buf.subarray(end + 4).includes('0\r\n\r\n');
  if (len === null) throw new Error('no content-length (close-delimited answer)');
  return body >= len;
}

function fail(sock, why) {
  if (sock.state === 'done' || sock.state === 'failed') return;
  sock.state = 'failed';
  failed++;
  errors[why] = (errors[why] || 0) + 1;
  inFlight--;
  sock.destroy();
  next();
}

function open() {
  started++;
  inFlight++;
  const sock = useTls
    ? tls.connect({ port, host: '127.0.0.1', servername: 'localhost', rejectUnauthorized: false,
      minVersion: tlsVersion, maxVersion: tlsVersion, session: undefined })
    : net.connect({ port, host: '127.0.0.1' });
  sock.state = 'waiting';
  sockets.push(sock);
  let buf = Buffer.alloc(0);
  sock.setNoDelay(true);
  sock.on(useTls ? 'secureConnect' : 'connect', () => sock.write(request));
  sock.on('data', (d) => {
    if (sock.state !== 'waiting') {
      unexpectedBytes += d.length;
      return;
    }
    buf = Buffer.concat([buf, d]);
    let done;
    try {
      done = complete(buf);
    } catch (e) {
      return fail(sock, e.message);
    }
    if (done) {
      sock.state = 'done';
      buf = null;
      ok++;
      inFlight--;
      next();
    }
  });
  sock.on('error', (e) => fail(sock, e.code || e.message));
  sock.on('close', () => {
    if (sock.state === 'done') {
      sock.state = 'closed';
      closedByPeer++;
    } else fail(sock, 'closed before the answer');
  });
}

function next() {
  if (phaseDone) return;
  while (started < conns && inFlight < concurrency) open();
  if (ok + failed === conns) ready();
}

function openCount() {
  return sockets.filter((s) => s.state === 'done').length;
}

function ready() {
  if (readyAt) return;
  phaseDone = true;
  clearTimeout(timeout);
  readyAt = Date.now();
  const line = { event: 'ready', ok, failed, closed_by_peer: closedByPeer, ms: readyAt - t0 };
  if (failed) line.errors = errors;
  process.stdout.write(JSON.stringify(line) + '\n');
  if (closeAfter) {
    for (const s of sockets) s.destroy();
    process.exit(0);
  }
  setTimeout(end, holdMs);
}

function end() {
  const line = { event: 'end', open: openCount(), closed_by_peer: closedByPeer,
    unexpected_bytes: unexpectedBytes, held_ms: readyAt ? Date.now() - readyAt : 0 };
  process.stdout.write(JSON.stringify(line) + '\n');
  for (const s of sockets) s.destroy();
  process.exit(0);
}

const timeout = setTimeout(() => {
  // Whatever is still pending after --timeout-ms counts as failed.
  phaseDone = true;
  for (const s of sockets) if (s.state === 'waiting') fail(s, 'timeout');
  failed += conns - started;
  if (conns > started) errors['never started'] = conns - started;
  started = conns;
  ready();
}, timeoutMs);
process.on('SIGTERM', end);
process.on('SIGINT', end);
next();
