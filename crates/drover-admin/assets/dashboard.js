// drover's live dashboard. Plain JS, no build step; served by the admin listener with
// uPlot beside it, and talks to nothing else.
//
// The stream is read with fetch() and a ReadableStream reader, not EventSource: an
// EventSource cannot send the Authorization header, and the token must not go into a
// URL. Frames are parsed here (event:/data: lines, a blank line ends one).
'use strict';

const KEY = 'drover-admin-token';
const POINTS = 600;
const $ = (id) => document.getElementById(id);
const el = (tag, props, ...kids) => {
  const e = document.createElement(tag);
  Object.assign(e, props || {});
  for (const k of kids) e.append(k);
  return e;
};

let token = sessionStorage.getItem(KEY) || '';
// Actions are offered once the stream was let in: no token set, or the right one given.
let canAct = false;
// Per balancer: its uPlot charts and their columns.
const charts = new Map();
let events = [];
// Last CPU reading per app/worker/pid, for a CPU % from two samples.
const cpuSeen = new Map();
// Runtime members (drainable) per balancer: address -> id.
const runtime = new Map();

function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (token) h.Authorization = 'Bearer ' + token;
  return h;
}

function say(text, bad) {
  const r = $('result');
  r.textContent = text;
  r.style.color = bad ? '#ff8a65' : '#c5e1a5';
}

function conn(text, ok) {
  const c = $('conn');
  c.textContent = text;
  c.className = 'conn ' + (ok ? 'ok' : 'bad');
}

function askToken(why) {
  canAct = false;
  $('login-why').textContent = why;
  $('login').hidden = false;
  $('token').focus();
}

$('login').addEventListener('submit', (e) => {
  e.preventDefault();
  token = $('token').value.trim();
  sessionStorage.setItem(KEY, token);
  $('login').hidden = true;
  connect();
});

let generation = 0;
async function connect() {
  const mine = ++generation;
  conn('connecting…', false);
  let resp;
  try {
    resp = await fetch('/v1/events', { headers: headers(), cache: 'no-store' });
  } catch (e) {
    return retry(mine, 'cannot reach the admin API: ' + e.message);
  }
  if (resp.status === 401) {
    sessionStorage.removeItem(KEY);
    conn('401 unauthorized', false);
    askToken(token
      ? 'The token was refused (401). Enter the admin token:'
      : 'This admin API needs a token (401). Enter it:');
    token = '';
    return;
  }
  if (!resp.ok) return retry(mine, 'the event stream answered ' + resp.status);
  canAct = true;
  conn('live', true);
  const reader = resp.body.getReader();
  const text = new TextDecoder();
  let buf = '';
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done || mine !== generation) break;
      buf += text.decode(value, { stream: true });
      let end;
      while ((end = buf.indexOf('\n\n')) >= 0) {
        frame(buf.slice(0, end));
        buf = buf.slice(end + 2);
      }
    }
  } catch (e) {
    return retry(mine, 'stream broken: ' + e.message);
  }
  retry(mine, 'stream ended');
}

function retry(mine, why) {
  if (mine !== generation) return;
  conn(why + '; retrying…', false);
  setTimeout(() => { if (mine === generation) connect(); }, 2000);
}

function frame(raw) {
  let name = 'message';
  const data = [];
  for (const line of raw.split('\n')) {
    if (line.startsWith(':')) continue;
    const at = line.indexOf(':');
    const field = at < 0 ? line : line.slice(0, at);
    const value = at < 0 ? '' : line.slice(at + 1).replace(/^ /, '');
    if (field === 'event') name = value;
    else if (field === 'data') data.push(value);
  }
  if (!data.length) return;
  const msg = JSON.parse(data.join('\n'));
  if (name === 'history') history(msg);
  else if (name === 'sample') sample(msg);
  else if (name === 'event') addEvents([msg]);
}

function history(h) {
  for (const s of h.series) {
    const c = chartsFor(s.balancer);
    c.cols = [s.t, s.rps, s.eps, s.derr, s.p50, s.p99];
    redraw(c);
  }
  events = [];
  $('events').replaceChildren();
  addEvents(h.events);
}

