'use strict';
// drover's preload, loaded into a worker's Node processes by NODE_OPTIONS. Its jobs:
//
// 1. Apps started by a package manager (`npm start`, `yarn start`, `pnpm start`) or by
//    tsx (`tsx app.ts`, which runs the app in a child Node with its loader): npm and tsx
//    are Node processes themselves, and Node takes NODE_CHANNEL_FD in the first process
//    that starts, so drover passes the channel under its own names and this file makes
//    the app's process the cluster worker, exactly as NODE_CHANNEL_FD and NODE_UNIQUE_ID
//    would have.
// 2. In a cluster worker of drover's, give client connections back when drover retires
//    the worker (a reload, a scale-down): each HTTP connection drover handed to it goes
//    back over the channel between two requests, and drover serves it from then on.
//    Without this the worker's server closes them as it stops, and a request sent on
//    one at that moment fails. drover also takes them back from a worker that stays
//    (`reclaim`): it hands a connection to a worker of its own while the app has more
//    workers than client connections, and places each request again once it has not.
//    For that it must know how many client connections each worker serves: this says
//    so (`clients`) whenever the number changes, at most once per turn of the loop.
//    Only the servers on the app's first port count: drover balances that one; a port
//    the app listens on after it (a metrics server's) its workers share as under Node's
//    cluster module, and its connections stay where they are.
//
// 3. drover stops a worker with SIGTERM, as Docker, systemd and Kubernetes do; PM2 stops
//    it with SIGINT, and apps written for PM2 shut down gracefully on SIGINT only
//    (`process.on('SIGINT', ...)`: finish the job, close the database, exit). With no
//    SIGTERM listener Node ends such an app at once. So while the app listens to SIGINT
//    and not to SIGTERM, a SIGTERM goes to its SIGINT listeners.
//
// 5. A Unix socket the app listens on is bound once by drover and shared by all of its
//    workers. An app removes the socket's file before its listen() (the usual guard
//    against a stale one left by a crash), and so every new worker of a reload would
//    remove the one its other workers serve, and clients would find nothing there until
//    drover bound it again. drover names the sockets it holds (DROVER_UNIX_SOCKETS), and
//    removing one of those does nothing; any other file is removed as asked.
//
// 6. Where drover serves the app at the port its listen() names, the app sees the
//    user's PORT, not drover's (see below).
// 7. A listen() with `exclusive: true` asks drover too (see below).
// 8. A request drover placed shows the client's address, not drover's (see below).
// 9. An app server that reads larger request heads than drover is told so (see below).
// 10. A worker that handles drover's SIGTERM leaves when its own shutdown is done, as it
//    would alone (see below).
// 11. An app that asks whether it is the cluster's primary is named so to drover (see
//    below).
// 12. A Node process that drover's worker started, whose port is taken, says why (see
//    below).
// 13. In shared mode, the app's first listen() serves the socket drover passed it (see
//    below).
// 14. An app written for @socket.io/sticky (socket.io's guide to Node's cluster module)
//    or sticky-session has its workers listen too (see below).
// 15. A Node process of the worker that ends its work without listening exits, as it
//    would alone: a step before the app (`node migrate.js && node server.js`) lets
//    the app start (see below).
// 16. A worker that handles the stop signal gets it before it ends, when drover
//    retires it through its channel (see below).
// 17. What this file tells drover over the channel once the channel is gone is dropped,
//    not thrown: Node raises ERR_IPC_CHANNEL_CLOSED from a timer, and a retiring HTTPS
//    worker (whose connections close after drover let it go) exited with status 1.
// 18. drover hears whether the app ends itself on the stop signal, so a retired worker
//    whose clients hold WebSockets or streams gets it soon after its drain begins (see
//    below).
// 19. A server drover's retire closed (as Node's primary's disconnect does) is closed:
//    the app's own close() of it on the SIGTERM that follows is not an error.
//
// Nothing else of the app is touched; until drover asks, this only names what each of
// the app's servers speaks, notes its HTTP servers, counts client connections as they
// arrive and close, gives a request drover placed its client's address (8.), watches
// which signals the app listens to, and notes the app's first read of
// cluster.isPrimary (11.).
const script = process.argv[1] || '';
// NestJS's CLI (`nest start`, a Nest app's `npm start`) builds the app and runs
// `node dist/main` in a process of its own, as tsx does; cross-env, dotenv-cli's
// `dotenv`, env-cmd and dotenvx set the environment and run the command they are given
// below them (`cross-env NODE_ENV=production node app.js` in an `npm start` script), and
// npm-run-all's run-s and run-p run npm scripts; nodemon and ts-node-dev (`tsnd`) fork
// the app to restart it on a change. They are known by their packages'
// paths or their commands' (`node_modules/.bin/nest`, a global `bin/cross-env`), not by
// a file name alone: an app's own file may be called nest.js. (drover's NODE_WRAPPERS
// names the same commands.)
const wrappers = 'nest|nodemon|ts-node-dev|tsnd|cross-env|cross-env-shell|dotenv|env-cmd|dotenvx|run-s|run-p|npm-run-all2?';
const wrapperPackages =
  '@nestjs[\\\\/]cli|nodemon|cross-env|dotenv-cli|env-cmd|@dotenvx[\\\\/]dotenvx|npm-run-all2?';
const runner =
  /[\\/](npm|npx|yarn|yarnpkg|pnpm|pnpx|corepack|tsx)(-cli)?(\.[cm]?js)?$/.test(script) ||
  /[\\/]node_modules[\\/](npm|yarn|pnpm|corepack|tsx)[\\/]/.test(script) ||
  new RegExp(`[\\\\/]node_modules[\\\\/](${wrapperPackages})[\\\\/]`).test(script) ||
  // ts-node-dev's command, not its package: the app's process below it runs the
  // package's lib/wrap.js, and is the worker.
  /[\\/]node_modules[\\/]ts-node-dev[\\/]lib[\\/]bin\.js$/.test(script) ||
  new RegExp(`[\\\\/]\\.?bin[\\\\/](${wrappers})$`).test(script);
