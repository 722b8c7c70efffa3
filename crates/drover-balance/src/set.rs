//! An immutable snapshot of the endpoints a balancer chooses from.

use crate::endpoint::Endpoint;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// A snapshot of membership. The registry swaps in a new one (with `arc-swap`) when
/// membership changes; the hot path only reads. Each snapshot has a unique generation so
/// strategies can cache derived tables (Maglev) per snapshot.
#[derive(Debug, Default)]
pub struct EndpointSet {
    endpoints: Vec<Arc<Endpoint>>,
    generation: u64,
}

static GENERATIONS: AtomicU64 = AtomicU64::new(1);

impl EndpointSet {
    pub fn new(endpoints: Vec<Arc<Endpoint>>) -> Self {
        EndpointSet {
            endpoints,
            generation: GENERATIONS.fetch_add(1, Relaxed),
        }
    }

    pub fn endpoints(&self) -> &[Arc<Endpoint>] {
        &self.endpoints
    }

    pub fn len(&self) -> usize {
        self.endpoints.len()
    }

    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// Unique per snapshot, increasing.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn find(&self, addr: std::net::SocketAddr) -> Option<&Arc<Endpoint>> {
        self.endpoints.iter().find(|e| e.addr() == addr)
    }
}
