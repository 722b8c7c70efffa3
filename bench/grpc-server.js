// A gRPC backend for bench/grpc.sh (@grpc/grpc-js; messages are raw bytes): `node
// grpc-server.js` listens on 127.0.0.1:0 and prints "listening PORT". Each call of
// /bench.Work/Call spins the CPU for as many microseconds as its request says (ASCII
// digits), then answers "ok": the cost of a call is the client's to choose.
// `node grpc-server.js report` also reports its load in each answer's metadata, as the
// Node SDK does for HTTP (`endpoint-load-metrics: TEXT named_metrics.elu=X`, its
// event-loop utilisation): what drover reads to bind calls late.
const grpc = require('@grpc/grpc-js');
const elu = process.argv[2] === 'report' ? require('../sdk/node').eventLoopUtilization : null;
const raw = { requestSerialize: (b) => b, requestDeserialize: (b) => b,
  responseSerialize: (b) => b, responseDeserialize: (b) => b };
// /bench.Work/Heavy does the same: with BENCH_METHODS=2, grpc.sh's client sends its heavy
// calls there, as an app whose costly work has a method of its own.
const method = (path) => ({ path, requestStream: false, responseStream: false, ...raw });
const service = { call: method('/bench.Work/Call'), heavy: method('/bench.Work/Heavy') };
const spin = (call, cb) => {
  const until = process.hrtime.bigint() + BigInt(Number(call.request.toString()) || 0) * 1000n;
  while (process.hrtime.bigint() < until);
  if (elu) {
    const md = new grpc.Metadata();
    md.set('endpoint-load-metrics', `TEXT named_metrics.elu=${elu().toFixed(3)}`);
    call.sendMetadata(md);
  }
  cb(null, Buffer.from('ok'));
};
const server = new grpc.Server();
server.addService(service, { call: spin, heavy: spin });
server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (err, port) => {
  if (err) throw err;
  console.log(`listening ${port}`);
});
