'use strict';
// drover's preload for apps started by a package manager (`npm start`, `yarn start`,
// `pnpm start`): npm is itself a Node process, and Node takes NODE_CHANNEL_FD in the
// first process that starts, so drover passes the channel under its own names and this
// file, loaded into every Node process below the package manager by NODE_OPTIONS,
// makes the app's process the cluster worker, exactly as NODE_CHANNEL_FD and
// NODE_UNIQUE_ID would have. Nothing else of the app is touched.
const script = process.argv[1] || '';
const runner =
  /[\\/](npm|npx|yarn|yarnpkg|pnpm|pnpx|corepack)(-cli)?(\.[cm]?js)?$/.test(script) ||
  /[\\/]node_modules[\\/](npm|yarn|pnpm|corepack)[\\/]/.test(script);
const fd = Number(process.env.DROVER_NODE_CHANNEL_FD);
if (script && !runner && Number.isInteger(fd) && fd >= 0) {
  const id = process.env.DROVER_NODE_UNIQUE_ID;
  // Gone before the app's code runs: what it starts in turn is not drover's worker.
  delete process.env.DROVER_NODE_CHANNEL_FD;
  delete process.env.DROVER_NODE_UNIQUE_ID;
  process.env.NODE_UNIQUE_ID = id;
  // What Node's own start-up does with NODE_CHANNEL_FD and NODE_UNIQUE_ID
  // (lib/internal/process/pre_execution.js), in the same order.
  require('child_process')._forkChild(fd, 'json');
  require('cluster')._setupWorker();
  delete process.env.NODE_UNIQUE_ID;
}