// Whether this process's cluster channel is drover's: drover names it
// (DROVER_NODE_CHANNEL beside Node's NODE_CHANNEL_FD, or DROVER_NODE_CHANNEL_FD below a
// runner). A worker that an app's own primary forked has a channel too, to that primary
// (the app runs its primary under `--mode background` or `shared`). Gone before the
// app's code runs, so what the app forks does not inherit it.
let droversChannel = process.env.DROVER_NODE_CHANNEL === '1';
delete process.env.DROVER_NODE_CHANNEL;
const fd = Number(process.env.DROVER_NODE_CHANNEL_FD);
if (script && !runner && Number.isInteger(fd) && fd >= 0) {
  droversChannel = true;
  // A runner's `node --watch app.js` (`npm run dev`): Node's watch process restarts the
  // app in a new process on a change, which would join drover's channel as a second app
  // of the worker, on the port the first still held. (drover refuses `node --watch` it
  // starts itself.) It stops, saying why, and takes Node's watch process with it.
  if (process.env.WATCH_REPORT_DEPENDENCIES) {
    console.error(
      'drover: this app runs under `node --watch`, which restarts it in a new process that ' +
        "cannot be drover's worker; run it without --watch: drover run --watch reloads the " +
        'workers one at a time, with no failed request, when a file changes ' +
        '(drover run --watch -- node app.js)',
    );
    try {
      process.kill(process.ppid, 'SIGTERM');
    } catch (e) {
      // Gone already.
    }
    process.exit(1);
  }
  const id = process.env.DROVER_NODE_UNIQUE_ID;
  // Gone before the app's code runs: what it starts in turn is not drover's worker.
  delete process.env.DROVER_NODE_CHANNEL_FD;
  delete process.env.DROVER_NODE_UNIQUE_ID;
  process.env.NODE_UNIQUE_ID = id;
  // A wrapper that forked this process (nodemon, ts-node-dev) gave it an IPC channel of
  // its own, which Node set up as process.send before this ran; drover's replaces it.
  const wrapperSend = typeof process.send === 'function' ? process._send : null;
  // What Node's own start-up does with NODE_CHANNEL_FD and NODE_UNIQUE_ID
  // (lib/internal/process/pre_execution.js), in the same order.
  require('child_process')._forkChild(fd, 'json');
  require('cluster')._setupWorker();
  delete process.env.NODE_UNIQUE_ID;
  if (wrapperSend) keepWrappersMessages(wrapperSend);
}
// `node -e CODE` (or `-p`): Node makes a process with NODE_UNIQUE_ID a cluster worker
// only when it runs a script (its pre-execution looks at process.argv[1]), so the
// app's listen() asked drover through a worker nobody had set up, and waited for good
// (no `listening`, no error). It is set up here as Node sets up a script's.
if (droversChannel && !script && process.env.NODE_UNIQUE_ID) {
  require('cluster')._setupWorker();
  delete process.env.NODE_UNIQUE_ID;
}

// ts-node-dev's process below it (lib/wrap.js) asks its parent, over the parent's
// channel, to compile each TypeScript file it requires, and waits for the file: sent to
// drover, the question went unanswered and the app never started. Its messages (node-dev's
// protocol: `cmd: 'NODE_DEV'`, and `compile`) go to the wrapper's channel; everything else
// (cluster's, drover's, an app's `process.send('ready')`) to drover's, as before.
function keepWrappersMessages(wrapperSend) {
  const droverSend = process.send;
  process.send = function send(message, ...rest) {
    const wrappers =
      message !== null &&
      typeof message === 'object' &&
      (message.cmd === 'NODE_DEV' || 'compile' in message);
    if (!wrappers) return droverSend.call(this, message, ...rest);
    // Handles drover's channel is sending queue what comes after them, on its channel;
    // none are ever sent on the wrapper's.
    const queue = this._handleQueue;
    this._handleQueue = null;
    try {
      const callback = rest.find((a) => typeof a === 'function');
      return wrapperSend.call(this, message, undefined, {}, callback);
    } finally {
      this._handleQueue = queue;
    }
  };
}

// The server on drover's socket (13.), once the app listens; what sigtermGoesToSigint
// does to look again at who hears SIGTERM.
let sharedServer = null;
let lookAtSignals = () => {};
// What a listen() does to make the channel hold the process (15.).
let holdsTheChannel = () => {};

// The servers on the first port the app listens on (the one drover balances; two at
// `localhost`'s two loopbacks), filled in by saysWhatItServes.
const balanced = new WeakSet();
// Of those, the HTTP servers whose requests show their client's address (8.).
const balancedHttp = new WeakSet();
// The same, to go through (10.).
const balancedHttpServers = new Set();
let balancedPort = 0;

// 6. The worker's own port, where drover's balancer and health checks reach it. Where
//    drover serves the app's clients at the port its listen() names (`drover run`
//    without --listen), the app reads the user's PORT, not this one, as under PM2:
//    `listen(process.env.PORT || 3000)` names 3000. A script runner passes drover's
//    PORT on (what it starts may not be Node): the user's (none, usually) is put back
//    here. A first listen() that names no port at all (`listen(process.env.PORT)` with no
//    PORT, `listen(cb)`, `listen()`) gets the worker's own, and is served at drover's
//    address.
const workerPort = Number(process.env.DROVER_WORKER_PORT) || Number(process.env.PORT) || 0;
let portForNoPort = 0;
if (!runner && require('cluster').isWorker) {
  const usersPort = process.env.DROVER_APP_PORT;
  delete process.env.DROVER_WORKER_PORT;
  delete process.env.DROVER_APP_PORT;
  // `drover run --app-port`: the port whose servers drover balances, where the app's
  // first may be another's (a metrics server started before the API).
  balancedPort = Number(process.env.DROVER_BALANCED_PORT) || 0;
  delete process.env.DROVER_BALANCED_PORT;
  if (usersPort !== undefined && workerPort > 0) {
    if (Number(process.env.PORT) === workerPort) {
      if (usersPort) process.env.PORT = usersPort;
      else delete process.env.PORT;
    }
    portForNoPort = workerPort;
  }
}

// 17. (above) What this file says to drover, while the channel is there.
function toDrover(message, handle, done) {
  if (!process.connected) {
    if (done) done();
    return;
  }
  process.send(message, handle, done);
}

if (!runner && require('cluster').isWorker && typeof process.send === 'function') {
  listensThroughDrover();
  closesQuietlyOnceRetired();
  saysWhatItServes();
  givesConnectionsBack();
  keepsSharedSockets();
  saysWhenItAsksIfPrimary();
  if (droversChannel) {
    listensForItsOwnPrimary();
    channelHoldsOnlyTheApp();
  }
  // For the processes it starts (12.).
  process.env.DROVER_WORKER_APP_PID = String(process.pid);
} else if (process.env.DROVER_WORKER_APP_PID) {
  saysWhyItsPortIsTaken(process.env.DROVER_WORKER_APP_PID);
}

