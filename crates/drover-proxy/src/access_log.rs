//! Access logs: one line per answered request, in Apache/nginx's combined format or as
//! JSON lines, per balancer; on a TCP balancer, one JSON line per connection
//! (`ConnectionRecord`).
//!
//! The request path never waits for the log. A serving thread formats the line into a
//! thread-local buffer and pushes it to the balancer's spool (`drover_spool`: a bounded
//! in-memory buffer under a mutex held for one copy); when that is full the line is
//! dropped and counted (`drover_access_log_dropped_total`). The spool's writer thread
//! writes what waits at least every `FLUSH_EVERY`, on `flush_all` (shutdown) and before
//! it reopens the file on `reopen_all` (SIGUSR1, after logrotate renamed it).

use drover_metrics::BalancerStats;
use drover_spool::{Options as SpoolOptions, Spool, WeakSpool};
use std::cell::RefCell;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// Most bytes of lines waiting for the writer, per balancer. At 100,000 requests/s of
/// 250-byte lines the writer takes 2.5 MB per `FLUSH_EVERY`: a disk that stalls for a
/// moment loses nothing, one that stalls for seconds costs lines, not requests.
pub const BUFFER_CAP: usize = 8 << 20;

/// The writer is woken early once this much waits, so its batches stay small.
const WAKE_AT: usize = 256 << 10;

/// How often the writer writes what waits, at least.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// `access_log.format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// No log (the default).
    #[default]
    Off,
    /// Apache/nginx's combined format, which GoAccess and most log tools read.
    Combined,
    /// One JSON object per line, with `fields`.
    Json,
}

impl Format {
    pub const NAMES: &'static str = "combined, json, off";
}

impl std::str::FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Format, String> {
        match s {
            "off" => Ok(Format::Off),
            "combined" => Ok(Format::Combined),
            "json" => Ok(Format::Json),
            _ => Err(format!(
                "unknown access log format {s:?}: expected one of {}",
                Format::NAMES
            )),
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Off => "off",
            Format::Combined => "combined",
            Format::Json => "json",
        })
    }
}

/// A field of a JSON line, in the order they are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Field {
    Time,
    Client,
    Method,
    Target,
    Protocol,
    Status,
    Bytes,
    DurationMs,
    UpstreamMs,
    QueueMs,
    Endpoint,
    Retries,
    Error,
    RequestId,
    UserAgent,
    Referer,
}

impl Field {
    pub const ALL: [Field; 16] = [
        Field::Time,
        Field::Client,
        Field::Method,
        Field::Target,
        Field::Protocol,
        Field::Status,
        Field::Bytes,
        Field::DurationMs,
        Field::UpstreamMs,
        Field::QueueMs,
        Field::Endpoint,
        Field::Retries,
        Field::Error,
        Field::RequestId,
        Field::UserAgent,
        Field::Referer,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Field::Time => "time",
            Field::Client => "client",
            Field::Method => "method",
            Field::Target => "target",
            Field::Protocol => "protocol",
            Field::Status => "status",
            Field::Bytes => "bytes",
            Field::DurationMs => "duration_ms",
            Field::UpstreamMs => "upstream_ms",
            Field::QueueMs => "queue_ms",
            Field::Endpoint => "endpoint",
            Field::Retries => "retries",
            Field::Error => "error",
            Field::RequestId => "request_id",
            Field::UserAgent => "user_agent",
            Field::Referer => "referer",
        }
    }

    /// `a,b,c` (the flag's form) as fields, in the order lines write them and without
    /// repeats; an unknown name is an error naming it.
    pub fn parse_list(s: &str) -> Result<Vec<Field>, String> {
        let mut fields = s
            .split(',')
            .map(|f| f.trim().parse())
            .collect::<Result<Vec<Field>, String>>()?;
        fields.sort();
        fields.dedup();
        Ok(fields)
    }
}

impl std::str::FromStr for Field {
    type Err = String;

    fn from_str(s: &str) -> Result<Field, String> {
        Field::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Field::ALL.iter().map(|f| f.name()).collect();
                format!(
                    "unknown access log field {s:?}: expected one of {}",
                    names.join(", ")
                )
            })
    }
}

/// Where the lines go: `-` is drover's stdout.
pub const STDOUT: &str = "-";

/// A balancer's `access_log` setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub format: Format,
    /// A file, opened for append (created if missing), or `-` for stdout.
    pub path: String,
    /// The JSON fields written, in `Field` order; default all.
    pub fields: Vec<Field>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            format: Format::Off,
            path: STDOUT.to_string(),
            fields: Field::ALL.to_vec(),
        }
    }
}

