//! Durations and sizes as people write them, parsed the same way wherever drover reads
//! one: a flag of any command (`drover bench -d 10s` as `drover proxy
//! --connect-timeout 10s`), a `drover.toml` value, an admin body's TTL, an `--slo`.
//!
//! Durations are humantime's grammar (`250ms`, `1.5s`, `1m 30s`, `2h`): the well-kept
//! crate already does it, so only the messages are drover's. A bare number is refused,
//! `0` aside: nginx reads `10` as seconds and HAProxy as milliseconds, so a unit is the
//! only way to say which.

use std::fmt;
use std::time::Duration;

/// What is wrong with a value, in words that name it and show a valid one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitError(String);

impl fmt::Display for UnitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UnitError {}

/// `250ms`, `2s`, `1.5s`, `1m 30s`, `100us`; `0` is zero.
pub fn duration(s: &str) -> Result<Duration, UnitError> {
    let t = s.trim();
    if t != "0" && !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(UnitError(format!(
            "invalid duration {s:?}: a number needs a unit, e.g. \"{t}s\" or \"{t}ms\""
        )));
    }
    humantime::parse_duration(t).map_err(|e| {
        UnitError(format!(
            "invalid duration {s:?} ({e}): expected e.g. \"250ms\", \"2s\" or \"1m\""
        ))
    })
}

/// A duration above zero.
pub fn positive_duration(s: &str) -> Result<Duration, UnitError> {
    match duration(s)? {
        d if d.is_zero() => Err(UnitError(format!(
            "invalid duration {s:?}: must be greater than 0"
        ))),
        d => Ok(d),
    }
}

/// A timeout above zero, or `off` (`None`): no limit of its own.
pub fn timeout_or_off(s: &str) -> Result<Option<Duration>, UnitError> {
    if s.trim() == "off" {
        return Ok(None);
    }
    positive_duration(s)
        .map(Some)
        .map_err(|e| UnitError(format!("{e}, or \"off\"")))
}

/// A size in bytes: a whole number, or a number with a unit: `512M`, `512MB`, `512MiB`,
/// `1.5G`, `800k`. Binary units (as `ps` and `top` show RSS), so `M` and `MB` both mean
/// MiB. Hand-written: the unit list is short, and a crate would bring its own idea of
/// what `MB` means.
pub fn byte_size(s: &str) -> Result<u64, UnitError> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| {
        UnitError(format!(
            "invalid size {s:?}: expected e.g. 512M, 2G or a number of bytes"
        ))
    })?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => {
            return Err(UnitError(format!(
                "invalid size {s:?}: unknown unit {other:?} (use K, M or G)"
            )))
        }
    };
    let bytes = value * mult as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(UnitError(format!("invalid size {s:?}: too large")));
    }
    Ok(bytes as u64)
}

/// `n` things as a person writes them: "1 worker", "2 workers", "0 backends".
pub fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units_and_refuse_bare_numbers() {
        let ok = |s| duration(s).unwrap();
        assert_eq!(ok("10s"), Duration::from_secs(10));
        assert_eq!(ok("1.5s"), Duration::from_millis(1500));
        assert_eq!(ok("250ms"), Duration::from_millis(250));
        assert_eq!(ok("2m"), Duration::from_secs(120));
        assert_eq!(ok("1m 30s"), Duration::from_secs(90));
        assert_eq!(ok("100us"), Duration::from_micros(100));
        assert_eq!(ok(" 5s "), Duration::from_secs(5));
        assert_eq!(ok("0"), Duration::ZERO);
        let err = |s| duration(s).unwrap_err().to_string();
        assert!(
            err("10").contains("a number needs a unit, e.g. \"10s\""),
            "{}",
            err("10")
        );
        assert!(err("1.5").contains("needs a unit"));
        assert!(err("ten").contains("invalid duration \"ten\""));
        assert!(err("5x").contains("expected e.g. \"250ms\""));
        assert!(err("-1s").contains("invalid duration"));
        assert!(err("").contains("invalid duration"));
        assert_eq!(timeout_or_off("off").unwrap(), None);
        assert_eq!(
            timeout_or_off("2m").unwrap(),
            Some(Duration::from_secs(120))
        );
        assert!(timeout_or_off("0s")
            .unwrap_err()
            .to_string()
            .ends_with("must be greater than 0, or \"off\""));
        assert!(timeout_or_off("none")
            .unwrap_err()
            .to_string()
            .contains("or \"off\""));
        assert!(positive_duration("0s")
            .unwrap_err()
            .to_string()
            .contains("greater than 0"));
        assert_eq!(positive_duration("1ms").unwrap(), Duration::from_millis(1));
    }

    #[test]
    fn sizes_take_binary_units() {
        assert_eq!(byte_size("1.5G"), Ok(3 << 29));
        assert_eq!(byte_size("800k"), Ok(800 << 10));
        assert_eq!(byte_size("512MiB"), Ok(512 << 20));
        assert_eq!(byte_size("1048576"), Ok(1 << 20));
        assert!(byte_size("M")
            .unwrap_err()
            .to_string()
            .contains("invalid size"));
        assert!(byte_size("5T")
            .unwrap_err()
            .to_string()
            .contains("unknown unit \"t\""));
        assert!(byte_size("1e30G").is_err());
    }

    #[test]
    fn counts_say_one_thing_or_many() {
        assert_eq!(count(1, "worker"), "1 worker");
        assert_eq!(count(0, "backend"), "0 backends");
        assert_eq!(count(8, "worker"), "8 workers");
    }
}
