#!/usr/bin/env node
// Long-lived connections through a proxy (no npm dependencies):
//
//   node longlived.js URL --polls 20 --sse 10 --ws 10 --ms 20000 --duration 24
//
// (it stops early, with the same report, on SIGTERM)
//
// Keeps --polls long-polls (GET /poll?ms=MS), --sse event streams (GET /sse?ms=MS, one
// event a second) and --ws WebSockets (/ws, a frame a second from the backend, plus an
// echoed frame sent every 2 s) open for --duration seconds; each one that ends well is
// opened again. Prints "ready" on stderr once all of them got their response head (or
// 101), then at the end one JSON object:
//   opened, completed (ended as expected), failed, open_at_end (still open and fine when
//   the run ended: not a failure; a WebSocket never ends by itself, so it is one of these), failures by reason, per kind {opened, completed, failed},
//   ready_ms (time until all were established), sse_events, ws_frames.
// A long-poll fails on an error, a non-200 status or an answer much earlier than MS;
// an SSE stream on an error, a non-200 status, a wrong content type, a gap of more than
// 3.5 s between events (a proxy buffering the stream) or an end before MS; a WebSocket
// on a failed handshake, a close or error before the end, a gap of more than 3.5 s
// between frames, or an echo that does not come back.
'use strict';
const http = require('http');
const crypto = require('crypto');

const argv = process.argv.slice(2);
const url = new URL(argv[0].includes('://') ? argv[0] : `http://${argv[0]}`);
const opt = { polls: 20, sse: 10, ws: 10, ms: 20000, duration: 24 };
for (let i = 1; i < argv.length; i += 2) {
  const k = argv[i].replace(/^--/, '');
  if (!(k in opt)) { console.error(`longlived.js: unknown option ${argv[i]}`); process.exit(2); }
  opt[k] = Number(argv[i + 1]);
}
const GAP_MS = 3500;
const agent = new http.Agent({ keepAlive: true, maxSockets: Infinity });
const t0 = Date.now();
const endAt = t0 + opt.duration * 1000;
let stopping = false;

const kinds = { poll: { opened: 0, completed: 0, failed: 0 }, sse: { opened: 0, completed: 0, failed: 0 }, ws: { opened: 0, completed: 0, failed: 0 } };
const reasons = {};
let sseEvents = 0;
let wsFrames = 0;
const live = new Set(); // handles with .close()
let established = 0;
let readyMs = null;
const want = opt.polls + opt.sse + opt.ws;
function onEstablished() {
  established++;
  if (established === want && readyMs === null) { readyMs = Date.now() - t0; console.error(`ready ${readyMs}ms`); }
}

function outcome(kind, good, reason) {
  if (good) kinds[kind].completed++;
  else { kinds[kind].failed++; const r = `${kind}:${reason}`; reasons[r] = (reasons[r] || 0) + 1; }
}

function startPoll() {
  if (stopping) return;
  kinds.poll.opened++;
  const started = Date.now();
  let first = true;
  const h = { done: false };
  const finish = (good, reason) => {
    if (h.done) return; h.done = true; live.delete(h);
    outcome('poll', good, reason);
    startPoll();
  };
  const req = http.get({ host: url.hostname, port: url.port, path: `/poll?ms=${opt.ms}`, agent }, (res) => {
    if (first) { first = false; onEstablished(); }
    res.on('data', () => {});
    res.on('end', () => {
      if (res.statusCode !== 200) return finish(false, `status-${res.statusCode}`);
      if (Date.now() - started < opt.ms * 0.9) return finish(false, 'early');
      finish(true);
    });
    res.on('error', () => finish(false, 'io'));
  });
  // A long-poll's head only arrives at the end; count it established once the request went out.
  req.on('socket', (s) => {
    const mark = () => { if (first) { first = false; onEstablished(); } };
    if (s.connecting) s.once('connect', mark); else setImmediate(mark);
  });
  req.on('error', (e) => finish(false, e.code || 'io'));
  h.close = () => { h.done = true; req.destroy(); };
  live.add(h);
}

function startSse() {
  if (stopping) return;
  kinds.sse.opened++;
  const started = Date.now();
  const h = { done: false };
  let gapTimer = null;
  const finish = (good, reason) => {
    if (h.done) return; h.done = true; live.delete(h); clearTimeout(gapTimer);
    outcome('sse', good, reason);
    req.destroy();
    startSse();
  };
  const armGap = () => { clearTimeout(gapTimer); gapTimer = setTimeout(() => finish(false, 'stalled'), GAP_MS); };
  const req = http.get({ host: url.hostname, port: url.port, path: `/sse?ms=${opt.ms}`, agent, headers: { accept: 'text/event-stream' } }, (res) => {
    onEstablished();
    if (res.statusCode !== 200) { res.resume(); return finish(false, `status-${res.statusCode}`); }
    if (!String(res.headers['content-type']).startsWith('text/event-stream')) { res.resume(); return finish(false, 'content-type'); }
    armGap();
    let buf = '';
    res.setEncoding('utf8');
    res.on('data', (d) => {
      buf += d;
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, i); buf = buf.slice(i + 2);
        if (ev.includes('data:')) { sseEvents++; armGap(); }
      }
    });
    res.on('end', () => {
      if (Date.now() - started < opt.ms * 0.9) return finish(false, 'early-end');
      finish(true);
    });
    res.on('error', () => finish(false, 'io'));
  });
  req.on('error', (e) => finish(false, e.code || 'io'));
  h.close = () => { h.done = true; clearTimeout(gapTimer); req.destroy(); };
  live.add(h);
}