impl Settings {
    /// Opens the destination as the writer will, so that a path that cannot be
    /// appended to fails the start (and `drover check`) rather than the first line.
    pub fn check_path(&self) -> io::Result<()> {
        if self.format == Format::Off {
            return Ok(());
        }
        open(&self.path).map(drop)
    }
}

fn open(path: &str) -> io::Result<Box<dyn Write + Send>> {
    if path == STDOUT {
        return Ok(Box::new(io::stdout()));
    }
    let file: File = OpenOptions::new().create(true).append(true).open(path)?;
    Ok(Box::new(file))
}

// ---------------------------------------------------------------------------------------
// One request, as a line
// ---------------------------------------------------------------------------------------

/// What a line says about one request. Request fields are raw bytes as the client sent
/// them: they may be anything, and each format escapes them its own way.
#[derive(Debug, Clone, Default)]
pub struct Record<'a> {
    /// When the answer was done, since the Unix epoch.
    pub time: Duration,
    /// The client's address as text (the connection formats it once).
    pub client: Option<&'a str>,
    /// `None` for a request head drover could not parse: logged as `-`.
    pub method: Option<&'a [u8]>,
    pub target: Option<&'a [u8]>,
    /// `HTTP/1.1` or `HTTP/1.0`.
    pub protocol: Option<&'static str>,
    pub status: u16,
    /// Response bytes written to the client (head and body).
    pub bytes: u64,
    /// Of those, the body's: what the combined format logs, as nginx's
    /// `$body_bytes_sent` and Apache's `%b` (GoAccess's bandwidth reads it).
    pub body_bytes: u64,
    pub duration: Duration,
    /// From being bound to an endpoint to its response head; `None` without one.
    pub upstream: Option<Duration>,
    pub queue: Duration,
    pub endpoint: Option<SocketAddr>,
    pub retries: u32,
    /// The `drover-error` cause of drover's own answer.
    pub error: Option<&'static str>,
    pub request_id: Option<&'a [u8]>,
    pub user_agent: Option<&'a [u8]>,
    pub referer: Option<&'a [u8]>,
}

