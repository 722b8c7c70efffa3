//! Messages between an app's workers that Node's cluster module would pass through the
//! app's own primary: socket.io's cluster adapter (`@socket.io/cluster-adapter`).
//!
//! A socket.io app on several workers delivers `io.emit(...)` (and rooms,
//! `fetchSockets`, `serverSideEmit`) only to the clients of the worker that sends it,
//! unless an adapter carries it to the others. The cluster adapter's workers
//! `process.send` each packet with `source: "_sio_adapter"`, and the primary's
//! `setupPrimary()` sends it on to the other workers. Under drover, drover is the
//! primary: an app whose workers use the adapter needs no primary code, and a message
//! from one worker goes to every other worker of the app. (The primary sends a response
//! to its requester alone; the others drop a response whose request is not theirs, so
//! sending it to all is the same to the app.)

use serde_json::Value;
use std::sync::Arc;
use tokio::sync::broadcast;

/// `source` of the cluster adapter's messages.
const ADAPTER_SOURCE: &str = "_sio_adapter";

/// Messages not yet sent on to a slow worker; past this many, it misses the oldest
/// (as a worker whose IPC channel fills up would under Node's primary).
const BACKLOG: usize = 4096;

/// One app's relay; cheap to clone, one per session.
#[derive(Clone)]
pub struct Relay {
    tx: broadcast::Sender<(u64, Arc<Value>)>,
}

impl Default for Relay {
    fn default() -> Self {
        Relay {
            tx: broadcast::channel(BACKLOG).0,
        }
    }
}

impl Relay {
    /// What the other sessions of the app publish.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<(u64, Arc<Value>)> {
        self.tx.subscribe()
    }

    /// Sends `message` from session `from` to every other session of the app, if it is
    /// one to relay; true when it is.
    pub(crate) fn publish(&self, from: u64, message: &Value) -> bool {
        if message.get("source").and_then(Value::as_str) != Some(ADAPTER_SOURCE) {
            return false;
        }
        // No receiver (one worker): nothing to do.
        let _ = self.tx.send((from, Arc::new(message.clone())));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_the_adapters_messages_go_to_the_others() {
        let relay = Relay::default();
        let mut a = relay.subscribe();
        let packet = json!({"source": "_sio_adapter", "type": 3, "nsp": "/", "uid": "x"});
        assert!(relay.publish(1, &packet));
        assert!(!relay.publish(1, &json!({"source": "other"})));
        assert!(!relay.publish(1, &json!("ready")));
        let (from, got) = a.try_recv().unwrap();
        assert_eq!((from, &*got), (1, &packet));
        assert!(a.try_recv().is_err());
    }
}
