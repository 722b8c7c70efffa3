// PM2 in cluster mode, as people run it: `pm2 start examples/pi-server.js -i N` written
// down, so bench/cluster.sh can start it with a port of its choosing. PM2's God daemon
// is the cluster primary: it accepts connections and hands them to the instances
// round-robin (Node's cluster module underneath).
//
//   PORT=8000 WORKERS=2 PM2_HOME=/tmp/x pm2 start bench/pm2/ecosystem.config.js
//
// Everything else stays at PM2's defaults (autorestart on, its @pm2/io probes in each
// instance), because those are what a PM2 user gets.
'use strict';
const path = require('node:path');

module.exports = {
  apps: [
    {
      name: 'pi',
      script: path.join(__dirname, '..', '..', 'examples', 'pi-server.js'),
      exec_mode: 'cluster',
      instances: Number(process.env.WORKERS || 0), // 0: one per core
      env: { PORT: process.env.PORT || '3000' },
    },
  ],
};
