// The first post's pi server as it was written: the port comes from argv, with a
// default. Runs unchanged under `drover run -w 3 -- node argv-port.js [PORT]`: drover
// answers each worker's listen() whatever port it names (see README.md beside this).
const http = require('http');
const url = require('url');

const port = process.argv[2] || 8000;

function estimatePi(points) {
  let inside = 0;
  for (let i = 0; i < points; i++) {
    const x = Math.random();
    const y = Math.random();
    if (x * x + y * y <= 1) inside++;
  }
  return (4 * inside) / points;
}

http
  .createServer((req, res) => {
    const points = Number(url.parse(req.url, true).query.points) || 1e5;
    res.writeHead(200, { 'Content-Type': 'text/plain' });
    res.end(`pi is about ${estimatePi(points)} (pid ${process.pid})\n`);
  })
  .listen(port);
console.log(`Server running at http://127.0.0.1:${port}/`);