if (!runner) {
  sigtermGoesToSigint();
}

// 13. Shared mode (`drover run --mode shared`): drover binds a listening socket for each
//    worker and passes it open, as fd 3 (`LISTEN_FDS`, as systemd's socket activation
//    does), or as fd 100 below a script runner, whose Node closes 3 for what it starts.
//    The app's first listen() on a TCP port, whatever port it names, serves that socket,
//    as it serves drover's port in the other modes, and the app runs as written. A
//    listen() on that descriptor itself (an app that reads LISTEN_FDS) is left as it is.
//    Below a runner, the socket is not fd 3 and this process is not LISTEN_PID (the
//    runner's): an app that reads systemd's variables itself (SvelteKit's adapter-node
//    throws "received LISTEN_PID 9711 but current process id is 9734") is told none,
//    and its listen() serves the socket here like any other app's.
if (!runner && process.env.DROVER_SHARED_FD) {
  const sharedFd = Number(process.env.DROVER_SHARED_FD);
  // The app's own processes (a child it forks) are not the worker.
  delete process.env.DROVER_SHARED_FD;
  if (sharedFd !== 3 && process.env.LISTEN_PID !== String(process.pid)) {
    delete process.env.LISTEN_FDS;
    delete process.env.LISTEN_PID;
    delete process.env.LISTEN_FDNAMES;
  }
  if (Number.isInteger(sharedFd) && sharedFd >= 0) servesSharedSocket(sharedFd);
}

// 4. A worker's listen() asks drover for the server (`queryServer`), as a cluster
//    worker asks its primary; this adds what the server speaks, from its class, so
//    drover places HTTP requests (HTTP/2 ones too, when it speaks HTTP/2 to the
//    workers) but hands a TLS server's connections (the app ends TLS itself:
//    https.createServer) and a raw TCP protocol's (net.createServer) to the workers
//    unread, as Node's own primary hands every connection.
function saysWhatItServes() {
  const cluster = require('cluster');
  const getServer = cluster._getServer;
  if (typeof getServer !== 'function') return;
  const http = require('http');
  const tls = require('tls');
  const net = require('net');
  // The question goes at the next tick, after the code that called listen() has run
  // (questions keep their order: nextTick is first in, first out). An app may attach its
  // server's connection handler just after listen() (`server.listen(port);
  // server.on('connection', ...)`), and only then can the server be told from a port
  // probe. Node's own listen() asks its primary and returns; its callback comes later.
  cluster._getServer = function (server, options, cb) {
    process.nextTick(() => ask.call(this, server, options, cb));
  };
  function ask(server, options, cb) {
    let speaks;
    if (server instanceof http.Server) speaks = 'http';
    else if (server instanceof tls.Server) speaks = 'tls';
    // http2.createServer (cleartext HTTP/2, as @grpc/grpc-js serves insecure calls)
    // has no class of its own to test: its constructor's name says it.
    else if (server instanceof net.Server)
      speaks = server.constructor && server.constructor.name === 'Http2Server' ? 'h2c' : 'tcp';
    const port = Number(options && options.port) || 0;
    const tcp = options && (options.addressType === 4 || options.addressType === 6);
    // A plain net server with nothing to take its connections is a port probe: get-port,
    // detect-port and portfinder listen and close at once to see that a port is free
    // (react-router-serve and remix-serve do before their own listen()). Taken for the
    // app's server, it made drover hand the app's HTTP clients over unread (TCP mode).
    const probe = speaks === 'tcp' && server.listenerCount('connection') === 0;
    if (probe) {
      const asked = Object.assign({}, options, { droverServer: speaks, droverProbe: true });
      return getServer.call(this, server, asked, cb);
    }
    if (speaks && tcp && port > 0) {
      if (balancedPort === 0) balancedPort = port;
      if (port === balancedPort) {
        balanced.add(server);
        if (speaks === 'http') seesItsClients(server);
        if (speaks === 'http') balancedHttpServers.add(server);
        if (speaks === 'http') saysIfItReadsLargerHeads(server);
      }
    }
    const asked = speaks ? Object.assign({}, options, { droverServer: speaks }) : options;
    if (speaks === 'http' && keepsSessions()) asked.droverSessions = true;
    return getServer.call(this, server, asked, cb);
  }
}

// 4b. socket.io keeps each session in the process that answered its handshake, and a
//    session's long-polls and POSTs come on several connections: a connection handed to
//    a worker carries them past drover, which keeps each session's requests on its
//    worker (drover-proxy's engine_io). An app that loaded engine.io (socket.io's
//    transport) by the time it listens (socket.io attaches to the server before
//    listen(), or in the same turn) says so, and drover hands it no connection. Asked
//    after the code that called listen() has run (see `cluster._getServer` above).
const engineIoModule = /[\\/]node_modules[\\/]engine\.io[\\/]/;
function keepsSessions() {
  return Object.keys(require.cache).some((path) => engineIoModule.test(path));
}

// The servers the app called listen() on.
const listenCalled = new WeakSet();

// 15. A cluster worker's channel keeps its process alive (cluster's own 'disconnect'
//    listener refs it), so a Node process of drover's worker that finishes its work
//    without listening never exits. Alone it would. In an `npm start` of
//    `node migrate.js && node server.js`, or with a `prestart` script, the first Node
//    process takes drover's channel (1.), runs its migration and then waited forever: the
//    app's process never started, and drover stopped the worker after its ready timeout,
//    blaming the port, and ran the migration again. (Node's cluster module and PM2 do the
//    same to such a step; only `node migrate.js` alone exits.) So the channel holds the
//    process only once it is the app's: it listens, or hears its primary
//    (`process.on('message')`); until then it ends when its work does, and the next Node
//    process of the worker takes the channel up. drover's SIGTERM lets it go again (10.).
function channelHoldsOnlyTheApp() {
  const channel = process.channel;
  if (!channel || typeof channel.unref !== 'function') return;
  channel.unref();
  const hold = () => {
    holdsTheChannel = () => {};
    process.removeListener('newListener', heard);
    channel.ref();
  };
  // Only the app's own: cluster's worker object has one already, as every worker does.
  const heard = (event) => {
    if (event === 'message') hold();
  };
  holdsTheChannel = hold;
  process.on('newListener', heard);
}

