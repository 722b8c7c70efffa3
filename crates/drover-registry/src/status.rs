//! HTTP status ranges, shared by active checks (what counts as up) and passive health
//! (what counts as a failure).

use std::fmt;

/// An inclusive range of HTTP status codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusRange {
    pub lo: u16,
    pub hi: u16,
}

impl StatusRange {
    /// `lo..=hi`; the bounds are swapped when given backwards.
    pub const fn new(lo: u16, hi: u16) -> Self {
        if lo <= hi {
            StatusRange { lo, hi }
        } else {
            StatusRange { lo: hi, hi: lo }
        }
    }

    /// Exactly one code.
    pub const fn exact(code: u16) -> Self {
        StatusRange { lo: code, hi: code }
    }

    /// 2xx and 3xx: what nginx and HAProxy accept from a health check by default (a
    /// redirect still proves the application is up).
    pub const SUCCESS: StatusRange = StatusRange::new(200, 399);

    /// Every 5xx.
    pub const SERVER_ERROR: StatusRange = StatusRange::new(500, 599);

    pub const fn contains(&self, code: u16) -> bool {
        self.lo <= code && code <= self.hi
    }
}

impl Default for StatusRange {
    fn default() -> Self {
        StatusRange::SUCCESS
    }
}

impl fmt::Display for StatusRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.lo == self.hi {
            write!(f, "{}", self.lo)
        } else {
            write!(f, "{}-{}", self.lo, self.hi)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert!(StatusRange::default().contains(200));
        assert!(StatusRange::default().contains(399));
        assert!(!StatusRange::default().contains(400));
        assert!(StatusRange::exact(204).contains(204));
        assert!(!StatusRange::exact(204).contains(200));
        assert_eq!(StatusRange::new(599, 500), StatusRange::SERVER_ERROR);
        assert_eq!(StatusRange::new(200, 299).to_string(), "200-299");
        assert_eq!(StatusRange::exact(200).to_string(), "200");
    }
}
