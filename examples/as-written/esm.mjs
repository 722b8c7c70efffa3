// An ES module with top-level await before it listens, on a fixed port and host.
import http from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';

await sleep(10); // say, loading a config
const server = http.createServer((req, res) => {
  res.setHeader('content-type', 'application/json');
  res.end(JSON.stringify({ module: 'esm', pid: process.pid, url: req.url }) + '\n');
});
server.listen(8080, '127.0.0.1', () => console.log('esm server on 127.0.0.1:8080'));