// 7. A listen() is drover's question in a worker. `exclusive: true` makes a cluster
//    worker bind the port itself, past its primary (Node's own cluster module then has
//    every worker but the first fail with EADDRINUSE, and so does PM2): under drover
//    the first worker served clients past drover and the others crash-looped. drover is
//    the one process that binds, so the option is dropped.
function listensThroughDrover() {
  const net = require('net');
  const listen = net.Server.prototype.listen;
  // `Number(process.env.PORT)` and `parseInt` of none are NaN; Node would throw.
  const none = (port) => port === undefined || port === null || Number.isNaN(port);
  net.Server.prototype.listen = function (...args) {
    listenCalled.add(this);
    holdsTheChannel();
    const first = args[0];
    const options = first !== null && typeof first === 'object' && !first._handle;
    if (options && first.exclusive) {
      args[0] = Object.assign({}, first, { exclusive: false });
    }
    if (portForNoPort && balancedPort === 0) {
      if (args.length === 0 || typeof first === 'function') {
        // `listen()` and `listen(cb)` name no port either: Node takes a random one.
        args.unshift(portForNoPort);
        portForNoPort = 0;
      } else if (none(first)) {
        args[0] = portForNoPort;
        portForNoPort = 0;
      } else if (
        options &&
        'port' in first &&
        none(first.port) &&
        first.path == null &&
        first.handle == null &&
        first.fd == null
      ) {
        args[0] = Object.assign({}, args[0], { port: portForNoPort });
        portForNoPort = 0;
      }
    }
    return listen.apply(this, args);
  };
}

// 8. Under Node's cluster module and PM2 a worker serves its client's own connection, so
//    `req.socket.remoteAddress` is the client's: Express's `req.ip`, the key of
//    express-rate-limit, morgan's log line, an allow-list. A request drover placed comes
//    on drover's own connection to the worker (127.0.0.1, one of a pool that serves many
//    clients in turn), and an app that read it saw every client as one: its rate limit
//    was shared by all of them. drover names the client in X-Forwarded-For and
//    Forwarded, and while such a request is served its socket gives that address
//    (`remoteAddress`, `remoteFamily`); the port stays drover's.
//    Connections drover handed over are the clients' own, and are left as they are.
// The client a connection of drover's serves now, on its socket. Its getters are two
// functions for every socket: with a new pair for each, no two sockets would share a
// shape, and Node's HTTP code, which reads sockets most, ran a hello world 20 % slower.
const clientAddress = Symbol('drover client address');
let clientGetters = null;
function seesItsClients(server) {
  if (balancedHttp.has(server)) return;
  balancedHttp.add(server);
  const net = require('net');
  if (clientGetters === null) {
    const own = (name) => Object.getOwnPropertyDescriptor(net.Socket.prototype, name).get;
    const address = own('remoteAddress');
    const family = own('remoteFamily');
    clientGetters = {
      remoteAddress: {
        configurable: true,
        get() {
          const ip = this[clientAddress];
          return ip ? ip : address.call(this);
        },
      },
      remoteFamily: {
        configurable: true,
        get() {
          const ip = this[clientAddress];
          if (!ip) return family.call(this);
          return ip.includes(':') ? 'IPv6' : 'IPv4';
        },
      },
    };
  }
  const emit = server.emit;
  server.emit = function (event, req) {
    if ((event === 'request' || event === 'upgrade') && req && req.socket) {
      const socket = req.socket;
      if (socket[clientAddress] !== undefined || socket.localPort === workerPort) {
        if (socket[clientAddress] === undefined) Object.defineProperties(socket, clientGetters);
        // None (one of drover's health checks): the socket's own.
        socket[clientAddress] = takesDroversFields(req, net);
      }
    }
    return emit.apply(this, arguments);
  };
}

// drover names the client in the two fields it writes last, X-Forwarded-For and then
// Forwarded; the last element of each (after ", ", with none within it) is drover's.
// Takes both elements off and returns the address ('' where they are not there: one of
// drover's health checks). The app sees the fields as the client (or a proxy before
// drover) sent them, or none, as under Node's cluster module; express-rate-limit would
// otherwise warn of a proxy that Express was not told to trust. Fields taken off the
// end leave the headers object as fast as it was (V8 undoes the properties added last):
// about 0.4 µs a request, where a search and delete in the middle cost 1 µs.
function takesDroversFields(req, net) {
  const raw = req.rawHeaders;
  const n = raw.length;
  if (n < 4 || raw[n - 4] !== 'X-Forwarded-For' || raw[n - 2] !== 'Forwarded') return '';
  const xff = raw[n - 3];
  const forwarded = raw[n - 1];
  const xffCut = xff.lastIndexOf(', ');
  const ip = xffCut < 0 ? xff : xff.slice(xffCut + 2);
  if (net.isIP(ip) === 0) return '';
  const forwardedCut = forwarded.lastIndexOf(', ');
  const headers = req.headers;
  // The last added first.
  if (forwardedCut < 0) delete headers.forwarded;
  else headers.forwarded = raw[n - 1] = forwarded.slice(0, forwardedCut);
  if (xffCut < 0) delete headers['x-forwarded-for'];
  else headers['x-forwarded-for'] = raw[n - 3] = xff.slice(0, xffCut);
  if (forwardedCut < 0 && xffCut < 0) raw.length = n - 4;
  else if (forwardedCut < 0) raw.length = n - 2;
  else if (xffCut < 0) raw.splice(n - 4, 2);
  return ip;
}

