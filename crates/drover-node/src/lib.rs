//! Node.js's cluster protocol, primary side.
//!
//! A Node app run by `node app.js` listens where it likes: a fixed port, one from argv,
//! or `PORT`. Under Node's cluster module (and PM2's cluster mode) that works for any
//! number of workers because a worker's `listen()` is not a `bind()`: the worker asks its
//! primary over the IPC channel (`queryServer`), and the primary answers. drover speaks
//! the primary's side of that conversation, so an unmodified app runs as N workers.
//!
//! A worker started with `NODE_UNIQUE_ID` and `NODE_CHANNEL_FD` (see [`channel_env`]; a
//! package manager's or tsx's app through a preload, [`runner_env`]) becomes a cluster worker at
//! startup. Its `listen(port)` then reaches
//! [`Session::run`], which answers the way Node's own primary does in its round-robin
//! mode: "listening" without a socket, with the address the app asked for. The
//! connections then arrive as handles (`newconn`, an fd passed by `SCM_RIGHTS`): drover
//! accepts them on the worker's own loopback port and hands each one over.
//!
//! A port the worker listens on after its first (a metrics server's) is bound once for
//! all the app's workers and shared among them as Node's primary shares every port
//! ([`SharedPorts`]): drover balances the first port by load, and hands the others'
//! connections to each worker in turn.
//!
//! Retiring a worker that serves clients directly (a reload, a scale-down) would close
//! their keep-alive connections, and a request sent at that moment would fail. So
//! drover's preload in the worker ([`channel_env`]) gives each one back between two
//! requests when drover asks ([`Inbox::give_back_connections`]), as a handle on the
//! same channel, and drover serves it from there on.
//!
//! The wire format (JSON lines, one handle at a time, each acknowledged) is Node's
//! `lib/internal/child_process.js`; the messages are `lib/internal/cluster/*.js`. Both
//! have been stable since Node 0.12, and the tests run them under Debian's Node 18 and
//! the machine's own.

mod channel;
#[doc(hidden)]
pub mod fuzzing;
mod inspector;
mod launch;
mod message;
mod node_command;
mod relay;
mod session;
mod shared_ports;

pub use channel::ChannelError;
pub use inspector::with_inspector_port;
pub use launch::{
    app_port_env, channel_env, head_limit_env, is_node_program, is_node_wrapper_name,
    is_other_js_runtime, is_script_runner, port_env, preload_env, preload_path, runner_env,
    shared_socket_env, starts_node, unix_sockets_env, write_preload,
};
pub use message::{parse, AddressType, FromWorker, Served, ServerQuery, Speaks};
pub use node_command::watch_mode_option;
pub use relay::Relay;
pub use session::{Ended, Inbox, Session, SessionEvent};
pub use shared_ports::{Place, SharedPorts};
