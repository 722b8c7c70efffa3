// What the SDK's tests share: a real `drover proxy` (env DROVER_BIN) with an admin API
// and no backends, small HTTP helpers, and test servers that say who answered.
// Kept out of test/ because `node --test` runs every .js file under a test/ directory.
'use strict';

const assert = require('node:assert/strict');
const http = require('node:http');
const net = require('node:net');
const path = require('node:path');
const { spawn } = require('node:child_process');

const REPO = path.resolve(__dirname, '../../..');

function droverBin() {
  const bin = process.env.DROVER_BIN;
  if (!bin) {
    throw new Error(
      'DROVER_BIN is not set: these tests run against a real drover. Build it and point at it, e.g.\n' +
        '  cargo build -p drover && DROVER_BIN=$PWD/target/debug/drover node --test sdk/node/test/',
    );
  }
  return path.resolve(bin);
}

// Children still running when the test process ends are killed: on exit (a failed
// assertion) and on the signal a runner's timeout sends, which skips 'exit' handlers.
const children = new Set();
const killChildren = () => {
  for (const c of children) c.kill('SIGKILL');
};
process.on('exit', killChildren);
for (const signal of ['SIGTERM', 'SIGINT', 'SIGHUP']) {
  process.once(signal, () => {
    killChildren();
    process.exit(1);
  });
}

// What a surrounding `drover run` worker or shell would leak into the children.
const LEAKS = ['DROVER_WORKER_ID', 'DROVER_APP', 'DROVER_ADMIN', 'DROVER_BALANCER', 'DROVER_ADMIN_TOKEN', 'LISTEN_FDS', 'LISTEN_PID', 'LISTEN_FDNAMES'];

/** process.env plus `extra`, without the variables a surrounding drover may have set. */
function cleanEnv(extra = {}) {
  const env = { ...process.env, ...extra };
  for (const k of LEAKS) {
    if (!(k in extra)) delete env[k];
  }
  return env;
}

/** Spawns a process; resolves once each regex matches a whole line of `stream`. */
function spawnReady(cmd, args, { env, stream = 'stderr', patterns, timeoutMs = 8000 }) {
  const child = spawn(cmd, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
  children.add(child);
  child.on('exit', () => children.delete(child));
  child.output = '';
  for (const s of ['stdout', 'stderr']) child[s].on('data', (d) => (child.output += d));
  return new Promise((resolve, reject) => {
    let text = '';
    const onData = (d) => {
      text += d;
      // Whole lines only: a chunk may end mid-address ("listening on 127").
      const lines = text.slice(0, text.lastIndexOf('\n') + 1);
      const found = patterns.map((re) => re.exec(lines));
      if (!found.every(Boolean)) return;
      done();
      resolve({ child, found });
    };
    const onExit = (code, signal) => fail(`exited (${code ?? signal}) before it was ready`);
    const onError = (err) => fail(err.message);
    const done = () => {
      clearTimeout(timer);
      child[stream].removeListener('data', onData);
      child.removeListener('exit', onExit);
      child.removeListener('error', onError);
    };
    const fail = (why) => {
      done();
      child.kill('SIGKILL');
      reject(new Error(`${path.basename(cmd)} ${args.join(' ')}: ${why}; output:\n${child.output}`));
    };
    const timer = setTimeout(() => fail(`not ready within ${timeoutMs} ms`), timeoutMs);
    child[stream].on('data', onData);
    child.on('exit', onExit);
    child.on('error', onError);
  });
}

/**
 * Starts `drover proxy --listen 127.0.0.1:0 --admin ADDR` with no backends. Resolves
 * { admin, listen, balancer, token, child, stop() }.
 */
async function startDrover({ token, admin = '127.0.0.1:0', args = [] } = {}) {
  const argv = ['proxy', '--listen', '127.0.0.1:0', '--admin', admin, ...args];
  if (token) argv.push('--admin-token', token);
  const { child, found } = await spawnReady(droverBin(), argv, {
    env: cleanEnv(),
    patterns: [/admin API listening on (\S+)/, /balancer "([^"]+)" listening on (\S+)/],
  });
  const d = {
    child,
    token,
    admin: `http://${found[0][1]}`,
    balancer: found[1][1],
    listen: found[1][2],
    stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    },
  };
  return d;
}