function sigtermGoesToSigint() {
  const bridge = () => process.emit('SIGINT', 'SIGINT');
  // 10. Once drover's SIGTERM has come, the channel no longer keeps the process alive.
  //    An app that handles the signal usually closes its server and lets Node exit
  //    when nothing is left to do (Express's guide: `server.close()`, no exit()). Alone,
  //    or under PM2 without the channel, it then exits; as a cluster worker its channel
  //    held it until drover's SIGKILL, stop_timeout later, on every stop and reload.
  //    Node's own primary disconnects the channel to stop a worker, and a worker whose
  //    channel ends exits at once, its handler's work cut short: this lets that work end.
  //    Only a cluster worker's channel (drover's; or that of an app's own cluster
  //    primary, which drover stops with it): a process the app forks
  //    (child_process.fork) runs this file too, and its channel to the app stays as is.
  //    drover's own idle keep-alive connections to the worker close too, as Node 19
  //    and later close idle connections in server.close(): Node 18's close() waited
  //    for them to time out, and each worker stopped 5 s late. (drover sends a worker
  //    it stops nothing more, and gave back the clients it handed it.)
  const clusterWorker = require('cluster').isWorker;
  // 13. In shared mode, with nothing of the app's own to hear the signal (below).
  const drain = () => drainsSharedServer(drain);
  // 16. drover retires a worker (a reload, a scale-down) through its channel, as Node's
  //    primary does (`worker.disconnect()`): the worker closes its servers, its
  //    connections end, the channel closes, and drover's SIGTERM follows. An app with a
  //    handler of its own for the signal (Express's guide's `server.close()`, NestJS's
  //    shutdown hooks, OpenTelemetry's flush) expects it before it ends, as PM2 sends
  //    it; but with nothing else in its event loop it ended as the channel closed, and
  //    its handler never ran (a reload under keep-alive load skipped every one). So it
  //    waits for the signal, which drover sends at once, for up to SIGNAL_WAIT_MS.
  const SIGNAL_WAIT_MS = 5000;
  let waitForSignal = null;
  if (clusterWorker) {
    process.once('disconnect', () => {
      if (process.listeners('SIGTERM').includes(leave)) {
        waitForSignal = setTimeout(() => {}, SIGNAL_WAIT_MS);
      }
    });
  }
  const leave = () => {
    if (waitForSignal) clearTimeout(waitForSignal);
    if (clusterWorker && process.channel) process.channel.unref();
    for (const server of balancedHttpServers) {
      if (typeof server.closeIdleConnections === 'function') server.closeIdleConnections();
    }
  };
  // Listeners change one at a time, and 'newListener' comes before the change: look
  // once the turn's changes are made.
  let looking = false;
  let toldHandled = false;
  const look = () => {
    looking = false;
    const listeners = process.listeners('SIGTERM');
    const own = listeners.filter((f) => f !== bridge && f !== leave && f !== drain).length;
    const bridged = listeners.includes(bridge);
    const wanted = own === 0 && process.listenerCount('SIGINT') > 0;
    if (wanted && !bridged) process.on('SIGTERM', bridge);
    if (!wanted && bridged) process.removeListener('SIGTERM', bridge);
    const drains = sharedServer !== null && own === 0 && !wanted;
    const draining = listeners.includes(drain);
    if (drains && !draining) process.on('SIGTERM', drain);
    if (!drains && draining) process.removeListener('SIGTERM', drain);
    // Only beside a listener of the app's: alone, it would keep SIGTERM from ending it.
    const handled = own > 0 || wanted;
    const leaving = listeners.includes(leave);
    if (handled && !leaving) process.prependListener('SIGTERM', leave);
    if (!handled && leaving) process.removeListener('SIGTERM', leave);
    // 18. drover retires a worker whose app ends itself on the signal with it soon
    //    after the drain begins, not at its end: WebSockets and event streams would hold
    //    it for all of drain_timeout, and the app could not close them itself.
    if (clusterWorker && handled !== toldHandled) {
      toldHandled = handled;
      toDrover({ cmd: 'NODE_DROVER', act: 'handles-stop', on: handled });
    }
  };
  const changed = (event) => {
    if ((event === 'SIGINT' || event === 'SIGTERM') && !looking) {
      looking = true;
      process.nextTick(look);
    }
  };
  process.on('newListener', changed);
  process.on('removeListener', changed);
  lookAtSignals = () => changed('SIGTERM');
}

// 19. drover retires a worker through its channel (16.), and Node's cluster module
//    then closes the worker's servers, as Node's primary does on `worker.disconnect()`.
//    The app's own shutdown closes them again on the SIGTERM that follows (Next.js,
//    Express's guide), and Node answered that close() with ERR_SERVER_NOT_RUNNING: each
//    old worker of a Next.js app logged "Error: Server is not running." on 5 of 6
//    reloads, and `drover ctl restarts` showed it as the worker's last words. A server
//    closed so is done; its app's close() is told so, without an error.
function closesQuietlyOnceRetired() {
  const net = require('net');
  const close = net.Server.prototype.close;
  let retired = false;
  process.once('disconnect', () => {
    retired = true;
  });
  net.Server.prototype.close = function (cb) {
    if (retired && !this.listening && listenCalled.has(this)) {
      if (typeof cb === 'function') process.nextTick(cb);
      return this;
    }
    return close.apply(this, arguments);
  };
}