/// Appends `r` as a combined-format line (with its newline) to `out`:
/// `%h - - [%d/%b/%Y:%H:%M:%S %z] "%r" %>s %b "%{Referer}i" "%{User-Agent}i"`.
pub fn write_combined(out: &mut Vec<u8>, r: &Record<'_>) {
    out.extend_from_slice(r.client.unwrap_or("-").as_bytes());
    out.extend_from_slice(b" - - [");
    let t = Civil::from_unix(r.time.as_secs());
    const MONTHS: [&[u8; 3]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    push_padded(out, t.day as u64, 2);
    out.push(b'/');
    out.extend_from_slice(MONTHS[t.month as usize - 1]);
    out.push(b'/');
    push_padded(out, t.year as u64, 4);
    out.push(b':');
    t.push_time_of_day(out);
    out.extend_from_slice(b" +0000] \"");
    match (r.method, r.target) {
        (Some(method), Some(target)) => {
            escape_combined(out, method);
            out.push(b' ');
            escape_combined(out, target);
            out.push(b' ');
            out.extend_from_slice(r.protocol.unwrap_or("HTTP/1.1").as_bytes());
        }
        _ => out.push(b'-'),
    }
    out.extend_from_slice(b"\" ");
    push_padded(out, r.status as u64, 3);
    out.push(b' ');
    if r.body_bytes == 0 {
        out.push(b'-');
    } else {
        push_padded(out, r.body_bytes, 1);
    }
    for value in [r.referer, r.user_agent] {
        out.extend_from_slice(b" \"");
        match value {
            Some(v) => escape_combined(out, v),
            None => out.push(b'-'),
        }
        out.push(b'"');
    }
    out.push(b'\n');
}

/// As nginx escapes a logged value: `"`, `\` and bytes outside printable ASCII as
/// `\xHH`, so a line can hold no quote, newline or invalid UTF-8 of the client's.
fn escape_combined(out: &mut Vec<u8>, v: &[u8]) {
    for &b in v {
        if b == b'"' || b == b'\\' || !(0x20..0x7f).contains(&b) {
            out.extend_from_slice(b"\\x");
            out.push(HEX_UPPER[(b >> 4) as usize]);
            out.push(HEX_UPPER[(b & 0xf) as usize]);
        } else {
            out.push(b);
        }
    }
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

/// Appends `r` as one JSON object (with its newline) of `fields` to `out`.
pub fn write_json(out: &mut Vec<u8>, r: &Record<'_>, fields: &[Field]) {
    out.push(b'{');
    for (i, &field) in fields.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.push(b'"');
        out.extend_from_slice(field.name().as_bytes());
        out.extend_from_slice(b"\":");
        match field {
            Field::Time => push_time(out, r.time),
            Field::Client => json_string_or_null(out, r.client.map(str::as_bytes)),
            Field::Method => json_string_or_dash(out, r.method),
            Field::Target => json_string_or_dash(out, r.target),
            Field::Protocol => json_string_or_dash(out, r.protocol.map(str::as_bytes)),
            Field::Status => push_padded(out, r.status as u64, 1),
            Field::Bytes => push_padded(out, r.bytes, 1),
            Field::DurationMs => push_millis(out, r.duration),
            Field::UpstreamMs => match r.upstream {
                Some(d) => push_millis(out, d),
                None => out.extend_from_slice(b"null"),
            },
            Field::QueueMs => push_millis(out, r.queue),
            Field::Endpoint => push_endpoint(out, r.endpoint),
            Field::Retries => push_padded(out, r.retries as u64, 1),
            Field::Error => json_string_or_null(out, r.error.map(str::as_bytes)),
            Field::RequestId => json_string_or_null(out, r.request_id),
            Field::UserAgent => json_string_or_null(out, r.user_agent),
            Field::Referer => json_string_or_null(out, r.referer),
        }
    }
    out.extend_from_slice(b"}\n");
}

/// The fields of a TCP balancer's line, in the order they are written. Fixed: a
/// connection has none of a request's fields, and these few are all it has.
pub const TCP_FIELDS: &str = "time, client, endpoint, bytes_received, bytes_sent, duration_ms, queue_ms, connect_ms, retries, end, error";

/// What a line says about one TCP connection (`mode = "tcp"`), written when it ends.
#[derive(Debug, Clone, Default)]
pub struct ConnectionRecord<'a> {
    /// When the connection ended, since the Unix epoch.
    pub time: Duration,
    /// The client's IP address as text (the one a PROXY header named, if any).
    pub client: &'a str,
    /// The endpoint that took it; `None` when none did.
    pub endpoint: Option<SocketAddr>,
    /// Bytes from the client, relayed to the endpoint.
    pub received: u64,
    /// Bytes from the endpoint, relayed to the client.
    pub sent: u64,
    /// From accept to the end.
    pub duration: Duration,
    /// Waited for an endpoint under `max_conns`, over every try.
    pub queue: Duration,
    /// The connect to the endpoint that took it; `None` when none did.
    pub connect: Option<Duration>,
    pub retries: u32,
    /// How it ended: `done`, `idle`, `half-close`, `failed` or `unserved`.
    pub end: &'static str,
    /// Why no endpoint took it (`drover_tcp_unserved_total`'s cause).
    pub error: Option<&'static str>,
}

/// Appends `r` as one JSON object (with its newline) of `TCP_FIELDS` to `out`.
pub fn write_connection_json(out: &mut Vec<u8>, r: &ConnectionRecord<'_>) {
    out.extend_from_slice(b"{\"time\":");
    push_time(out, r.time);
    out.extend_from_slice(b",\"client\":");
    json_string(out, r.client.as_bytes());
    out.extend_from_slice(b",\"endpoint\":");
    push_endpoint(out, r.endpoint);
    out.extend_from_slice(b",\"bytes_received\":");
    push_padded(out, r.received, 1);
    out.extend_from_slice(b",\"bytes_sent\":");
    push_padded(out, r.sent, 1);
    out.extend_from_slice(b",\"duration_ms\":");
    push_millis(out, r.duration);
    out.extend_from_slice(b",\"queue_ms\":");
    push_millis(out, r.queue);
    out.extend_from_slice(b",\"connect_ms\":");
    match r.connect {
        Some(d) => push_millis(out, d),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"retries\":");
    push_padded(out, r.retries as u64, 1);
    out.extend_from_slice(b",\"end\":");
    json_string(out, r.end.as_bytes());
    out.extend_from_slice(b",\"error\":");
    json_string_or_null(out, r.error.map(str::as_bytes));
    out.extend_from_slice(b"}\n");
}

/// `"YYYY-MM-DDTHH:MM:SS.mmmZ"`.
fn push_time(out: &mut Vec<u8>, time: Duration) {
    let t = Civil::from_unix(time.as_secs());
    out.push(b'"');
    push_padded(out, t.year as u64, 4);
    out.push(b'-');
    push_padded(out, t.month as u64, 2);
    out.push(b'-');
    push_padded(out, t.day as u64, 2);
    out.push(b'T');
    t.push_time_of_day(out);
    out.push(b'.');
    push_padded(out, time.subsec_millis() as u64, 3);
    out.extend_from_slice(b"Z\"");
}

