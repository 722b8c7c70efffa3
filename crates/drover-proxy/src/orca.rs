//! Backend load reports in Envoy's ORCA text form:
//! `endpoint-load-metrics: TEXT cpu_utilization=0.42, named_metrics.elu=0.91`.

/// The response header a backend reports its load in; drover removes it.
pub const HEADER: &str = "endpoint-load-metrics";

/// The utilisation a TEXT report describes: the highest of `application_utilization`,
/// `cpu_utilization` and `named_metrics.elu` (Node's event-loop utilisation, the
/// figure that best predicts queueing in a single-threaded backend). `None` for other
/// formats or a report without those fields.
pub fn parse_text(value: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(value).ok()?.trim();
    let fields = text.strip_prefix("TEXT ")?;
    fields
        .split(',')
        .filter_map(|kv| kv.trim().split_once('='))
        .filter(|(k, _)| {
            matches!(
                *k,
                "application_utilization" | "cpu_utilization" | "named_metrics.elu"
            )
        })
        .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v >= 0.0)
        .reduce(f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_text_reports() {
        assert_eq!(
            parse_text(b"TEXT cpu_utilization=0.42, named_metrics.elu=0.91"),
            Some(0.91)
        );
        assert_eq!(parse_text(b"TEXT cpu_utilization=0.3"), Some(0.3));
        assert_eq!(parse_text(b"TEXT rps_fractional=10"), None);
        assert_eq!(parse_text(b"JSON {\"cpu_utilization\": 0.3}"), None);
        assert_eq!(
            parse_text(b"TEXT cpu_utilization=-1, cpu_utilization=NaN"),
            None
        );
        assert_eq!(parse_text(b"\xff"), None);
    }
}