function givesConnectionsBack() {
  const http = require('http');
  const diagnostics = require('diagnostics_channel');
  // drover's own connections to the worker (its balancer's, its health checks) arrive
  // at its own port; clients handed over arrive at drover's listen address.
  const ownPort = workerPort;
  const servers = new Set();
  // Client connections drover handed over and the worker still serves (not drover's
  // own at PORT), and whether drover has heard the current number.
  let clients = 0;
  let told = 0;
  let telling = false;
  // drover counts a connection once the worker acknowledges it, before this says so:
  // after one arrives, the count goes even if it ended where it was (another closed
  // in the same turn), or drover's would stay one too high.
  let arrived = false;
  const givenBack = new WeakSet();
  const tell = () => {
    telling = false;
    if (clients !== told || arrived) {
      told = clients;
      arrived = false;
      toDrover({ cmd: 'NODE_DROVER', act: 'clients', n: clients });
    }
  };
  const changed = (by) => {
    clients += by;
    if (by > 0) arrived = true;
    if (!telling) {
      telling = true;
      setImmediate(tell);
    }
  };
  // Requests answered on the connections drover handed over: drover sees none of them
  // pass, so this counts them (by status class, and their durations in buckets of
  // powers of two microseconds) and says so at most every SERVED_EVERY_MS, for drover's
  // metrics and dashboard. One listener and two clock reads a request: a hello server's
  // CPU per request with and without them stayed within this machine's noise (13-20
  // µs, 3 rounds of 150,000 requests each). A request that ends SERVED_EVERY_MS or more
  // after the last word says so at once, not on a timer: a worker computing requests
  // back to back, longer than a health check waits, runs no timer until its batch is
  // done, and drover, seeing nothing complete, killed it as hung with the connections
  // it held (`process.send` writes to the channel before it returns).
  const SERVED_EVERY_MS = 250;
  let servedSaidAt = 0;
  const handedSocket = Symbol('drover.handed');
  const startedAt = Symbol('drover.started');
  let servedCodes = [0, 0, 0, 0, 0];
  let servedMicros = new Array(32).fill(0);
  let servedTimer = null;
  const sayServed = () => {
    if (servedTimer) clearTimeout(servedTimer);
    servedTimer = null;
    servedSaidAt = performance.now();
    // New arrays after each: Node queues a message object (not its text) while a
    // handle is on its way.
    toDrover({ cmd: 'NODE_DROVER', act: 'served', codes: servedCodes, us: servedMicros });
    servedCodes = [0, 0, 0, 0, 0];
    servedMicros = new Array(32).fill(0);
  };
  function answered() {
    const status = this.statusCode;
    servedCodes[status >= 100 && status <= 599 ? ((status / 100) | 0) - 1 : 4]++;
    const now = performance.now();
    const micros = (now - this[startedAt]) * 1000;
    servedMicros[micros < 2 ? 0 : Math.min(31, Math.floor(Math.log2(micros)))]++;
    if (now - servedSaidAt >= SERVED_EVERY_MS) {
      sayServed();
    } else if (!servedTimer) {
      servedTimer = setTimeout(sayServed, SERVED_EVERY_MS);
      servedTimer.unref();
    }
  }
  function countsHanded(req, res) {
    if (req.socket && req.socket[handedSocket]) {
      res[startedAt] = performance.now();
      res.on('finish', answered);
    }
  }
  const noteServer = (message) => {
    const socket = message && message.socket;
    const server = socket && socket.server;
    if (!server || !balanced.has(server)) return;
    // HTTP only: drover cannot carry on a TLS session (https.Server is not an
    // http.Server), and a raw TCP protocol has no point between requests.
    if (server instanceof http.Server && !servers.has(server)) {
      servers.add(server);
      server.prependListener('request', countsHanded);
    }
    if (socket && socket.localPort !== ownPort) {
      socket[handedSocket] = true;
      changed(1);
      socket.once('close', () => {
        if (!givenBack.has(socket)) changed(-1);
      });
    }
  };
  if (typeof diagnostics.subscribe === 'function') {
    diagnostics.subscribe('net.server.socket', noteServer);
  } else {
    diagnostics.channel('net.server.socket').subscribe(noteServer);
  }
  let returning = false;
  // A reclaim gives back what it can for this many rounds of 5 ms, then stops: a
  // connection held by a long request (a long-poll) stays, and drover asks again.
  const RECLAIM_ROUNDS = 200;
  let reclaimRounds = 0;
  let giving = false;
  process.on('internalMessage', (message) => {
    // drover asks whether the event loop turns (a worker that waits on I/O answers at
    // once; one stuck in a busy loop, or stopped, cannot).
    if (message && message.cmd === 'NODE_DROVER' && message.act === 'ping') {
      toDrover({ cmd: 'NODE_DROVER', act: 'pong' });
      return;
    }
    if (message && message.cmd === 'NODE_DROVER' && message.act === 'return' && !returning) {
      returning = true;
      if (!giving) giveAllBack();
    }
    if (message && message.cmd === 'NODE_DROVER' && message.act === 'reclaim' && !giving) {
      reclaimRounds = 0;
      giveAllBack();
    }
  });
  // With its pid: below a runner (npm, tsx, a shell) the app is not the process drover
  // started, and drover reads the app's CPU and memory, and sees it exit, by this pid.
  toDrover({ cmd: 'NODE_DROVER', act: 'ready', pid: process.pid });

  // Node's list of a server's HTTP connections (what closeIdleConnections() uses).
  const connectionsOf = (server) => {
    const key = Object.getOwnPropertySymbols(server).find(
      (s) => s.description === 'http.server.connections',
    );
    return key ? server[key] : null;
  };

  // Every few milliseconds, each connection that sits between two requests (nothing of
  // the next one read, the last answer written out) goes back; the rest are looked at
  // again, until none is left.
  function giveAllBack() {
    giving = true;
    let left = 0;
    for (const server of servers) {
      const list = connectionsOf(server);
      if (!list) continue;
      const idle = new Set(list.idle().map((parser) => parser.socket));
      for (const parser of list.all()) {
        const socket = parser.socket;
        if (!socket || !socket._handle || socket.destroyed || socket.localPort === ownPort) {
          continue;
        }
        const between = idle.has(socket) || socket.bytesRead === 0;
        if (between && !socket._httpMessage && socket.writableLength === 0) {
          giveBack(socket);
        } else {
          left++;
        }
      }
    }
    if (left === 0 || (!returning && ++reclaimRounds >= RECLAIM_ROUNDS)) {
      giving = false;
      // Sent after every handle above: Node queues messages behind an unacked handle.
      if (returning) toDrover({ cmd: 'NODE_DROVER', act: 'returned' });
    } else {
      setTimeout(giveAllBack, 5);
    }
  }

  function giveBack(socket) {
    const handle = socket._handle;
    // Nothing more is read here: what the client sends next waits in the kernel for
    // drover. Everything read so far was a whole request, answered.
    handle.readStop();
    handle.reading = false;
    const parser = socket.parser;
    if (parser && parser._consumed) {
      // The HTTP parser reads the handle directly; it lets go before the socket does.
      parser.unconsume();
      parser._consumed = false;
    }
    // The socket forgets the handle, so destroying it (which frees the parser and
    // takes it off the server's list) leaves the descriptor open.
    socket._handle = null;
    givenBack.add(socket);
    changed(-1);
    socket.destroy();
    toDrover({ cmd: 'NODE_DROVER', act: 'return' }, handle, () => handle.close());
  }
}

function keepsSharedSockets() {
  let held;
  try {
    held = JSON.parse(process.env.DROVER_UNIX_SOCKETS || '[]');
  } catch (e) {
    held = [];
  }
  delete process.env.DROVER_UNIX_SOCKETS;
  if (!Array.isArray(held) || held.length === 0) return;
  const fs = require('fs');
  const path = require('path');
  const kept = new Set(held);
  const isKept = (p) => typeof p === 'string' && kept.has(path.resolve(p));
  const unlinkSync = fs.unlinkSync;
  const unlink = fs.unlink;
  const rmSync = fs.rmSync;
  const rm = fs.rm;
  const promises = fs.promises;
  const unlinkPromise = promises.unlink;
  const rmPromise = promises.rm;
  fs.unlinkSync = function (p) {
    if (isKept(p)) return undefined;
    return unlinkSync.apply(this, arguments);
  };
  fs.unlink = function (p, cb) {
    if (isKept(p) && typeof cb === 'function') return process.nextTick(cb, null);
    return unlink.apply(this, arguments);
  };
  if (typeof rmSync === 'function') {
    fs.rmSync = function (p) {
      if (isKept(p)) return undefined;
      return rmSync.apply(this, arguments);
    };
  }
  if (typeof rm === 'function') {
    fs.rm = function (p) {
      const cb = arguments[arguments.length - 1];
      if (isKept(p) && typeof cb === 'function') return process.nextTick(cb, null);
      return rm.apply(this, arguments);
    };
  }
  promises.unlink = function (p) {
    if (isKept(p)) return Promise.resolve();
    return unlinkPromise.apply(this, arguments);
  };
  if (typeof rmPromise === 'function') {
    promises.rm = function (p) {
      if (isKept(p)) return Promise.resolve();
      return rmPromise.apply(this, arguments);
    };
  }
  // `import { unlinkSync } from 'fs'` in an ES module sees the same functions.
  require('module').syncBuiltinESMExports();
}