/// `"ip:port"`, or `null`.
fn push_endpoint(out: &mut Vec<u8>, endpoint: Option<SocketAddr>) {
    match endpoint {
        Some(addr) => {
            out.push(b'"');
            write_addr(out, addr);
            out.push(b'"');
        }
        None => out.extend_from_slice(b"null"),
    }
}

fn json_string_or_null(out: &mut Vec<u8>, v: Option<&[u8]>) {
    match v {
        Some(v) => json_string(out, v),
        None => out.extend_from_slice(b"null"),
    }
}

/// Method, target and protocol of a request head drover could not read are `"-"`, as
/// in the combined format.
fn json_string_or_dash(out: &mut Vec<u8>, v: Option<&[u8]>) {
    json_string(out, v.unwrap_or(b"-"));
}

/// A JSON string of bytes that may be anything: each invalid UTF-8 sequence becomes
/// U+FFFD (as `String::from_utf8_lossy` decides them), control characters `\u00XX`.
fn json_string(out: &mut Vec<u8>, v: &[u8]) {
    out.push(b'"');
    // Most values (paths, ids, user agents) need no escape: one copy.
    if v.iter()
        .all(|&b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
    {
        out.extend_from_slice(v);
        out.push(b'"');
        return;
    }
    for chunk in v.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '"' => out.extend_from_slice(b"\\\""),
                '\\' => out.extend_from_slice(b"\\\\"),
                '\n' => out.extend_from_slice(b"\\n"),
                '\r' => out.extend_from_slice(b"\\r"),
                '\t' => out.extend_from_slice(b"\\t"),
                c if (c as u32) < 0x20 || c == '\u{7f}' => {
                    let b = c as u8;
                    out.extend_from_slice(b"\\u00");
                    out.push(HEX_UPPER[(b >> 4) as usize]);
                    out.push(HEX_UPPER[(b & 0xf) as usize]);
                }
                c => {
                    let mut utf8 = [0; 4];
                    out.extend_from_slice(c.encode_utf8(&mut utf8).as_bytes());
                }
            }
        }
        if !chunk.invalid().is_empty() {
            out.extend_from_slice("\u{FFFD}".as_bytes());
        }
    }
    out.push(b'"');
}

/// Milliseconds with three decimals (microseconds), as a JSON number.
fn push_millis(out: &mut Vec<u8>, d: Duration) {
    let micros = d.as_micros() as u64;
    push_padded(out, micros / 1000, 1);
    out.push(b'.');
    push_padded(out, micros % 1000, 3);
}

/// `ip:port`. An IPv4 address by hand: `Display` (through `fmt`) cost more than a
/// tenth of a JSON line's instructions (callgrind).
fn write_addr(out: &mut Vec<u8>, addr: SocketAddr) {
    match addr {
        SocketAddr::V4(a) => {
            for (i, octet) in a.ip().octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                push_padded(out, octet as u64, 1);
            }
            out.push(b':');
            push_padded(out, a.port() as u64, 1);
        }
        SocketAddr::V6(_) => {
            let _ = write!(out, "{addr}");
        }
    }
}

/// `n` in decimal, zero-padded to at least `width` digits.
fn push_padded(out: &mut Vec<u8>, n: u64, width: usize) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for _ in (digits.len() - i)..width {
        out.push(b'0');
    }
    out.extend_from_slice(&digits[i..]);
}

/// A UTC date and time of day. Written by hand (no date crate): UTC needs no time zone
/// data, and the date is Howard Hinnant's `civil_from_days`, exact over the whole
/// proleptic Gregorian calendar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Civil {
    year: i64,
    month: u32,
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
}

impl Civil {
    /// `HH:MM:SS`, as both formats write it.
    fn push_time_of_day(&self, out: &mut Vec<u8>) {
        push_padded(out, self.hour as u64, 2);
        out.push(b':');
        push_padded(out, self.minute as u64, 2);
        out.push(b':');
        push_padded(out, self.second as u64, 2);
    }

    fn from_unix(secs: u64) -> Civil {
        let days = (secs / 86_400) as i64;
        let rem = secs % 86_400;
        // http://howardhinnant.github.io/date_algorithms.html#civil_from_days
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        Civil {
            year,
            month,
            day,
            hour: (rem / 3600) as u32,
            minute: (rem / 60 % 60) as u32,
            second: (rem % 60) as u32,
        }
    }
}

// ---------------------------------------------------------------------------------------
// The request fields, kept from the head until the answer is done
// ---------------------------------------------------------------------------------------

