// A Node app that needs its database, stood in for by a file (DEP_FILE): it exits at
// start without it ("connect ECONNREFUSED"), and exits when it goes away, as an app
// whose database client errors out does. Each start appends a line to STARTS_FILE.
// For bench/dependency.sh.
'use strict';
const fs = require('fs');
const dep = process.env.DEP_FILE;
if (process.env.STARTS_FILE) fs.appendFileSync(process.env.STARTS_FILE, `${process.pid}\n`);
if (!fs.existsSync(dep)) {
  console.error(`connect ECONNREFUSED (no ${dep})`);
  process.exit(1);
}
setInterval(() => {
  if (!fs.existsSync(dep)) {
    console.error('database connection lost');
    process.exit(1);
  }
}, 50);
require('http')
  .createServer((req, res) => res.end('ok ' + process.pid))
  .listen(process.env.PORT || 3000);
