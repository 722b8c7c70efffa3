// register() against a real `drover proxy` with no backends: joining, heartbeats past the
// TTL, draining on close(), joining again after drover forgot the member, the token,
// and riding out a drover that is not there yet.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const drover = require('..');
const h = require('../test-helpers/drover');

// Servers and registrations are closed first, then the drovers they talk to.
const opened = [];
const drovers = [];
after(async () => {
  for (const x of opened.reverse()) await x();
  for (const d of drovers) d.stop();
});

async function startDrover(opts) {
  const d = await h.startDrover(opts);
  drovers.push(d);
  return d;
}

/** A test server registered with `d`; both are cleaned up after the file's tests. */
async function joined(d, name, opts = {}) {
  const server = await h.startServer(name);
  opened.push(() => h.closeServer(server));
  const reg = drover.register({
    drover: d.admin,
    balancer: d.balancer,
    server,
    id: name,
    ttl: '2s',
    token: d.token,
    signals: false,
    ...opts,
  });
  opened.push(() => reg.close());
  const problems = [];
  reg.on('warning', (e) => problems.push(e));
  reg.on('error', (e) => problems.push(e));
  reg.problems = problems;
  return { server, reg };
}

test('a server joins: listed with its address, TTL, weight and meta, and gets requests', { timeout: 10_000 }, async () => {
  const d = await startDrover();
  const { server, reg } = await joined(d, 'a', { weight: 3, meta: { zone: 'test' } });
  const [m] = await h.nextEvent(reg, 'registered');
  assert.equal(m.id, 'a');
  assert.equal(await reg.ready, m);

  const listed = await h.member(d, 'a');
  assert.ok(listed, 'the member is listed');
  assert.equal(listed.address, `127.0.0.1:${server.address().port}`);
  assert.equal(listed.state, 'active');
  assert.equal(listed.weight, 3);
  assert.equal(listed.ttl_secs, 2);
  assert.deepEqual(listed.meta, { zone: 'test' });

  for (let i = 0; i < 5; i++) {
    const res = await h.request(`http://${d.listen}/`);
    assert.equal(res.status, 200);
    assert.equal(res.headers['x-server'], 'a');
  }
  assert.deepEqual(reg.problems, []);
});

test('the default id is hostname-pid-port, and a wildcard listener registers as 127.0.0.1', { timeout: 10_000 }, async () => {
  const d = await startDrover();
  const server = await h.startServer('w');
  // Listening on 0.0.0.0 instead: re-listen the same handler there.
  await h.closeServer(server);
  await new Promise((r) => server.listen(0, '0.0.0.0', r));
  opened.push(() => h.closeServer(server));
  const reg = drover.register({ drover: d.admin.replace('http://', ''), balancer: d.balancer, server, signals: false });
  opened.push(() => reg.close());
  const [m] = await h.nextEvent(reg, 'registered');
  const port = server.address().port;
  assert.equal(m.address, `127.0.0.1:${port}`);
  assert.match(m.id, new RegExp(`-${process.pid}-${port}$`));
  assert.equal(m.ttl_secs, 10, 'the default TTL is 10 s');
});

test('heartbeats keep a member past its TTL, carrying a load', { timeout: 10_000 }, async () => {
  const d = await startDrover();
  const { reg } = await joined(d, 'b');
  await h.registered(reg);
  let beats = 0;
  reg.on('heartbeat', () => beats++);
  // 2.5 TTLs: without heartbeats it would have lapsed twice.
  await h.sleep(5000);
  assert.ok(beats >= 5, `heartbeats every ttl/3, got ${beats} in 5 s`);
  const m = await h.member(d, 'b');
  assert.equal(m?.state, 'active', 'still a member after 2.5 TTLs');
  assert.ok(m.ttl_left_secs > 0.5, `ttl_left_secs ${m.ttl_left_secs}`);
  const res = await h.request(`http://${d.listen}/`);
  assert.equal(res.headers['x-server'], 'b');
  assert.deepEqual(reg.problems, []);
});