function sample(s) {
  const names = new Set();
  for (const b of s.balancers) {
    names.add(b.name);
    const c = chartsFor(b.name, b);
    const p = b.point;
    const t = c.cols[0];
    if (p && (!t.length || p.t > t[t.length - 1])) {
      const row = [p.t, p.rps, p.eps, p.derr, p.p50, p.p99];
      row.forEach((v, i) => c.cols[i].push(v));
      if (t.length > POINTS) c.cols.forEach((col) => col.splice(0, col.length - POINTS));
      redraw(c);
    }
    balancerInfo(c, b);
    certWarnings(c, b);
    endpointTable(c, b);
  }
  for (const [name, c] of charts) {
    if (!names.has(name)) { c.box.remove(); charts.delete(name); }
  }
  appTables(Array.isArray(s.apps) ? s.apps : []);
  addEvents(s.events);
}

// ---- charts -------------------------------------------------------------------------

const COLORS = { ejection: '#ef6c00', restart: '#c62828', replace: '#1565c0', reload: '#1565c0', scale: '#6a1b9a' };

// Draws a dashed vertical line at each event about this balancer or its app.
function markers(c) {
  return {
    hooks: {
      draw: [(u) => {
        const ctx = u.ctx;
        ctx.save();
        ctx.lineWidth = 1.5;
        ctx.setLineDash([4, 3]);
        for (const e of events) {
          if (!relevant(c, e) || e.t < u.scales.x.min || e.t > u.scales.x.max) continue;
          const x = Math.round(u.valToPos(e.t, 'x', true));
          ctx.strokeStyle = COLORS[e.kind] || '#666';
          ctx.beginPath();
          ctx.moveTo(x, u.bbox.top);
          ctx.lineTo(x, u.bbox.top + u.bbox.height);
          ctx.stroke();
        }
        ctx.restore();
      }],
    },
  };
}

function relevant(c, e) {
  return e.subject === c.name || e.subject === '' || (c.app && e.subject === c.app);
}

function chartsFor(name) {
  let c = charts.get(name);
  if (c) return c;
  c = { name, app: null, cols: [[], [], [], [], [], []], plots: [] };
  c.box = el('section', { className: 'box balancer' });
  c.box.dataset.balancer = name;
  c.title = el('h2', { textContent: 'balancer ' + name });
  c.info = el('div', { className: 'meta' });
  c.certs = el('div', { className: 'cert-warnings', hidden: true });
  c.certs.setAttribute('role', 'alert');
  const row = el('div', { className: 'charts' });
  c.table = el('table', {}, el('thead'), el('tbody'));
  c.box.append(c.title, c.info, c.certs, row, c.table);
  $('balancers').append(c.box);
  const make = (title, series, pick, unit) => {
    const div = el('div');
    row.append(div);
    const plot = new uPlot({
      title, width: 400, height: 190,
      scales: { x: { time: true } },
      series: [{}].concat(series.map(([label, stroke]) => ({
        label, stroke, width: 1.5, spanGaps: false,
        value: (u, v) => (v == null ? '-' : v.toFixed(v < 10 ? 2 : 0) + unit),
      }))),
      axes: [{}, { size: 55 }],
      plugins: [markers(c)],
    }, [[]].concat(series.map(() => [])), div);
    c.plots.push({ plot, pick });
  };
  make('requests/s', [['req/s', '#1565c0']], [1], '');
  make('errors/s', [['5xx/s', '#c62828'], ['drover errors/s', '#ef6c00']], [2, 3], '');
  make('latency (ms)', [['p50', '#2e7d32'], ['p99', '#6a1b9a']], [4, 5], ' ms');
  charts.set(name, c);
  refreshMembers(name);
  return c;
}

function redraw(c) {
  for (const { plot, pick } of c.plots) {
    plot.setData([c.cols[0]].concat(pick.map((i) => c.cols[i])));
  }
}

function balancerInfo(c, b) {
  c.app = b.app;
  const parts = [
    b.listen === '-' ? 'no listener: what routes send it' : b.listen && 'on ' + b.listen,
    b.strategy,
    b.app && 'app ' + b.app,
    'queue ' + b.queue_depth,
    'connections ' + b.connections,
    'requests ' + b.requests,
    'retries ' + b.retries,
    (b.routes || []).length && 'routes: ' + b.routes.join('; '),
  ].filter(Boolean);
  c.info.textContent = parts.join(' · ');
}

