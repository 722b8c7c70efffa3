//! What a cluster worker says, parsed from one line of its IPC channel, and what the
//! primary answers.
//!
//! A worker's messages come from its own code as much as from Node's: anything the app
//! passes to `process.send()` arrives on the same channel. So parsing never fails on
//! content: a line that is not one of Node's own messages is [`FromWorker::App`], and a
//! line that is not JSON is [`FromWorker::Unreadable`].

use serde_json::{json, Map, Value};

/// One message from a worker.
#[derive(Debug, Clone, PartialEq)]
pub enum FromWorker {
    /// The worker started and set up the cluster module.
    Online,
    /// The app called `listen()` (or a dgram `bind()`) and waits for the answer.
    QueryServer(ServerQuery),
    /// A server of the worker now listens; `port` is what the app sees.
    Listening { port: Option<i64> },
    /// The app closed the server that `key` names.
    Close { key: String },
    /// `worker.disconnect()`/`destroy()`: the worker leaves on purpose and waits for
    /// the ack of `seq` before it disconnects.
    ExitedAfterDisconnect { seq: u64 },
    /// The worker's answer to a `newconn`: it took the connection, or refused it (its
    /// server is closed, or at `maxConnections`).
    ConnectionAnswer { seq: u64, accepted: bool },
    /// The handle of the last message arrived (`NODE_HANDLE_ACK`); the next may go.
    HandleAck,
    /// The handle of the last message was lost on the way (`NODE_HANDLE_NACK`).
    HandleNack,
    /// A message with a descriptor alongside (`process.send(msg, handle)`): drover's
    /// preload giving a client connection back (`returned`), or anything else a worker
    /// sends with a handle. Node waits for `NODE_HANDLE_ACK` before its next one.
    Handle { returned: bool },
    /// drover's preload runs in the worker and can give connections back; `pid` is the
    /// process it runs in (the app's own, below a runner such as npm), when it said.
    PreloadReady { pid: Option<u32> },
    /// drover's preload gave back every connection it could.
    AllReturned,
    /// drover's preload answered a `ping`: the worker's event loop turns.
    Pong,
    /// drover's preload counted the client connections the worker serves that drover
    /// handed it (it says so whenever the number changes).
    Clients(usize),
    /// drover's preload counted the requests the worker answered on client connections
    /// drover handed it, since it last said.
    Served(Box<Served>),
    /// drover's preload saw the app ask Node's cluster module whether it is the primary
    /// (`cluster.isPrimary`, `isMaster`): as drover's worker it is not.
    AskedPrimary,
    /// Whether the app ends itself on drover's SIGTERM: it has a listener of its own for
    /// SIGTERM or for SIGINT (which drover's preload hands the SIGTERM to).
    HandlesStop(bool),
    /// Another of Node's internal messages, not the cluster's.
    OtherInternal,
    /// A message of the app's own (`process.send(...)`).
    App(Value),
    /// Not JSON.
    Unreadable,
}

/// Requests a worker answered on client connections drover handed it, as drover's
/// preload counts them (drover sees none of them pass): by status class (1xx to 5xx),
/// and their durations in buckets of powers of two microseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    pub by_class: [u64; 5],
    /// Bucket `i` counts durations in [2^i, 2^(i+1)) µs (bucket 0 also those below 1 µs,
    /// the last also those above).
    pub by_log2_micros: [u64; SERVED_BUCKETS],
}

/// Duration buckets the preload counts in: up to 2^32 µs (71 minutes).
pub const SERVED_BUCKETS: usize = 32;

/// More requests in one report than a process answers between two (it reports every
/// quarter second): a count above it is not the preload's, and the report is skipped.
const MAX_SERVED: u64 = 1 << 32;