/// The request line and the logged fields of one head, copied out of the head the
/// backend is sent (the client's buffer moves on to the body): method, target,
/// `User-Agent`, `Referer` and `x-request-id` (the client's, or the one drover made).
#[derive(Debug, Default)]
pub(crate) struct RequestFields {
    bytes: Vec<u8>,
    method: (usize, usize),
    target: (usize, usize),
    user_agent: Option<(usize, usize)>,
    referer: Option<(usize, usize)>,
    request_id: Option<(usize, usize)>,
}

#[derive(Clone, Copy)]
enum LoggedHeader {
    UserAgent,
    Referer,
    RequestId,
}

thread_local! {
    /// A spare buffer for `RequestFields`, so a thread that logs allocates none per
    /// request: a request takes it and gives it back when its line is written.
    static SPARE_FIELDS: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// Where this thread formats a line before appending it to a log's buffer.
    static LINE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl RequestFields {
    /// Copies the fields out of `backend_head`, the head drover wrote for the backend
    /// (`http1::forward`): a request line, then `Name: value` lines, each ending CRLF.
    pub(crate) fn capture(backend_head: &[u8]) -> RequestFields {
        let mut f = RequestFields {
            bytes: SPARE_FIELDS.with(|s| std::mem::take(&mut *s.borrow_mut())),
            ..RequestFields::default()
        };
        f.bytes.clear();
        // Lines found with memchr: a byte-at-a-time split was a third of a line's cost.
        let mut start = 0;
        let mut lines = memchr::memchr_iter(b'\n', backend_head).map(|end| {
            let line = &backend_head[start..end];
            start = end + 1;
            line.strip_suffix(b"\r").unwrap_or(line)
        });
        let request_line = lines.next().unwrap_or_default();
        let mut parts = request_line.splitn(3, |&b| b == b' ');
        f.method = f.keep(parts.next().unwrap_or_default());
        f.target = f.keep(parts.next().unwrap_or_default());
        for line in lines {
            // Most fields are none of the three: tell by the first letter.
            if !matches!(line.first(), Some(b'u' | b'U' | b'r' | b'R' | b'x' | b'X')) {
                continue;
            }
            let Some(colon) = memchr::memchr(b':', line) else {
                continue;
            };
            let name = &line[..colon];
            let value = line[colon + 1..].trim_ascii();
            // The first of each field counts, as a backend reading the head would.
            let slot = if name.eq_ignore_ascii_case(b"user-agent") {
                LoggedHeader::UserAgent
            } else if name.eq_ignore_ascii_case(b"referer") {
                LoggedHeader::Referer
            } else if name.eq_ignore_ascii_case(b"x-request-id") {
                LoggedHeader::RequestId
            } else {
                continue;
            };
            if f.slot(slot).is_none() {
                let kept = f.keep(value);
                *f.slot(slot) = Some(kept);
            }
        }
        f
    }

    fn slot(&mut self, header: LoggedHeader) -> &mut Option<(usize, usize)> {
        match header {
            LoggedHeader::UserAgent => &mut self.user_agent,
            LoggedHeader::Referer => &mut self.referer,
            LoggedHeader::RequestId => &mut self.request_id,
        }
    }

    fn keep(&mut self, v: &[u8]) -> (usize, usize) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(v);
        (start, self.bytes.len())
    }

    fn get(&self, (start, end): (usize, usize)) -> &[u8] {
        &self.bytes[start..end]
    }

    /// `r` with this request's fields filled in.
    pub(crate) fn fill<'a>(&'a self, r: &mut Record<'a>) {
        r.method = Some(self.get(self.method));
        r.target = Some(self.get(self.target));
        r.user_agent = self.user_agent.map(|s| self.get(s));
        r.referer = self.referer.map(|s| self.get(s));
        r.request_id = self.request_id.map(|s| self.get(s));
    }
}

impl Drop for RequestFields {
    fn drop(&mut self) {
        let bytes = std::mem::take(&mut self.bytes);
        // Keep the larger buffer; a huge one (a long target) is let go.
        if bytes.capacity() <= 16 << 10 {
            SPARE_FIELDS.with(|s| {
                let mut spare = s.borrow_mut();
                if bytes.capacity() > spare.capacity() {
                    *spare = bytes;
                }
            });
        }
    }
}

// ---------------------------------------------------------------------------------------
// The log: a bounded buffer, and its writer thread
// ---------------------------------------------------------------------------------------

/// A balancer's access log: its lines go through a spool of their own, whose writer
/// thread writes them (`drover_spool`). Dropping it lets the writer write what waits
/// and end.
pub struct AccessLog {
    settings: Settings,
    spool: Spool,
    stats: Arc<BalancerStats>,
}