/** One HTTP request; resolves { status, headers, body (text), json }. Never keeps alive. */
function request(url, { method = 'GET', body, headers = {}, timeoutMs = 5000 } = {}) {
  return new Promise((resolve, reject) => {
    const payload = body === undefined ? null : Buffer.from(typeof body === 'string' ? body : JSON.stringify(body));
    const h = { ...headers };
    if (payload) h['content-length'] = payload.length;
    const req = http.request(url, { method, headers: h, agent: false }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d) => (text += d));
      res.on('end', () => {
        let json = null;
        try {
          json = JSON.parse(text);
        } catch {
          // Not JSON.
        }
        resolve({ status: res.statusCode, headers: res.headers, body: text, json });
      });
    });
    req.setTimeout(timeoutMs, () => req.destroy(new Error(`${method} ${url}: no answer in ${timeoutMs} ms`)));
    req.on('error', reject);
    req.end(payload);
  });
}

/** A request to drover's admin API, with its token when it has one. */
function api(d, method, apiPath, body) {
  const headers = d.token ? { authorization: `Bearer ${d.token}` } : {};
  return request(d.admin + apiPath, { method, body, headers });
}

async function members(d) {
  const res = await api(d, 'GET', `/v1/balancers/${d.balancer}/members`);
  assert.equal(res.status, 200, `GET members: ${res.body}`);
  return res.json.members;
}

async function member(d, id) {
  return (await members(d)).find((m) => m.id === id);
}

/** Polls `check` (async, truthy when done) every 50 ms; fails after `timeoutMs`. */
async function waitFor(what, check, timeoutMs = 5000) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    last = await check();
    if (last) return last;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(50);
  }
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** An HTTP server on 127.0.0.1:0 answering "NAME" with `x-server: NAME`. */
async function startServer(name, wrap = (h) => h) {
  const server = http.createServer(
    wrap((req, res) => {
      res.writeHead(200, { 'content-type': 'text/plain', 'x-server': name });
      res.end(name);
    }),
  );
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return server;
}

function closeServer(server) {
  return new Promise((r) => {
    server.close(() => r());
    server.closeAllConnections();
  });
}

/**
 * Sends requests through the balancer from `concurrency` loops until `stop()` (or
 * `maxMs`, so a test that fails before stop() does not spin on);
 * stop() resolves with [{ started, status, server, error }].
 */
function loadLoop(d, { concurrency = 4, path: p = '/', maxMs = 8000 } = {}) {
  const results = [];
  let running = true;
  const deadline = Date.now() + maxMs;
  const loops = Array.from({ length: concurrency }, async () => {
    while (running && Date.now() < deadline) {
      const started = Date.now();
      try {
        const res = await request(`http://${d.listen}${p}`);
        results.push({ started, status: res.status, server: res.headers['x-server'] ?? res.headers['x-worker'] });
      } catch (error) {
        results.push({ started, status: 0, error: error.message });
        await sleep(10);
      }
    }
  });
  return {
    results,
    async stop() {
      running = false;
      await Promise.all(loops);
      return results;
    },
  };
}

/** The resolution of the first `event` of `emitter` within `timeoutMs`. */
function nextEvent(emitter, event, timeoutMs = 5000) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      emitter.removeListener(event, on);
      reject(new Error(`no '${event}' event within ${timeoutMs} ms`));
    }, timeoutMs);
    const on = (...args) => {
      clearTimeout(timer);
      resolve(args);
    };
    emitter.once(event, on);
  });
}

/** The member `reg` registered as, within `timeoutMs`; fails with what it reported. */
async function registered(reg, timeoutMs = 5000) {
  const problems = [];
  const note = (e) => problems.push(e.message);
  reg.on('warning', note);
  reg.on('error', note);
  try {
    const m = await Promise.race([reg.ready, sleep(timeoutMs).then(() => undefined)]);
    if (m === undefined) throw new Error(`not registered within ${timeoutMs} ms: ${problems.join('; ') || 'nothing reported'}`);
    return m;
  } finally {
    reg.removeListener('warning', note);
    reg.removeListener('error', note);
  }
}

/** A port nothing listens on (bound and released at once). */
function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

module.exports = {
  REPO,
  api,
  cleanEnv,
  closeServer,
  freePort,
  loadLoop,
  member,
  members,
  nextEvent,
  registered,
  request,
  sleep,
  spawnReady,
  startDrover,
  startServer,
  waitFor,
};
