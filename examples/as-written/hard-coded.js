// The fourth post's server1.js as it was written: a port fixed in the code.
const http = require('http');

http
  .createServer((req, res) => {
    res.writeHead(200, { 'Content-Type': 'text/plain' });
    res.end(`Hello from server1 (pid ${process.pid})\n`);
  })
  .listen(3000, () => console.log('server1 listening on port 3000'));