test('close() drains the member: it leaves, and requests go to the others without a failure', { timeout: 10_000 }, async () => {
  const d = await startDrover();
  const a = await joined(d, 'c1');
  const b = await joined(d, 'c2');
  await Promise.all([h.registered(a.reg), h.registered(b.reg)]);

  const loop = h.loadLoop(d);
  await h.sleep(500);
  const left = await a.reg.close();
  const closedAt = Date.now();
  assert.ok(['draining', 'removed'].includes(left.state), `state ${left.state}`);
  await h.waitFor('c1 to leave the member list', async () => !(await h.member(d, 'c1')), 3000);
  await h.sleep(500);
  const results = await loop.stop();

  const failed = results.filter((r) => r.status !== 200);
  assert.deepEqual(failed, [], 'no request failed');
  const before = results.filter((r) => r.started < closedAt - 100);
  assert.ok(before.some((r) => r.server === 'c1'), 'c1 had requests before it left');
  const afterClose = results.filter((r) => r.started > closedAt);
  assert.ok(afterClose.length > 0);
  assert.deepEqual([...new Set(afterClose.map((r) => r.server))], ['c2'], 'only c2 after c1 left');
  assert.equal(await h.member(d, 'c2').then((m) => m.state), 'active');
  // close() is idempotent.
  assert.equal(await a.reg.close(), left);
});

test('a member drover no longer knows (404 heartbeat) registers again', { timeout: 10_000 }, async () => {
  const d = await startDrover();
  const { reg } = await joined(d, 'r');
  await h.registered(reg);
  // Drained through the API with nothing in flight: removed at once, so the next
  // heartbeat is answered 404, as after a lapsed TTL or a restarted drover.
  const res = await h.api(d, 'DELETE', `/v1/balancers/${d.balancer}/members/r`);
  assert.equal(res.status, 200);
  assert.equal(res.json.state, 'removed');
  assert.equal(await h.member(d, 'r'), undefined);

  const [m, { created }] = await h.nextEvent(reg, 'registered', 3000);
  assert.equal(m.id, 'r');
  assert.equal(created, true, 'drover had forgotten it');
  assert.equal((await h.member(d, 'r'))?.state, 'active');
  assert.ok(reg.problems.some((e) => /404/.test(e.message)), 'the 404 is reported as a warning');
});

test('the token is sent when given; a wrong one is an error event, not an exception', { timeout: 10_000 }, async () => {
  const d = await startDrover({ token: 'sekrit-token' });
  const good = await joined(d, 't1');
  await h.registered(good.reg);
  assert.equal((await h.member(d, 't1'))?.state, 'active');
  await h.nextEvent(good.reg, 'heartbeat');

  const server = await h.startServer('t2');
  opened.push(() => h.closeServer(server));
  const bad = drover.register({ drover: d.admin, balancer: d.balancer, server, id: 't2', token: 'wrong', signals: false });
  opened.push(() => bad.close());
  const [err] = await h.nextEvent(bad, 'error');
  assert.equal(err.status, 401, err.message);
  assert.equal(await h.member(d, 't2'), undefined);
  assert.deepEqual(good.reg.problems, []);
});

test('drover not there yet: warnings and back-off, then it joins once drover starts', { timeout: 10_000 }, async () => {
  const port = await h.freePort();
  const server = await h.startServer('late');
  opened.push(() => h.closeServer(server));
  const reg = drover.register({ drover: `127.0.0.1:${port}`, balancer: 'default', server, id: 'late', signals: false });
  opened.push(() => reg.close());
  const [warning] = await h.nextEvent(reg, 'warning');
  assert.match(warning.message, /unreachable/);

  const d = await startDrover({ admin: `127.0.0.1:${port}` });
  assert.equal(d.balancer, 'default');
  await h.registered(reg, 6000); // the back-off is at most 10 s, and 2 s by now
  assert.equal((await h.member(d, 'late'))?.state, 'active');
});

test('under drover run (DROVER_WORKER_ID) register() asks nothing of any drover', { timeout: 10_000 }, async () => {
  const port = await h.freePort(); // nothing listens: any request would warn
  const server = await h.startServer('worker');
  opened.push(() => h.closeServer(server));
  process.env.DROVER_WORKER_ID = '1';
  let reg;
  try {
    reg = drover.register({ drover: `127.0.0.1:${port}`, balancer: 'default', server, signals: false });
  } finally {
    delete process.env.DROVER_WORKER_ID;
  }
  const problems = [];
  reg.on('warning', (e) => problems.push(e));
  reg.on('error', (e) => problems.push(e));
  assert.equal(reg.supervised, true);
  assert.equal(await reg.ready, null);
  await h.sleep(500);
  assert.deepEqual(problems, []);
  assert.equal(await reg.close(), null);
});

test('options that cannot work are refused at once', () => {
  const server = require('node:http').createServer();
  assert.throws(() => drover.register({ drover: '127.0.0.1:1', balancer: 'x' }), /server/);
  assert.throws(() => drover.register({ drover: '127.0.0.1:1', server, signals: false, balancer: '' }), /balancer/);
  assert.throws(() => drover.register({ balancer: 'x', server, drover: '' }), /drover/);
  assert.throws(() => drover.register({ drover: '127.0.0.1:1', balancer: 'x', server, ttl: 'soon' }), /ttl/);
});
