//! Numbers as people read them in a report: microseconds and bytes, each in the unit
//! that suits it. Every report view (text, HTML, compare, admin) writes with these, so
//! they sit below all of them.

/// Microseconds, in the unit that suits them.
pub fn fmt_us(v: u64) -> String {
    fmt_us_f(v as f64)
}

/// Like [`fmt_us`], for a fractional value (a mean, an objective's threshold).
pub fn fmt_us_f(v: f64) -> String {
    if v >= 10_000_000.0 {
        format!("{:.2}s", v / 1e6)
    } else if v >= 10_000.0 {
        format!("{:.1}ms", v / 1000.0)
    } else if v >= 1000.0 {
        format!("{:.2}ms", v / 1000.0)
    } else {
        format!("{v:.0}µs")
    }
}

/// A request rate: whole numbers from 10 req/s up, the fraction below (`--rate 0.5`).
pub fn fmt_rate(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// Bytes with a binary unit, as wrk prints them.
pub fn fmt_bytes(v: f64) -> String {
    const UNITS: [&str; 4] = ["KB", "MB", "GB", "TB"];
    if v < 1024.0 {
        return format!("{v:.0}B");
    }
    let mut x = v / 1024.0;
    let mut unit = 0;
    while x >= 1024.0 && unit < UNITS.len() - 1 {
        x /= 1024.0;
        unit += 1;
    }
    format!("{x:.2}{}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(fmt_us(999), "999µs");
        assert_eq!(fmt_us(1500), "1.50ms");
        assert_eq!(fmt_us(25_000), "25.0ms");
        assert_eq!(fmt_us(12_000_000), "12.00s");
        assert_eq!(fmt_bytes(512.0), "512B");
        assert_eq!(fmt_bytes(1536.0), "1.50KB");
        assert_eq!(fmt_bytes(3.0 * 1024.0 * 1024.0), "3.00MB");
    }
}
