#!/usr/bin/env node
// Workload-matrix backend: `node bench/matrix/backend.js PORT` (no npm dependencies).
//
//   /               "ok"
//   /io?ms=100      answers after a timer of ms (I/O-bound: the event loop stays free)
//   /cpu?us=20      burns that much CPU time, synchronously (CPU-bound, like a real Node app:
//   /cpu?ms=10      everything else queued on this process waits)
//   /poll?ms=20000  long-poll: answered after ms by a timer
//   /sse?ms=20000   text/event-stream: one event at once and one a second, ends after ms
//   /ws             WebSocket (RFC 6455, by hand): sends "tick N" every second, echoes
//                   text/binary frames, answers ping and close
//   /__mode?...     per-process mode (admin, called on the backend's own port):
//                     reset=1            back to normal
//                     slow=F             every delay and cost x F (a heterogeneous backend)
//                     degrade_in_ms=T    after T ms every delay and cost x degrade_factor
//                     degrade_factor=10  (default 10)
//                     fail=1             every other request gets 500 at once (fail fast)
//                   answers the mode as JSON; works in fail mode too
//   /__stats        {"id", "served", "mode"}
//
// Every response carries `x-backend: ID` (BACKEND_ID, default the port), the WebSocket
// 101 included, so a client can count where its requests went. MATRIX_MODE="slow=2&..."
// sets a mode at start; under bench/matrix/cluster.js a worker also takes modes over IPC.
// Long-poll and SSE durations are never scaled: they wait for an event, not for work.
'use strict';
const http = require('http');
const crypto = require('crypto');

const port = Number(process.argv[2] || process.env.PORT || 0);
const id = process.env.BACKEND_ID || String(port);

const mode = { slow: 1, fail: false, degradeAt: 0, degradeFactor: 10 };
function applyMode(query) {
  const q = new URLSearchParams(query);
  if (q.has('reset')) Object.assign(mode, { slow: 1, fail: false, degradeAt: 0, degradeFactor: 10 });
  if (q.has('slow')) mode.slow = Number(q.get('slow')) || 1;
  if (q.has('fail')) mode.fail = q.get('fail') === '1' || q.get('fail') === 'true';
  if (q.has('degrade_factor')) mode.degradeFactor = Number(q.get('degrade_factor')) || 10;
  if (q.has('degrade_in_ms')) mode.degradeAt = Date.now() + Number(q.get('degrade_in_ms'));
  if (q.has('degrade_at')) mode.degradeAt = Number(q.get('degrade_at'));
  return modeJson();
}
function modeJson() {
  return { id, slow: mode.slow, fail: mode.fail, degrade_in_ms: mode.degradeAt ? mode.degradeAt - Date.now() : null, degrade_factor: mode.degradeFactor };
}
function factor() {
  return mode.slow * (mode.degradeAt && Date.now() >= mode.degradeAt ? mode.degradeFactor : 1);
}
if (process.env.MATRIX_MODE) applyMode(process.env.MATRIX_MODE);
process.on('message', (m) => {
  if (m && typeof m.mode === 'string') {
    const state = applyMode(m.mode);
    if (process.send) process.send({ modeSet: state, seq: m.seq });
  }
});

// Burns ns of this process's CPU time, not of wall time: a handler's fixed work takes
// longer when the process waits for a core, as in a real CPU-bound app. (A wall-clock
// loop ended on time however little CPU it got, so N workers on fewer cores served as if
// each had a core of its own: it rewarded sending every worker work at once and made
// holding requests back look like lost capacity.)
function cpuNs() {
  const used = process.cpuUsage();
  return (used.user + used.system) * 1000;
}
function burnNs(ns) {
  if (ns <= 0) return;
  const end = cpuNs() + ns;
  while (cpuNs() < end) { /* busy */ }
}

const OK = Buffer.from('ok');
let served = 0;

// REPORT_LOAD=1: every answer reports the event loop's utilisation over the last ~100 ms
// in Envoy's ORCA text form, as a Node app with drover's SDK middleware would; drover
// reads it (and holds requests back while it is >= 0.9), nginx and HAProxy pass it on.
const { performance } = require('perf_hooks');
const REPORT_LOAD = process.env.REPORT_LOAD === '1';
let eluMark = performance.eventLoopUtilization();
let eluNow = 0;
function loadHeader() {
  const since = performance.eventLoopUtilization(eluMark);
  const span = since.idle + since.active;
  if (span >= 10) eluNow = since.utilization;
  if (span >= 100) eluMark = performance.eventLoopUtilization();
  return `TEXT named_metrics.elu=${eluNow.toFixed(3)}`;
}

function send(res, status, body, type = 'text/plain') {
  if (res.destroyed) return;
  const b = Buffer.isBuffer(body) ? body : Buffer.from(body);
  const head = { 'content-type': type, 'content-length': b.length, 'x-backend': id };
  if (REPORT_LOAD) head['endpoint-load-metrics'] = loadHeader();
  res.writeHead(status, head);
  res.end(b);
}

function num(q, name, dflt) {
  const v = q.get(name);
  if (v === null) return dflt;
  const n = Number(v);
  return Number.isFinite(n) && n >= 0 ? n : dflt;
}