impl Served {
    /// From `{"codes": [1xx, 2xx, 3xx, 4xx, 5xx], "us": [bucket counts]}`; `None` unless
    /// each count is a whole number in bounds and the durations count the responses.
    fn read(fields: &Map<String, Value>) -> Option<Served> {
        let counts = |name: &str, most: usize| -> Option<Vec<u64>> {
            let list = fields.get(name)?.as_array()?;
            if list.len() > most {
                return None;
            }
            list.iter()
                .map(|n| n.as_u64().filter(|&n| n <= MAX_SERVED))
                .collect()
        };
        let codes = counts("codes", 5)?;
        let micros = counts("us", SERVED_BUCKETS)?;
        let mut served = Served {
            by_class: [0; 5],
            by_log2_micros: [0; SERVED_BUCKETS],
        };
        served.by_class[..codes.len()].copy_from_slice(&codes);
        served.by_log2_micros[..micros.len()].copy_from_slice(&micros);
        (codes.len() == 5 && codes.iter().sum::<u64>() == micros.iter().sum::<u64>())
            .then_some(served)
    }

    /// The durations as (nanoseconds, count), each bucket at its middle (1.5 × 2^i µs).
    pub fn durations_ns(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.by_log2_micros
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(i, &n)| (1500u64 << i, n))
    }
}

/// The kind of socket a worker asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressType {
    Tcp4,
    Tcp6,
    Udp4,
    Udp6,
    /// A Unix socket path (`listen('/tmp/app.sock')`).
    Pipe,
    /// An inherited descriptor (`listen({ fd: 3 })`).
    Fd,
}

/// A worker's `listen()`: the fields of Node's `queryServer` that drover acts on, and
/// the whole message for what it passes back unchanged.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerQuery {
    /// Echoed as `ack` in the answer, which is how the worker matches it.
    pub seq: u64,
    pub address: Option<String>,
    /// The port the app asked for: 0 for "any".
    pub port: i64,
    pub address_type: AddressType,
    /// Names the server in later messages (`newconn`, `close`). Built the way Node's
    /// primary builds it, from the fields that make a server unique in one worker.
    pub key: String,
    /// Opaque data servers share through the primary (TLS ticket keys), passed back.
    pub data: Value,
    /// What the server speaks, as drover's preload says (`droverServer`).
    pub speaks: Speaks,
    /// drover's preload says the server is a port probe (`droverProbe`): a plain net
    /// server with nothing to take its connections, which get-port, detect-port and
    /// portfinder open and close at once to see that a port is free (react-router-serve,
    /// remix-serve). The app's real server listens next, and says what it speaks.
    pub probe: bool,
    /// drover's preload says the app keeps sessions in its process that every request
    /// of a session must reach (`droverSessions`: it loaded engine.io, socket.io's
    /// transport): drover places each request, and hands it no connection.
    pub keeps_sessions: bool,
}

/// What a worker's server speaks to its clients, as drover's preload tells it from the
/// server's class: a balancer that reads HTTP can serve only the first; the others get
/// each connection unread (Node's cluster module hands every kind over alike).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Speaks {
    /// `http.createServer`, Express, Fastify...; also what a listen said without the
    /// preload's word is taken for (drover's own preload always says it).
    #[default]
    Http,
    /// `https.createServer`, `tls.createServer`, `http2.createSecureServer`: the app
    /// holds the certificate and ends TLS itself.
    Tls,
    /// `http2.createServer`: cleartext HTTP/2 (@grpc/grpc-js's insecure server).
    H2c,
    /// `net.createServer`: a protocol of its own (Redis's, MQTT, a game's).
    Tcp,
}

impl std::fmt::Display for Speaks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Speaks::Http => "HTTP",
            Speaks::Tls => "TLS (https.createServer or tls.createServer)",
            Speaks::H2c => "cleartext HTTP/2 (http2.createServer)",
            Speaks::Tcp => "a TCP protocol of its own (net.createServer)",
        })
    }
}