// The certificates due for renewal: within 14 days of their notAfter, or past it (the
// sampler picks them, by the same rule as the log's warning).
function certWarnings(c, b) {
  const lines = (b.expiring_certificates || []).map((k) => {
    const date = new Date(k.not_after * 1000).toISOString().slice(0, 10);
    const days = Math.round(Math.abs(k.days_left));
    const span = days + (days === 1 ? ' day' : ' days');
    const expired = k.days_left < 0;
    const text = expired
      ? 'TLS certificate ' + k.cert + ' expired on ' + date + ' (' + span + ' ago): renew it'
      : 'TLS certificate ' + k.cert + ' expires on ' + date + ' (in ' + span + '): renew it';
    return { text, expired, cert: k.cert };
  });
  // Rebuilt only when the text changes: an alert is announced again at each change.
  const shown = lines.map((l) => l.text).join('\n');
  if (c.certs.dataset.shown === shown) return;
  c.certs.dataset.shown = shown;
  c.certs.replaceChildren(...lines.map((l) => {
    const p = el('p', { className: 'cert-warning' + (l.expired ? ' expired' : ''), textContent: '\u26a0 ' + l.text });
    p.dataset.cert = l.cert;
    return p;
  }));
  c.certs.hidden = !lines.length;
}

// ---- tables -------------------------------------------------------------------------

function head(table, names) {
  const thead = table.tHead;
  const want = names.join('|');
  if (thead.dataset.cols === want) return;
  thead.dataset.cols = want;
  thead.replaceChildren(el('tr', {}, ...names.map((n) => el('th', { textContent: n }))));
}

// Updates rows in place, keyed, so a button under the pointer survives the next sample.
function rows(tbody, items, keyOf, fill) {
  const old = new Map([...tbody.children].map((tr) => [tr.dataset.key, tr]));
  let before = tbody.firstChild;
  for (const it of items) {
    const key = String(keyOf(it));
    let tr = old.get(key);
    old.delete(key);
    if (!tr) { tr = el('tr'); tr.dataset.key = key; }
    fill(tr, it);
    if (tr !== before) tbody.insertBefore(tr, before);
    before = tr.nextSibling;
  }
  for (const tr of old.values()) tr.remove();
}

// cells: text, or {t, c: class, k: key class}, or {node}.
function cells(tr, list) {
  while (tr.children.length < list.length) tr.append(el('td'));
  while (tr.children.length > list.length) tr.lastChild.remove();
  list.forEach((v, i) => {
    const td = tr.children[i];
    const cell = v !== null && typeof v === 'object' ? v : { t: v };
    if (cell.node !== undefined) {
      if (td.firstChild !== cell.node) td.replaceChildren(cell.node || '');
    } else {
      const t = cell.t == null ? '-' : String(cell.t);
      if (td.textContent !== t) td.textContent = t;
    }
    const cls = [cell.k, cell.c].filter(Boolean).join(' ');
    if (td.className !== cls) td.className = cls;
  });
}

const ms = (v) => (v == null ? '-' : v < 10 ? v.toFixed(2) : v.toFixed(0));
// The limit in force and why: a learned limit holds only while the backend is
// saturated, and counts requests awaiting their response head, not streams.
const limitText = (e) =>
  e.limit_reason === 'saturated'
    ? e.limit + (e.waiting ? ' (saturated, ' + e.waiting + ' waiting)' : ' (saturated)')
    : e.limit_reason === 'not-saturated' ? '- (not saturated)'
      : e.limit_reason === 'mostly-waits' ? '- (requests wait)'
      : e.limit_reason === 'serves-clients' ? '- (handed connections)'
      : e.limit_reason === 'probation' ? e.limit + ' (checks get no answer)'
      : e.limit ? String(e.limit) : '-';