const server = http.createServer((req, res) => {
  served++;
  const qi = req.url.indexOf('?');
  const path = qi < 0 ? req.url : req.url.slice(0, qi);
  const q = new URLSearchParams(qi < 0 ? '' : req.url.slice(qi + 1));
  if (path === '/__mode') return send(res, 200, JSON.stringify(applyMode(q.toString())), 'application/json');
  if (path === '/__stats') return send(res, 200, JSON.stringify({ id, served, mode: modeJson() }), 'application/json');
  if (mode.fail) return send(res, 500, 'failing\n');
  switch (path) {
    case '/': return send(res, 200, OK);
    case '/io': {
      const t = setTimeout(() => send(res, 200, 'io\n'), num(q, 'ms', 100) * factor());
      res.on('close', () => clearTimeout(t));
      return;
    }
    case '/cpu': {
      const ns = q.has('ms') ? num(q, 'ms', 0) * 1e6 : num(q, 'us', 20) * 1e3;
      burnNs(ns * factor());
      return send(res, 200, 'cpu\n');
    }
    case '/poll': {
      const t = setTimeout(() => send(res, 200, 'poll\n'), num(q, 'ms', 20000));
      res.on('close', () => clearTimeout(t));
      return;
    }
    case '/sse': {
      const ms = num(q, 'ms', 20000);
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', 'x-backend': id });
      let n = 0;
      const tick = () => res.write(`event: tick\ndata: ${n++}\n\n`);
      tick();
      const iv = setInterval(tick, 1000);
      const end = setTimeout(() => { clearInterval(iv); res.end('event: end\ndata: done\n\n'); }, ms);
      res.on('close', () => { clearInterval(iv); clearTimeout(end); });
      return;
    }
    default: return send(res, 404, 'not found\n');
  }
});

// ---------------------------------------------------------------- WebSocket (RFC 6455)
const WS_GUID = '258EAFA5-E914-47DA-95CA-C5AB0DC11B65';
function wsFrame(opcode, payload) {
  const p = Buffer.isBuffer(payload) ? payload : Buffer.from(payload);
  let head;
  if (p.length < 126) head = Buffer.from([0x80 | opcode, p.length]);
  else if (p.length < 65536) { head = Buffer.alloc(4); head[0] = 0x80 | opcode; head[1] = 126; head.writeUInt16BE(p.length, 2); }
  else { head = Buffer.alloc(10); head[0] = 0x80 | opcode; head[1] = 127; head.writeBigUInt64BE(BigInt(p.length), 2); }
  return Buffer.concat([head, p]);
}
// Parses complete frames off the front of buf; returns [frames, rest].
function wsParse(buf) {
  const frames = [];
  for (;;) {
    if (buf.length < 2) break;
    const opcode = buf[0] & 0x0f;
    const masked = (buf[1] & 0x80) !== 0;
    let len = buf[1] & 0x7f;
    let off = 2;
    if (len === 126) { if (buf.length < 4) break; len = buf.readUInt16BE(2); off = 4; }
    else if (len === 127) { if (buf.length < 10) break; len = Number(buf.readBigUInt64BE(2)); off = 10; }
    const maskOff = off;
    if (masked) off += 4;
    if (buf.length < off + len) break;
    const payload = Buffer.from(buf.subarray(off, off + len));
    if (masked) for (let i = 0; i < len; i++) payload[i] ^= buf[maskOff + (i & 3)];
    frames.push({ opcode, payload });
    buf = buf.subarray(off + len);
  }
  return [frames, buf];
}

server.on('upgrade', (req, socket, head) => {
  served++;
  const key = req.headers['sec-websocket-key'];
  const path = req.url.split('?')[0];
  if (mode.fail || path !== '/ws' || !key || String(req.headers.upgrade).toLowerCase() !== 'websocket') {
    const body = mode.fail ? 'failing\n' : 'bad upgrade\n';
    socket.end(`HTTP/1.1 ${mode.fail ? 500 : 400} ${mode.fail ? 'Internal Server Error' : 'Bad Request'}\r\ncontent-length: ${body.length}\r\nx-backend: ${id}\r\nconnection: close\r\n\r\n${body}`);
    return;
  }
  const accept = crypto.createHash('sha1').update(key + WS_GUID).digest('base64');
  socket.setNoDelay(true);
  socket.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n' +
    `Sec-WebSocket-Accept: ${accept}\r\nx-backend: ${id}\r\n\r\n`);
  let n = 0;
  const iv = setInterval(() => socket.write(wsFrame(1, `tick ${n++}`)), 1000);
  let buf = head && head.length ? Buffer.from(head) : Buffer.alloc(0);
  const onData = (chunk) => {
    buf = buf.length ? Buffer.concat([buf, chunk]) : chunk;
    const [frames, rest] = wsParse(buf);
    buf = rest;
    for (const f of frames) {
      if (f.opcode === 8) { clearInterval(iv); socket.end(wsFrame(8, f.payload.subarray(0, 2))); return; }
      if (f.opcode === 9) socket.write(wsFrame(10, f.payload));
      else if (f.opcode === 1 || f.opcode === 2) socket.write(wsFrame(f.opcode, f.payload));
    }
  };
  socket.on('data', onData);
  socket.on('close', () => clearInterval(iv));
  socket.on('error', () => clearInterval(iv));
  if (buf.length) { const b = buf; buf = Buffer.alloc(0); onData(b); }
});

// Outlive every proxy's idle timeout so upstream keep-alive connections are reused.
server.keepAliveTimeout = 300e3;
server.headersTimeout = 301e3;
server.requestTimeout = 0;
server.listen({ port, host: '127.0.0.1', backlog: 4096 }, () => {
  const a = server.address();
  console.error(`matrix backend ${id} listening on ${a.address}:${a.port} (pid ${process.pid})`);
});
for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => process.exit(0));
// A cluster worker whose primary is gone (even by SIGKILL) goes too.
if (process.send) process.on('disconnect', () => process.exit(0));