// 9. drover reads each request head before the app does, and answers one over its limit
//    (DROVER_HEAD_LIMIT: 16 KiB, as Node's own, unless the user raised it) with a 431.
//    An app may raise Node's (`maxHeaderSize`, `--max-http-header-size`) for large
//    cookies or tokens; under PM2 such a request is answered, under drover it would be
//    refused with no word in the app's log. So the first such server says it, once.
const headLimit = Number(process.env.DROVER_HEAD_LIMIT) || 0;
let toldHeadLimit = false;
function saysIfItReadsLargerHeads(server) {
  if (!headLimit || toldHeadLimit) return;
  const nodes = server.maxHeaderSize || require('http').maxHeaderSize;
  if (!(nodes > headLimit)) return;
  toldHeadLimit = true;
  console.error(
    `drover: this app's server reads request heads of up to ${nodes} bytes (maxHeaderSize ` +
      `or --max-http-header-size), and drover answers heads over ${headLimit} bytes with ` +
      `a 431 before the app sees them: run drover with --max-header-bytes ${nodes} ` +
      `(limits.max_header_bytes in drover.toml)`,
  );
}

// 11. An app that runs Node's cluster module itself asks whether it is the primary
//    (`cluster.isPrimary`, `isMaster`); as drover's worker it is not, and it runs its
//    worker code. Where that code never listens, because the app's own primary would
//    have passed it connections (@socket.io/sticky's setupMaster), the worker is never
//    ready, and drover's word on it names this cause and the way out: so drover hears
//    of the app's first question. Node's own reads (net's and dgram's listen()) are not
//    the app's.
function saysWhenItAsksIfPrimary() {
  const cluster = require('cluster');
  let said = false;
  for (const name of ['isPrimary', 'isMaster']) {
    let value = cluster[name];
    Object.defineProperty(cluster, name, {
      configurable: true,
      enumerable: true,
      get() {
        if (!said) {
          // [0] "Error", [1] this getter, [2] the reader.
          const reader = String(new Error().stack).split('\n')[2] || '';
          if (!/[( ]node:/.test(reader)) {
            said = true;
            toDrover({ cmd: 'NODE_DROVER', act: 'asked-primary' });
          }
        }
        return value;
      },
      set(v) {
        value = v;
      },
    });
  }
}

// 14. socket.io's guide to Node's cluster module uses @socket.io/sticky: the app's primary
//    listens, reads the start of each connection and passes it to the worker that holds
//    its session (`setupMaster`), and each worker's server listens on no port: its
//    `setupWorker(io)` takes the connections its primary sends. As drover's worker the
//    app runs its worker code alone, no worker ever listened, and drover restarted them
//    for never being ready (PM2 does the same). So setupWorker has the server listen too,
//    where the app would with no port of its own (`listen(process.env.PORT)`: drover's
//    address, or the user's PORT), unless the app calls listen() itself in that turn.
//    drover then does what the primary did, per request: it keeps each session on the
//    worker that holds it (drover-proxy's engine_io) and relays the cluster adapter's
//    messages (drover-node's relay). setupWorker's `Connection: close` on every answer,
//    which made each request come on a new connection for the primary to route, is
//    taken off: drover routes every request, and would only open a connection to the
//    worker for each. The older sticky-session (`if (!sticky.listen(server, 3000)) {
//    primary } else { worker }`) is the same in a worker: it returns true and does not
//    listen; here its worker listens on the port it names, as its primary would have.
//    Known by the packages' paths, as engine.io is (4b.); CommonJS and ES module
//    imports of them both compile them here.
const stickyModule = /[\\/]node_modules[\\/]@socket\.io[\\/]sticky[\\/]/;
const stickySessionModule = /[\\/]node_modules[\\/]sticky-session[\\/]/;
const listensUnderDrover = Symbol('drover: listens under drover');
function listensForItsOwnPrimary() {
  const Module = require('module');
  const compileJs = Module._extensions['.js'];
  Module._extensions['.js'] = function (module, filename) {
    const result = compileJs.apply(this, arguments);
    const exported = module.exports;
    if (exported === null || typeof exported !== 'object') return result;
    if (stickyModule.test(filename)) wrapOnce(exported, 'setupWorker', setupWorkerListens);
    if (stickySessionModule.test(filename)) wrapOnce(exported, 'listen', workerListens);
    return result;
  };
}

// Replaces `exported[name]` with `wrap` of it, unless it is a wrapper already (a module
// that exports another's function, as sticky-session's index does its api's).
function wrapOnce(exported, name, wrap) {
  const original = exported[name];
  if (typeof original !== 'function' || original[listensUnderDrover]) return;
  const wrapped = wrap(original);
  wrapped[listensUnderDrover] = true;
  exported[name] = wrapped;
}

// The server listens at the next turn, unless the app called its listen() by then.
function listenUnlessAsked(server, port) {
  setImmediate(() => {
    if (!listenCalled.has(server)) server.listen(port);
  });
}

function setupWorkerListens(setupWorker) {
  return function setupWorkerThatListens(io) {
    const server = io && io.httpServer;
    const before = server ? server.listeners('request') : [];
    const result = setupWorker.apply(this, arguments);
    if (!server || typeof server.listen !== 'function') return result;
    for (const listener of server.listeners('request')) {
      if (!before.includes(listener)) server.removeListener('request', listener);
    }
    listenUnlessAsked(server, process.env.PORT);
    return result;
  };
}

function workerListens(listen) {
  return function listenAsAWorker(server, port) {
    const worker = listen.apply(this, arguments);
    if (worker === true && server && typeof server.listen === 'function') {
      listenUnlessAsked(server, port);
    }
    return worker;
  };
}

// 13. (See above.)
function servesSharedSocket(fd) {
  const net = require('net');
  const listen = net.Server.prototype.listen;
  // Node's own reading of listen()'s arguments (18 to 24 have it): a port, host and
  // callback, or options, or a path, or a handle. Without it the app listens where it
  // says, and drover's look names the port.
  const normalize = net._normalizeArgs;
  if (typeof normalize !== 'function') return;
  let served = null;
  let appsPort = 0;
  net.Server.prototype.listen = function (...args) {
    if (served === null) {
      const [options, cb] = normalize(args);
      const elsewhere =
        options.path != null || options.fd != null || options.handle != null || options._handle;
      // `listen()`, `listen(cb)` and `listen(null)` are a TCP port too (an unused one).
      const tcp =
        'port' in options || args.length === 0 || typeof args[0] === 'function' || args[0] == null;
      if (options.fd === fd) served = this;
      if (!elsewhere && tcp) {
        served = this;
        sharedServer = this;
        lookAtSignals();
        appsPort = Number(options.port) || 0;
        const shared = options.signal ? { fd, signal: options.signal } : { fd };
        return cb ? listen.call(this, shared, cb) : listen.call(this, shared);
      }
    }
    return listen.apply(this, args);
  };
  // A second port is the app's own: every worker's copy binds it, and all but the first
  // fail. Where nothing handles that, it says why, once, before Node throws it.
  const emit = net.Server.prototype.emit;
  let said = false;
  net.Server.prototype.emit = function (event, err) {
    const unhandled = event === 'error' && this !== served && this.listenerCount('error') === 0;
    if (unhandled && !said && err && err.code === 'EADDRINUSE') {
      said = true;
      const named = appsPort ? ` (it named port ${appsPort})` : '';
      console.error(
        `drover: this process (pid ${process.pid}) cannot listen on port ${err.port}, which ` +
          `another process holds. In shared mode (drover run --mode shared) drover passes each ` +
          `worker one listening socket, which the app's first listen() serves${named}; a ` +
          `second port is bound by each worker's copy of the app itself, and all but the ` +
          `first fail. Run the app without --mode shared: drover then serves every port ` +
          `it listens on, as Node's cluster module does`,
      );
    }
    return emit.apply(this, arguments);
  };
}

// 13. drover stops a shared-mode worker (a reload, a scale-down, its shutdown) with
//    SIGTERM, and an app that does not handle it would end at once: every keep-alive
//    client of the worker then lost the request it had just sent (wrk counted 11 over a
//    reload and a scale-down). In the other modes the worker gives such connections back
//    to drover between two requests (2.); here there is no channel to give them on, so
//    the worker drains them first, as Node's cluster module disconnects a worker: it
//    stops accepting (drover keeps the socket, and what waits in its queue is the next
//    worker's), answers each request still to come on a connection with `Connection:
//    close`, and closes a connection that has sent nothing for a second. Then it ends
//    by the SIGTERM, as it would have. Only while the app has no SIGTERM or SIGINT
//    handler of its own: an app's own shutdown is its own. drover's stop_timeout bounds
//    it, as always.
const IDLE_BEFORE_CLOSE_MS = 1000;
function drainsSharedServer(listener) {
  const server = sharedServer;
  // Once: the SIGTERM it ends by is the default's.
  sharedServer = null;
  process.removeListener('SIGTERM', listener);
  const end = () => process.kill(process.pid, 'SIGTERM');
  const key = Object.getOwnPropertySymbols(server).find(
    (s) => s.description === 'http.server.connections',
  );
  const list = key ? server[key] : null;
  // Not HTTP (a TLS server, a raw protocol): nothing tells its clients to go.
  if (!list) return end();
  // net's close, not http's: Node 19 and later close every idle connection in http's,
  // and a request a client sends at that moment is lost.
  require('net').Server.prototype.close.call(server);
  server.prependListener('request', (req, res) => {
    res.shouldKeepAlive = false;
  });
  const idleSince = new Map();
  const round = () => {
    const now = Date.now();
    const idle = new Set(list.idle().map((parser) => parser.socket));
    let left = 0;
    for (const parser of list.all()) {
      const socket = parser.socket;
      if (!socket || socket.destroyed) continue;
      left++;
      const answering = socket._httpMessage;
      if (answering && !answering.headersSent) answering.shouldKeepAlive = false;
      if (!idle.has(socket) || answering || socket.writableLength > 0) {
        idleSince.delete(socket);
        continue;
      }
      const seen = idleSince.get(socket);
      if (!seen || seen.bytes !== socket.bytesRead) {
        idleSince.set(socket, { at: now, bytes: socket.bytesRead });
      } else if (now - seen.at >= IDLE_BEFORE_CLOSE_MS) {
        socket.destroy();
      }
    }
    if (left === 0) end();
    else setTimeout(round, 50);
  };
  round();
}

// 12. A process that drover's worker starts is not drover's worker: its listen() binds
//    the port itself, as a process a cluster worker starts does. Where the worker is a
//    Node program that runs the app below it and drover does not know it for one (a
//    wrapper of its own, `node wrap.js server.js`), each worker's copy of the app binds
//    the app's port, and all but the first fail with EADDRINUSE; so does a helper each
//    worker's app starts on a fixed port. Such a failure, where nothing handles it, says
//    so, once, before Node throws it as it would have.
function saysWhyItsPortIsTaken(workerPid) {
  const net = require('net');
  const emit = net.Server.prototype.emit;
  let said = false;
  net.Server.prototype.emit = function (event, err) {
    // Only where Node throws it: an app that handles it (tries the next port) is fine.
    const unhandled = event === 'error' && this.listenerCount('error') === 0;
    if (unhandled && !said && err && err.code === 'EADDRINUSE') {
      said = true;
      console.error(
        `drover: this process (pid ${process.pid}) cannot listen on port ${err.port}, which ` +
          `another process holds. drover's worker (pid ${workerPid}) started it, so its ` +
          `listen() binds the port itself, past drover, and each worker's copy does. If ` +
          `the worker's program runs your app in a Node process of its own, start the app ` +
          `itself (drover run -- node app.js) or through npm, yarn, pnpm, npx, tsx, nest, ` +
          `nodemon, ts-node-dev, cross-env, dotenv, env-cmd, dotenvx or npm-run-all, which ` +
          `drover passes its channel past`,
      );
    }
    return emit.apply(this, arguments);
  };
}