function wsFrame(opcode, text) {
  const p = Buffer.from(text);
  if (p.length >= 126) throw new Error('short frames only');
  const mask = crypto.randomBytes(4);
  const out = Buffer.alloc(6 + p.length);
  out[0] = 0x80 | opcode; out[1] = 0x80 | p.length; mask.copy(out, 2);
  for (let i = 0; i < p.length; i++) out[6 + i] = p[i] ^ mask[i & 3];
  return out;
}

function startWs() {
  if (stopping) return;
  kinds.ws.opened++;
  const h = { done: false };
  let gapTimer = null;
  let echoTimer = null;
  let sock = null;
  let echoWanted = null;
  let echoSent = 0;
  const finish = (good, reason) => {
    if (h.done) return; h.done = true; live.delete(h);
    clearTimeout(gapTimer); clearInterval(echoTimer);
    outcome('ws', good, reason);
    if (sock) sock.destroy();
    startWs();
  };
  const armGap = () => { clearTimeout(gapTimer); gapTimer = setTimeout(() => finish(false, 'stalled'), GAP_MS); };
  const key = crypto.randomBytes(16).toString('base64');
  const req = http.request({
    host: url.hostname, port: url.port, path: '/ws', agent: false,
    headers: { connection: 'Upgrade', upgrade: 'websocket', 'sec-websocket-version': '13', 'sec-websocket-key': key },
  });
  req.on('response', (res) => { onEstablished(); res.resume(); finish(false, `status-${res.statusCode}`); });
  req.on('upgrade', (res, socket, head) => {
    onEstablished();
    sock = socket;
    const expect = crypto.createHash('sha1').update(key + '258EAFA5-E914-47DA-95CA-C5AB0DC11B65').digest('base64');
    if (res.headers['sec-websocket-accept'] !== expect) return finish(false, 'bad-accept');
    armGap();
    let buf = head && head.length ? Buffer.from(head) : Buffer.alloc(0);
    const onData = (chunk) => {
      buf = buf.length ? Buffer.concat([buf, chunk]) : chunk;
      while (buf.length >= 2) {
        const opcode = buf[0] & 0x0f;
        let len = buf[1] & 0x7f;
        let off = 2;
        if (len === 126) { if (buf.length < 4) break; len = buf.readUInt16BE(2); off = 4; }
        else if (len === 127) { if (buf.length < 10) break; len = Number(buf.readBigUInt64BE(2)); off = 10; }
        if (buf.length < off + len) break;
        const payload = buf.subarray(off, off + len).toString();
        buf = buf.subarray(off + len);
        if (opcode === 8) return finish(false, 'closed-by-server');
        wsFrames++;
        armGap();
        if (echoWanted !== null && payload === echoWanted) echoWanted = null;
      }
    };
    socket.on('data', onData);
    socket.on('close', () => finish(false, 'closed'));
    socket.on('error', () => finish(false, 'io'));
    echoTimer = setInterval(() => {
      if (echoWanted !== null) return finish(false, 'no-echo');
      echoWanted = `echo ${echoSent++}`;
      socket.write(wsFrame(1, echoWanted));
    }, 2000);
    if (buf.length) { const b = buf; buf = Buffer.alloc(0); onData(b); }
  });
  req.on('error', (e) => finish(false, e.code || 'io'));
  req.end();
  h.close = () => {
    if (h.done) return; h.done = true; clearTimeout(gapTimer); clearInterval(echoTimer);
    if (sock) { try { sock.end(wsFrame(8, '')); } catch { /* gone */ } sock.destroy(); } else req.destroy();
  };
  live.add(h);
}

for (let i = 0; i < opt.polls; i++) startPoll();
for (let i = 0; i < opt.sse; i++) startSse();
for (let i = 0; i < opt.ws; i++) startWs();

// The end: after --duration, or at once on SIGTERM (matrix.sh sends it when its short
// requests are done).
let ended = false;
function end() {
  if (ended) return;
  ended = true;
  stopping = true;
  const openAtEnd = {};
  for (const h of [...live]) h.close();
  for (const k of Object.keys(kinds)) openAtEnd[k] = kinds[k].opened - kinds[k].completed - kinds[k].failed;
  const sum = (f) => Object.values(kinds).reduce((a, k) => a + k[f], 0);
  console.log(JSON.stringify({
    tool: 'matrix-longlived', target: url.host, polls: opt.polls, sse: opt.sse, ws: opt.ws, ms: opt.ms, duration_s: opt.duration,
    ready_ms: readyMs, established,
    opened: sum('opened'), completed: sum('completed'), failed: sum('failed'),
    open_at_end: Object.values(openAtEnd).reduce((a, b) => a + b, 0), open_at_end_by_kind: openAtEnd,
    failures: reasons, kinds, sse_events: sseEvents, ws_frames: wsFrames,
  }));
  agent.destroy();
  setTimeout(() => process.exit(0), 100);
}
setTimeout(end, Math.max(0, endAt - Date.now()));
process.on('SIGTERM', end);
process.on('SIGINT', end);
