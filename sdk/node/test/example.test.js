// examples/pi-server-sdk.js as a child process: it joins a running `drover proxy` (no
// restart, no config), answers through it, and on SIGTERM drains itself and exits while
// the balancer's other member takes the requests, none failing.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const drover = require('..');
const h = require('../test-helpers/drover');

const EXAMPLE = path.join(h.REPO, 'examples/pi-server-sdk.js');

const opened = [];
after(async () => {
  for (const x of opened.reverse()) await x();
});

/** Starts the example with PORT=0 against `d`; resolves { child, id, port }. */
async function startExample(d, env = {}) {
  const { child, found } = await h.spawnReady(process.execPath, [EXAMPLE], {
    stream: 'stdout',
    env: h.cleanEnv({ PORT: '0', DROVER_ADMIN: d.admin, DROVER_BALANCER: d.balancer, ...env }),
    patterns: [/listening on 127\.0\.0\.1:(\d+)/, /joined balancer \S+ as (\S+) \(/],
  });
  opened.push(async () => child.kill('SIGKILL'));
  return { child, port: Number(found[0][1]), id: found[1][1] };
}

test('the pi example joins a running drover and answers through it', { timeout: 10_000 }, async () => {
  const d = await h.startDrover();
  opened.push(async () => d.stop());
  // The balancer is up, with no backends, before the example exists.
  assert.deepEqual(await h.members(d), []);
  const ex = await startExample(d);

  const m = await h.member(d, ex.id);
  assert.equal(m?.state, 'active');
  assert.equal(m.address, `127.0.0.1:${ex.port}`);
  assert.match(ex.id, new RegExp(`-${ex.child.pid}-${ex.port}$`));

  const res = await h.request(`http://${d.listen}/pi?iterations=1000`);
  assert.equal(res.status, 200);
  assert.equal(res.json.pid, ex.child.pid);
  assert.ok(Math.abs(res.json.pi - Math.PI) < 0.5);
  assert.equal(res.headers['endpoint-load-metrics'], undefined, 'drover strips the load header');

  // Directly, the load header is there.
  const direct = await h.request(`http://127.0.0.1:${ex.port}/health`);
  assert.equal(direct.body, 'ok');
  assert.match(direct.headers['endpoint-load-metrics'], /^TEXT named_metrics\.elu=(0\.\d{3}|1\.000)$/);
});

test('SIGTERM: the example drains, exits 0, and requests go elsewhere without a failure', { timeout: 10_000 }, async () => {
  const d = await h.startDrover();
  opened.push(async () => d.stop());
  const ex = await startExample(d);
  // The other member, in this process.
  const server = await h.startServer('other');
  opened.push(() => h.closeServer(server));
  const reg = drover.register({ drover: d.admin, balancer: d.balancer, server, id: 'other', ttl: '2s', signals: false });
  opened.push(() => reg.close());
  await h.registered(reg);

  const loop = h.loadLoop(d, { path: '/pi?iterations=20000' });
  await h.sleep(500);
  const exited = new Promise((r) => ex.child.on('exit', (code, signal) => r({ code, signal })));
  ex.child.kill('SIGTERM');
  const { code, signal } = await exited;
  const exitedAt = Date.now();
  assert.equal(code, 0, `exit ${code ?? signal}; output:\n${ex.child.output}`);
  assert.match(ex.child.output, /left, (draining|removed)/);
  await h.waitFor('the example to leave the member list', async () => !(await h.member(d, ex.id)), 3000);
  await h.sleep(300);
  const results = await loop.stop();

  assert.deepEqual(results.filter((r) => r.status !== 200), [], 'no request failed');
  const pid = String(ex.child.pid);
  assert.ok(results.some((r) => r.server === pid), 'the example answered before SIGTERM');
  const later = results.filter((r) => r.started > exitedAt);
  assert.ok(later.length > 0);
  assert.ok(later.every((r) => r.server === 'other'), 'only the other member after the example left');
});
