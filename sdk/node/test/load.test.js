// loadReporter(): the `endpoint-load-metrics` header on every response, as a wrapper and
// as Express-style middleware; drover reads it and strips it. And the small parsers.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const drover = require('..');
const h = require('../test-helpers/drover');

const opened = [];
after(async () => {
  for (const x of opened.reverse()) await x();
});

/** The elu value of a header, checked for ORCA's text format and 3 decimals. */
function elu(header) {
  assert.ok(header, 'the endpoint-load-metrics header is present');
  const m = /^TEXT named_metrics\.elu=(\d\.\d{3})$/.exec(header);
  assert.ok(m, `header ${JSON.stringify(header)}`);
  const x = Number(m[1]);
  assert.ok(x >= 0 && x <= 1, `elu ${x} in 0..1`);
  return x;
}

/** Keeps the event loop busy for `ms` (the load the header must see). */
function spin(ms) {
  const end = Date.now() + ms;
  while (Date.now() < end);
}

test('as a handler wrapper: every response carries the load, which rises with work', { timeout: 10_000 }, async () => {
  const server = await h.startServer('wrapped', drover.loadReporter);
  opened.push(() => h.closeServer(server));
  const url = `http://127.0.0.1:${server.address().port}/`;
  const first = await h.request(url);
  assert.equal(first.status, 200);
  assert.equal(first.body, 'wrapped');
  elu(first.headers['endpoint-load-metrics']);

  // A window (>= 100 ms) spent almost all busy reads close to 1.
  await h.sleep(120);
  spin(300);
  const busy = elu((await h.request(url)).headers['endpoint-load-metrics']);
  assert.ok(busy >= 0.5, `after 300 ms of spinning elu is ${busy}`);

  // Then a quiet window reads low.
  await h.request(url);
  await h.sleep(300);
  const quiet = elu((await h.request(url)).headers['endpoint-load-metrics']);
  assert.ok(quiet < 0.5, `after 300 ms idle elu is ${quiet}`);
});

test('as Express-style middleware (req, res, next), the app\'s own headers kept', { timeout: 10_000 }, async () => {
  const mw = drover.loadReporter();
  const server = http.createServer((req, res) => {
    mw(req, res, () => {
      res.writeHead(201, { 'x-app': 'yes' });
      res.end('made');
    });
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  opened.push(() => h.closeServer(server));
  const res = await h.request(`http://127.0.0.1:${server.address().port}/`);
  assert.equal(res.status, 201);
  assert.equal(res.headers['x-app'], 'yes');
  elu(res.headers['endpoint-load-metrics']);
});

test('drover strips the header before the client sees it', { timeout: 10_000 }, async () => {
  const d = await h.startDrover();
  opened.push(async () => d.stop());
  const server = await h.startServer('behind', drover.loadReporter);
  opened.push(() => h.closeServer(server));
  const reg = drover.register({ drover: d.admin, balancer: d.balancer, server, id: 'behind', ttl: '2s', signals: false });
  opened.push(() => reg.close());
  await h.registered(reg);
  const direct = await h.request(`http://127.0.0.1:${server.address().port}/`);
  elu(direct.headers['endpoint-load-metrics']);
  const through = await h.request(`http://${d.listen}/`);
  assert.equal(through.status, 200);
  assert.equal(through.headers['x-server'], 'behind');
  assert.equal(through.headers['endpoint-load-metrics'], undefined);
});

test('loadMetrics formats and bounds a utilisation', () => {
  assert.equal(drover.loadMetrics(0.42), 'TEXT named_metrics.elu=0.420');
  assert.equal(drover.loadMetrics(1.7), 'TEXT named_metrics.elu=1.000');
  assert.equal(drover.loadMetrics(-1), 'TEXT named_metrics.elu=0.000');
  assert.equal(drover.loadMetrics(NaN), 'TEXT named_metrics.elu=0.000');
  assert.throws(() => drover.loadReporter('nope'), TypeError);
});

test('durations, member addresses and admin addresses parse', () => {
  const { parseDuration, formatDuration, memberAddress, parseAdmin } = drover._internal;
  assert.equal(parseDuration('10s'), 10_000);
  assert.equal(parseDuration('500ms'), 500);
  assert.equal(parseDuration('1.5s'), 1500);
  assert.equal(parseDuration('2m'), 120_000);
  assert.equal(parseDuration(3), 3000);
  assert.throws(() => parseDuration('10'), TypeError);
  assert.throws(() => parseDuration(-1), TypeError);
  assert.equal(formatDuration(10_000), '10s');
  assert.equal(formatDuration(1500), '1500ms');

  assert.equal(memberAddress({ address: '0.0.0.0', port: 80 }), '127.0.0.1:80');
  assert.equal(memberAddress({ address: '::', port: 80 }), '127.0.0.1:80');
  assert.equal(memberAddress({ address: '10.0.0.2', port: 80 }), '10.0.0.2:80');
  assert.equal(memberAddress({ address: '::1', port: 80 }), '[::1]:80');
  assert.equal(memberAddress({ address: '0.0.0.0', port: 80 }, '10.1.2.3'), '10.1.2.3:80');
  assert.equal(memberAddress({ address: '0.0.0.0', port: 80 }, 'app.internal:8080'), 'app.internal:8080');
  assert.equal(memberAddress({ address: '0.0.0.0', port: 80 }, '[fd00::1]:81'), '[fd00::1]:81');
  assert.equal(memberAddress({ address: '0.0.0.0', port: 80 }, 'fd00::1'), '[fd00::1]:80');
  assert.equal(memberAddress('/tmp/sock'), null);
  assert.equal(memberAddress('/tmp/sock', 'h:1'), 'h:1');

  assert.equal(parseAdmin('127.0.0.1:9900').port, '9900');
  assert.equal(parseAdmin('http://[::1]:9900/').hostname, '::1');
  assert.equal(parseAdmin('https://drover.internal/admin/').base, '/admin');
  assert.throws(() => parseAdmin('ftp://x'), TypeError);
});
