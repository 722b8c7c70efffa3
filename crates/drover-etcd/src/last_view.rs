//! The members a pool keeps when etcd suddenly lists none.
//!
//! A registry that empties all at once is more likely broken than every app gone: auth
//! switched on before the apps had a user (their heartbeats fail, and every lease
//! lapses within one TTL), an etcd restored or rebuilt with an empty data directory, a
//! partition that outlasted the leases. drover applied the empty list, and every
//! balancer on the prefix answered `503 no-healthy-endpoint` to everything at once:
//! 121,606 failed requests in 17 s on one balancer when auth was switched on, 35,714
//! (median of 3) when etcd came back empty, where nginx fed by confd kept its last
//! upstreams (confd's read failed; `nginx -t` refused an empty upstream) and failed
//! none (multi-machine seat).
//!
//! So while etcd lists no member, the pool serves the members etcd listed within
//! `RECENT` before it emptied (leases lapse one by one, over up to a TTL), until etcd
//! lists any member again; then etcd's list applies as it is. A member that is truly
//! gone is found by the balancer's own health (connect failures eject it) as any dead
//! member is; one drained through any balancer, which marks its value `draining` before
//! it deletes it (`MemberValue::draining`), is not kept.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How long a member etcd listed stays among those kept if etcd then lists none: the
/// longest TTL the apps use is about this, so a prefix whose leases lapse one after
/// the other is kept whole.
pub(crate) const RECENT: Duration = Duration::from_secs(60);

/// The members etcd listed lately, and whether they are being kept now.
#[derive(Debug, Default)]
pub(crate) struct LastView {
    /// Each member etcd listed within `RECENT`: its weight, and when it was last listed.
    recent: BTreeMap<SocketAddr, (u32, Instant)>,
    /// How many members are kept while etcd lists none (0: etcd's list applies).
    kept: usize,
}

/// What the pool serves after a change of etcd's list.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Serve {
    pub members: Vec<(SocketAddr, u32)>,
    /// Keeping started (`Some(n)`, n members) or ended (`Some(0)`) with this change.
    pub turned: Option<usize>,
}

impl LastView {
    /// A member that left on purpose: it is not kept.
    pub(crate) fn forget(&mut self, addr: SocketAddr) {
        self.recent.remove(&addr);
    }

    /// The members to serve now that etcd lists `listed`, at `now`.
    pub(crate) fn serve(&mut self, listed: Vec<(SocketAddr, u32)>, now: Instant) -> Serve {
        if listed.is_empty() {
            // Frozen while etcd lists none: no member ages out of what is kept.
            let members: Vec<(SocketAddr, u32)> =
                self.recent.iter().map(|(a, (w, _))| (*a, *w)).collect();
            let was = std::mem::replace(&mut self.kept, members.len());
            return Serve {
                turned: (was != members.len()).then_some(members.len()),
                members,
            };
        }
        self.recent
            .retain(|_, (_, seen)| now.saturating_duration_since(*seen) <= RECENT);
        for (addr, weight) in &listed {
            self.recent.insert(*addr, (*weight, now));
        }
        let was = std::mem::take(&mut self.kept);
        Serve {
            members: listed,
            turned: (was > 0).then_some(0),
        }
    }

    /// How many members are kept while etcd lists none.
    pub(crate) fn kept(&self) -> usize {
        self.kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn members_that_lapse_one_by_one_are_all_kept_once_none_is_left() {
        let mut view = LastView::default();
        let t0 = Instant::now();
        let all = vec![(at(1), 1), (at(2), 2), (at(3), 1)];
        assert_eq!(view.serve(all.clone(), t0).members, all);
        // Leases lapse a few seconds apart: the list shrinks as etcd says.
        let two = vec![(at(2), 2), (at(3), 1)];
        let s = view.serve(two.clone(), t0 + Duration::from_secs(3));
        assert_eq!((s.members, s.turned), (two, None));
        let s = view.serve(vec![(at(3), 1)], t0 + Duration::from_secs(5));
        assert_eq!(s.members, [(at(3), 1)]);
        // None left: the three are kept, and stay kept however long etcd lists none.
        let s = view.serve(vec![], t0 + Duration::from_secs(8));
        assert_eq!((s.members, s.turned), (all.clone(), Some(3)));
        let s = view.serve(vec![], t0 + Duration::from_secs(600));
        assert_eq!((s.members, s.turned), (all, None));
        assert_eq!(view.kept(), 3);
        // etcd lists one again: its list applies as it is.
        let back = vec![(at(4), 1)];
        let s = view.serve(back.clone(), t0 + Duration::from_secs(601));
        assert_eq!((s.members, s.turned), (back, Some(0)));
        assert_eq!(view.kept(), 0);
    }

    #[test]
    fn a_member_listed_long_before_or_drained_is_not_kept() {
        let mut view = LastView::default();
        let t0 = Instant::now();
        view.serve(vec![(at(1), 1), (at(2), 1)], t0);
        // Member 1 left long ago; member 2 was listed until now; member 3 was drained.
        let later = t0 + RECENT + Duration::from_secs(10);
        view.serve(vec![(at(2), 1), (at(3), 1)], later);
        view.forget(at(3));
        let s = view.serve(vec![], later + Duration::from_secs(1));
        assert_eq!(s.members, [(at(2), 1)]);
        // A balancer that never had a member keeps none.
        let mut fresh = LastView::default();
        let s = fresh.serve(vec![], t0);
        assert_eq!((s.members, s.turned), (vec![], None));
    }
}
