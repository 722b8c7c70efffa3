#!/usr/bin/env node
// The app of bench/deploy.sh, written as apps are: it reads PORT (3000 without it),
// handles no signal, and does its start-up work before it listens, as a real app
// requires its modules, reads its config and warms its caches. No dependencies.
//
//   GET /work?ms=N   N ms of CPU time (at most 1000), then 200 JSON {pid}
//   GET /            the same with ms=1
//   GET /events      an event stream: one event a second, until the client leaves
//
// STARTUP_MS (default 300): CPU time spent before listen().
'use strict';

const http = require('node:http');

const PORT = Number(process.env.PORT || 3000);
const STARTUP_MS = Number(process.env.STARTUP_MS || 300);

function burn(ms) {
  const until = process.cpuUsage();
  const end = (until.user + until.system) / 1000 + ms;
  for (;;) {
    const now = process.cpuUsage();
    if ((now.user + now.system) / 1000 >= end) return;
  }
}

burn(STARTUP_MS);

http
  .createServer((req, res) => {
    const url = new URL(req.url, 'http://x');
    if (url.pathname === '/events') {
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
      res.write(`data: ${process.pid} 0\n\n`);
      let n = 0;
      const timer = setInterval(() => res.write(`data: ${process.pid} ${++n}\n\n`), 1000);
      return req.on('close', () => clearInterval(timer));
    }
    const ms = Math.min(Number(url.searchParams.get('ms') || 1), 1000);
    burn(ms);
    const body = JSON.stringify({ pid: process.pid }) + '\n';
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
    res.end(body);
  })
  .listen(PORT);
