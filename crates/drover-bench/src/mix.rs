//! Request mix: which path each request asks for.
//!
//! `--path /x` is a mix of one entry. `--mix "90:/cheap,10:/expensive"` picks a path per
//! request at random with the given weights, from a seeded generator so runs repeat.

use std::fmt;

/// One weighted path of a [`Mix`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MixEntry {
    pub weight: u32,
    pub path: String,
}

/// A weighted set of request paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mix {
    entries: Vec<MixEntry>,
    /// Running sums of the weights, same order as `entries`.
    cumulative: Vec<u64>,
}

/// Why a mix specification was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MixError {
    Empty,
    BadWeight(String),
    ZeroWeight(String),
    BadPath(String),
    Duplicate(String),
}

impl fmt::Display for MixError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MixError::Empty => write!(f, "mix is empty; expected e.g. \"90:/cheap,10:/expensive\""),
            MixError::BadWeight(s) => write!(f, "mix entry {s:?}: weight is not a whole number"),
            MixError::ZeroWeight(s) => write!(f, "mix entry {s:?}: weight must be at least 1"),
            MixError::BadPath(s) => write!(
                f,
                "mix entry {s:?}: path must start with '/' and contain no spaces or control characters"
            ),
            MixError::Duplicate(p) => write!(f, "mix names path {p:?} twice"),
        }
    }
}

impl std::error::Error for MixError {}

/// True when `path` can be put on a request line as is.
pub fn valid_path(path: &str) -> bool {
    path.starts_with('/') && path.bytes().all(|b| b > b' ' && b != 0x7f)
}

impl Mix {
    /// A mix that always asks for `path`.
    pub fn single(path: &str) -> Result<Mix, MixError> {
        if !valid_path(path) {
            return Err(MixError::BadPath(path.to_string()));
        }
        Ok(Mix {
            entries: vec![MixEntry {
                weight: 1,
                path: path.to_string(),
            }],
            cumulative: vec![1],
        })
    }

    /// Parses `"W:/path,W:/path,..."`. An entry without `W:` has weight 1.
    pub fn parse(spec: &str) -> Result<Mix, MixError> {
        let mut entries: Vec<MixEntry> = Vec::new();
        for raw in spec.split(',') {
            let item = raw.trim();
            if item.is_empty() {
                continue;
            }
            let (weight, path) = match item.split_once(':') {
                Some((w, p)) if !w.trim().starts_with('/') => {
                    let w = w.trim();
                    let weight: u32 = w
                        .parse()
                        .map_err(|_| MixError::BadWeight(item.to_string()))?;
                    if weight == 0 {
                        return Err(MixError::ZeroWeight(item.to_string()));
                    }
                    (weight, p.trim())
                }
                _ => (1, item),
            };
            if !valid_path(path) {
                return Err(MixError::BadPath(item.to_string()));
            }
            if entries.iter().any(|e| e.path == path) {
                return Err(MixError::Duplicate(path.to_string()));
            }
            entries.push(MixEntry {
                weight,
                path: path.to_string(),
            });
        }
        if entries.is_empty() {
            return Err(MixError::Empty);
        }
        let mut sum = 0u64;
        let cumulative = entries
            .iter()
            .map(|e| {
                sum += u64::from(e.weight);
                sum
            })
            .collect();
        Ok(Mix {
            entries,
            cumulative,
        })
    }

    pub fn entries(&self) -> &[MixEntry] {
        &self.entries
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Sum of all weights.
    pub fn total_weight(&self) -> u64 {
        self.cumulative.last().copied().unwrap_or(0)
    }

    /// Index of the entry to use for the next request.
    pub fn pick(&self, rng: &mut fastrand::Rng) -> usize {
        if self.entries.len() == 1 {
            return 0;
        }
        let x = rng.u64(0..self.total_weight());
        // First entry whose running sum exceeds x.
        self.cumulative.partition_point(|&c| c <= x)
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.entries.len() == 1 {
            return f.write_str(&self.entries[0].path);
        }
        for (i, e) in self.entries.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}:{}", e.weight, e.path)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_weighted_entries() {
        let m = Mix::parse("90:/cheap, 10:/expensive").unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m.entries()[0].weight, 90);
        assert_eq!(m.entries()[0].path, "/cheap");
        assert_eq!(m.entries()[1].weight, 10);
        assert_eq!(m.entries()[1].path, "/expensive");
        assert_eq!(m.total_weight(), 100);
        assert_eq!(m.to_string(), "90:/cheap,10:/expensive");
    }

    #[test]
    fn entry_without_weight_counts_once_and_paths_may_hold_colons() {
        let m = Mix::parse("/a,3:/b?x=1:2").unwrap();
        assert_eq!(m.entries()[0].weight, 1);
        assert_eq!(m.entries()[0].path, "/a");
        assert_eq!(m.entries()[1].weight, 3);
        assert_eq!(m.entries()[1].path, "/b?x=1:2");
    }

    #[test]
    fn rejects_bad_specs() {
        assert_eq!(Mix::parse(""), Err(MixError::Empty));
        assert_eq!(Mix::parse(" , "), Err(MixError::Empty));
        assert!(matches!(Mix::parse("x:/a"), Err(MixError::BadWeight(_))));
        assert!(matches!(Mix::parse("-1:/a"), Err(MixError::BadWeight(_))));
        assert!(matches!(Mix::parse("0:/a"), Err(MixError::ZeroWeight(_))));
        assert!(matches!(Mix::parse("5:a"), Err(MixError::BadPath(_))));
        assert!(matches!(Mix::parse("5:/a b"), Err(MixError::BadPath(_))));
        assert!(matches!(
            Mix::parse("5:/a\r\nX: y"),
            Err(MixError::BadPath(_))
        ));
        assert!(matches!(
            Mix::parse("1:/a,2:/a"),
            Err(MixError::Duplicate(_))
        ));
        assert!(Mix::single("nope").is_err());
    }

    #[test]
    fn pick_follows_weights_and_repeats_with_seed() {
        let m = Mix::parse("90:/cheap,10:/expensive").unwrap();
        let mut rng = fastrand::Rng::with_seed(7);
        let mut counts = [0u32; 2];
        for _ in 0..100_000 {
            counts[m.pick(&mut rng)] += 1;
        }
        // 10 % ± 0.5 % (≈ 5 standard deviations).
        assert!((9_500..=10_500).contains(&counts[1]), "{counts:?}");

        let seq = |seed| {
            let mut rng = fastrand::Rng::with_seed(seed);
            (0..64).map(|_| m.pick(&mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(seq(42), seq(42));
    }

    #[test]
    fn pick_boundaries() {
        let m = Mix::parse("1:/a,1:/b,2:/c").unwrap();
        let mut rng = fastrand::Rng::with_seed(1);
        let mut seen = [false; 3];
        for _ in 0..1000 {
            seen[m.pick(&mut rng)] = true;
        }
        assert_eq!(seen, [true, true, true]);
        let single = Mix::single("/").unwrap();
        assert_eq!(single.pick(&mut rng), 0);
    }
}
