// Node's cluster module as the posts use it: the primary forks N copies of an app, whose
// listen(PORT) is shared through the primary (round-robin handoff of connections).
//
//   PORT=8000 node examples/seeds/cluster.js APP.js [N=cores]
'use strict';

const cluster = require('node:cluster');
const path = require('node:path');

const [app, n = require('node:os').availableParallelism()] = process.argv.slice(2);
if (cluster.isPrimary) {
  for (let i = 0; i < Number(n); i++) cluster.fork();
  cluster.on('exit', (w, code, signal) => {
    if (!signal && code !== 0) cluster.fork(); // a worker that crashed is replaced
  });
} else {
  require(path.resolve(app));
}