/// Parses one line (without its newline).
pub fn parse(line: &[u8]) -> FromWorker {
    let Ok(value) = serde_json::from_slice::<Value>(line) else {
        return FromWorker::Unreadable;
    };
    let Some(fields) = value.as_object() else {
        return FromWorker::App(value);
    };
    match fields.get("cmd").and_then(Value::as_str) {
        Some("NODE_CLUSTER") => cluster_message(fields),
        Some("NODE_HANDLE_ACK") => FromWorker::HandleAck,
        Some("NODE_HANDLE_NACK") => FromWorker::HandleNack,
        Some("NODE_HANDLE") => FromWorker::Handle {
            returned: fields.get("type").and_then(Value::as_str) == Some("net.Native")
                && fields
                    .get("msg")
                    .and_then(Value::as_object)
                    .is_some_and(|msg| drover_act(msg) == Some("return")),
        },
        Some(DROVER_CMD) => match drover_act(fields) {
            Some("ready") => FromWorker::PreloadReady {
                pid: fields
                    .get("pid")
                    .and_then(Value::as_u64)
                    .and_then(|p| u32::try_from(p).ok())
                    .filter(|&p| p > 1),
            },
            Some("returned") => FromWorker::AllReturned,
            Some("pong") => FromWorker::Pong,
            Some("asked-primary") => FromWorker::AskedPrimary,
            Some("handles-stop") => match fields.get("on").and_then(Value::as_bool) {
                Some(on) => FromWorker::HandlesStop(on),
                None => FromWorker::OtherInternal,
            },
            Some("clients") => match fields.get("n").and_then(Value::as_u64) {
                Some(n) if n <= MAX_CLIENTS => FromWorker::Clients(n as usize),
                _ => FromWorker::OtherInternal,
            },
            Some("served") => match Served::read(fields) {
                Some(served) => FromWorker::Served(Box::new(served)),
                None => FromWorker::OtherInternal,
            },
            _ => FromWorker::OtherInternal,
        },
        // Node's own rule for "internal": a `cmd` that starts with NODE_ and is longer.
        Some(cmd) if cmd.len() > 5 && cmd.starts_with("NODE_") => FromWorker::OtherInternal,
        _ => FromWorker::App(value),
    }
}

/// More client connections than one process could hold open: a count above it is not
/// the preload's, and is skipped.
const MAX_CLIENTS: u64 = 1 << 24;

/// The `cmd` of the messages between drover and its preload in a worker (preload.cjs).
/// Node's rule makes it internal: the app's `message` listeners never see it.
const DROVER_CMD: &str = "NODE_DROVER";

/// `act` of a message with drover's `cmd`.
fn drover_act(fields: &Map<String, Value>) -> Option<&str> {
    match fields.get("cmd").and_then(Value::as_str) {
        Some(DROVER_CMD) => fields.get("act").and_then(Value::as_str),
        _ => None,
    }
}

/// Asks drover's preload to give back the client connections the worker serves, each
/// between two requests, and then to say so (`AllReturned`).
pub(crate) fn give_connections_back() -> Value {
    json!({ "cmd": DROVER_CMD, "act": "return" })
}

/// Asks drover's preload to give back the client connections the worker serves, each
/// between two requests, while the worker stays (it stops trying after a second).
pub(crate) fn reclaim_connections() -> Value {
    json!({ "cmd": DROVER_CMD, "act": "reclaim" })
}

/// Asks drover's preload whether the worker's event loop turns: it answers `pong` from
/// the loop, which it cannot while it spins in a busy loop or the process is stopped.
pub(crate) fn ping() -> Value {
    json!({ "cmd": DROVER_CMD, "act": "ping" })
}

/// The ack that lets a worker send its next message with a handle.
pub(crate) fn handle_ack() -> Value {
    json!({ "cmd": "NODE_HANDLE_ACK" })
}

fn cluster_message(fields: &Map<String, Value>) -> FromWorker {
    let seq = fields.get("seq").and_then(Value::as_u64);
    if let Some(ack) = fields.get("ack").and_then(Value::as_u64) {
        return FromWorker::ConnectionAnswer {
            seq: ack,
            accepted: fields.get("accepted").and_then(Value::as_bool) == Some(true),
        };
    }
    match fields.get("act").and_then(Value::as_str) {
        Some("online") => FromWorker::Online,
        Some("queryServer") => match (seq, server_query(fields)) {
            (Some(seq), Some(mut query)) => {
                query.seq = seq;
                FromWorker::QueryServer(query)
            }
            _ => FromWorker::OtherInternal,
        },
        Some("listening") => FromWorker::Listening {
            port: fields.get("port").and_then(Value::as_i64),
        },
        Some("close") => FromWorker::Close {
            key: fields
                .get("key")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
        },
        Some("exitedAfterDisconnect") => match seq {
            Some(seq) => FromWorker::ExitedAfterDisconnect { seq },
            None => FromWorker::OtherInternal,
        },
        _ => FromWorker::OtherInternal,
    }
}