function endpointTable(c, b) {
  head(c.table, ['endpoint', 'state', 'in-flight / limit', 'queue', 'p99 ms (1 min)',
    '5xx', 'failures', 'ejections', 'health check', 'weight', '']);
  const drainable = runtime.get(b.name) || new Map();
  rows(c.table.tBodies[0], b.endpoints, (e) => e.address, (tr, e) => {
    tr.dataset.endpoint = e.address;
    const id = drainable.get(e.address);
    if (id && canAct) {
      if (!tr._drain || tr._drain.dataset.id !== id) {
        tr._drain = el('button', { textContent: 'drain' });
        tr._drain.dataset.id = id;
        tr._drain.addEventListener('click', () => act(
          'Drain member ' + id + ' (' + e.address + ') of ' + b.name + '?',
          'DELETE', '/v1/balancers/' + encodeURIComponent(b.name) + '/members/' + encodeURIComponent(id)));
      }
    } else {
      tr._drain = null;
    }
    cells(tr, [
      e.address,
      { t: e.state, c: 'st-' + e.state, k: 'state' },
      e.in_flight + ' / ' + limitText(e),
      b.queue_depth,
      ms(e.p99_ms),
      e.responses_5xx,
      e.failures,
      { t: e.ejections, k: 'ejections' },
      { t: e.check, c: e.check && 'st-' + e.check },
      e.weight,
      { node: tr._drain },
    ]);
  });
}

const human = {
  secs(s) {
    if (s == null) return '-';
    s = Math.max(0, Math.floor(s));
    if (s < 60) return s + 's';
    if (s < 3600) return Math.floor(s / 60) + 'm' + (s % 60) + 's';
    return Math.floor(s / 3600) + 'h' + Math.floor((s % 3600) / 60) + 'm';
  },
  bytes(b) {
    if (b == null) return '-';
    const u = ['B', 'KiB', 'MiB', 'GiB'];
    let i = 0;
    while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
    return (i ? b.toFixed(1) : b) + ' ' + u[i];
  },
};

const apps = new Map();

function appTables(list) {
  const names = new Set();
  const now = performance.now() / 1000;
  for (const a of list) {
    names.add(a.name);
    let box = apps.get(a.name);
    if (!box) box = appBox(a.name);
    box.meta.textContent = a.mode + ' mode · ' + a.workers.length + ' workers · ' +
      (a.command || []).join(' ');
    box.actions.hidden = !canAct;
    const has = (f) => a.workers.some((w) => w[f] !== undefined && w[f] !== null);
    const cpu = has('cpu_seconds');
    const reason = has('last_restart_reason');
    // Connections handed to the workers (auto, handoff): their requests are not in-flight.
    const clients = has('clients');
    head(box.table, ['worker', 'pid', 'port', 'state', 'uptime', 'restarts', 'RSS']
      .concat(cpu ? ['CPU'] : [], ['in-flight'], clients ? ['clients'] : [], ['last exit'],
        reason ? ['last restart'] : []));
    rows(box.table.tBodies[0], a.workers, (w) => w.id, (tr, w) => {
      tr.dataset.app = a.name;
      tr.dataset.worker = w.id;
      tr.dataset.pid = w.pid == null ? '' : w.pid;
      tr.dataset.restarts = w.restarts;
      const list = [w.id, { t: w.pid, k: 'pid' }, w.port, { t: w.state, c: 'st-' + w.state, k: 'state' },
        human.secs(w.uptime_secs), { t: w.restarts, k: 'restarts' }, human.bytes(w.rss_bytes)];
      if (cpu) list.push(cpuText(a.name, w, now));
      list.push(w.in_flight);
      if (clients) list.push(w.clients);
      list.push(w.last_exit);
      if (reason) list.push(w.last_restart_reason);
      cells(tr, list);
    });
    restartLog(box, a.restarts);
  }
  for (const [name, box] of apps) {
    if (!names.has(name)) { box.box.remove(); apps.delete(name); }
  }
}

// CPU time used, and its rate over the last two samples of the same process.
function cpuText(app, w, now) {
  if (w.cpu_seconds == null) return '-';
  const key = app + '/' + w.id;
  const seen = cpuSeen.get(key);
  cpuSeen.set(key, { pid: w.pid, cpu: w.cpu_seconds, at: now, pct: seen && seen.pid === w.pid ? seen.pct : null });
  let pct = seen && seen.pid === w.pid ? seen.pct : null;
  if (seen && seen.pid === w.pid && now > seen.at) {
    pct = (100 * (w.cpu_seconds - seen.cpu)) / (now - seen.at);
    cpuSeen.get(key).pct = pct;
  }
  return w.cpu_seconds.toFixed(1) + ' s' + (pct == null ? '' : ' (' + pct.toFixed(0) + '%)');
}

