// A Node app that leaks: every request keeps LEAK_KIB KiB (default 256) for as long as
// the process lives, as a cache that is never evicted does. For bench/memory-turns.sh.
const kib = Number(process.env.LEAK_KIB || 256);
const kept = [];
require('http')
  .createServer((req, res) => {
    kept.push(Buffer.alloc(kib * 1024, 1));
    res.end('ok ' + process.pid);
  })
  .listen(process.env.PORT || 3000);