fn server_query(fields: &Map<String, Value>) -> Option<ServerQuery> {
    // dgram sends `fd: -1` for "no descriptor"; net leaves it out.
    let fd = fields
        .get("fd")
        .and_then(Value::as_i64)
        .filter(|fd| *fd >= 0);
    let port = fields.get("port").and_then(Value::as_i64);
    let address_type = match fields.get("addressType") {
        _ if fd.is_some() => AddressType::Fd,
        Some(Value::String(s)) if s == "udp4" => AddressType::Udp4,
        Some(Value::String(s)) if s == "udp6" => AddressType::Udp6,
        Some(Value::Number(n)) if n.as_i64() == Some(6) => AddressType::Tcp6,
        Some(Value::Number(n)) if n.as_i64() == Some(4) => AddressType::Tcp4,
        Some(Value::Number(n)) if n.as_i64() == Some(-1) => AddressType::Pipe,
        _ => return None,
    };
    let address = fields
        .get("address")
        .and_then(Value::as_str)
        .map(str::to_string);
    // lib/internal/cluster/primary.js: `${address}:${port}:${addressType}:${fd}:${index}`.
    let text = |name: &str| match fields.get(name) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) => "null".to_string(),
        Some(other) => other.to_string(),
        None => "undefined".to_string(),
    };
    let key = ["address", "port", "addressType", "fd", "index"]
        .map(text)
        .join(":");
    Some(ServerQuery {
        seq: 0,
        address,
        port: port.unwrap_or(0),
        address_type,
        key,
        data: fields.get("data").cloned().unwrap_or(Value::Null),
        speaks: match fields.get("droverServer").and_then(Value::as_str) {
            Some("tls") => Speaks::Tls,
            Some("h2c") => Speaks::H2c,
            Some("tcp") => Speaks::Tcp,
            _ => Speaks::Http,
        },
        probe: fields.get("droverProbe") == Some(&Value::Bool(true)),
        keeps_sessions: fields.get("droverSessions") == Some(&Value::Bool(true)),
    })
}

/// The primary's side: each message carries `cmd: NODE_CLUSTER` and the primary's own
/// sequence number, as Node's `sendHelper` adds them.
pub(crate) fn cluster(seq: u64, mut body: Map<String, Value>) -> Value {
    body.insert("cmd".into(), json!("NODE_CLUSTER"));
    body.insert("seq".into(), json!(seq));
    Value::Object(body)
}

/// "Listening", for a server whose connections the primary will hand over: no socket,
/// and `sockname`, the address the app asked for. The worker checks that the port it
/// asked for is the port it got (net.js `checkBindError`), so this must not be the
/// loopback port where drover accepts.
pub(crate) fn listening_without_socket(query: &ServerQuery) -> Map<String, Value> {
    if query.address_type == AddressType::Pipe {
        // Node's primary names no address for a Unix socket: the app knows its path.
        return answer(query, 0);
    }
    let ipv6 = query.address_type == AddressType::Tcp6;
    let address = query
        .address
        .clone()
        .unwrap_or_else(|| if ipv6 { "::" } else { "0.0.0.0" }.to_string());
    let mut body = answer(query, 0);
    body.insert(
        "sockname".into(),
        json!({ "address": address, "family": if ipv6 { "IPv6" } else { "IPv4" }, "port": query.port }),
    );
    body
}

/// The answer to `query`: `errno` 0 (with a socket sent alongside, or
/// [`listening_without_socket`]), or a negative libuv errno that the app's `listen()`
/// raises as its error.
pub(crate) fn answer(query: &ServerQuery, errno: i32) -> Map<String, Value> {
    let mut body = Map::new();
    body.insert("errno".into(), json!(errno));
    body.insert("key".into(), json!(query.key));
    body.insert("ack".into(), json!(query.seq));
    body.insert("data".into(), query.data.clone());
    body
}

/// A new connection for the server `key`; its socket goes alongside.
pub(crate) fn new_connection(key: &str) -> Map<String, Value> {
    let mut body = Map::new();
    body.insert("act".into(), json!("newconn"));
    body.insert("key".into(), json!(key));
    body
}

