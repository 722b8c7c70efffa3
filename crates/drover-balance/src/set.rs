//! An immutable snapshot of the endpoints a balancer chooses from.

use crate::endpoint::Endpoint;
use crate::idle_turns::IdleTurns;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

/// A snapshot of membership. The registry swaps in a new one (with `arc-swap`) when
/// membership changes; the hot path only reads. Each snapshot has a unique generation so
/// strategies can cache derived tables (Maglev) per snapshot.
#[derive(Debug, Default)]
pub struct EndpointSet {
    endpoints: Vec<Arc<Endpoint>>,
    generation: u64,
    /// The largest weight when the snapshot was made (the pool swaps in a new snapshot
    /// when a weight changes), for draws that accept in proportion to weight.
    max_weight: u32,
    /// How many of the members a supervisor runs here are not in the snapshot: workers
    /// starting or restarting (0 for a pool nothing supervises).
    awaited: usize,
    /// Whose turn it is among the idle members; shared with the snapshots before and
    /// after it, so a change of membership does not restart the turns.
    idle_turns: Arc<IdleTurns>,
    /// Where each address is in `endpoints`, made at the first `find` of a large set.
    index: OnceLock<HashMap<SocketAddr, usize>>,
}

/// Up to this many endpoints `find` scans them: quicker than hashing for the few most
/// balancers have.
const SCAN_UP_TO: usize = 16;

static GENERATIONS: AtomicU64 = AtomicU64::new(1);

impl EndpointSet {
    pub fn new(endpoints: Vec<Arc<Endpoint>>) -> Self {
        EndpointSet {
            max_weight: endpoints.iter().map(|e| e.weight()).max().unwrap_or(1),
            endpoints,
            generation: GENERATIONS.fetch_add(1, Relaxed),
            awaited: 0,
            idle_turns: Arc::default(),
            index: OnceLock::new(),
        }
    }

    /// The same snapshot, saying that `awaited` more members are on their way.
    pub fn awaiting(self, awaited: usize) -> Self {
        EndpointSet { awaited, ..self }
    }

    /// This snapshot's members and generation (tables derived from them stay valid),
    /// with `awaited` more members on their way.
    pub fn now_awaiting(&self, awaited: usize) -> Self {
        EndpointSet {
            endpoints: self.endpoints.clone(),
            generation: self.generation,
            max_weight: self.max_weight,
            awaited,
            idle_turns: self.idle_turns.clone(),
            index: self.index.clone(),
        }
    }

    /// The same snapshot, taking turns among idle members where `previous` left off
    /// (see `idle_turns`): with turns restarted, a member added now would take one
    /// turn after another until it caught up with the others.
    pub fn taking_turns_after(self, previous: &EndpointSet) -> Self {
        EndpointSet {
            idle_turns: previous.idle_turns.clone(),
            ..self
        }
    }

    /// How many members a supervisor runs here are not in it yet: workers starting, or
    /// restarting.
    pub fn awaited(&self) -> usize {
        self.awaited
    }

    /// Whose turn it is among the idle members (see `idle_turns`).
    pub fn idle_turns(&self) -> &IdleTurns {
        &self.idle_turns
    }

    /// The largest endpoint weight in the snapshot (1 when empty).
    pub fn max_weight(&self) -> u32 {
        self.max_weight
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

    /// The endpoint at `addr`. A pool of thousands of registered members is looked up
    /// once per member on every change (to keep each one's state), and a scan made
    /// that n² per registration: 4,000 members took 35 s to register.
    pub fn find(&self, addr: SocketAddr) -> Option<&Arc<Endpoint>> {
        if self.endpoints.len() <= SCAN_UP_TO {
            return self.endpoints.iter().find(|e| e.addr() == addr);
        }
        let index = self.index.get_or_init(|| {
            let mut index = HashMap::with_capacity(self.endpoints.len());
            for (i, e) in self.endpoints.iter().enumerate() {
                // The first of an address, as a scan finds it.
                index.entry(e.addr()).or_insert(i);
            }
            index
        });
        index.get(&addr).map(|&i| &self.endpoints[i])
    }
}