/// Every log in the process, for SIGUSR1 (`reopen_all`) and shutdown (`flush_all`).
static LOGS: Mutex<Vec<WeakSpool>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl AccessLog {
    /// Opens the destination and starts the writer; `None` when the format is `off`.
    pub fn start(settings: &Settings, stats: Arc<BalancerStats>) -> io::Result<Option<AccessLog>> {
        if settings.format == Format::Off {
            return Ok(None);
        }
        let path = settings.path.clone();
        let sink = open(&path)?;
        let reopen = move || open(&path);
        AccessLog::with_sink(settings.clone(), sink, Box::new(reopen), BUFFER_CAP, stats).map(Some)
    }

    /// A log that writes to `sink`, reopened with `reopen`, keeping at most `cap` bytes
    /// of lines waiting.
    pub fn with_sink(
        settings: Settings,
        sink: Box<dyn Write + Send>,
        reopen: drover_spool::Reopen,
        cap: usize,
        stats: Arc<BalancerStats>,
    ) -> io::Result<AccessLog> {
        let options = SpoolOptions {
            thread: "drover-access-log".into(),
            cap,
            wake_at: WAKE_AT,
            flush_every: FLUSH_EVERY,
            name: Some(format!("the access log {}", settings.path)),
        };
        let spool = Spool::start(options, sink, Some(reopen))?;
        let mut logs = lock(&LOGS);
        logs.retain(WeakSpool::is_live);
        logs.push(spool.downgrade());
        Ok(AccessLog {
            settings,
            spool,
            stats,
        })
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Formats `r` and hands the line to the writer, or drops and counts it when the
    /// buffer is full. Never waits for the writer.
    pub fn log(&self, r: &Record<'_>) {
        LINE.with(|line| {
            let mut line = line.borrow_mut();
            line.clear();
            match self.settings.format {
                Format::Json => write_json(&mut line, r, &self.settings.fields),
                Format::Combined | Format::Off => write_combined(&mut line, r),
            }
            self.push(&line);
        });
    }

    /// As `log`, for a TCP balancer's connection (always JSON: the config refuses
    /// `combined`, an HTTP request's format, on a TCP balancer).
    pub fn log_connection(&self, r: &ConnectionRecord<'_>) {
        LINE.with(|line| {
            let mut line = line.borrow_mut();
            line.clear();
            write_connection_json(&mut line, r);
            self.push(&line);
        });
    }

    /// Appends one formatted line (with its newline).
    pub fn push(&self, line: &[u8]) {
        if !self.spool.push(line) {
            self.stats.record_access_log_dropped();
        }
    }

    /// Asks the writer to open its path anew (after what waits is written to the old
    /// file), as logrotate's `postrotate` expects of SIGUSR1.
    pub fn reopen(&self) {
        self.spool.reopen();
    }

    /// Waits (up to 5 s) until every line handed over so far is written.
    pub fn flush(&self) {
        self.spool.flush();
    }
}

/// Reopens every access log's file (SIGUSR1).
pub fn reopen_all() {
    for log in live_logs() {
        log.reopen();
    }
}

/// Writes out every access log's waiting lines, waiting for each (shutdown); a log a
/// reload replaced is written out too.
pub fn flush_all() {
    for log in live_logs() {
        log.flush();
    }
}

fn live_logs() -> Vec<WeakSpool> {
    lock(&LOGS).clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record<'a>() -> Record<'a> {
        Record {
            // 2026-11-26T15:11:41.123Z
            time: Duration::from_millis(1_795_705_901_123),
            client: Some("10.1.2.3"),
            method: Some(b"GET"),
            target: Some(b"/a?b=1"),
            protocol: Some("HTTP/1.1"),
            status: 200,
            bytes: 1234,
            body_bytes: 1000,
            duration: Duration::from_micros(2_345),
            upstream: Some(Duration::from_micros(1_500)),
            queue: Duration::from_micros(7),
            endpoint: Some("127.0.0.1:9001".parse().unwrap()),
            retries: 0,
            error: None,
            request_id: Some(b"abc123"),
            user_agent: Some(b"curl/8.5.0"),
            referer: None,
        }
    }

    #[test]
    fn civil_dates_match_known_days() {
        let c = Civil::from_unix(0);
        assert_eq!((c.year, c.month, c.day, c.hour), (1970, 1, 1, 0));
        // 2000-02-29 23:59:59, a leap day of a century divisible by 400.
        let c = Civil::from_unix(951_868_799);
        assert_eq!((c.year, c.month, c.day), (2000, 2, 29));
        assert_eq!((c.hour, c.minute, c.second), (23, 59, 59));
        let c = Civil::from_unix(1_795_705_901);
        assert_eq!((c.year, c.month, c.day), (2026, 11, 26));
        assert_eq!((c.hour, c.minute, c.second), (15, 11, 41));
        // Against std's own count: every day of 400 years (one full cycle) follows the
        // previous one.
        let mut prev = Civil::from_unix(0);
        for day in 1..146_097u64 {
            let c = Civil::from_unix(day * 86_400);
            let next_day = c.day == prev.day + 1 && c.month == prev.month;
            let next_month = c.day == 1
                && (c.month == prev.month + 1 || (c.month == 1 && c.year == prev.year + 1));
            assert!(next_day || next_month, "{prev:?} -> {c:?}");
            prev = c;
        }
    }

    #[test]
    fn combined_lines_are_apaches() {
        let mut out = Vec::new();
        write_combined(&mut out, &record());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "10.1.2.3 - - [26/Nov/2026:15:11:41 +0000] \"GET /a?b=1 HTTP/1.1\" 200 1000 \"-\" \"curl/8.5.0\"\n"
        );
        let mut out = Vec::new();
        let r = Record {
            method: None,
            target: None,
            status: 400,
            bytes: 0,
            body_bytes: 0,
            user_agent: Some(b"a \"q\" \\ \xff\n"),
            referer: Some(b"http://x/"),
            ..record()
        };
        write_combined(&mut out, &r);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "10.1.2.3 - - [26/Nov/2026:15:11:41 +0000] \"-\" 400 - \"http://x/\" \"a \\x22q\\x22 \\x5C \\xFF\\x0A\"\n"
        );
    }

    #[test]
    fn a_connection_line_is_json_with_the_tcp_fields_in_order() {
        let r = ConnectionRecord {
            time: Duration::from_millis(1_795_705_901_123),
            client: "10.1.2.3",
            endpoint: Some("127.0.0.1:9001".parse().unwrap()),
            received: 5,
            sent: 300_000,
            duration: Duration::from_micros(2_345),
            queue: Duration::from_micros(7),
            connect: Some(Duration::from_micros(150)),
            retries: 1,
            end: "done",
            error: None,
        };
        let mut out = Vec::new();
        write_connection_json(&mut out, &r);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        let documented: Vec<&str> = TCP_FIELDS.split(", ").collect();
        // serde_json's map sorts keys: compare as sets, and the order on the wire below.
        let (mut a, mut b) = (keys.clone(), documented.clone());
        a.sort();
        b.sort();
        assert_eq!(a, b);
        let text = String::from_utf8(out.clone()).unwrap();
        let at: Vec<usize> = documented
            .iter()
            .map(|k| text.find(&format!("\"{k}\":")).unwrap())
            .collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{text}");
        assert_eq!(v["time"], "2026-11-26T15:11:41.123Z");
        assert_eq!(v["client"], "10.1.2.3");
        assert_eq!(v["endpoint"], "127.0.0.1:9001");
        assert_eq!(
            (v["bytes_received"].clone(), v["bytes_sent"].clone()),
            (5.into(), 300_000.into())
        );
        assert_eq!(v["duration_ms"], 2.345);
        assert_eq!(v["queue_ms"], 0.007);
        assert_eq!(v["connect_ms"], 0.15);
        assert_eq!(v["retries"], 1);
        assert_eq!(v["end"], "done");
        assert!(v["error"].is_null());
        assert!(out.ends_with(b"}\n") && !out[..out.len() - 1].contains(&b'\n'));

        let unserved = ConnectionRecord {
            endpoint: None,
            connect: None,
            end: "unserved",
            error: Some("connect-failed"),
            ..r
        };
        let mut out = Vec::new();
        write_connection_json(&mut out, &unserved);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert!(v["endpoint"].is_null() && v["connect_ms"].is_null());
        assert_eq!(
            (v["end"].as_str(), v["error"].as_str()),
            (Some("unserved"), Some("connect-failed"))
        );
    }

    #[test]
    fn json_lines_are_valid_whatever_the_bytes() {
        let mut out = Vec::new();
        write_json(&mut out, &record(), &Field::ALL);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["time"], "2026-11-26T15:11:41.123Z");
        assert_eq!(v["client"], "10.1.2.3");
        assert_eq!(v["method"], "GET");
        assert_eq!(v["target"], "/a?b=1");
        assert_eq!(v["protocol"], "HTTP/1.1");
        assert_eq!(v["status"], 200);
        assert_eq!(v["bytes"], 1234);
        assert_eq!(v["duration_ms"], 2.345);
        assert_eq!(v["upstream_ms"], 1.5);
        assert_eq!(v["queue_ms"], 0.007);
        assert_eq!(v["endpoint"], "127.0.0.1:9001");
        assert_eq!(v["retries"], 0);
        assert!(v["error"].is_null() && v["referer"].is_null());
        assert_eq!(v["request_id"], "abc123");
        assert_eq!(v["user_agent"], "curl/8.5.0");
        assert!(out.ends_with(b"}\n") && !out[..out.len() - 1].contains(&b'\n'));

        let weird = b"q\"b\\s\xff\xfe ok \xe2\x82 \x01\x7f\t\xc3\xa9";
        let r = Record {
            user_agent: Some(weird),
            upstream: None,
            endpoint: None,
            error: Some("connect-failed"),
            status: 502,
            ..record()
        };
        let mut out = Vec::new();
        write_json(&mut out, &r, &Field::ALL);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v["user_agent"],
            "q\"b\\s\u{FFFD}\u{FFFD} ok \u{FFFD} \u{1}\u{7f}\té"
        );
        assert!(v["upstream_ms"].is_null() && v["endpoint"].is_null());
        assert_eq!(v["error"], "connect-failed");

        let mut out = Vec::new();
        write_json(&mut out, &r, &[Field::Status, Field::Error]);
        assert_eq!(out, b"{\"status\":502,\"error\":\"connect-failed\"}\n");
    }

    #[test]
    fn fields_and_formats_parse() {
        assert_eq!(
            Field::parse_list("status, time,referer,time"),
            Ok(vec![Field::Time, Field::Status, Field::Referer])
        );
        assert!(Field::parse_list("status,nope")
            .unwrap_err()
            .starts_with("unknown access log field \"nope\""));
        assert_eq!("json".parse(), Ok(Format::Json));
        assert_eq!(
            "xml".parse::<Format>(),
            Err("unknown access log format \"xml\": expected one of combined, json, off".into())
        );
    }

    #[test]
    fn request_fields_come_from_the_backend_head() {
        let head = b"POST /up?x HTTP/1.1\r\nHost: a\r\nUser-Agent: ua/1\r\nREFERER: http://r/\r\nX-Forwarded-For: 1.2.3.4\r\nx-request-id: 00ff\r\n\r\n";
        let f = RequestFields::capture(head);
        let mut r = Record::default();
        f.fill(&mut r);
        assert_eq!(r.method, Some(&b"POST"[..]));
        assert_eq!(r.target, Some(&b"/up?x"[..]));
        assert_eq!(r.user_agent, Some(&b"ua/1"[..]));
        assert_eq!(r.referer, Some(&b"http://r/"[..]));
        assert_eq!(r.request_id, Some(&b"00ff"[..]));
    }

    /// What a full spool does is `drover_spool`'s (its test stalls a writer); here, that
    /// a line it drops is counted on the balancer's metrics: in a spool of 250 bytes, 5
    /// lines of 100 at once are dropped (one count), and one line fits.
    #[test]
    fn a_line_the_spool_drops_is_counted() {
        let stats = Arc::new(BalancerStats::default());
        let settings = Settings {
            format: Format::Combined,
            ..Settings::default()
        };
        let log = AccessLog::with_sink(
            settings,
            Box::new(io::sink()),
            Box::new(|| Err(io::Error::other("no reopen here"))),
            250,
            Arc::clone(&stats),
        )
        .unwrap();
        let mut line = vec![b'x'; 99];
        line.push(b'\n');
        let line = [line.as_slice(); 5].concat();
        log.push(&line);
        log.push(&line[..100]);
        assert_eq!(stats.snapshot().access_log_dropped, 1);
    }

    #[test]
    fn reopen_writes_the_old_file_first_then_the_new() {
        let dir = std::env::temp_dir().join(format!("drover-al-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("access.log");
        let settings = Settings {
            format: Format::Combined,
            path: path.to_str().unwrap().into(),
            fields: Field::ALL.to_vec(),
        };
        let stats = Arc::new(BalancerStats::default());
        let log = AccessLog::start(&settings, stats).unwrap().unwrap();
        log.push(b"one\n");
        std::fs::rename(&path, dir.join("access.log.1")).unwrap();
        log.push(b"two\n");
        log.reopen();
        // The reopen is done once a flush after it is.
        log.flush();
        log.push(b"three\n");
        log.flush();
        assert_eq!(
            std::fs::read(dir.join("access.log.1")).unwrap(),
            b"one\ntwo\n"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"three\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
