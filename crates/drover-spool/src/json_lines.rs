//! drover's stderr as one JSON object a line (`--log-format json`), for what reads fields
//! rather than prefixes: Loki, Fluent Bit, Vector, CloudWatch, `docker logs | jq`. Every
//! line has a `timestamp` (RFC 3339, UTC, as tracing's JSON lines): drover's own log
//! (tracing's JSON form, its fields flattened), its messages (`eprintln!`) and each line a
//! worker writes, with the app, the worker and the stream it came on. In the text form
//! worker lines carry no time, as under PM2 without `--time`; journald and `docker logs`
//! stamp them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

static JSON: AtomicBool = AtomicBool::new(false);

/// From now on, drover's stderr lines are JSON objects: set once, at start, before any
/// line is written.
pub fn use_json_lines() {
    JSON.store(true, Ordering::Relaxed);
}

/// Whether drover's stderr lines are JSON objects.
pub fn json_lines() -> bool {
    JSON.load(Ordering::Relaxed)
}

/// A field of a JSON line beyond its time, level and message.
#[derive(Debug, Clone, Copy)]
pub enum Field<'a> {
    Str(&'a str),
    Num(u64),
}

/// Appends `{"timestamp":…,"level":…,…fields,"message":…}` and a newline to `out`; no
/// `level` where drover cannot tell one (a worker's line).
pub fn push_json_line(
    out: &mut Vec<u8>,
    level: Option<&str>,
    fields: &[(&str, Field<'_>)],
    message: &str,
) {
    let at = humantime::format_rfc3339_micros(SystemTime::now());
    out.extend_from_slice(format!("{{\"timestamp\":\"{at}\"").as_bytes());
    if let Some(level) = level {
        push_pair(out, "level", Field::Str(level));
    }
    for &(name, value) in fields {
        push_pair(out, name, value);
    }
    push_pair(out, "message", Field::Str(message));
    out.extend_from_slice(b"}\n");
}

fn push_pair(out: &mut Vec<u8>, name: &str, value: Field<'_>) {
    out.push(b',');
    push_string(out, name);
    out.push(b':');
    match value {
        Field::Str(s) => push_string(out, s),
        Field::Num(n) => out.extend_from_slice(n.to_string().as_bytes()),
    }
}

/// `s` as a JSON string: serde_json's escaping (control bytes as `\u00XX`, so a worker's
/// colour codes or a stray CR cannot break the line).
fn push_string(out: &mut Vec<u8>, s: &str) {
    // Writing a `str` into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// One of drover's own messages as a JSON line: `error: …` is an error, anything else
/// news (a listener up, a reload, a stop); the `drover: ` prefix of the text form goes.
pub fn message_line(text: &str) -> Vec<u8> {
    let (level, message) = match text.strip_prefix("error: ") {
        Some(rest) => ("ERROR", rest),
        None => ("INFO", text.strip_prefix("drover: ").unwrap_or(text)),
    };
    let mut out = Vec::with_capacity(text.len() + 64);
    push_json_line(&mut out, Some(level), &[], message);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_one_json_object_whatever_its_text() {
        let mut out = Vec::new();
        let nasty = "tab\there \"quoted\" \u{1b}[31mred\u{1b}[0m back\\slash\r";
        push_json_line(
            &mut out,
            None,
            &[
                ("app", Field::Str("web")),
                ("worker", Field::Num(3)),
                ("stream", Field::Str("stderr")),
            ],
            nasty,
        );
        assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 1);
        assert!(out.ends_with(b"}\n"));
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["message"], nasty);
        assert_eq!(
            (v["app"].as_str(), v["worker"].as_u64()),
            (Some("web"), Some(3))
        );
        assert!(v.get("level").is_none());
        let at = v["timestamp"].as_str().unwrap();
        assert!(humantime::parse_rfc3339(at).is_ok(), "{at}");
    }

    #[test]
    fn drovers_messages_say_their_level() {
        let v: serde_json::Value =
            serde_json::from_slice(&message_line("drover: app \"web\" starting 2 workers"))
                .unwrap();
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["message"], "app \"web\" starting 2 workers");
        let v: serde_json::Value =
            serde_json::from_slice(&message_line("error: port 80 in use")).unwrap();
        assert_eq!(
            (v["level"].as_str(), v["message"].as_str()),
            (Some("ERROR"), Some("port 80 in use"))
        );
    }
}
