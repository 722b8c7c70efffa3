//! `x-request-id` values for requests that come without one.

use std::cell::Cell;

thread_local! {
    // Per-thread counter from a random start: unique enough for tracing a request
    // across logs, and needs no shared atomic on the hot path.
    static NEXT: Cell<u64> = Cell::new(fastrand::u64(..));
}

/// Appends a new 16-hex-digit request id to `out`.
pub fn write_new(out: &mut Vec<u8>) {
    let id = NEXT.with(|n| {
        let id = n.get();
        n.set(id.wrapping_add(0x9e37_79b9_7f4a_7c15));
        id
    });
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for shift in (0..16).rev() {
        out.push(HEX[((id >> (shift * 4)) & 0xf) as usize]);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_differ() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        super::write_new(&mut a);
        super::write_new(&mut b);
        assert_eq!(a.len(), 16);
        assert_ne!(a, b);
    }
}