/// The ack of a message that waits for one (`exitedAfterDisconnect`).
pub(crate) fn ack(seq: u64) -> Map<String, Value> {
    let mut body = Map::new();
    body.insert("ack".into(), json!(seq));
    body
}

/// How a message travels with a socket: wrapped, so the receiver knows to take the
/// descriptor that arrived with this line. `net.Native` is a raw libuv handle, what
/// Node's primary sends for both listening sockets and connections.
pub(crate) fn with_handle(inner: Value) -> Value {
    json!({ "cmd": "NODE_HANDLE", "type": "net.Native", "msg": inner })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listen_on_a_port_as_node_20_sends_it() {
        let line = br#"{"cmd":"NODE_CLUSTER","act":"queryServer","index":0,"data":null,"address":null,"port":3000,"addressType":4,"backlog":511,"seq":1}"#;
        let FromWorker::QueryServer(q) = parse(line) else {
            panic!("{:?}", parse(line))
        };
        assert_eq!(q.seq, 1);
        assert_eq!(q.port, 3000);
        assert_eq!(q.address_type, AddressType::Tcp4);
        assert_eq!(q.key, "null:3000:4:undefined:0");
        assert_eq!(q.speaks, Speaks::Http, "without the preload's word");
    }

    #[test]
    fn what_a_server_speaks_is_the_preloads_word_and_leaves_the_key_alone() {
        for (word, speaks) in [
            ("http", Speaks::Http),
            ("tls", Speaks::Tls),
            ("h2c", Speaks::H2c),
            ("tcp", Speaks::Tcp),
            ("gopher", Speaks::Http),
        ] {
            let line = format!(
                r#"{{"cmd":"NODE_CLUSTER","act":"queryServer","index":0,"data":null,"address":null,"port":8443,"addressType":4,"droverServer":"{word}","seq":1}}"#
            );
            let FromWorker::QueryServer(q) = parse(line.as_bytes()) else {
                panic!("{:?}", parse(line.as_bytes()))
            };
            assert_eq!(q.speaks, speaks, "{word}");
            assert_eq!(q.key, "null:8443:4:undefined:0", "{word}");
            assert!(!q.probe, "{word}");
        }
    }

    #[test]
    fn a_port_probe_is_the_preloads_word_true_alone() {
        for (word, probe) in [
            ("true", true),
            ("false", false),
            ("1", false),
            (r#""yes""#, false),
        ] {
            let line = format!(
                r#"{{"cmd":"NODE_CLUSTER","act":"queryServer","index":0,"data":null,"address":null,"port":3000,"addressType":4,"droverServer":"tcp","droverProbe":{word},"seq":1}}"#
            );
            let FromWorker::QueryServer(q) = parse(line.as_bytes()) else {
                panic!("{:?}", parse(line.as_bytes()))
            };
            assert_eq!(q.probe, probe, "{word}");
            assert_eq!(q.key, "null:3000:4:undefined:0", "{word}");
        }
    }

    #[test]
    fn sessions_are_the_preloads_word_true_alone() {
        for (word, sessions) in [("true", true), ("false", false), ("1", false)] {
            let line = format!(
                r#"{{"cmd":"NODE_CLUSTER","act":"queryServer","index":0,"data":null,"address":null,"port":3000,"addressType":4,"droverServer":"http","droverSessions":{word},"seq":1}}"#
            );
            let FromWorker::QueryServer(q) = parse(line.as_bytes()) else {
                panic!("{:?}", parse(line.as_bytes()))
            };
            assert_eq!(q.keeps_sessions, sessions, "{word}");
        }
    }

    #[test]
    fn other_listens_are_told_apart() {
        let udp = br#"{"cmd":"NODE_CLUSTER","act":"queryServer","address":"0.0.0.0","port":0,"addressType":"udp4","fd":-1,"index":0,"seq":2}"#;
        let pipe = br#"{"cmd":"NODE_CLUSTER","act":"queryServer","address":"/tmp/a.sock","port":-1,"addressType":-1,"index":0,"seq":3}"#;
        let fd = br#"{"cmd":"NODE_CLUSTER","act":"queryServer","address":null,"port":null,"addressType":null,"fd":3,"index":0,"seq":4}"#;
        let kind = |line: &[u8]| match parse(line) {
            FromWorker::QueryServer(q) => q.address_type,
            other => panic!("{other:?}"),
        };
        assert_eq!(kind(udp), AddressType::Udp4);
        assert_eq!(kind(pipe), AddressType::Pipe);
        assert_eq!(kind(fd), AddressType::Fd);
    }

    #[test]
    fn a_unix_sockets_answer_names_no_address() {
        let line = br#"{"cmd":"NODE_CLUSTER","act":"queryServer","address":"/srv/app/app.sock","port":-1,"addressType":-1,"index":0,"seq":3}"#;
        let FromWorker::QueryServer(q) = parse(line) else {
            panic!()
        };
        assert_eq!(q.key, "/srv/app/app.sock:-1:-1:undefined:0");
        let answer = listening_without_socket(&q);
        assert!(!answer.contains_key("sockname"), "{answer:?}");
        assert_eq!(answer["errno"], 0);
    }

    #[test]
    fn answers_and_acks() {
        assert_eq!(
            parse(br#"{"cmd":"NODE_CLUSTER","ack":7,"accepted":true,"seq":9}"#),
            FromWorker::ConnectionAnswer {
                seq: 7,
                accepted: true
            }
        );
        assert_eq!(
            parse(br#"{"cmd":"NODE_HANDLE_ACK"}"#),
            FromWorker::HandleAck
        );
        assert_eq!(
            parse(br#"{"cmd":"NODE_CLUSTER","act":"exitedAfterDisconnect","seq":4}"#),
            FromWorker::ExitedAfterDisconnect { seq: 4 }
        );
    }

    #[test]
    fn the_preloads_messages_and_handles() {
        assert_eq!(
            parse(br#"{"cmd":"NODE_DROVER","act":"ready"}"#),
            FromWorker::PreloadReady { pid: None }
        );
        assert_eq!(
            parse(br#"{"cmd":"NODE_DROVER","act":"ready","pid":4242}"#),
            FromWorker::PreloadReady { pid: Some(4242) }
        );
        // Not a process of its own: 0 and 1 (init), a negative, a float, too large.
        for pid in ["0", "1", "-5", "4.5", "4294967296", "\"42\""] {
            let line = format!(r#"{{"cmd":"NODE_DROVER","act":"ready","pid":{pid}}}"#);
            assert_eq!(
                parse(line.as_bytes()),
                FromWorker::PreloadReady { pid: None },
                "{pid}"
            );
        }
        assert_eq!(
            parse(br#"{"cmd":"NODE_DROVER","act":"returned"}"#),
            FromWorker::AllReturned
        );
        assert_eq!(
            parse(br#"{"cmd":"NODE_DROVER","act":"pong"}"#),
            FromWorker::Pong
        );
        assert_eq!(
            parse(br#"{"cmd":"NODE_DROVER","act":"asked-primary"}"#),
            FromWorker::AskedPrimary
        );
        assert_eq!(
            parse(br#"{"cmd":"NODE_DROVER","act":"handles-stop","on":true}"#),
            FromWorker::HandlesStop(true)
        );
        assert_eq!(
            parse(br#"{"cmd":"NODE_DROVER","act":"handles-stop","on":"yes"}"#),
            FromWorker::OtherInternal
        );
        assert_eq!(
            parse(br#"{"cmd":"NODE_DROVER","act":"x"}"#),
            FromWorker::OtherInternal
        );
        assert_eq!(
            parse(br#"{"cmd":"NODE_DROVER","act":"clients","n":3}"#),
            FromWorker::Clients(3)
        );
        // A count that is not one is skipped, not read as zero.
        for bad in [
            r#"{"cmd":"NODE_DROVER","act":"clients"}"#,
            r#"{"cmd":"NODE_DROVER","act":"clients","n":-1}"#,
            r#"{"cmd":"NODE_DROVER","act":"clients","n":1.5}"#,
            r#"{"cmd":"NODE_DROVER","act":"clients","n":"2"}"#,
            r#"{"cmd":"NODE_DROVER","act":"clients","n":99999999999}"#,
        ] {
            assert_eq!(parse(bad.as_bytes()), FromWorker::OtherInternal, "{bad}");
        }
        let FromWorker::Served(served) =
            parse(br#"{"cmd":"NODE_DROVER","act":"served","codes":[0,3,0,1,0],"us":[0,0,0,0,0,0,0,0,0,0,4]}"#)
        else {
            panic!("not read as served");
        };
        assert_eq!(served.by_class, [0, 3, 0, 1, 0]);
        assert_eq!(served.durations_ns().collect::<Vec<_>>(), [(1_536_000, 4)]);
        // Counts out of bounds, of the wrong kind or length, or durations that do not
        // count the responses: skipped whole.
        for bad in [
            r#"{"cmd":"NODE_DROVER","act":"served","codes":[0,1,0,0,0]}"#,
            r#"{"cmd":"NODE_DROVER","act":"served","codes":[0,1,0,0],"us":[1]}"#,
            r#"{"cmd":"NODE_DROVER","act":"served","codes":[0,1,0,0,0],"us":[2]}"#,
            r#"{"cmd":"NODE_DROVER","act":"served","codes":[0,-1,0,0,0],"us":[1]}"#,
            r#"{"cmd":"NODE_DROVER","act":"served","codes":[0,1.5,0,0,0],"us":[1]}"#,
            r#"{"cmd":"NODE_DROVER","act":"served","codes":[0,99999999999,0,0,0],"us":[99999999999]}"#,
        ] {
            assert_eq!(parse(bad.as_bytes()), FromWorker::OtherInternal, "{bad}");
        }
        let too_many = format!(
            r#"{{"cmd":"NODE_DROVER","act":"served","codes":[0,1,0,0,0],"us":[{}1]}}"#,
            "0,".repeat(SERVED_BUCKETS)
        );
        assert_eq!(parse(too_many.as_bytes()), FromWorker::OtherInternal);
        assert_eq!(
            parse(br#"{"cmd":"NODE_HANDLE","type":"net.Native","msg":{"cmd":"NODE_DROVER","act":"return"}}"#),
            FromWorker::Handle { returned: true }
        );
        // The app's own handles (a socket sent to the primary) are not drover's.
        assert_eq!(
            parse(br#"{"cmd":"NODE_HANDLE","type":"net.Socket","msg":{"cmd":"NODE_DROVER","act":"return"}}"#),
            FromWorker::Handle { returned: false }
        );
        assert_eq!(
            parse(br#"{"cmd":"NODE_HANDLE","type":"net.Native","msg":"hi"}"#),
            FromWorker::Handle { returned: false }
        );
    }

    #[test]
    fn the_apps_own_messages_and_garbage_are_not_errors() {
        assert_eq!(parse(br#""ready""#), FromWorker::App(json!("ready")));
        assert_eq!(
            parse(br#"{"cmd":"NODE"}"#),
            FromWorker::App(json!({"cmd": "NODE"}))
        );
        assert_eq!(parse(b"{not json"), FromWorker::Unreadable);
        assert_eq!(parse(b""), FromWorker::Unreadable);
        // A queryServer without a seq cannot be answered; it is not an app message.
        assert_eq!(
            parse(br#"{"cmd":"NODE_CLUSTER","act":"queryServer","port":1,"addressType":4}"#),
            FromWorker::OtherInternal
        );
    }

    #[test]
    fn the_answer_names_the_port_the_app_asked_for() {
        let FromWorker::QueryServer(q) = parse(
            br#"{"cmd":"NODE_CLUSTER","act":"queryServer","index":0,"data":{"k":1},"address":"::","port":8000,"addressType":6,"seq":5}"#,
        ) else {
            panic!()
        };
        let body = cluster(2, listening_without_socket(&q));
        assert_eq!(body["ack"], json!(5));
        assert_eq!(body["seq"], json!(2));
        assert_eq!(body["errno"], json!(0));
        assert_eq!(body["data"], json!({"k": 1}));
        assert_eq!(
            body["sockname"],
            json!({"address": "::", "family": "IPv6", "port": 8000})
        );
    }
}