// The app's restart records (when the status carries them), newest first.
function restartLog(box, list) {
  if (!Array.isArray(list) || !list.length) { box.log.hidden = true; return; }
  box.log.hidden = false;
  const items = list.slice(-8).reverse().map((r) => {
    const how = r.signal_name || (r.exit_code != null ? 'exit ' + r.exit_code : '');
    return [r.time || '', 'worker ' + r.worker, r.pid != null ? 'pid ' + r.pid : '', r.reason, how, r.detail || '']
      .filter(Boolean).join('  ');
  });
  const want = items.join('\n');
  if (box.log.dataset.text === want) return;
  box.log.dataset.text = want;
  box.log.replaceChildren(el('summary', { textContent: 'recent restarts (' + list.length + ')' }),
    ...items.map((t) => el('div', { textContent: t })));
}

function appBox(name) {
  const box = { box: el('section', { className: 'box app' }) };
  box.box.dataset.app = name;
  box.meta = el('span', { className: 'meta' });
  const scaleTo = el('input', { type: 'number', min: '0', step: '1', title: 'workers' });
  const q = '?app=' + encodeURIComponent(name);
  const reload = el('button', { textContent: 'reload' });
  reload.addEventListener('click', () => act('Rolling reload of every worker of ' + name + '?',
    'POST', '/v1/reload' + q));
  const scale = el('button', { textContent: 'scale' });
  scale.addEventListener('click', () => {
    const n = scaleTo.value.trim();
    if (!/^\d+$/.test(n)) { say('scale: enter a whole number of workers', true); return; }
    act('Run ' + n + ' workers of ' + name + '?', 'POST', '/v1/scale' + q + '&workers=' + n);
  });
  box.actions = el('div', { className: 'actions' }, reload, el('span', { textContent: 'workers:' }), scaleTo, scale);
  box.table = el('table', {}, el('thead'), el('tbody'));
  box.log = el('details', { hidden: true });
  box.box.append(el('h2', {}, 'app ' + name + ' ', box.meta), box.actions, box.table, box.log);
  $('apps').append(box.box);
  apps.set(name, box);
  return box;
}

// ---- events -------------------------------------------------------------------------

function addEvents(list) {
  if (!list || !list.length) return;
  const ol = $('events');
  for (const e of list) {
    events.push(e);
    const when = new Date(e.t * 1000).toLocaleTimeString();
    const li = el('li', { className: 'ev-' + e.kind,
      textContent: when + '  ' + e.kind + '  ' + (e.subject ? e.subject + ': ' : '') + e.text });
    li.dataset.kind = e.kind;
    ol.prepend(li);
  }
  if (events.length > 200) events = events.slice(-200);
  while (ol.children.length > 200) ol.lastChild.remove();
  for (const c of charts.values()) redraw(c);
}

// ---- actions ------------------------------------------------------------------------

async function act(question, method, path) {
  if (!canAct || !confirm(question)) return;
  say(method + ' ' + path + ' …', false);
  try {
    const r = await fetch(path, { method, headers: headers() });
    const body = await r.json().catch(() => ({}));
    if (r.status === 401) { askToken('The token was refused (401).'); }
    const what = body.result || body.error || (body.id ? body.id + ' ' + body.state : r.statusText);
    say(r.status + ': ' + what, !r.ok);
  } catch (e) {
    say('failed: ' + e.message, true);
  }
}

// Which endpoints are runtime members (the only ones a drain applies to): when a
// balancer appears, then every 5 s.
async function refreshMembers(name) {
  if (!canAct) return;
  try {
    const r = await fetch('/v1/balancers/' + encodeURIComponent(name) + '/members', { headers: headers() });
    if (!r.ok) { runtime.delete(name); return; }
    const list = await r.json();
    runtime.set(name, new Map(list.members
      .filter((m) => (m.source === 'admin' || m.source === 'etcd') && m.state === 'active')
      .map((m) => [m.addr, m.id])));
  } catch (e) {
    runtime.delete(name);
  }
}

async function members() {
  for (const name of charts.keys()) await refreshMembers(name);
  setTimeout(members, 5000);
}

connect();
members();
