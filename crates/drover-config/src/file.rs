//! drover.toml: the raw schema, its loader and its validation into the model.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::model::*;
use drover_supervisor::MAX_WORKERS;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use toml::Spanned;

// ---------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------

/// A config that could not be read, parsed or validated.
///
/// Displays as `{file}:{line}:{column}: {key}: {message}`; the position is left out when
/// unknown (e.g. "nothing to run", I/O errors) and the key when there is none (syntax
/// errors before any key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file name as given to [`load`] or [`parse`].
    pub file: String,
    /// 1-based line, when the error points at a place in the file.
    pub line: Option<usize>,
    /// 1-based column in characters, when `line` is known.
    pub column: Option<usize>,
    /// Dotted key path such as `balancer[0].timeouts.connect`; may be empty.
    pub key: String,
    /// What is wrong, and where possible what would be right.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(col) = self.column {
                write!(f, ":{col}")?;
            }
        }
        if !self.key.is_empty() {
            write!(f, ": {}", self.key)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Where the settings that can only fail once drover starts were written: listen
/// addresses (taken by another program) and commands (no such program). An error found
/// then names the place as a config error does, `{file}:{line}:{column}: {key}`, or the
/// flag the setting came from.
#[derive(Debug, Clone, Default)]
pub struct Origins(BTreeMap<String, Origin>);

#[derive(Debug, Clone)]
enum Origin {
    /// A config error at the place, without its message.
    File(ConfigError),
    Flag(&'static str),
}

impl Origins {
    /// Records that `key` (such as `balancer[0].listen`) came from command-line `flag`.
    pub fn with_flag(mut self, key: &str, flag: &'static str) -> Origins {
        self.0.insert(key.to_string(), Origin::Flag(flag));
        self
    }

    /// `message` about setting `key`, prefixed with where the setting was written;
    /// just `message` when that is not known.
    pub fn error(&self, key: &str, message: impl Into<String>) -> String {
        let message = message.into();
        match self.0.get(key) {
            Some(Origin::File(at)) => ConfigError {
                message,
                ..at.clone()
            }
            .to_string(),
            Some(Origin::Flag(flag)) => format!("{flag}: {message}"),
            None => message,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------------------

/// Reads, parses and validates the config file at `path`. Errors name the path as given.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    load_with_origins(path).map(|(cfg, _)| cfg)
}

/// `load`, plus where the settings that can fail at start-up were written.
pub fn load_with_origins(path: &Path) -> Result<(Config, Origins), ConfigError> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: origin.clone(),
        line: None,
        column: None,
        key: String::new(),
        message: format!("cannot read config file: {e}"),
    })?;
    parse_with_origins(&text, &origin)
}

/// Parses and validates config `text`; `origin` is the file name used in errors. The
/// tests' way in; drover itself loads files.
/// One value (a size, a backend, a name server, an etcd URL) that does not parse; the
/// message says what was expected. Callers add the key or flag it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueError(String);

impl fmt::Display for ValueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ValueError {}

impl From<String> for ValueError {
    fn from(s: String) -> ValueError {
        ValueError(s)
    }
}

/// Loads a config from text; `origin` names it in errors.
pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
    parse_with_origins(text, origin).map(|(cfg, _)| cfg)
}

/// Parses and validates config `text`, noting where the settings that can fail at
/// start-up were written.
fn parse_with_origins(text: &str, origin: &str) -> Result<(Config, Origins), ConfigError> {
    let ctx = Ctx { text, origin };
    let raw: RawConfig = serde_path_to_error::deserialize(toml::Deserializer::new(text))
        .map_err(|e| ctx.serde_error(e))?;
    raw.validate(&ctx)
}

/// Where errors are reported from: the text (to turn spans into line:column) and its name.
struct Ctx<'a> {
    text: &'a str,
    origin: &'a str,
}

impl Ctx<'_> {
    fn at(
        &self,
        span: Range<usize>,
        key: impl Into<String>,
        msg: impl Into<String>,
    ) -> ConfigError {
        let (line, col) = line_col(self.text, span.start);
        ConfigError {
            file: self.origin.to_string(),
            line: Some(line),
            column: Some(col),
            key: key.into(),
            message: msg.into(),
        }
    }

    fn nowhere(&self, key: impl Into<String>, msg: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.origin.to_string(),
            line: None,
            column: None,
            key: key.into(),
            message: msg.into(),
        }
    }

    /// Turns a deserialization error into a `ConfigError`, rewording serde's generic
    /// messages so they talk about keys rather than fields.
    fn serde_error(&self, err: serde_path_to_error::Error<toml::de::Error>) -> ConfigError {
        let mut key = render_path(err.path());
        let inner = err.inner();
        // toml's syntax errors can span several lines ("expected ..."); keep one line.
        let raw_msg = inner.message().trim().replace('\n', "; ");
        let message = if let Some(name) = backticked(&raw_msg, "missing field `") {
            // serde reports the table, not the key; name the key in the path instead.
            push_key(&mut key, name);
            "required key is missing".to_string()
        } else if let Some(rest) = raw_msg.strip_prefix("unknown field") {
            format!("unknown key{rest}")
        } else if raw_msg.contains("expected a sequence") && (key == "balancer" || key == "app") {
            format!("{raw_msg} (write [[{key}]], with double brackets, for each {key})")
        } else if let Some(hint) = value_form_hint(&key, &raw_msg) {
            format!("{raw_msg} ({hint})")
        } else {
            raw_msg
        };
        match inner.span() {
            Some(span) => self.at(span, key, message),
            None => self.nowhere(key, message),
        }
    }
}

/// What to write instead, for values people write in another form than drover reads:
/// a command as one string (PM2's `script`), a port as a bare number.
fn value_form_hint(key: &str, msg: &str) -> Option<String> {
    let leaf = key.rsplit('.').next().unwrap_or(key);
    if leaf == "command" {
        let text = msg
            .strip_prefix("invalid type: string \"")?
            .split("\", expected a sequence")
            .next()?;
        let words: Vec<String> = text.split_whitespace().map(|w| format!("{w:?}")).collect();
        return Some(format!(
            "a list of words, as exec takes them: command = [{}]",
            words.join(", ")
        ));
    }
    if leaf == "listen" {
        let port = msg
            .strip_prefix("invalid type: integer `")?
            .split('`')
            .next()?;
        return Some(format!(
            "a string: listen = \"{port}\" (every address), or \"127.0.0.1:{port}\""
        ));
    }
    None
}

/// 1-based line and character column of byte `offset` in `text`.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut end = offset.min(text.len());
    // Spans from toml always fall on char boundaries; this only guards against a
    // future change turning into a panic.
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = &text[..end];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = before[line_start..].chars().count() + 1;
    (line, col)
}

/// The text between `prefix` and the next backtick, if `msg` starts with `prefix`.
fn backticked<'m>(msg: &'m str, prefix: &str) -> Option<&'m str> {
    let rest = msg.strip_prefix(prefix)?;
    rest.split('`').next()
}

/// Renders a serde path as `a.b[0].c`, hiding the private field names that
/// `toml::Spanned` introduces.
fn render_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for seg in path.iter() {
        match seg {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } if key.starts_with("$__serde_spanned_private") => {}
            Segment::Map { key } => push_key(&mut out, key),
            Segment::Enum { variant } => push_key(&mut out, variant),
            Segment::Unknown => push_key(&mut out, "?"),
        }
    }
    out
}

/// Appends `key` to a dotted path, quoting it when it is not a bare TOML key.
fn push_key(path: &mut String, key: &str) {
    if !path.is_empty() {
        path.push('.');
    }
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        path.push_str(key);
    } else {
        path.push_str(&format!("{key:?}"));
    }
}

// ---------------------------------------------------------------------------------------
// Single-value newtypes: validated during deserialization so errors get a span + path
// ---------------------------------------------------------------------------------------

/// A humantime duration string ("250ms", "2s", "1m"); zero allowed.
#[derive(Debug, Clone, Copy)]
struct Dur(Duration);

/// A duration that must be greater than zero.
#[derive(Debug, Clone, Copy)]
struct PosDur(Duration);

struct DurVisitor;

impl Visitor<'_> for DurVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a duration string such as \"250ms\", \"2s\" or \"1m\"")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Duration, E> {
        drover_units::duration(s).map_err(E::custom)
    }

    // A bare number has no unit; say so rather than serde's generic "invalid type".
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Duration, E> {
        Err(E::custom(format!(
            "invalid duration {n}: durations are strings with a unit, e.g. \"{n}s\" or \"{n}ms\""
        )))
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DurVisitor).map(Dur)
    }
}

impl<'de> Deserialize<'de> for PosDur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let dur = d.deserialize_any(DurVisitor)?;
        if dur.is_zero() {
            return Err(de::Error::custom("duration must be greater than 0"));
        }
        Ok(PosDur(dur))
    }
}

/// A duration above zero, or `"off"` (`None`): `timeouts.request`.
#[derive(Debug, Clone, Copy)]
struct PosDurOrOff(Option<Duration>);

impl<'de> Deserialize<'de> for PosDurOrOff {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct OrOff;
        impl Visitor<'_> for OrOff {
            type Value = Option<Duration>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string such as \"30s\" or \"2m\", or \"off\"")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                drover_units::timeout_or_off(s).map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Self::Value, E> {
                DurVisitor.visit_i64(n).map(Some)
            }
        }
        d.deserialize_any(OrOff).map(PosDurOrOff)
    }
}

/// An integer in `LO..=HI`; the bounds are named in the error.
#[derive(Debug, Clone, Copy)]
struct Bounded<const LO: i64, const HI: i64>(i64);

impl<const LO: i64, const HI: i64> Bounded<LO, HI> {
    // The casts cannot truncate: every instantiation's range fits the target type.
    fn as_u32(self) -> u32 {
        self.0 as u32
    }
    fn as_usize(self) -> usize {
        self.0 as usize
    }
    fn as_u16(self) -> u16 {
        self.0 as u16
    }
}

impl<'de, const LO: i64, const HI: i64> Deserialize<'de> for Bounded<LO, HI> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<const LO: i64, const HI: i64>;
        impl<const LO: i64, const HI: i64> Visitor<'_> for V<LO, HI> {
            type Value = i64;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "an integer in {LO}..={HI}")
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<i64, E> {
                if (LO..=HI).contains(&n) {
                    Ok(n)
                } else {
                    Err(E::custom(format!(
                        "{n} is out of range: expected {LO}..={HI}"
                    )))
                }
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<i64, E> {
                match i64::try_from(n) {
                    Ok(n) => self.visit_i64(n),
                    Err(_) => Err(E::custom(format!(
                        "{n} is out of range: expected {LO}..={HI}"
                    ))),
                }
            }
        }
        d.deserialize_any(V::<LO, HI>).map(Bounded)
    }
}

/// A `SocketAddr` given as a string.
#[derive(Debug, Clone, Copy)]
struct Addr(SocketAddr);

/// A size in bytes: a whole number, or a string with a unit (`"512M"`, `"1.5GiB"`).
struct ByteSize(u64);

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = u64;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size like \"512M\", \"2G\" or a number of bytes")
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<u64, E> {
                u64::try_from(n).map_err(|_| E::custom(format!("size {n} must not be negative")))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<u64, E> {
                drover_units::byte_size(s).map_err(E::custom)
            }
        }
        d.deserialize_any(V).map(ByteSize)
    }
}

impl<'de> Deserialize<'de> for Addr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        listen_addr(&s).map(Addr).map_err(de::Error::custom)
    }
}

/// An address to listen on, as users of nginx and HAProxy write it: `IP:PORT`; `PORT`
/// or `:PORT` for every IPv4 address (nginx's `listen 8000`, HAProxy's `bind :8000`);
/// or `localhost:PORT` (127.0.0.1). Before, each of the last three was refused with
/// Rust's bare "invalid socket address syntax".
pub fn listen_addr(s: &str) -> Result<SocketAddr, String> {
    let port = |p: &str| {
        (!p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            .then(|| p.parse::<u16>().ok())
            .flatten()
    };
    if let Some(p) = port(s).or_else(|| s.strip_prefix(':').and_then(port)) {
        return Ok(SocketAddr::from(([0, 0, 0, 0], p)));
    }
    if let Some(p) = s.strip_prefix("localhost:").and_then(port) {
        return Ok(SocketAddr::from(([127, 0, 0, 1], p)));
    }
    parse_socket_addr(s)
        .map_err(|e| format!("{e}, \"PORT\" or \":PORT\" (every address), or \"localhost:PORT\""))
}

fn parse_socket_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse().map_err(|_| {
        let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
        let hint = match s.rsplit_once(':') {
            Some((_, p)) if digits(p) && p.parse::<u16>().is_err() => {
                format!(" (port {p} is past 65535)")
            }
            // A host name is the likeliest mistake: say why it is refused.
            Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => {
                " (host names are not resolved here; use an IP address such as 127.0.0.1)".to_string()
            }
            _ => String::new(),
        };
        format!("invalid address {s:?}{hint}: expected IP:PORT such as \"127.0.0.1:8000\" or \"[::1]:8000\"")
    })
}

/// A strategy name, parsed by `drover_balance` so the two never disagree on spelling.
#[derive(Debug, Clone, Copy)]
struct StrategyName(Strategy);

impl<'de> Deserialize<'de> for StrategyName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        // ParseStrategyError's message already lists every valid name.
        s.parse().map(StrategyName).map_err(de::Error::custom)
    }
}

/// An HTTP token (RFC 9110 `tchar`s): header and cookie names.
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// `hash.key` as written, parsed by `HashKey`'s own parser (the one flags use too).
struct RawHashKey(HashKey);

impl<'de> Deserialize<'de> for RawHashKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map(RawHashKey).map_err(de::Error::custom)
    }
}

/// A cookie name (an HTTP token).
#[derive(Debug, Clone)]
struct CookieName(String);

impl<'de> Deserialize<'de> for CookieName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if is_token(&s) {
            Ok(CookieName(s))
        } else {
            Err(de::Error::custom(format!("invalid cookie name {s:?}")))
        }
    }
}

/// A health-check path: must start with `/`.
#[derive(Debug, Clone)]
struct HttpPath(String);

impl<'de> Deserialize<'de> for HttpPath {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s.starts_with('/') && !s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            Ok(HttpPath(s))
        } else {
            Err(de::Error::custom(format!(
                "invalid path {s:?}: expected an absolute path such as \"/health\""
            )))
        }
    }
}

impl<'de> Deserialize<'de> for QueueMax {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = QueueMax;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"unlimited\" or a number up to 1000000 (0: never queue)")
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<QueueMax, E> {
                QueueMax::parse_count(n).map_err(E::custom)
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<QueueMax, E> {
                s.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for ConnLimit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ConnLimit;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"auto\", 0 (no limit) or a number up to 1000000")
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<ConnLimit, E> {
                if (0..=1_000_000).contains(&n) {
                    Ok(ConnLimit::Fixed(n as u32))
                } else {
                    Err(E::custom(format!(
                        "{n} is out of range: expected \"auto\", 0 (no limit) or 1..=1000000"
                    )))
                }
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<ConnLimit, E> {
                s.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// `workers = N` or `workers = "auto"`.
#[derive(Debug, Clone, Copy)]
struct WorkerCount(Workers);

impl<'de> Deserialize<'de> for WorkerCount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Workers;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a number of workers in 1..={MAX_WORKERS} or \"auto\"")
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Workers, E> {
                match usize::try_from(n) {
                    Ok(n) if (1..=MAX_WORKERS).contains(&n) => Ok(Workers::Count(n)),
                    _ => Err(E::custom(format!(
                        "{n} is out of range: expected 1..={MAX_WORKERS} or \"auto\""
                    ))),
                }
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Workers, E> {
                // A count goes as a number (`workers = 4`); PM2's 0 and -N are the
                // command line's and an ecosystem file's, not drover.toml's.
                match s {
                    "auto" | "max" => Ok(Workers::Auto),
                    _ => Err(E::custom(format!(
                        "invalid workers {s:?}: expected a number in 1..={MAX_WORKERS} or \"auto\""
                    ))),
                }
            }
        }
        d.deserialize_any(V).map(WorkerCount)
    }
}

/// `watch = true` (the app's `cwd`), `watch = "src"` or `watch = ["src", "config"]`:
/// the paths whose changes reload the app; `false` or an empty list, none.
#[derive(Debug, Clone)]
struct WatchPaths(Vec<PathBuf>);

impl<'de> Deserialize<'de> for WatchPaths {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Vec<PathBuf>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "true, false, a path or a list of paths")
            }
            fn visit_bool<E: de::Error>(self, on: bool) -> Result<Vec<PathBuf>, E> {
                Ok(if on {
                    vec![PathBuf::from(".")]
                } else {
                    Vec::new()
                })
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Vec<PathBuf>, E> {
                if s.is_empty() {
                    return Err(E::custom(
                        "an empty path: expected true, false, a path or a list of paths",
                    ));
                }
                Ok(vec![PathBuf::from(s)])
            }
            fn visit_seq<A: de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Vec<PathBuf>, A::Error> {
                let mut paths = Vec::new();
                while let Some(path) = seq.next_element::<String>()? {
                    if path.is_empty() {
                        return Err(de::Error::custom("an empty path in the list"));
                    }
                    paths.push(PathBuf::from(path));
                }
                Ok(paths)
            }
        }
        d.deserialize_any(V).map(WatchPaths)
    }
}

/// `expect = 200` or `expect = "200-399"`: an inclusive status range.
#[derive(Debug, Clone, Copy)]
struct Expect(StatusRange);

impl<'de> Deserialize<'de> for Expect {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        fn status<E: de::Error>(n: i64) -> Result<u16, E> {
            if (100..=599).contains(&n) {
                Ok(n as u16)
            } else {
                Err(E::custom(format!(
                    "status {n} is out of range: expected 100..=599"
                )))
            }
        }
        impl Visitor<'_> for V {
            type Value = (u16, u16);
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a status code such as 200 or a range such as \"200-399\"")
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<(u16, u16), E> {
                let s = status(n)?;
                Ok((s, s))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<(u16, u16), E> {
                let bad = || {
                    E::custom(format!(
                        "invalid expect {s:?}: expected a status such as 200 or a range such as \"200-399\""
                    ))
                };
                let num = |t: &str| t.trim().parse::<i64>().map_err(|_| bad());
                let (lo, hi) = match s.split_once('-') {
                    Some((lo, hi)) => (status(num(lo)?)?, status(num(hi)?)?),
                    None => {
                        let one = status(num(s)?)?;
                        (one, one)
                    }
                };
                if lo > hi {
                    return Err(E::custom(format!(
                        "invalid expect {s:?}: {lo} is above {hi}"
                    )));
                }
                Ok((lo, hi))
            }
        }
        d.deserialize_any(V)
            .map(|(lo, hi)| Expect(StatusRange::new(lo, hi)))
    }
}

/// A backend reference as written, before the checks that need the whole file.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Addr(SocketAddr),
    App(String),
    Dns { host: String, port: u16 },
    DnsSrv(String),
    Etcd(String),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Addr(a) => write!(f, "{a}"),
            Target::App(n) => write!(f, "app:{n}"),
            Target::Dns { host, port } => write!(f, "dns:{host}:{port}"),
            Target::DnsSrv(name) => write!(f, "dns+srv:{name}"),
            Target::Etcd(p) => write!(f, "etcd:{p}"),
        }
    }
}

/// One `--backend` of `drover proxy`: what a file's `backends` entry may say, except
/// `app:NAME` (that needs `drover up`). `etcd`: whether `--etcd` gave a cluster.
pub fn backend_from_flag(s: &str, etcd: bool) -> Result<BackendRef, ValueError> {
    backend_from_flag_text(s, etcd).map_err(ValueError)
}

fn backend_from_flag_text(s: &str, etcd: bool) -> Result<BackendRef, String> {
    match parse_target(s)? {
        Target::Addr(addr) => Ok(BackendRef::Addr {
            addr,
            weight: 1,
            max_conns: None,
        }),
        Target::App(_) => Err(format!(
            "{s}: app backends are workers drover runs; use `drover run` or `drover up`"
        )),
        Target::Dns { host, port } => Ok(BackendRef::Dns(drover_dns::DnsTarget::A { host, port })),
        Target::DnsSrv(name) => Ok(BackendRef::Dns(drover_dns::DnsTarget::Srv { name })),
        Target::Etcd(prefix) if etcd => Ok(BackendRef::Etcd(prefix)),
        Target::Etcd(_) => Err(format!("{s} needs --etcd URL, the cluster's client URL")),
    }
}

fn parse_target(s: &str) -> Result<Target, String> {
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(Target::Addr(addr));
    }
    if let Some(addr) = s
        .strip_prefix("localhost:")
        .and_then(|p| p.parse::<u16>().ok())
    {
        return Ok(Target::Addr(SocketAddr::from(([127, 0, 0, 1], addr))));
    }
    // nginx's `proxy_pass http://...` habit.
    if let Some((scheme, rest)) = s.split_once("://") {
        let tls = if scheme == "https" {
            " and give the balancer backend_tls (--backend-tls) to speak TLS to it"
        } else {
            ""
        };
        return Err(format!(
            "invalid backend {s:?}: a backend is an address, not a URL: write {rest:?}{tls}"
        ));
    }
    if let Some(name) = s.strip_prefix("app:") {
        return if is_valid_name(name) {
            Ok(Target::App(name.to_string()))
        } else {
            Err(format!(
                "invalid backend {s:?}: app names match [a-z0-9_-]+"
            ))
        };
    }
    let dns_name = |host: &str| {
        !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_')
    };
    if let Some(name) = s.strip_prefix("dns+srv:") {
        return if dns_name(name) {
            Ok(Target::DnsSrv(name.to_string()))
        } else {
            Err(format!(
                "invalid backend {s:?}: expected \"dns+srv:NAME\" such as \"dns+srv:_http._tcp.api.internal\""
            ))
        };
    }
    if let Some(rest) = s.strip_prefix("dns:") {
        let parsed = rest.rsplit_once(':').and_then(|(host, port)| {
            Some((host, port.parse::<u16>().ok()?)).filter(|_| dns_name(host))
        });
        return match parsed {
            Some((host, port)) => Ok(Target::Dns {
                host: host.to_string(),
                port,
            }),
            None => Err(format!("invalid backend {s:?}: expected \"dns:HOST:PORT\"")),
        };
    }
    if let Some(prefix) = s.strip_prefix("etcd:") {
        return if prefix.starts_with('/') {
            Ok(Target::Etcd(prefix.to_string()))
        } else {
            Err(format!("invalid backend {s:?}: expected \"etcd:/PREFIX\""))
        };
    }
    let hint = if parse_socket_addr(s).is_err() && s.contains(':') && !s.contains("://") {
        " (host names are not resolved; use an IP address, or \"dns:HOST:PORT\")"
    } else {
        ""
    };
    Err(format!(
        "invalid backend {s:?}: expected \"IP:PORT\", \"app:NAME\", \"dns:HOST:PORT\", \"dns+srv:NAME\" or \"etcd:/PREFIX\"{hint}"
    ))
}

impl<'de> Deserialize<'de> for Target {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_target(&s).map_err(de::Error::custom)
    }
}

/// One `backends` entry: a string, or a table with per-backend settings.
#[derive(Debug, Clone)]
struct RawBackend {
    target: Target,
    weight: Option<u32>,
    max_conns: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackendTable {
    address: Target,
    weight: Option<Bounded<1, 1000>>,
    max_conns: Option<Bounded<0, 1_000_000>>,
}

impl<'de> Deserialize<'de> for RawBackend {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawBackend;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a backend string such as \"127.0.0.1:9001\" or a table { address = \"...\", weight = N, max_conns = N }")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<RawBackend, E> {
                Ok(RawBackend {
                    target: parse_target(s).map_err(E::custom)?,
                    weight: None,
                    max_conns: None,
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawBackend, A::Error> {
                // Reuse the derived impl so the table form gets deny_unknown_fields and
                // precise per-key errors for free.
                let t = RawBackendTable::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(RawBackend {
                    target: t.address,
                    weight: t.weight.map(Bounded::as_u32),
                    max_conns: t.max_conns.map(Bounded::as_u32),
                })
            }
        }
        d.deserialize_any(V)
    }
}

// ---------------------------------------------------------------------------------------
// Raw (as-written) schema
// ---------------------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    admin: Option<Spanned<RawAdmin>>,
    resolver: Option<Spanned<RawResolver>>,
    etcd: Option<Spanned<RawEtcd>>,
    #[serde(default)]
    app: Vec<Spanned<RawApp>>,
    #[serde(default)]
    balancer: Vec<Spanned<RawBalancer>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawResolver {
    nameservers: Option<Vec<Spanned<String>>>,
    min_ttl: Option<PosDur>,
    max_ttl: Option<PosDur>,
    timeout: Option<PosDur>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEtcd {
    endpoints: Spanned<Vec<Spanned<String>>>,
    /// `{ ca, cert, key, server_name }`, as a balancer's `backend_tls`.
    tls: Option<Spanned<RawBackendTls>>,
    user: Option<Spanned<String>>,
    password_file: Option<Spanned<String>>,
    /// Refused with a message of its own: the password goes in `password_file`.
    password: Option<Spanned<toml::Value>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAdmin {
    listen: Option<Spanned<Addr>>,
    token: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawApp {
    name: Spanned<String>,
    command: Spanned<Vec<String>>,
    workers: Option<WorkerCount>,
    cwd: Option<PathBuf>,
    env: Option<Spanned<BTreeMap<String, String>>>,
    health: Option<Spanned<RawHealth>>,
    ready_timeout: Option<PosDur>,
    stop_timeout: Option<PosDur>,
    drain_timeout: Option<PosDur>,
    max_restarts: Option<u32>,
    max_memory: Option<Spanned<ByteSize>>,
    wait_ready: Option<bool>,
    increment_var: Option<String>,
    instance_var: Option<String>,
    mode: Option<Spanned<String>>,
    listen: Option<Spanned<Addr>>,
    watch: Option<WatchPaths>,
    ignore_watch: Option<Vec<String>>,
    watch_delay: Option<PosDur>,
    app_port: Option<Spanned<Bounded<1, 65535>>>,
    worker_ports: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHealth {
    path: Option<HttpPath>,
    tcp: Option<Spanned<bool>>,
    expect: Option<Spanned<Expect>>,
    /// A TCP check's bytes to write, and what the answer must contain.
    send: Option<Spanned<String>>,
    receive: Option<Spanned<String>>,
    /// The gRPC health checking protocol, for `service` ("": the whole server).
    grpc: Option<Spanned<bool>>,
    service: Option<Spanned<String>>,
    interval: Option<PosDur>,
    timeout: Option<PosDur>,
    rise: Option<Bounded<1, 100>>,
    fall: Option<Bounded<1, 100>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBalancer {
    name: Option<Spanned<String>>,
    listen: Option<Spanned<Addr>>,
    mode: Option<Spanned<Parsed<Protocol>>>,
    strategy: Option<Spanned<StrategyName>>,
    backends: Spanned<Vec<Spanned<RawBackend>>>,
    retries: Option<Bounded<0, 10>>,
    max_conns: Option<Spanned<ConnLimit>>,
    queue: Option<RawQueue>,
    timeouts: Option<RawTimeouts>,
    health: Option<Spanned<RawHealth>>,
    passive: Option<RawPassive>,
    slow_start: Option<Dur>,
    hash: Option<Spanned<RawHash>>,
    sticky: Option<Spanned<RawSticky>>,
    proxy_protocol: Option<Spanned<RawProxyProtocol>>,
    send_proxy_protocol: Option<Spanned<String>>,
    forwarded_headers: Option<Spanned<RawTrusted>>,
    limits: Option<Spanned<RawLimits>>,
    drain_timeout: Option<Dur>,
    shutdown_delay: Option<Dur>,
    threads: Option<Bounded<1, { THREADS_MAX as i64 }>>,
    access_log: Option<Spanned<RawAccessLog>>,
    tls: Option<Spanned<RawTls>>,
    backend_tls: Option<Spanned<RawBackendTls>>,
    backend_protocol: Option<Spanned<String>>,
    redirect_to_https: Option<Spanned<Bounded<1, 65535>>>,
    http2: Option<Spanned<bool>>,
    h2c: Option<Spanned<bool>>,
    http2_max_streams: Option<Spanned<Bounded<1, { HTTP2_MAX_STREAMS_MAX as i64 }>>>,
    routes: Option<Spanned<Vec<Spanned<RawRoute>>>>,
}

/// One of `routes`: what it takes (TCP mode: server names; HTTP: hosts and a path
/// prefix), and the balancer it sends that to.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    sni: Option<Spanned<Vec<Spanned<String>>>>,
    host: Option<Spanned<Vec<Spanned<String>>>>,
    path_prefix: Option<Spanned<String>>,
    strip_prefix: Option<Spanned<bool>>,
    balancer: Spanned<String>,
}

/// `tls = { cert, key }` for one certificate, or `tls = { certs = [{ cert, key }, ...] }`
/// for several (chosen by SNI; the first is the default).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    cert: Option<Spanned<String>>,
    key: Option<Spanned<String>>,
    certs: Option<Spanned<Vec<Spanned<RawCert>>>>,
    /// A TCP listener's ALPN protocols.
    alpn: Option<Spanned<Vec<Spanned<String>>>>,
    min_version: Option<Spanned<String>>,
    client_ca: Option<Spanned<String>>,
    verify_client: Option<Spanned<String>>,
}

/// `backend_tls = { ca, server_name, cert, key, insecure_skip_verify }`; `{}` verifies
/// against the system's trust store.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackendTls {
    ca: Option<Spanned<String>>,
    server_name: Option<Spanned<String>>,
    cert: Option<Spanned<String>>,
    key: Option<Spanned<String>>,
    insecure_skip_verify: Option<Spanned<bool>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCert {
    cert: Spanned<String>,
    /// Without it, the key is in the cert's file (a combined PEM).
    key: Option<Spanned<String>>,
}

impl RawTls {
    /// Each certificate's `cert` and `key` (the cert's when there is none), with the
    /// key each is known by (`certs[J].cert`): also the single form's, so an error about
    /// a file names its place whichever form wrote it.
    fn entries(&self) -> Vec<(&Spanned<String>, &Spanned<String>)> {
        match (&self.cert, &self.certs) {
            (Some(cert), _) => vec![(cert, self.key.as_ref().unwrap_or(cert))],
            (None, Some(certs)) => certs
                .get_ref()
                .iter()
                .map(|c| {
                    let c = c.get_ref();
                    (&c.cert, c.key.as_ref().unwrap_or(&c.cert))
                })
                .collect(),
            (None, None) => Vec::new(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAccessLog {
    format: Option<Parsed<crate::AccessLogFormat>>,
    path: Option<Spanned<String>>,
    fields: Option<Spanned<Vec<Parsed<crate::AccessLogField>>>>,
}

/// A value written as a string and parsed by its type's own parser, the one its flag
/// uses too (`access_log.format`, each of `access_log.fields`); the parser's message,
/// which lists the valid values, is the error's.
struct Parsed<T>(T);

impl<'de, T: std::str::FromStr<Err = String>> Deserialize<'de> for Parsed<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map(Parsed).map_err(de::Error::custom)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawQueue {
    max: Option<QueueMax>,
    timeout: Option<PosDur>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTimeouts {
    connect: Option<PosDur>,
    // Spanned: a TCP balancer refuses these, pointing at them.
    header_read: Option<Spanned<PosDur>>,
    request: Option<Spanned<PosDurOrOff>>,
    idle: Option<PosDur>,
    client: Option<Spanned<PosDur>>,
    body: Option<Spanned<PosDur>>,
    body_min_rate: Option<Spanned<Bounded<1, { u32::MAX as i64 }>>>,
    half_close: Option<Spanned<PosDur>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPassive {
    failures: Option<Bounded<0, 1000>>,
    ejection: Option<PosDur>,
    max_ejection: Option<Spanned<PosDur>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHash {
    key: RawHashKey,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSticky {
    cookie: Option<CookieName>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProxyProtocol {
    /// Addresses and CIDR ranges allowed to send a header.
    trusted: Spanned<Vec<Spanned<String>>>,
}

/// `forwarded_headers = { trusted = [...] }`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTrusted {
    /// Addresses and CIDR ranges whose forwarding fields go on as sent.
    trusted: Spanned<Vec<Spanned<String>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    max_header_bytes: Option<Bounded<{ HEAD_BYTES_RANGE.0 as i64 }, { HEAD_BYTES_RANGE.1 as i64 }>>,
    max_uri_bytes: Option<Bounded<256, 1_048_576>>,
    max_headers: Option<Bounded<1, 10_000>>,
    max_body_bytes: Option<ByteSize>,
}

// ---------------------------------------------------------------------------------------
// Validation: raw -> typed, with the checks that need more than one value
// ---------------------------------------------------------------------------------------

/// App and balancer names: lowercase so `app:NAME` references and metric labels
/// are unambiguous.
pub fn is_valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

pub const NAME_RULE: &str = "names are 1 to 64 characters of a-z, 0-9, '_' and '-'";

impl RawConfig {
    fn validate(self, ctx: &Ctx<'_>) -> Result<(Config, Origins), ConfigError> {
        let mut origins = Origins::default();
        let mut origin = |span: Range<usize>, key: String| {
            let at = ctx.at(span, key.clone(), "");
            origins.0.insert(key, Origin::File(at));
        };
        let admin = match self.admin {
            Some(a) => {
                let listen = a.get_ref().listen.as_ref().map(|l| l.span());
                origin(listen.unwrap_or_else(|| a.span()), "admin.listen".into());
                Some(validate_admin(a, ctx)?)
            }
            None => None,
        };
        let resolver = match self.resolver {
            Some(r) => validate_resolver(r, ctx)?,
            None => ResolverConfig::default(),
        };
        let etcd = match self.etcd {
            Some(e) => {
                let span = e.span();
                let tls = e.get_ref().tls.as_ref();
                let table = tls.map_or(span.clone(), |t| t.span());
                let at = |f: Option<&Spanned<String>>| f.map_or(table.clone(), |f| f.span());
                let tls = tls.map(|t| t.get_ref());
                origin(at(tls.and_then(|t| t.ca.as_ref())), "etcd.tls.ca".into());
                origin(
                    at(tls.and_then(|t| t.cert.as_ref())),
                    "etcd.tls.cert".into(),
                );
                // A key left out is the cert's file: its errors point at the cert.
                let key = tls.and_then(|t| t.key.as_ref().or(t.cert.as_ref()));
                origin(at(key), "etcd.tls.key".into());
                origin(
                    at(tls.and_then(|t| t.server_name.as_ref())),
                    "etcd.tls.server_name".into(),
                );
                origin(table.clone(), "etcd.tls".into());
                let password_file = e.get_ref().password_file.as_ref();
                origin(
                    password_file.map_or(span, Spanned::span),
                    "etcd.password_file".into(),
                );
                Some(validate_etcd(e, ctx)?)
            }
            None => None,
        };

        let mut apps = Vec::with_capacity(self.app.len());
        let mut app_names = HashSet::new();
        let mut app_listen_spans = Vec::with_capacity(self.app.len());
        let mut app_grpc_spans = Vec::with_capacity(self.app.len());
        for (i, raw) in self.app.into_iter().enumerate() {
            let name_span = raw.get_ref().name.span();
            app_listen_spans.push(raw.get_ref().listen.as_ref().map(|l| l.span()));
            app_grpc_spans.push(raw.get_ref().health.as_ref().and_then(|h| {
                h.get_ref()
                    .grpc
                    .as_ref()
                    .filter(|g| *g.get_ref())
                    .map(|g| g.span())
            }));
            origin(raw.get_ref().command.span(), format!("app[{i}].command"));
            if let Some(l) = &raw.get_ref().listen {
                origin(l.span(), format!("app[{i}].listen"));
            }
            let app = validate_app(raw.into_inner(), i, ctx)?;
            if !app_names.insert(app.spec.name.clone()) {
                return Err(ctx.at(
                    name_span,
                    format!("app[{i}].name"),
                    format!("duplicate app name {:?}", app.spec.name),
                ));
            }
            apps.push(app);
        }

        if apps.is_empty() && self.balancer.is_empty() {
            return Err(ctx.nowhere(
                "",
                "nothing to run: add at least one [[balancer]] or [[app]]",
            ));
        }

        let lone = self.balancer.len() == 1;
        let mut balancers: Vec<BalancerConfig> = Vec::with_capacity(self.balancer.len());
        let mut route_targets: Vec<Vec<(Range<usize>, String)>> = Vec::new();
        let mut table_spans: Vec<Range<usize>> = Vec::new();
        let mut listens: Vec<(SocketAddr, String)> = Vec::new();
        if let Some(a) = &admin {
            listens.push((a.listen, "admin.listen".to_string()));
        }
        for (i, app) in apps.iter().enumerate() {
            if let Some(listen) = app.listen {
                if let Some((_, owner)) = listens.iter().find(|(a, _)| listens_clash(*a, listen)) {
                    let span = app_listen_spans[i].clone().unwrap_or_default();
                    return Err(ctx.at(
                        span,
                        format!("app[{i}].listen"),
                        format!("address {listen} is already used by {owner}"),
                    ));
                }
                listens.push((listen, format!("app[{i}].listen")));
            }
        }
        let shared_apps: HashSet<&str> = apps
            .iter()
            .filter(|a| a.spec.mode == Mode::Shared)
            .map(|a| a.spec.name.as_str())
            .collect();
        let background_apps: HashSet<&str> = apps
            .iter()
            .filter(|a| a.spec.mode == Mode::Background)
            .map(|a| a.spec.name.as_str())
            .collect();
        let mut behind: BTreeMap<String, usize> = BTreeMap::new();
        for (i, raw) in self.balancer.into_iter().enumerate() {
            let backends_span = raw.get_ref().backends.span();
            let listen_span = raw.get_ref().listen.as_ref().map(|l| l.span());
            let table_span = raw.span();
            let name_span = raw.get_ref().name.as_ref().map(|n| n.span());
            if let Some(span) = &listen_span {
                origin(span.clone(), format!("balancer[{i}].listen"));
            }
            table_spans.push(table_span.clone());
            route_targets.push(
                raw.get_ref()
                    .routes
                    .iter()
                    .flat_map(|r| r.get_ref())
                    .map(|r| {
                        let b = &r.get_ref().balancer;
                        (b.span(), b.get_ref().clone())
                    })
                    .collect(),
            );
            if let Some(log) = &raw.get_ref().access_log {
                let path = log.get_ref().path.as_ref().map(|p| p.span());
                origin(
                    path.unwrap_or_else(|| log.span()),
                    format!("balancer[{i}].access_log.path"),
                );
            }
            if let Some(tls) = &raw.get_ref().tls {
                for (j, (cert, key)) in tls.get_ref().entries().into_iter().enumerate() {
                    origin(cert.span(), format!("balancer[{i}].tls.certs[{j}].cert"));
                    origin(key.span(), format!("balancer[{i}].tls.certs[{j}].key"));
                }
                if let Some(ca) = &tls.get_ref().client_ca {
                    origin(ca.span(), format!("balancer[{i}].tls.client_ca"));
                }
            }
            if let Some(bt) = &raw.get_ref().backend_tls {
                let table = bt.span();
                let bt = bt.get_ref();
                let at =
                    |f: &Option<Spanned<String>>| f.as_ref().map_or(table.clone(), |f| f.span());
                origin(at(&bt.ca), format!("balancer[{i}].backend_tls.ca"));
                origin(at(&bt.cert), format!("balancer[{i}].backend_tls.cert"));
                // A key left out is the cert's file: its errors point at the cert.
                let key = if bt.key.is_some() { &bt.key } else { &bt.cert };
                origin(at(key), format!("balancer[{i}].backend_tls.key"));
                origin(
                    at(&bt.server_name),
                    format!("balancer[{i}].backend_tls.server_name"),
                );
                origin(table.clone(), format!("balancer[{i}].backend_tls"));
            }
            let b = validate_balancer(
                raw,
                i,
                lone,
                AppRefs {
                    defined: &app_names,
                    behind: &behind,
                },
                Sources {
                    admin: admin.is_some(),
                    etcd: etcd.is_some(),
                },
                ctx,
            )?;
            if let Some(other) = balancers.iter().position(|o| o.name == b.name) {
                let msg = format!(
                    "duplicate balancer name {:?} (also balancer[{other}]; unnamed balancers are called \"balancer-INDEX\")",
                    b.name
                );
                return Err(match name_span {
                    Some(span) => ctx.at(span, format!("balancer[{i}].name"), msg),
                    None => ctx.at(table_span, format!("balancer[{i}]"), msg),
                });
            }
            if let (Some(listen), Some(span)) = (b.listen, listen_span) {
                if let Some((_, owner)) = listens.iter().find(|(a, _)| listens_clash(*a, listen)) {
                    return Err(ctx.at(
                        span,
                        format!("balancer[{i}].listen"),
                        format!("address {listen} is already used by {owner}"),
                    ));
                }
                listens.push((listen, format!("balancer[{i}].listen")));
            }
            if let Some(app) = b.backends.iter().find_map(|r| match r {
                BackendRef::App(a) if shared_apps.contains(a.as_str()) => Some(a),
                _ => None,
            }) {
                return Err(ctx.at(
                    backends_span,
                    format!("balancer[{i}].backends"),
                    format!("app {app:?} runs in shared mode: its workers accept on the app's own listen address, and no balancer can reach one of them"),
                ));
            }
            if let Some(app) = b.backends.iter().find_map(|r| match r {
                BackendRef::App(a) if background_apps.contains(a.as_str()) => Some(a),
                _ => None,
            }) {
                return Err(ctx.at(
                    backends_span,
                    format!("balancer[{i}].backends"),
                    format!("app {app:?} runs in background mode: its workers serve no port for a balancer to reach (give it mode = \"auto\" if it serves one)"),
                ));
            }
            let mut b = b;
            let app = b.backends.iter().find_map(|r| match r {
                BackendRef::App(name) => apps.iter().find(|a| &a.spec.name == name),
                _ => None,
            });
            let beside_others = b.backends.len() > 1;
            if let Some(app) = app {
                if app.spec.mode == Mode::Handoff && b.backend_protocol.is_http2() {
                    return Err(ctx.at(
                        backends_span,
                        format!("balancer[{i}].backends"),
                        format!("app {:?} runs in handoff mode, which hands each client connection to a worker as it is; this balancer speaks HTTP/2 to the workers and places each stream: use mode = \"auto\" or \"proxy\"", app.spec.name),
                    ));
                }
                if app.spec.mode == Mode::Handoff && beside_others {
                    return Err(ctx.at(
                        backends_span,
                        format!("balancer[{i}].backends"),
                        format!("app {:?} runs in handoff mode: its workers take the connections themselves, and the other backends beside it would get none; use mode = \"auto\" or \"proxy\"", app.spec.name),
                    ));
                }
                behind.insert(app.spec.name.clone(), i);
            }
            // A connection handed to a worker stays there: beside other backends the
            // balancer places every request itself, so they get their share.
            let modes: Vec<Mode> = match app {
                Some(app) if !beside_others => vec![app.spec.mode],
                _ => Vec::new(),
            };
            // A listener with routes hands nothing over (its next request may go
            // elsewhere), nor does a balancer without one (the connections are the
            // routing listener's). A TCP balancer in front of an app alone hands each
            // connection to a Node worker at accept, unread, as `drover run --tcp`
            // does (one no worker takes is relayed); hashed, it relays them all.
            b.connection_affinity = !modes.is_empty();
            if b.routes.is_empty() && b.listen.is_some() {
                b.handoff = match b.mode {
                    Protocol::Http => b.handoff_for(&modes),
                    Protocol::Tcp
                        if b.strategy != Strategy::Hash
                            && modes
                                .iter()
                                .any(|m| matches!(m, Mode::Auto | Mode::Handoff)) =>
                    {
                        drover_proxy::Handoff::Always
                    }
                    Protocol::Tcp => drover_proxy::Handoff::Never,
                };
            }
            balancers.push(b);
        }
        check_route_targets(&balancers, &route_targets, &table_spans, ctx)?;
        // An app behind a balancer that speaks HTTP/2 to it serves only HTTP/2 (a gRPC
        // server): its health probes must speak it too.
        for (i, app) in apps.iter_mut().enumerate() {
            app.spec.h2c = behind.get(&app.spec.name).is_some_and(|&b| {
                balancers[b].backend_protocol == drover_proxy::BackendProtocol::H2c
            });
            app.spec.head_limit = behind
                .get(&app.spec.name)
                .filter(|&&b| balancers[b].mode == Protocol::Http)
                .map(|&b| balancers[b].limits.max_header_bytes);
            if let (Some(span), false) = (&app_grpc_spans[i], app.spec.h2c) {
                return Err(ctx.at(
                    span.clone(),
                    format!("app[{i}].health.grpc"),
                    format!("the gRPC health protocol is spoken over HTTP/2, and no balancer speaks it to app {:?}: put it behind one with backend_protocol = \"h2c\"", app.spec.name),
                ));
            }
        }

        Ok((
            Config {
                admin,
                resolver,
                etcd,
                apps,
                balancers,
            },
            origins,
        ))
    }
}

/// Whether two listeners would fight over the same port. Port 0 never clashes: the OS
/// picks a free port for each (tests rely on this).
fn listens_clash(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// A name server as `[resolver] nameservers` and `--resolver` take it: IP or IP:PORT
/// (a bare IP means port 53, as in resolv.conf).
pub fn nameserver(text: &str) -> Result<SocketAddr, ValueError> {
    nameserver_text(text).map_err(ValueError)
}

fn nameserver_text(text: &str) -> Result<SocketAddr, String> {
    text.parse::<SocketAddr>()
        .ok()
        .or_else(|| {
            text.parse::<std::net::IpAddr>()
                .ok()
                .map(|ip| SocketAddr::new(ip, 53))
        })
        .ok_or_else(|| format!("{text:?} is not an IP address or IP:PORT"))
}

/// An etcd client URL as `[etcd] endpoints` and `--etcd` take it: `http://HOST:PORT`,
/// or `https://HOST:PORT` for etcd over TLS.
pub fn check_etcd_endpoint(url: &str) -> Result<(), ValueError> {
    check_etcd_endpoint_text(url).map_err(ValueError)
}

fn check_etcd_endpoint_text(url: &str) -> Result<(), String> {
    let ok = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .and_then(|rest| rest.rsplit_once(':'))
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{url:?} is not a client URL such as \"http://127.0.0.1:2379\" or \"https://10.0.0.5:2379\""
        ))
    }
}

/// The endpoints' kind: all `https://` (TLS), or all `http://`. `tls_given`: TLS
/// settings were given, which `http://` endpoints would ignore.
pub fn etcd_endpoints_use_tls(endpoints: &[String], tls_given: bool) -> Result<bool, String> {
    let https = endpoints
        .iter()
        .filter(|e| e.starts_with("https://"))
        .count();
    if https > 0 && https < endpoints.len() {
        return Err(
            "endpoints mix http:// and https://: an etcd cluster serves its clients one way".into(),
        );
    }
    let tls = https > 0;
    if tls_given && !tls {
        return Err(
            "TLS settings for http:// endpoints, which speak no TLS: write https:// URLs".into(),
        );
    }
    Ok(tls)
}

fn validate_resolver(
    raw: Spanned<RawResolver>,
    ctx: &Ctx<'_>,
) -> Result<ResolverConfig, ConfigError> {
    let span = raw.span();
    let raw = raw.into_inner();
    let mut r = ResolverConfig::default();
    if let Some(servers) = raw.nameservers {
        let mut parsed = Vec::new();
        for (j, s) in servers.into_iter().enumerate() {
            let at = s.span();
            let text = s.into_inner();
            match nameserver_text(&text) {
                Ok(a) => parsed.push(a),
                Err(e) => return Err(ctx.at(at, format!("resolver.nameservers[{j}]"), e)),
            }
        }
        r.nameservers = Some(parsed);
    }
    if let Some(d) = raw.min_ttl {
        r.min_ttl = d.0;
    }
    if let Some(d) = raw.max_ttl {
        r.max_ttl = d.0;
    }
    if let Some(d) = raw.timeout {
        r.timeout = d.0;
    }
    if r.min_ttl > r.max_ttl {
        return Err(ctx.at(
            span,
            "resolver.min_ttl",
            format!("min_ttl {:?} is above max_ttl {:?}", r.min_ttl, r.max_ttl),
        ));
    }
    Ok(r)
}

fn validate_etcd(raw: Spanned<RawEtcd>, ctx: &Ctx<'_>) -> Result<EtcdConfig, ConfigError> {
    let RawEtcd {
        endpoints: list,
        tls: raw_tls,
        user,
        password_file,
        password,
    } = raw.into_inner();
    if let Some(p) = password {
        return Err(ctx.at(
            p.span(),
            "etcd.password",
            "keep the password out of drover.toml (it is often world-readable, or committed): write it to a file only drover may read, and give password_file = \"PATH\"",
        ));
    }
    let auth =
        match (user, password_file) {
            (None, None) => None,
            (Some(u), None) => return Err(ctx.at(
                u.span(),
                "etcd.user",
                "a user needs its password: give password_file = \"PATH\", a file that holds it",
            )),
            (None, Some(f)) => return Err(ctx.at(
                f.span(),
                "etcd.password_file",
                "a password needs its user: give user = \"NAME\", the etcd user drover logs in as",
            )),
            (Some(u), Some(f)) => {
                if u.get_ref().is_empty() {
                    return Err(ctx.at(u.span(), "etcd.user", "empty user name"));
                }
                if f.get_ref().is_empty() {
                    return Err(ctx.at(f.span(), "etcd.password_file", "empty path"));
                }
                Some(EtcdAuthConfig {
                    user: u.into_inner(),
                    password_file: PathBuf::from(f.into_inner()),
                })
            }
        };
    let list_span = list.span();
    let list = list.into_inner();
    if list.is_empty() {
        return Err(ctx.at(
            list_span,
            "etcd.endpoints",
            "endpoints must not be empty: list the cluster's client URLs, e.g. \"http://127.0.0.1:2379\"",
        ));
    }
    let mut endpoints = Vec::new();
    for (j, e) in list.into_iter().enumerate() {
        let at = e.span();
        let url = e.into_inner();
        check_etcd_endpoint_text(&url)
            .map_err(|e| ctx.at(at, format!("etcd.endpoints[{j}]"), e))?;
        endpoints.push(url);
    }
    let given = raw_tls.as_ref().map(|t| t.span());
    let uses_tls = etcd_endpoints_use_tls(&endpoints, given.is_some()).map_err(|e| {
        ctx.at(
            given.clone().unwrap_or(list_span.clone()),
            if given.is_some() {
                "etcd.tls"
            } else {
                "etcd.endpoints"
            },
            e,
        )
    })?;
    let tls = match raw_tls {
        // The same checks as a balancer's backend_tls, under this table's keys.
        Some(t) => Some(validate_backend_tls(
            t,
            &|k: &str| format!("etcd.{}", k.replacen("backend_tls", "tls", 1)),
            ctx,
        )?),
        None => uses_tls.then(BackendTlsConfig::default),
    };
    Ok(EtcdConfig {
        endpoints,
        tls,
        auth,
    })
}

fn validate_admin(raw: Spanned<RawAdmin>, ctx: &Ctx<'_>) -> Result<AdminConfig, ConfigError> {
    let span = raw.span();
    let raw = raw.into_inner();
    let (listen, listen_span) = match raw.listen {
        Some(l) => (l.get_ref().0, l.span()),
        None => (
            DEFAULT_ADMIN_LISTEN
                .parse()
                .expect("default admin address parses"),
            span,
        ),
    };
    let token_span = raw.token.as_ref().map(Spanned::span);
    let token = raw.token.map(Spanned::into_inner);
    // The one rule for every way drover starts (see `crate::check_exposure`),
    // reported here with the file, line and key.
    if let Err(e) = crate::check_exposure(listen, token.as_deref()) {
        let span = match e {
            crate::ExposureError::EmptyToken => token_span.unwrap_or(listen_span),
            crate::ExposureError::TokenRequired { .. } => listen_span,
        };
        return Err(ctx.at(span, "admin.token", e.to_string()));
    }
    Ok(AdminConfig { listen, token })
}

fn validate_app(raw: RawApp, i: usize, ctx: &Ctx<'_>) -> Result<AppConfig, ConfigError> {
    let key = |k: &str| format!("app[{i}].{k}");
    if !is_valid_name(raw.name.get_ref()) {
        return Err(ctx.at(
            raw.name.span(),
            key("name"),
            format!("invalid app name {:?}: {NAME_RULE}", raw.name.get_ref()),
        ));
    }
    let command_span = raw.command.span();
    let command = raw.command.into_inner();
    match command.first() {
        None => return Err(ctx.at(command_span, key("command"), "command must not be empty")),
        Some(p) if p.is_empty() => {
            return Err(ctx.at(
                command_span,
                key("command"),
                "program (command[0]) must not be empty",
            ))
        }
        Some(_) => {}
    }
    let env = match raw.env {
        Some(env) => {
            let span = env.span();
            let env = env.into_inner();
            // The OS cannot represent these; spawning would fail later with a vaguer error.
            if let Some(bad) = env
                .iter()
                .find(|(k, v)| k.is_empty() || k.contains(['=', '\0']) || v.contains('\0'))
            {
                return Err(ctx.at(
                    span,
                    key("env"),
                    format!("invalid environment variable {:?}: names must be non-empty without '=' or NUL, values without NUL", bad.0),
                ));
            }
            env
        }
        None => BTreeMap::new(),
    };
    let mode = match &raw.mode {
        Some(m) => m
            .get_ref()
            .parse::<Mode>()
            .map_err(|e| ctx.at(m.span(), key("mode"), e.to_string()))?,
        None => Mode::default(),
    };
    if let (Mode::Shared, Some(h)) = (mode, &raw.health) {
        return Err(ctx.at(
            h.span(),
            key("health"),
            "health checks need a port per worker, which mode = \"shared\" does not have",
        ));
    }
    if let (Mode::Background, Some(h)) = (mode, &raw.health) {
        return Err(ctx.at(
            h.span(),
            key("health"),
            "health checks need a port per worker, and with mode = \"background\" the workers serve none",
        ));
    }
    if mode == Mode::Background && drover_supervisor::command_uses_port(&command) {
        return Err(ctx.at(
            command_span.clone(),
            key("command"),
            "{port} needs a port per worker, and with mode = \"background\" the workers serve none",
        ));
    }
    if let (Mode::Shared | Mode::Background, Some(p)) = (mode, &raw.app_port) {
        return Err(ctx.at(
            p.span(),
            key("app_port"),
            "app_port names the port of a Node app's servers that drover balances; with mode = \"shared\" or \"background\" drover runs no balancer for the app",
        ));
    }
    let worker_ports = match &raw.worker_ports {
        Some(w) if matches!(mode, Mode::Shared | Mode::Background) => {
            return Err(ctx.at(
                w.span(),
                key("worker_ports"),
                format!("worker_ports: with mode = \"{mode}\" no worker has a port of its own"),
            ))
        }
        Some(w) => Some(
            w.get_ref()
                .parse::<drover_supervisor::PortRange>()
                .map_err(|e| ctx.at(w.span(), key("worker_ports"), e))?,
        ),
        None => None,
    };
    if mode == Mode::Shared && drover_supervisor::command_uses_port(&command) {
        return Err(ctx.at(
            command_span,
            key("command"),
            "{port} needs a port per worker, which mode = \"shared\" does not have: each worker accepts on the socket drover gives it as fd 3 (listen)",
        ));
    }
    let health = match raw.health {
        Some(h) => Some(validate_health(h, &key("health"), true, ctx)?),
        None => None,
    };
    let listen = raw.listen.as_ref().map(|l| l.get_ref().0);
    match (mode, &raw.listen) {
        (Mode::Shared, None) => {
            let span = raw.mode.as_ref().map_or(raw.name.span(), |m| m.span());
            return Err(ctx.at(
                span,
                key("listen"),
                "mode = \"shared\" needs listen: the address drover binds for the workers",
            ));
        }
        (Mode::Background, Some(l)) => {
            return Err(ctx.at(
                l.span(),
                key("listen"),
                "listen is for mode = \"shared\"; with mode = \"background\" the workers serve no port",
            ));
        }
        (Mode::Auto | Mode::Proxy | Mode::Handoff, Some(l)) => {
            return Err(ctx.at(
                l.span(),
                key("listen"),
                "listen is for mode = \"shared\"; in proxy mode a [[balancer]] listens (backends = [\"app:NAME\"])",
            ));
        }
        _ => {}
    }
    let max_memory = match &raw.max_memory {
        Some(m) if m.get_ref().0 == 0 => {
            return Err(ctx.at(
                m.span(),
                key("max_memory"),
                "max_memory must be greater than 0",
            ))
        }
        Some(m) => Some(m.get_ref().0),
        None => None,
    };
    let watching = raw.watch.as_ref().is_some_and(|w| !w.0.is_empty());
    if !watching && (raw.ignore_watch.is_some() || raw.watch_delay.is_some()) {
        let which = if raw.ignore_watch.is_some() {
            "ignore_watch"
        } else {
            "watch_delay"
        };
        return Err(ctx.nowhere(
            key(which),
            format!("{which} applies to watched files, and the app watches none: add watch = true (its cwd) or watch = [\"PATH\", ...]"),
        ));
    }
    let defaults = AppSpec::new(raw.name.into_inner(), command);
    let watch = raw.watch.filter(|paths| !paths.0.is_empty()).map(|paths| {
        drover_supervisor::watch::WatchSpec {
            paths: paths.0,
            ignore: raw.ignore_watch.unwrap_or_default(),
            delay: raw
                .watch_delay
                .map_or(drover_supervisor::watch::DEFAULT_WATCH_DELAY, |d| d.0),
        }
    });
    Ok(AppConfig {
        spec: AppSpec {
            workers: raw.workers.map_or(defaults.workers, |w| w.0),
            cwd: raw.cwd,
            env,
            health,
            ready_timeout: raw.ready_timeout.map_or(defaults.ready_timeout, |d| d.0),
            stop_timeout: raw.stop_timeout.map_or(defaults.stop_timeout, |d| d.0),
            drain_timeout: raw.drain_timeout.map_or(defaults.drain_timeout, |d| d.0),
            max_memory,
            wait_ready: raw.wait_ready.unwrap_or(defaults.wait_ready),
            increment_var: raw.increment_var,
            instance_var: raw.instance_var,
            mode,
            watch,
            app_port: raw.app_port.map(|p| p.into_inner().as_u16()),
            worker_ports,
            restart: drover_supervisor::Backoff {
                max_restarts: raw.max_restarts,
                ..defaults.restart
            },
            ..defaults
        },
        listen,
    })
}

/// `for_app`: apps default to an HTTP check of `/health`; balancers must say which kind,
/// because a backend drover does not run may have no `/health` at all.
fn validate_health(
    raw: Spanned<RawHealth>,
    key: &str,
    for_app: bool,
    ctx: &Ctx<'_>,
) -> Result<HealthCheck, ConfigError> {
    let span = raw.span();
    let raw = raw.into_inner();
    let tcp = raw.tcp.as_ref().is_some_and(|t| *t.get_ref());
    let grpc = raw.grpc.as_ref().filter(|g| *g.get_ref());
    if let (Some(s), None) = (&raw.service, grpc) {
        return Err(ctx.at(
            s.span(),
            format!("{key}.service"),
            "service names what a gRPC health check asks for: set grpc = true",
        ));
    }
    if let Some(g) = grpc {
        let other = [
            ("path", raw.path.is_some()),
            ("tcp", tcp),
            ("expect", raw.expect.is_some()),
            ("send", raw.send.is_some()),
            ("receive", raw.receive.is_some()),
        ];
        if let Some((other, _)) = other.iter().find(|(_, set)| *set) {
            return Err(ctx.at(
                g.span(),
                format!("{key}.grpc"),
                format!(
                    "choose one check: grpc = true (the gRPC health protocol) or {other}, not both"
                ),
            ));
        }
        let d = HealthCheck::default();
        return Ok(HealthCheck {
            kind: CheckKind::Grpc {
                service: raw
                    .service
                    .map(Spanned::into_inner)
                    .unwrap_or_default()
                    .into(),
            },
            interval: raw.interval.map_or(d.interval, |v| v.0),
            timeout: raw.timeout.map_or(d.timeout, |v| v.0),
            rise: raw.rise.map_or(d.rise, Bounded::as_u32),
            fall: raw.fall.map_or(d.fall, Bounded::as_u32),
        });
    }
    let kind = match (raw.path, tcp) {
        (Some(_), true) => {
            let tspan = raw.tcp.as_ref().map_or(span, |t| t.span());
            return Err(ctx.at(
                tspan,
                format!("{key}.tcp"),
                "choose one check: path (HTTP) or tcp = true, not both",
            ));
        }
        (None, true) => {
            if let Some(e) = &raw.expect {
                return Err(ctx.at(
                    e.span(),
                    format!("{key}.expect"),
                    "expect applies only to HTTP checks (set path instead of tcp = true); a TCP check's answer is receive = \"...\"",
                ));
            }
            match (raw.send, raw.receive) {
                (None, None) => CheckKind::Tcp,
                (Some(send), None) => {
                    return Err(ctx.at(
                        send.span(),
                        format!("{key}.send"),
                        "send needs receive = \"...\": what the answer must contain",
                    ))
                }
                (send, Some(receive)) => {
                    if receive.get_ref().is_empty() {
                        return Err(ctx.at(
                            receive.span(),
                            format!("{key}.receive"),
                            "empty receive: every answer would pass; leave send and receive out for a connect check",
                        ));
                    }
                    CheckKind::TcpExchange {
                        send: send
                            .map_or_else(Box::default, |s| s.into_inner().into_bytes().into()),
                        receive: receive.into_inner().into_bytes().into(),
                    }
                }
            }
        }
        (path, false) => {
            if let Some(s) = raw.send.as_ref().or(raw.receive.as_ref()) {
                let k = if raw.send.is_some() {
                    "send"
                } else {
                    "receive"
                };
                return Err(ctx.at(
                    s.span(),
                    format!("{key}.{k}"),
                    format!("{k} applies only to TCP checks: set tcp = true"),
                ));
            }
            let path = match path {
                Some(p) => p.0,
                None if for_app => "/health".to_string(),
                None => {
                    return Err(ctx.at(
                        span,
                        key,
                        "set path = \"/...\" for an HTTP check or tcp = true for a TCP check",
                    ))
                }
            };
            CheckKind::Http {
                path,
                expect: raw
                    .expect
                    .map_or(StatusRange::default(), |e| e.into_inner().0),
            }
        }
    };
    let d = HealthCheck::default();
    Ok(HealthCheck {
        kind,
        interval: raw.interval.map_or(d.interval, |v| v.0),
        timeout: raw.timeout.map_or(d.timeout, |v| v.0),
        rise: raw.rise.map_or(d.rise, Bounded::as_u32),
        fall: raw.fall.map_or(d.fall, Bounded::as_u32),
    })
}

/// What a balancer's `app:NAME` backends are checked against.
#[derive(Debug, Clone, Copy)]
struct AppRefs<'a> {
    /// The apps the file defines.
    defined: &'a HashSet<String>,
    /// The apps earlier balancers balance over, with that balancer's index. An app's
    /// workers join one pool, and the balancer in front of it sets that pool's options.
    behind: &'a BTreeMap<String, usize>,
}

/// Which runtime sources the file sets up.
#[derive(Debug, Clone, Copy)]
struct Sources {
    /// An [admin] table: members may register at runtime, so a balancer may start
    /// with no backends.
    admin: bool,
    /// An [etcd] table: `etcd:` backends have a cluster.
    etcd: bool,
}

/// A balancer's `routes` (what each matches; the balancers they send to are checked
/// once every balancer is read: `check_route_targets`).
fn validate_routes(
    routes: &Spanned<Vec<Spanned<RawRoute>>>,
    i: usize,
    tcp: bool,
    ctx: &Ctx<'_>,
) -> Result<Vec<RouteConfig>, ConfigError> {
    let key = |k: &str| format!("balancer[{i}].routes{k}");
    if routes.get_ref().is_empty() {
        let example = if tcp {
            "{ sni = [\"NAME\"], balancer = \"NAME\" }"
        } else {
            "{ host = [\"NAME\"], path_prefix = \"/PATH\", balancer = \"NAME\" }"
        };
        return Err(ctx.at(
            routes.span(),
            key(""),
            format!("no route: list at least one {example}, or leave routes out"),
        ));
    }
    // What each route takes, with where it was first listed: a name (TCP), or a host
    // (empty: any) and a prefix (HTTP).
    let mut seen: HashMap<(String, String), (String, Range<usize>)> = HashMap::new();
    let mut out = Vec::new();
    for (j, route) in routes.get_ref().iter().enumerate() {
        let route_span = route.span();
        let route = route.get_ref();
        let at = |k: &str| key(&format!("[{j}]{k}"));
        let mut taken = |what: (String, String), at: String, span: Range<usize>| {
            if let Some((first, first_span)) = seen.get(&what) {
                let (line, col) = line_col(ctx.text, first_span.start);
                let shown = match (tcp, what.0.as_str()) {
                    (true, name) => format!("{name:?}"),
                    (false, "") => format!("path_prefix {:?} for any host", what.1),
                    (false, host) => format!("host {host:?} with path_prefix {:?}", what.1),
                };
                return Err(ctx.at(
                    span,
                    at,
                    format!("{shown} is routed already by {first} (line {line}, column {col}): a request (or connection) must have one route"),
                ));
            }
            seen.insert(what, (at, span));
            Ok(())
        };
        let mut config = RouteConfig {
            sni: Vec::new(),
            host: Vec::new(),
            path_prefix: "/".to_string(),
            strip_prefix: false,
            balancer: route.balancer.get_ref().clone(),
        };
        if tcp {
            let http_keys = [
                ("host", route.host.as_ref().map(Spanned::span)),
                ("path_prefix", route.path_prefix.as_ref().map(Spanned::span)),
                (
                    "strip_prefix",
                    route.strip_prefix.as_ref().map(Spanned::span),
                ),
            ];
            if let Some((k, Some(span))) = http_keys.into_iter().find(|(_, s)| s.is_some()) {
                return Err(ctx.at(
                    span,
                    at(&format!(".{k}")),
                    "a mode = \"tcp\" listener routes connections by the sni of their TLS ClientHello (nothing is decrypted, so no host or path is read): use sni = [...]",
                ));
            }
            let Some(sni) = &route.sni else {
                return Err(ctx.at(
                    route_span,
                    at(".sni"),
                    "required key is missing: list the server names this route takes, e.g. sni = [\"api.example.com\"]",
                ));
            };
            if sni.get_ref().is_empty() {
                return Err(ctx.at(
                    sni.span(),
                    at(".sni"),
                    "no name: list the server names this route takes, e.g. [\"api.example.com\", \"*.api.example.com\"]",
                ));
            }
            for (k, name) in sni.get_ref().iter().enumerate() {
                let name_at = at(&format!(".sni[{k}]"));
                let normal = route_name(name.get_ref(), true)
                    .map_err(|e| ctx.at(name.span(), &name_at, e))?;
                taken((normal.clone(), String::new()), name_at, name.span())?;
                config.sni.push(normal);
            }
        } else {
            if let Some(sni) = &route.sni {
                return Err(ctx.at(
                    sni.span(),
                    at(".sni"),
                    "an HTTP listener routes requests by host and path: write host = [...] (sni routes are for mode = \"tcp\", TLS passthrough)",
                ));
            }
            if let Some(p) = &route.path_prefix {
                config.path_prefix = route_prefix(p.get_ref())
                    .map_err(|e| ctx.at(p.span(), at(".path_prefix"), e))?;
            }
            if let Some(strip) = &route.strip_prefix {
                if *strip.get_ref() && config.path_prefix == "/" {
                    return Err(ctx.at(
                        strip.span(),
                        at(".strip_prefix"),
                        "strip_prefix needs a path_prefix other than \"/\" to strip",
                    ));
                }
                config.strip_prefix = *strip.get_ref();
            }
            let prefix_span = route
                .path_prefix
                .as_ref()
                .map_or(route_span.clone(), |p| p.span());
            match &route.host {
                None => taken(
                    (String::new(), config.path_prefix.clone()),
                    at(""),
                    prefix_span,
                )?,
                Some(hosts) if hosts.get_ref().is_empty() => {
                    return Err(ctx.at(
                        hosts.span(),
                        at(".host"),
                        "no host: list the hosts this route takes, e.g. [\"api.example.com\", \"*.example.com\"], or leave host out for any host",
                    ));
                }
                Some(hosts) => {
                    for (k, host) in hosts.get_ref().iter().enumerate() {
                        let host_at = at(&format!(".host[{k}]"));
                        let normal = route_name(host.get_ref(), false)
                            .map_err(|e| ctx.at(host.span(), &host_at, e))?;
                        let what = (normal.clone(), config.path_prefix.clone());
                        taken(what, host_at, host.span())?;
                        config.host.push(normal);
                    }
                }
            }
        }
        out.push(config);
    }
    Ok(out)
}

/// A route's path prefix, as a request's path is compared with it.
fn route_prefix(text: &str) -> Result<String, String> {
    if !text.starts_with('/') {
        return Err(format!("{text:?}: a path prefix starts with \"/\""));
    }
    if let Some(c) = text.chars().find(|c| {
        matches!(c, '?' | '#' | '*') || c.is_whitespace() || c.is_control() || !c.is_ascii()
    }) {
        return Err(format!(
            "{text:?}: a path prefix is a path as a request sends it, without {c:?} (no query, fragment, glob, space, control or non-ASCII character; percent-encode instead)"
        ));
    }
    Ok(text.to_string())
}

/// A route's server name (`sni`) or host, lowercase and without a trailing dot;
/// `*.SUFFIX` for a wildcard. A host may be an IP address (IPv6 in brackets, as a
/// `Host` field has it); a client never sends one as SNI.
fn route_name(text: &str, sni: bool) -> Result<String, String> {
    let lower = text.to_ascii_lowercase();
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<std::net::IpAddr>() {
        Ok(_) if sni => return Err(format!("{text:?} is an IP address, which a client never sends as SNI (RFC 6066); a connection without SNI goes to this balancer's own backends")),
        Ok(std::net::IpAddr::V6(ip)) => return Ok(format!("[{ip}]")),
        Ok(std::net::IpAddr::V4(ip)) => return Ok(ip.to_string()),
        Err(_) => {}
    }
    let host = name.strip_prefix("*.").unwrap_or(name);
    if host.contains('*') {
        return Err(format!(
            "{text:?}: a wildcard is written \"*.SUFFIX\", its whole first label, e.g. \"*.example.com\""
        ));
    }
    let valid_label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
    };
    if host.is_empty() || host.len() > 253 || !host.split('.').all(valid_label) {
        return Err(format!("{text:?} is not a DNS name: labels of letters, digits, '-' and '_', 1 to 63 characters each, joined by dots"));
    }
    Ok(name.to_string())
}

/// Each `routes[J].balancer` names another balancer of the same mode, without routes
/// of its own; each balancer without `listen` is named by a route. `targets[i]` are
/// balancer i's, as (its span, the name); `tables[i]` is its table's span.
fn check_route_targets(
    balancers: &[BalancerConfig],
    targets: &[Vec<(Range<usize>, String)>],
    tables: &[Range<usize>],
    ctx: &Ctx<'_>,
) -> Result<(), ConfigError> {
    for (i, routes) in targets.iter().enumerate() {
        for (j, (span, name)) in routes.iter().enumerate() {
            let at = || format!("balancer[{i}].routes[{j}].balancer");
            let Some(target) = balancers.iter().find(|b| &b.name == name) else {
                let names: Vec<&str> = balancers.iter().map(|b| b.name.as_str()).collect();
                return Err(ctx.at(
                    span.clone(),
                    at(),
                    format!(
                        "no balancer is named {name:?} (balancers: {})",
                        names.join(", ")
                    ),
                ));
            };
            let why = if target.name == balancers[i].name {
                Some("a balancer's own backends already take what no route matches: route to another balancer")
            } else if target.mode != balancers[i].mode && target.mode == Protocol::Tcp {
                Some("it is mode = \"tcp\", and this listener is HTTP: a routed request is proxied by an HTTP balancer")
            } else if target.mode != balancers[i].mode {
                Some("it is not mode = \"tcp\": a routed connection is relayed unread")
            } else if !target.routes.is_empty() {
                Some("it has routes of its own: a request or connection is routed once")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(ctx.at(
                    span.clone(),
                    at(),
                    format!("balancer {name:?} cannot be routed to: {why}"),
                ));
            }
        }
    }
    for (i, b) in balancers.iter().enumerate() {
        let routed = || targets.iter().flatten().any(|(_, name)| *name == b.name);
        if b.listen.is_none() && !routed() {
            return Err(ctx.at(
                tables[i].clone(),
                format!("balancer[{i}].listen"),
                format!("required key is missing: balancer {:?} needs a listen address, unless another balancer's routes send to it", b.name),
            ));
        }
    }
    Ok(())
}

fn validate_balancer(
    raw: Spanned<RawBalancer>,
    i: usize,
    lone: bool,
    apps: AppRefs<'_>,
    sources: Sources,
    ctx: &Ctx<'_>,
) -> Result<BalancerConfig, ConfigError> {
    let key = |k: &str| format!("balancer[{i}].{k}");
    let table_span = raw.span();
    let raw = raw.into_inner();

    let name = match &raw.name {
        Some(n) if !is_valid_name(n.get_ref()) => {
            return Err(ctx.at(
                n.span(),
                key("name"),
                format!("invalid balancer name {:?}: {NAME_RULE}", n.get_ref()),
            ));
        }
        Some(n) => n.get_ref().clone(),
        None if lone => DEFAULT_BALANCER.to_string(),
        None => format!("balancer-{i}"),
    };
    let listen = raw.listen.as_ref().map(|l| l.get_ref().0);
    let any = SocketAddr::from(([0, 0, 0, 0], 0));
    let mut b = BalancerConfig::new(name, listen.unwrap_or(any), Vec::new());
    b.listen = listen;
    if listen.is_none() {
        let listener_only = [
            ("tls", raw.tls.as_ref().map(Spanned::span)),
            (
                "proxy_protocol",
                raw.proxy_protocol.as_ref().map(Spanned::span),
            ),
            (
                "forwarded_headers",
                raw.forwarded_headers.as_ref().map(Spanned::span),
            ),
            (
                "redirect_to_https",
                raw.redirect_to_https.as_ref().map(Spanned::span),
            ),
            ("http2", raw.http2.as_ref().map(Spanned::span)),
            ("h2c", raw.h2c.as_ref().map(Spanned::span)),
            (
                "http2_max_streams",
                raw.http2_max_streams.as_ref().map(Spanned::span),
            ),
            ("routes", raw.routes.as_ref().map(Spanned::span)),
        ];
        if let Some((k, Some(span))) = listener_only.into_iter().find(|(_, s)| s.is_some()) {
            return Err(ctx.at(
                span,
                key(k),
                format!("{k} is a listener's setting, and this balancer has no listen: it serves what other balancers' routes send it, on their connections (set {k} on the balancer with the routes)"),
            ));
        }
    }
    if let Some(m) = &raw.mode {
        b.mode = m.get_ref().0;
    }
    let tcp = b.mode == Protocol::Tcp;
    // A setting only HTTP has, written under a TCP balancer: refused where it stands.
    let http_only = |span: Range<usize>, k: &str| {
        let entry = HttpOnly::of(k);
        ctx.at(span, key(entry.key), entry.in_file())
    };

    // Strategy-specific tables: required by their strategy, meaningless elsewhere.
    let strategy_span = raw
        .strategy
        .as_ref()
        .map_or(table_span.clone(), |s| s.span());
    if let Some(s) = raw.strategy {
        b.strategy = s.into_inner().0;
    }
    let hash_span = raw.hash.as_ref().map(|h| h.span());
    match (b.strategy, raw.hash) {
        (Strategy::Hash, Some(h)) => b.hash = Some(h.into_inner().key.0),
        (Strategy::Hash, None) => {
            return Err(ctx.at(
                strategy_span,
                key("hash"),
                "strategy \"hash\" needs a hash key, e.g. hash = { key = \"header:x-user\" } (or \"cookie:NAME\", \"client-ip\", \"path\")",
            ))
        }
        (other, Some(h)) => {
            return Err(ctx.at(
                h.span(),
                key("hash"),
                format!("hash is only used with strategy = \"hash\" (strategy is \"{other}\")"),
            ))
        }
        (_, None) => {}
    }
    match (b.strategy, raw.sticky) {
        (Strategy::Sticky, s) => {
            let cookie = s
                .and_then(|s| s.into_inner().cookie)
                .map_or_else(|| DEFAULT_STICKY_COOKIE.to_string(), |c| c.0);
            b.sticky = Some(StickyConfig { cookie });
        }
        (other, Some(s)) => {
            return Err(ctx.at(
                s.span(),
                key("sticky"),
                format!("sticky is only used with strategy = \"sticky\" (strategy is \"{other}\")"),
            ))
        }
        (_, None) => {}
    }

    if tcp {
        if let Some(why) = tcp_strategy_refusal(b.strategy, b.hash.as_ref()) {
            let at = if b.strategy == Strategy::Hash {
                hash_span.clone().unwrap_or(strategy_span.clone())
            } else {
                strategy_span.clone()
            };
            let k = if b.strategy == Strategy::Hash {
                "hash.key"
            } else {
                "strategy"
            };
            return Err(ctx.at(at, key(k), why));
        }
        if let Some(p) = &raw.backend_protocol {
            return Err(http_only(p.span(), "backend_protocol"));
        }
        if let Some(port) = &raw.redirect_to_https {
            return Err(http_only(port.span(), "redirect_to_https"));
        }
        if let Some(h) = &raw.http2 {
            return Err(http_only(h.span(), "http2"));
        }
        if let Some(h) = &raw.h2c {
            return Err(http_only(h.span(), "h2c"));
        }
        if let Some(h) = &raw.http2_max_streams {
            return Err(http_only(h.span(), "http2_max_streams"));
        }
        if let Some(l) = &raw.limits {
            let what = if l.get_ref().max_body_bytes.is_some() {
                "limits.max_body_bytes"
            } else {
                "limits"
            };
            return Err(http_only(l.span(), what));
        }
        if let Some(f) = &raw.forwarded_headers {
            return Err(http_only(f.span(), "forwarded_headers"));
        }
        if let Some(m) = raw
            .max_conns
            .as_ref()
            .filter(|m| *m.get_ref() == ConnLimit::Auto)
        {
            return Err(http_only(m.span(), "max_conns"));
        }
        if let Some(h) = raw.health.as_ref().filter(|h| h.get_ref().path.is_some()) {
            return Err(http_only(h.span(), "health.path"));
        }
        if let Some(t) = &raw.timeouts {
            let spans = [
                // With a PROXY header, a handshake or a ClientHello to read, it bounds
                // that, as in HTTP mode.
                (
                    "timeouts.header_read",
                    t.header_read
                        .as_ref()
                        .filter(|_| {
                            raw.proxy_protocol.is_none()
                                && raw.tls.is_none()
                                && raw.routes.is_none()
                        })
                        .map(Spanned::span),
                ),
                ("timeouts.request", t.request.as_ref().map(Spanned::span)),
                ("timeouts.client", t.client.as_ref().map(Spanned::span)),
                ("timeouts.body", t.body.as_ref().map(Spanned::span)),
                (
                    "timeouts.body_min_rate",
                    t.body_min_rate.as_ref().map(Spanned::span),
                ),
            ];
            if let Some((k, Some(span))) = spans.into_iter().find(|(_, s)| s.is_some()) {
                return Err(http_only(span, k));
            }
        }
        // "auto" learns from request latency: a TCP balancer has no cap unless given one.
        b.max_conns = ConnLimit::Fixed(0);
    } else if let Some(h) = raw.timeouts.as_ref().and_then(|t| t.half_close.as_ref()) {
        return Err(ctx.at(
            h.span(),
            key("timeouts.half_close"),
            "timeouts.half_close applies to mode = \"tcp\" only (an HTTP connection is never half-closed by drover's choice)",
        ));
    }

    // `trusted = [...]` under `table`: the senders, or an error naming the entry. None
    // at all only where that means something (`forwarded_headers`: pass no client's).
    let trusted_senders = |trusted: Spanned<Vec<Spanned<String>>>, table: &str, none_ok: bool| {
        if trusted.get_ref().is_empty() && !none_ok {
            return Err(ctx.at(
                trusted.span(),
                key(&format!("{table}.trusted")),
                "no sender to trust: list the addresses or CIDR ranges of the balancers in front, e.g. [\"10.0.0.0/8\"]",
            ));
        }
        let mut ranges = Vec::new();
        for (j, entry) in trusted.into_inner().into_iter().enumerate() {
            let range = drover_proxy::proxy_protocol::parse_range(entry.get_ref())
                .map_err(|e| ctx.at(entry.span(), key(&format!("{table}.trusted[{j}]")), e))?;
            ranges.push(range);
        }
        Ok(TrustedSenders::new(ranges))
    };
    if let Some(pp) = raw.proxy_protocol {
        b.proxy_protocol = Some(trusted_senders(
            pp.into_inner().trusted,
            "proxy_protocol",
            false,
        )?);
    }
    if let Some(f) = raw.forwarded_headers {
        b.forwarded_headers = Some(trusted_senders(
            f.into_inner().trusted,
            "forwarded_headers",
            true,
        )?);
    }

    if let Some(routes) = &raw.routes {
        b.routes = validate_routes(routes, i, tcp, ctx)?;
    }

    let backends_span = raw.backends.span();
    let entries = raw.backends.into_inner();
    if let Some(port) = raw.redirect_to_https {
        let span = port.span();
        if raw.tls.is_some() {
            return Err(ctx.at(
                span,
                key("redirect_to_https"),
                "a balancer that redirects to HTTPS serves plain HTTP: give it no tls (the balancer it redirects to has it)",
            ));
        }
        if !entries.is_empty() {
            return Err(ctx.at(
                backends_span,
                key("backends"),
                "a balancer that redirects to HTTPS proxies nothing: write backends = []",
            ));
        }
        b.redirect_to_https = Some(port.into_inner().as_u16());
    } else if entries.is_empty() && !sources.admin && raw.routes.is_none() {
        return Err(ctx.at(
            backends_span,
            key("backends"),
            "backends must not be empty: list at least one \"IP:PORT\" or \"app:NAME\", or add an [admin] table so members can register at runtime (a balancer with routes may have none: what no route matches is closed then)",
        ));
    }
    for (j, entry) in entries.into_iter().enumerate() {
        let span = entry.span();
        let entry = entry.into_inner();
        let bkey = format!("balancer[{i}].backends[{j}]");
        let backend = match entry.target {
            Target::Addr(addr) => BackendRef::Addr {
                addr,
                weight: entry.weight.unwrap_or(1),
                max_conns: entry.max_conns,
            },
            Target::App(name) => {
                if entry.weight.is_some() || entry.max_conns.is_some() {
                    let k = if entry.weight.is_some() {
                        "weight"
                    } else {
                        "max_conns"
                    };
                    return Err(ctx.at(
                        span,
                        format!("{bkey}.{k}"),
                        "weight and max_conns apply only to IP:PORT backends; an app's workers are equal (use the balancer's max_conns)",
                    ));
                }
                if !apps.defined.contains(&name) {
                    let known = if apps.defined.is_empty() {
                        "no [[app]] is defined".to_string()
                    } else {
                        let mut names: Vec<&str> =
                            apps.defined.iter().map(String::as_str).collect();
                        names.sort_unstable();
                        format!("defined apps: {}", names.join(", "))
                    };
                    return Err(ctx.at(
                        span,
                        bkey,
                        format!(
                            "backend \"app:{name}\" refers to an app that does not exist ({known})"
                        ),
                    ));
                }
                if let Some(other) = apps.behind.get(&name) {
                    return Err(ctx.at(
                        span,
                        bkey,
                        format!("app {name:?} is behind balancer[{other}] already: an app's workers join one balancer; give each balancer its own app"),
                    ));
                }
                if let Some(BackendRef::App(first)) =
                    b.backends.iter().find(|o| matches!(o, BackendRef::App(_)))
                {
                    if *first != name {
                        return Err(ctx.at(
                            span,
                            bkey,
                            format!("one app per balancer (this one balances over \"app:{first}\"): give app {name:?} a balancer of its own"),
                        ));
                    }
                }
                BackendRef::App(name)
            }
            Target::Dns { host, port } => BackendRef::Dns(drover_dns::DnsTarget::A { host, port }),
            Target::DnsSrv(name) => BackendRef::Dns(drover_dns::DnsTarget::Srv { name }),
            Target::Etcd(prefix) => {
                if !sources.etcd {
                    return Err(ctx.at(
                        span,
                        bkey,
                        format!("backend \"etcd:{prefix}\" needs an [etcd] table with the cluster's endpoints"),
                    ));
                }
                if b.backends.iter().any(|o| matches!(o, BackendRef::Etcd(_))) {
                    return Err(ctx.at(
                        span,
                        bkey,
                        "one etcd: prefix per balancer: the members API writes to it",
                    ));
                }
                BackendRef::Etcd(prefix)
            }
        };
        let same = |o: &BackendRef| match (o, &backend) {
            (BackendRef::Addr { addr: a, .. }, BackendRef::Addr { addr: b, .. }) => a == b,
            (a, b) => a == b,
        };
        if let Some(first) = b.backends.iter().position(same) {
            return Err(ctx.at(
                span,
                bkey,
                format!(
                    "duplicate backend (same as backends[{first}]); use weight to favour a backend"
                ),
            ));
        }
        b.backends.push(backend);
    }

    if let Some(version) = raw.send_proxy_protocol {
        let span = version.span();
        let version = version.into_inner();
        let parsed: SendVersion = version
            .parse()
            .map_err(|e: String| ctx.at(span.clone(), key("send_proxy_protocol"), e))?;
        if let Some(BackendRef::App(app)) =
            b.backends.iter().find(|o| matches!(o, BackendRef::App(_)))
        {
            return Err(ctx.at(
                span,
                key("send_proxy_protocol"),
                format!("not in front of app {app:?}: drover checks and hands connections to its workers without a header, and a Node server reads none; send it to backends that expect one (nginx `listen ... proxy_protocol`, HAProxy `accept-proxy`)"),
            ));
        }
        b.send_proxy_protocol = Some(parsed);
    }

    if let Some(r) = raw.retries {
        b.retries = r.as_u32();
    }
    if let Some(m) = raw.max_conns {
        b.max_conns = m.into_inner();
    }
    if let Some(q) = raw.queue {
        if let Some(m) = q.max {
            b.queue.max = m;
        }
        if let Some(t) = q.timeout {
            b.queue.timeout = Some(t.0);
        }
    }
    if let Some(t) = raw.timeouts {
        let set = |slot: &mut Duration, v: Option<PosDur>| {
            if let Some(v) = v {
                *slot = v.0;
            }
        };
        set(&mut b.timeouts.connect, t.connect);
        set(
            &mut b.timeouts.header_read,
            t.header_read.map(Spanned::into_inner),
        );
        if let Some(request) = t.request {
            b.timeouts.request = request.into_inner().0;
        }
        set(&mut b.timeouts.idle, t.idle);
        set(&mut b.timeouts.client, t.client.map(Spanned::into_inner));
        set(&mut b.timeouts.body, t.body.map(Spanned::into_inner));
        set(
            &mut b.timeouts.half_close,
            t.half_close.map(Spanned::into_inner),
        );
        if let Some(rate) = t.body_min_rate {
            b.timeouts.body_min_rate = rate.into_inner().as_u32();
        }
    }
    let health_span = raw.health.as_ref().map(Spanned::span);
    if let Some(h) = raw.health {
        b.health = Some(validate_health(h, &key("health"), false, ctx)?);
    }
    if let Some(p) = raw.passive {
        if let Some(f) = p.failures {
            b.passive.failures = f.as_u32();
        }
        if let Some(e) = p.ejection {
            b.passive.ejection = e.0;
        }
        if let Some(m) = p.max_ejection {
            let span = m.span();
            b.passive.max_ejection = m.into_inner().0;
            if b.passive.max_ejection < b.passive.ejection {
                return Err(ctx.at(
                    span,
                    key("passive.max_ejection"),
                    format!(
                        "max_ejection ({}) must not be below ejection ({})",
                        humantime::format_duration(b.passive.max_ejection),
                        humantime::format_duration(b.passive.ejection)
                    ),
                ));
            }
        } else {
            // Only `ejection` was raised: lift the cap with it rather than erroring on a
            // value the user never wrote.
            b.passive.max_ejection = b.passive.max_ejection.max(b.passive.ejection);
        }
    }
    if let Some(s) = raw.slow_start {
        b.slow_start = s.0;
    }
    if let Some(l) = raw.limits {
        let l = l.into_inner();
        if let Some(v) = l.max_header_bytes {
            b.limits.max_header_bytes = v.as_usize();
        }
        if let Some(v) = l.max_uri_bytes {
            b.limits.max_uri_bytes = v.as_usize();
        }
        if let Some(v) = l.max_headers {
            b.limits.max_headers = v.as_usize();
        }
        if let Some(ByteSize(n)) = l.max_body_bytes {
            b.limits.max_body_bytes = (n > 0).then_some(n);
        }
    }
    if let Some(d) = raw.drain_timeout {
        b.drain_timeout = d.0;
    }
    if let Some(d) = raw.shutdown_delay {
        b.shutdown_delay = d.0;
    }
    b.threads = raw.threads.map(Bounded::as_usize);
    if let Some(h) = &raw.http2 {
        b.http2 = *h.get_ref();
    }
    if let Some(h) = raw.h2c.as_ref().filter(|h| *h.get_ref()) {
        let why = if raw.tls.is_some() {
            Some("h2c is HTTP/2 in cleartext; with tls, HTTP/2 is offered by ALPN (http2 = true, the default): remove h2c")
        } else if !b.http2 {
            Some("h2c = true serves HTTP/2, which http2 = false turns off: remove one of them")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(ctx.at(h.span(), key("h2c"), why));
        }
        b.h2c = true;
    }
    if let Some(n) = &raw.http2_max_streams {
        if !(b.h2c || (raw.tls.is_some() && b.http2)) {
            return Err(ctx.at(
                n.span(),
                key("http2_max_streams"),
                "http2_max_streams bounds HTTP/2 connections, and this balancer serves none: it needs tls (with http2, on by default) or h2c = true",
            ));
        }
        b.http2_max_streams = n.get_ref().as_u32();
    }
    if let Some(tls) = raw.tls {
        b.tls = Some(validate_tls(tls, &key, tcp, ctx)?);
    }
    if let Some(tls) = raw.backend_tls {
        if let Some(BackendRef::App(app)) =
            b.backends.iter().find(|o| matches!(o, BackendRef::App(_)))
        {
            // Its workers are drover's own children on loopback ports, and may be
            // handed client connections as they come: they speak plain HTTP.
            return Err(ctx.at(
                tls.span(),
                key("backend_tls"),
                format!("backend_tls does not apply to the workers of app {app:?}, which drover reaches over loopback in plain HTTP: put it on a balancer of remote backends"),
            ));
        }
        b.backend_tls = Some(validate_backend_tls(tls, &key, ctx)?);
    }
    if let Some(p) = raw.backend_protocol {
        let span = p.span();
        let protocol: drover_proxy::BackendProtocol = p
            .into_inner()
            .parse()
            .map_err(|e: String| ctx.at(span.clone(), key("backend_protocol"), e))?;
        let refuse = |why: String| Err(ctx.at(span.clone(), key("backend_protocol"), why));
        if let Some(why) = crate::model::backend_protocol_refusal(
            protocol,
            b.backend_tls.is_some(),
            b.send_proxy_protocol.is_some(),
        ) {
            return refuse(why.to_owned());
        }
        b.backend_protocol = protocol;
    }
    let grpc_check = b
        .health
        .as_ref()
        .is_some_and(|h| matches!(h.kind, CheckKind::Grpc { .. }));
    if grpc_check && !b.backend_protocol.is_http2() {
        return Err(ctx.at(
            health_span.unwrap_or_default(),
            key("health.grpc"),
            GRPC_CHECK_NEEDS_HTTP2,
        ));
    }
    if let Some(log) = raw.access_log {
        let log_span = log.span();
        let log = log.into_inner();
        let fields_span = log.fields.as_ref().map(Spanned::span);
        if let Some(f) = log.format {
            b.access_log.format = f.0;
        }
        if let Some(path) = log.path {
            let span = path.span();
            let path = path.into_inner();
            if path.is_empty() {
                return Err(ctx.at(
                    span,
                    key("access_log.path"),
                    "empty path: a file, or \"-\" for stdout",
                ));
            }
            b.access_log.path = path;
        }
        if let Some(fields) = log.fields {
            let span = fields.span();
            if b.access_log.format != crate::AccessLogFormat::Json {
                return Err(ctx.at(
                    span,
                    key("access_log.fields"),
                    "fields apply to format = \"json\" only",
                ));
            }
            let mut fields: Vec<_> = fields.into_inner().into_iter().map(|f| f.0).collect();
            if fields.is_empty() {
                return Err(ctx.at(
                    span,
                    key("access_log.fields"),
                    "no fields: leave the key out for all of them",
                ));
            }
            // Written in one order whatever the order given, without repeats.
            fields.sort();
            fields.dedup();
            b.access_log.fields = fields;
        }
        if let Some(why) = tcp
            .then(|| tcp_access_log_refusal(b.access_log.format, fields_span.is_some()))
            .flatten()
        {
            // The format has no span of its own (a parsed string): the table's, then.
            let (at, k) = match fields_span {
                Some(f) if b.access_log.format != crate::AccessLogFormat::Combined => {
                    (f, "access_log.fields")
                }
                _ => (log_span, "access_log.format"),
            };
            return Err(ctx.at(at, key(k), why));
        }
    }
    Ok(b)
}

/// `tls`: one form or the other, no empty path. The files are read when the balancer is
/// planned (`BalancerPlan::from_config`), at start and at each reload.
fn validate_tls(
    raw: Spanned<RawTls>,
    key: &dyn Fn(&str) -> String,
    tcp: bool,
    ctx: &Ctx<'_>,
) -> Result<TlsConfig, ConfigError> {
    let span = raw.span();
    let mut tls = raw.into_inner();
    let mut alpn = Vec::new();
    if let Some(list) = tls.alpn.take() {
        if !tcp {
            return Err(ctx.at(
                list.span(),
                key("tls.alpn"),
                "an HTTP listener offers h2 and http/1.1 by ALPN as http2 says: alpn is for mode = \"tcp\"",
            ));
        }
        for (j, p) in list.into_inner().into_iter().enumerate() {
            if let Some(why) = drover_proxy::tls::alpn_refusal(p.get_ref()) {
                return Err(ctx.at(p.span(), key(&format!("tls.alpn[{j}]")), why));
            }
            alpn.push(p.into_inner());
        }
    }
    match (&tls.cert, &tls.key, &tls.certs) {
        (Some(_), _, Some(certs)) => {
            return Err(ctx.at(
                certs.span(),
                key("tls.certs"),
                "give either cert (and key) or certs = [{ cert, key }, ...], not both",
            ))
        }
        (None, Some(k), _) => {
            return Err(ctx.at(
                k.span(),
                key("tls.key"),
                "a key without its cert: write tls = { cert = \"FILE\", key = \"FILE\" }",
            ))
        }
        (None, None, None) => {
            return Err(ctx.at(
                span,
                key("tls"),
                "no certificate: write tls = { cert = \"FILE\", key = \"FILE\" }, or certs = [{ cert, key }, ...] for several",
            ))
        }
        (None, None, Some(certs)) if certs.get_ref().is_empty() => {
            return Err(ctx.at(
                certs.span(),
                key("tls.certs"),
                "no certificate: list at least one { cert = \"FILE\", key = \"FILE\" }",
            ))
        }
        _ => {}
    }
    let mut certs = Vec::new();
    for (j, (cert, private)) in tls.entries().into_iter().enumerate() {
        for (file, part) in [(cert, "cert"), (private, "key")] {
            if file.get_ref().is_empty() {
                let at = if tls.certs.is_some() {
                    format!("tls.certs[{j}].{part}")
                } else {
                    format!("tls.{part}")
                };
                return Err(ctx.at(file.span(), key(&at), "empty path: name a PEM file"));
            }
        }
        certs.push(TlsCertFiles {
            cert: PathBuf::from(cert.get_ref()),
            key: PathBuf::from(private.get_ref()),
        });
    }
    let min_version = match &tls.min_version {
        Some(v) => v
            .get_ref()
            .parse()
            .map_err(|e| ctx.at(v.span(), key("tls.min_version"), e))?,
        None => Default::default(),
    };
    let client_ca =
        match &tls.client_ca {
            Some(ca) if ca.get_ref().is_empty() => return Err(ctx.at(
                ca.span(),
                key("tls.client_ca"),
                "empty path: name a PEM file of the CA certificates that sign client certificates",
            )),
            Some(ca) => Some(PathBuf::from(ca.get_ref())),
            None => None,
        };
    let verify_client =
        match &tls.verify_client {
            Some(_) if client_ca.is_none() => return Err(ctx.at(
                span,
                key("tls.verify_client"),
                "verify_client without client_ca: name the CA file that signs client certificates",
            )),
            Some(v) => v
                .get_ref()
                .parse()
                .map_err(|e| ctx.at(v.span(), key("tls.verify_client"), e))?,
            None => Default::default(),
        };
    Ok(TlsConfig {
        certs,
        alpn,
        min_version,
        client_ca,
        verify_client,
    })
}

/// `backend_tls`: no empty path, a key only with its cert, a server name that is one,
/// and `insecure_skip_verify` not beside a `ca` it would ignore. The files are read
/// when the balancer is planned, at start and at each reload.
fn validate_backend_tls(
    raw: Spanned<RawBackendTls>,
    key: &dyn Fn(&str) -> String,
    ctx: &Ctx<'_>,
) -> Result<BackendTlsConfig, ConfigError> {
    let raw = raw.into_inner();
    let path = |f: Option<Spanned<String>>, k: &str| -> Result<Option<PathBuf>, ConfigError> {
        match f {
            Some(p) if p.get_ref().is_empty() => Err(ctx.at(
                p.span(),
                key(&format!("backend_tls.{k}")),
                "empty path: name a PEM file",
            )),
            Some(p) => Ok(Some(PathBuf::from(p.into_inner()))),
            None => Ok(None),
        }
    };
    if let (None, Some(k)) = (&raw.cert, &raw.key) {
        return Err(ctx.at(
            k.span(),
            key("backend_tls.key"),
            "a client key without its certificate: write cert = \"FILE\", key = \"FILE\"",
        ));
    }
    let insecure = raw
        .insecure_skip_verify
        .as_ref()
        .is_some_and(|v| *v.get_ref());
    if let (true, Some(ca)) = (insecure, &raw.ca) {
        return Err(ctx.at(
            ca.span(),
            key("backend_tls.ca"),
            "insecure_skip_verify = true verifies nothing, so no ca is read: remove one of them",
        ));
    }
    let server_name = match raw.server_name {
        Some(n) => {
            if let Err(e) = drover_proxy::backend_tls::server_name(n.get_ref()) {
                return Err(ctx.at(n.span(), key("backend_tls.server_name"), e));
            }
            Some(n.into_inner())
        }
        None => None,
    };
    let ca = path(raw.ca, "ca")?;
    let cert = path(raw.cert, "cert")?;
    let private = path(raw.key, "key")?;
    Ok(BackendTlsConfig {
        ca,
        server_name,
        client_cert: cert.map(|cert| TlsCertFiles {
            key: private.unwrap_or_else(|| cert.clone()),
            cert,
        }),
        insecure_skip_verify: insecure,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str) -> Config {
        match parse(text, "t.toml") {
            Ok(c) => c,
            Err(e) => panic!("expected config to parse, got: {e}"),
        }
    }

    fn err(text: &str) -> ConfigError {
        match parse(text, "t.toml") {
            Ok(c) => panic!("expected an error, got: {c:#?}"),
            Err(e) => e,
        }
    }

    /// Asserts the error's position, key and a fragment of its message together, so a
    /// failure shows the whole rendered error.
    #[track_caller]
    fn check(e: &ConfigError, line: usize, key: &str, msg_part: &str) {
        let shown = e.to_string();
        assert_eq!(e.file, "t.toml", "{shown}");
        assert_eq!(e.line, Some(line), "{shown}");
        assert!(e.column.is_some(), "{shown}");
        assert_eq!(e.key, key, "{shown}");
        assert!(e.message.contains(msg_part), "{shown}");
        assert!(shown.starts_with(&format!("t.toml:{line}:")), "{shown}");
    }

    const MINIMAL: &str =
        "[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = [\"127.0.0.1:9001\"]\n";

    /// A TCP listener `front` with `routes` (line 5 on) and its own `backends`, beside
    /// the TCP balancers `api` (line 1) and `web` (line 2), each one line.
    fn routed(backends: &str, routes: &str) -> String {
        format!(
            "[[balancer]]\nname = \"front\"\nmode = \"tcp\"\nlisten = \"127.0.0.1:8443\"\nbackends = {backends}\nroutes = [\n{routes}]\n\
             [[balancer]]\nname = \"api\"\nmode = \"tcp\"\nlisten = \"127.0.0.1:9443\"\nbackends = [\"127.0.0.1:9001\"]\n\
             [[balancer]]\nname = \"web\"\nmode = \"tcp\"\nlisten = \"127.0.0.1:9444\"\nbackends = [\"127.0.0.1:9002\"]\n"
        )
    }

    #[test]
    fn sni_routes_parse_lowercase_and_may_leave_no_default() {
        let c = ok(&routed(
            "[]",
            "  { sni = [\"API.Example.com.\", \"*.api.example.com\"], balancer = \"api\" },\n  { sni = [\"*.example.com\"], balancer = \"web\" },\n",
        ));
        let b = &c.balancers[0];
        assert!(b.backends.is_empty(), "no default: unmatched is closed");
        assert_eq!(
            b.routes,
            [
                sni_route(&["api.example.com", "*.api.example.com"], "api"),
                sni_route(&["*.example.com"], "web"),
            ]
        );
        // The ClientHello's read is bounded by header_read, which routes make meaningful.
        let t = routed("[]", "{ sni = [\"a.test\"], balancer = \"api\" },\n").replace(
            "backends = []\n",
            "backends = []\ntimeouts = { header_read = \"2s\" }\n",
        );
        assert_eq!(
            ok(&t).balancers[0].timeouts.header_read,
            Duration::from_secs(2)
        );
    }

    #[test]
    fn bad_sni_routes_are_named_where_they_stand() {
        let one = |route: &str| err(&routed("[]", &format!("  {route},\n")));
        check(
            &one("{ sni = [\"a.test\", \"A.test.\"], balancer = \"api\" }"),
            7,
            "balancer[0].routes[0].sni[1]",
            "\"a.test\" is routed already by balancer[0].routes[0].sni[0] (line 7, column 12)",
        );
        let e = err(&routed(
            "[]",
            "  { sni = [\"*.a.test\"], balancer = \"api\" },\n  { sni = [\"*.A.test\"], balancer = \"web\" },\n",
        ));
        check(
            &e,
            8,
            "balancer[0].routes[1].sni[0]",
            "routed already by balancer[0].routes[0].sni[0] (line 7,",
        );
        check(
            &one("{ sni = [], balancer = \"api\" }"),
            7,
            "balancer[0].routes[0].sni",
            "no name",
        );
        check(
            &one("{ sni = [\"a.*.test\"], balancer = \"api\" }"),
            7,
            "balancer[0].routes[0].sni[0]",
            "a wildcard is written",
        );
        check(
            &one("{ sni = [\"*\"], balancer = \"api\" }"),
            7,
            "balancer[0].routes[0].sni[0]",
            "a wildcard is written",
        );
        check(
            &one("{ sni = [\"a..test\"], balancer = \"api\" }"),
            7,
            "balancer[0].routes[0].sni[0]",
            "is not a DNS name",
        );
        check(
            &one("{ sni = [\"a test\"], balancer = \"api\" }"),
            7,
            "balancer[0].routes[0].sni[0]",
            "is not a DNS name",
        );
        check(
            &one("{ sni = [\"\"], balancer = \"api\" }"),
            7,
            "balancer[0].routes[0].sni[0]",
            "is not a DNS name",
        );
        check(
            &one("{ sni = [\"10.0.0.1\"], balancer = \"api\" }"),
            7,
            "balancer[0].routes[0].sni[0]",
            "is an IP address",
        );
        check(
            &one("{ sni = [\"a.test\"], balancer = \"nope\" }"),
            7,
            "balancer[0].routes[0].balancer",
            "no balancer is named \"nope\" (balancers: front, api, web)",
        );
        check(
            &one("{ sni = [\"a.test\"], balancer = \"front\" }"),
            7,
            "balancer[0].routes[0].balancer",
            "own backends already take",
        );
        check(
            &one("{ sni = [\"a.test\"] }"),
            7,
            "balancer[0].routes[0].balancer",
            "required key is missing",
        );
        check(
            &one("{ sni = [\"a.test\"], balancer = \"api\", host = [\"x\"] }"),
            7,
            "balancer[0].routes[0].host",
            "no host or path is read): use sni",
        );
        check(
            &one("{ sni = [\"a.test\"], balancer = \"api\", colour = \"x\" }"),
            7,
            "balancer[0].routes[0].colour",
            "unknown key `colour`",
        );
        check(
            &one("{ balancer = \"api\" }"),
            7,
            "balancer[0].routes[0].sni",
            "required key is missing",
        );
        let e = err(&routed("[]", "").replace("routes = [\n]", "routes = []"));
        check(&e, 6, "balancer[0].routes", "no route");
        // A target that is HTTP, or routes itself.
        let t = routed("[]", "  { sni = [\"a.test\"], balancer = \"api\" },\n")
            .replace("name = \"api\"\nmode = \"tcp\"\n", "name = \"api\"\n");
        check(
            &err(&t),
            7,
            "balancer[0].routes[0].balancer",
            "it is not mode = \"tcp\"",
        );
        let t = routed("[]", "  { sni = [\"a.test\"], balancer = \"web\" },\n").replace(
            "backends = [\"127.0.0.1:9002\"]\n",
            "backends = [\"127.0.0.1:9002\"]\nroutes = [{ sni = [\"b.test\"], balancer = \"api\" }]\n",
        );
        check(
            &err(&t),
            7,
            "balancer[0].routes[0].balancer",
            "it has routes of its own",
        );
        // An HTTP listener routes by host, not by SNI.
        let t = routed("[]", "  { sni = [\"a.test\"], balancer = \"api\" },\n").replacen(
            "mode = \"tcp\"\n",
            "",
            1,
        );
        check(
            &err(&t),
            6,
            "balancer[0].routes[0].sni",
            "an HTTP listener routes requests by host and path: write host",
        );
        // Without routes, header_read and an empty backends stay refused in TCP mode.
        let e = err("[[balancer]]\nmode = \"tcp\"\nlisten = \"127.0.0.1:8000\"\nbackends = []\n");
        check(
            &e,
            4,
            "balancer[0].backends",
            "a balancer with routes may have none",
        );
    }

    fn sni_route(names: &[&str], balancer: &str) -> RouteConfig {
        RouteConfig {
            sni: names.iter().map(|n| n.to_string()).collect(),
            host: Vec::new(),
            path_prefix: "/".into(),
            strip_prefix: false,
            balancer: balancer.into(),
        }
    }

    /// An HTTP listener `front` with `routes` (line 6 on) and no backends of its own,
    /// beside the HTTP balancers `api` and `web`, which have no listen.
    fn http_routed(routes: &str) -> String {
        format!(
            "[[balancer]]\nname = \"front\"\nlisten = \"127.0.0.1:8080\"\nbackends = []\nroutes = [\n{routes}]\n\
             [[balancer]]\nname = \"api\"\nbackends = [\"127.0.0.1:9001\"]\n\
             [[balancer]]\nname = \"web\"\nbackends = [\"127.0.0.1:9002\"]\n"
        )
    }

    #[test]
    fn http_routes_parse_and_their_balancers_need_no_listen() {
        let c = ok(&http_routed(
            "  { host = [\"API.Example.com.\", \"*.example.com\", \"10.0.0.1\", \"::1\"], path_prefix = \"/v1/\", strip_prefix = true, balancer = \"api\" },\n  { path_prefix = \"/v1\", balancer = \"api\" },\n  { balancer = \"web\" },\n",
        ));
        let route = |host: &[&str], prefix: &str, strip, balancer: &str| RouteConfig {
            sni: Vec::new(),
            host: host.iter().map(|h| h.to_string()).collect(),
            path_prefix: prefix.into(),
            strip_prefix: strip,
            balancer: balancer.into(),
        };
        assert_eq!(
            c.balancers[0].routes,
            [
                route(
                    &["api.example.com", "*.example.com", "10.0.0.1", "[::1]"],
                    "/v1/",
                    true,
                    "api"
                ),
                route(&[], "/v1", false, "api"),
                route(&[], "/", false, "web"),
            ]
        );
        assert_eq!(c.balancers[1].listen, None);
        assert_eq!(c.balancers[2].listen, None);
        // Connections stay with the listener that routes their requests.
        assert!(c
            .balancers
            .iter()
            .all(|b| b.handoff == drover_proxy::Handoff::Never));
    }

    #[test]
    fn bad_http_routes_are_named_where_they_stand() {
        let one = |route: &str| err(&http_routed(&format!("  {route},\n")));
        let e = err(&http_routed(
            "  { host = [\"a.test\"], path_prefix = \"/api\", balancer = \"api\" },\n  { host = [\"b.test\", \"A.test\"], path_prefix = \"/api\", balancer = \"web\" },\n",
        ));
        check(
            &e,
            7,
            "balancer[0].routes[1].host[1]",
            "host \"a.test\" with path_prefix \"/api\" is routed already by balancer[0].routes[0].host[0] (line 6, column 13)",
        );
        let e = err(&http_routed(
            "  { balancer = \"api\" },\n  { path_prefix = \"/\", balancer = \"web\" },\n",
        ));
        check(
            &e,
            7,
            "balancer[0].routes[1]",
            "path_prefix \"/\" for any host is routed already by balancer[0].routes[0]",
        );
        // The same prefix under another host, or another prefix, is no clash.
        ok(&http_routed(
            "  { host = [\"a.test\"], path_prefix = \"/api\", balancer = \"api\" },\n  { path_prefix = \"/api\", balancer = \"web\" },\n  { host = [\"a.test\"], path_prefix = \"/api/\", balancer = \"web\" },\n",
        ));
        for (route, key, msg) in [
            (
                "{ path_prefix = \"api\", balancer = \"api\" }",
                "balancer[0].routes[0].path_prefix",
                "starts with \"/\"",
            ),
            (
                "{ path_prefix = \"/a?b\", balancer = \"api\" }",
                "balancer[0].routes[0].path_prefix",
                "without '?'",
            ),
            (
                "{ path_prefix = \"/a*\", balancer = \"api\" }",
                "balancer[0].routes[0].path_prefix",
                "without '*'",
            ),
            (
                "{ path_prefix = \"/a b\", balancer = \"api\" }",
                "balancer[0].routes[0].path_prefix",
                "without ' '",
            ),
            (
                "{ strip_prefix = true, balancer = \"api\" }",
                "balancer[0].routes[0].strip_prefix",
                "needs a path_prefix",
            ),
            (
                "{ host = [], balancer = \"api\" }",
                "balancer[0].routes[0].host",
                "no host",
            ),
            (
                "{ host = [\"a..test\"], balancer = \"api\" }",
                "balancer[0].routes[0].host[0]",
                "is not a DNS name",
            ),
            (
                "{ host = [\"a.*.test\"], balancer = \"api\" }",
                "balancer[0].routes[0].host[0]",
                "a wildcard is written",
            ),
            (
                "{ host = \"a.test\", balancer = \"api\" }",
                "balancer[0].routes[0].host",
                "expected a sequence",
            ),
            (
                "{ sni = [\"a.test\"], balancer = \"api\" }",
                "balancer[0].routes[0].sni",
                "write host = [...]",
            ),
            (
                "{ balancer = \"front\" }",
                "balancer[0].routes[0].balancer",
                "own backends already take",
            ),
        ] {
            check(&one(route), 6, key, msg);
        }
        // A TCP target behind an HTTP listener.
        let t = http_routed("  { balancer = \"api\" },\n")
            .replace("name = \"api\"\n", "name = \"api\"\nmode = \"tcp\"\n");
        check(
            &err(&t),
            6,
            "balancer[0].routes[0].balancer",
            "it is mode = \"tcp\", and this listener is HTTP",
        );
        // A balancer without listen that no route names.
        let e = err(&http_routed("  { balancer = \"api\" },\n"));
        check(
            &e,
            11,
            "balancer[2].listen",
            "balancer \"web\" needs a listen address, unless another balancer's routes",
        );
        // What only a listener has, on a balancer without one.
        let t = http_routed(
            "  { path_prefix = \"/a\", balancer = \"api\" },\n  { balancer = \"web\" },\n",
        )
        .replace(
            "backends = [\"127.0.0.1:9002\"]\n",
            "backends = [\"127.0.0.1:9002\"]\nh2c = true\n",
        );
        check(
            &err(&t),
            15,
            "balancer[2].h2c",
            "h2c is a listener's setting",
        );
        // Whose forwarding fields to keep is the routing listener's to say.
        let t = http_routed(
            "  { path_prefix = \"/a\", balancer = \"api\" },\n  { balancer = \"web\" },\n",
        )
        .replace(
            "backends = [\"127.0.0.1:9002\"]\n",
            "backends = [\"127.0.0.1:9002\"]\nforwarded_headers = { trusted = [\"10.0.0.0/8\"] }\n",
        );
        check(
            &err(&t),
            15,
            "balancer[2].forwarded_headers",
            "forwarded_headers is a listener's setting",
        );
        let t = http_routed(
            "  { path_prefix = \"/a\", balancer = \"api\" },\n  { balancer = \"web\" },\n",
        )
        .replace(
            "backends = [\"127.0.0.1:9002\"]\n",
            "backends = [\"127.0.0.1:9002\"]\nroutes = [{ balancer = \"api\" }]\n",
        );
        check(
            &err(&t),
            15,
            "balancer[2].routes",
            "routes is a listener's setting",
        );
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn design_example_parses() {
        // The configuration example the design started from, verbatim.
        let c = ok(r#"
[admin]
listen = "127.0.0.1:9900"         # token required when not on loopback

[[app]]                           # supervised processes (optional)
name = "pi"
command = ["node", "examples/pi-server.js"]
workers = "auto"                  # one per core
health = { path = "/health", interval = "2s", rise = 2, fall = 3 }

[[balancer]]
listen = "0.0.0.0:8000"
strategy = "p2c"
backends = ["app:pi"]             # or "127.0.0.1:9001", "dns:api.internal:80", "etcd:/drover/pools/web"
retries = 2                       # only when the request never reached a backend, or is idempotent
timeouts = { connect = "5s", request = "30s", idle = "60s" }
"#);
        let admin = c.admin.as_ref().unwrap();
        assert_eq!(admin.listen, addr("127.0.0.1:9900"));
        assert_eq!(admin.token, None);
        assert_eq!(c.apps.len(), 1);
        let app = &c.apps[0].spec;
        assert_eq!(app.name, "pi");
        assert_eq!(app.command, ["node", "examples/pi-server.js"]);
        assert_eq!(app.workers, Workers::Auto);
        assert!(app.workers.resolve() >= 1);
        assert_eq!(app.health, Some(HealthCheck::http("/health")));
        let b = &c.balancers[0];
        assert_eq!(b.name, "default");
        assert_eq!(b.listen, Some(addr("0.0.0.0:8000")));
        assert_eq!(b.strategy, Strategy::P2c);
        assert_eq!(b.backends, [BackendRef::App("pi".into())]);
        assert_eq!(b.retries, 2);
        assert_eq!(
            b.timeouts,
            TimeoutConfig {
                connect: Duration::from_secs(5),
                ..TimeoutConfig::default()
            }
        );
    }

    #[test]
    fn minimal_balancer_gets_every_default() {
        let c = ok(MINIMAL);
        assert!(c.admin.is_none());
        assert!(c.apps.is_empty());
        let expected = BalancerConfig::new(
            "default",
            addr("127.0.0.1:8000"),
            vec![BackendRef::Addr {
                addr: addr("127.0.0.1:9001"),
                weight: 1,
                max_conns: None,
            }],
        );
        assert_eq!(c.balancers, std::slice::from_ref(&expected));
        // Spot-check the documented defaults, so changing one is a deliberate act.
        assert_eq!(expected.strategy, Strategy::P2c);
        assert_eq!(expected.retries, 2);
        assert_eq!(expected.max_conns, ConnLimit::Auto);
        assert_eq!(expected.queue.max, QueueMax::Unlimited);
        assert_eq!(expected.queue.timeout, None);
        assert_eq!(expected.timeouts.header_read, Duration::from_secs(10));
        assert_eq!(expected.passive.failures, 5);
        assert_eq!(expected.slow_start, Duration::from_secs(10));
        assert_eq!(expected.limits.max_header_bytes, 16384);
        assert_eq!(expected.drain_timeout, Duration::from_secs(30));
        assert_eq!(expected.health, None);
    }

    #[test]
    fn every_key_parses() {
        let c = ok(r#"
[admin]
listen = "0.0.0.0:9900"
token = "s3cret"

[[app]]
name = "api_v2"
command = ["./server", "--port", "0"]
workers = 4
cwd = "/srv/api"
env = { RUST_LOG = "info", "A.B" = "c" }
health = { tcp = true, interval = "500ms", timeout = "250ms", rise = 1, fall = 5 }
ready_timeout = "1m"
stop_timeout = "3s"
wait_ready = true
watch = ["src", "config.json"]
ignore_watch = ["src/tmp"]
watch_delay = "250ms"

[[balancer]]
name = "web"
listen = "[::1]:8080"
strategy = "hash"
backends = [
  "127.0.0.1:9001",
  { address = "127.0.0.1:9002", weight = 3, max_conns = 10 },
  "app:api_v2",
]
retries = 0
max_conns = 100
queue = { max = 0, timeout = "100ms" }
timeouts = { connect = "250ms", header_read = "5s", request = "2m", idle = "90s" }
health = { path = "/ready", expect = "200-299", interval = "3s", timeout = "2s", rise = 3, fall = 2 }
passive = { failures = 0, ejection = "1s", max_ejection = "10s" }
slow_start = "0s"
hash = { key = "header:X-User" }
limits = { max_header_bytes = 32768, max_uri_bytes = 4096, max_headers = 50 }
drain_timeout = "0s"
shutdown_delay = "5s"
threads = 2

[[balancer]]
listen = "127.0.0.1:8081"
strategy = "sticky"
backends = ["127.0.0.1:9003"]
sticky = { cookie = "sid" }
"#);
        assert_eq!(c.admin.as_ref().unwrap().token.as_deref(), Some("s3cret"));
        let app = &c.apps[0].spec;
        assert_eq!(app.workers, Workers::Count(4));
        assert_eq!(app.cwd.as_deref(), Some(Path::new("/srv/api")));
        assert_eq!(app.env.get("A.B").map(String::as_str), Some("c"));
        assert_eq!(app.health.as_ref().unwrap().kind, CheckKind::Tcp);
        assert_eq!(
            app.health.as_ref().unwrap().interval,
            Duration::from_millis(500)
        );
        assert_eq!(
            (
                app.health.as_ref().unwrap().rise,
                app.health.as_ref().unwrap().fall
            ),
            (1, 5)
        );
        assert_eq!(app.ready_timeout, Duration::from_secs(60));
        assert_eq!(app.stop_timeout, Duration::from_secs(3));
        assert!(app.wait_ready);
        let watch = app.watch.as_ref().unwrap();
        assert_eq!(watch.paths, [Path::new("src"), Path::new("config.json")]);
        assert_eq!(watch.ignore, ["src/tmp"]);
        assert_eq!(watch.delay, Duration::from_millis(250));

        let b = &c.balancers[0];
        assert_eq!(b.name, "web");
        assert_eq!(b.listen, Some(addr("[::1]:8080")));
        assert_eq!(
            b.backends,
            [
                BackendRef::Addr {
                    addr: addr("127.0.0.1:9001"),
                    weight: 1,
                    max_conns: None
                },
                BackendRef::Addr {
                    addr: addr("127.0.0.1:9002"),
                    weight: 3,
                    max_conns: Some(10)
                },
                BackendRef::App("api_v2".into()),
            ]
        );
        assert_eq!((b.retries, b.max_conns), (0, ConnLimit::Fixed(100)));
        assert_eq!(
            b.queue,
            QueueConfig {
                max: QueueMax::At(0),
                timeout: Some(Duration::from_millis(100))
            }
        );
        assert_eq!(b.timeouts.request, Some(Duration::from_secs(120)));
        assert_eq!(
            b.health,
            Some(HealthCheck {
                kind: CheckKind::Http {
                    path: "/ready".into(),
                    expect: StatusRange::new(200, 299)
                },
                interval: Duration::from_secs(3),
                timeout: Duration::from_secs(2),
                rise: 3,
                fall: 2,
            })
        );
        assert_eq!(
            b.passive,
            PassiveConfig {
                failures: 0,
                ejection: Duration::from_secs(1),
                max_ejection: Duration::from_secs(10)
            }
        );
        assert_eq!(b.slow_start, Duration::ZERO);
        assert_eq!(b.hash, Some(HashKey::Header("x-user".into())));
        assert_eq!(b.sticky, None);
        assert_eq!(b.limits.max_headers, 50);
        assert_eq!(b.drain_timeout, Duration::ZERO);
        assert_eq!(b.shutdown_delay, Duration::from_secs(5));
        assert_eq!(b.threads, Some(2));

        let s = &c.balancers[1];
        assert_eq!(s.name, "balancer-1");
        assert_eq!(
            s.sticky,
            Some(StickyConfig {
                cookie: "sid".into()
            })
        );
        assert_eq!(s.hash, None);
    }

    #[test]
    fn access_log_is_checked_with_its_place() {
        let c = ok(&format!(
            "{MINIMAL}access_log = {{ format = \"json\", path = \"/var/log/x.log\", fields = [\"status\", \"time\"] }}\n"
        ));
        let log = &c.balancers[0].access_log;
        assert_eq!(log.format, crate::AccessLogFormat::Json);
        assert_eq!(log.path, "/var/log/x.log");
        assert_eq!(
            log.fields,
            vec![crate::AccessLogField::Time, crate::AccessLogField::Status]
        );
        let c = ok(&format!(
            "{MINIMAL}access_log = {{ format = \"combined\" }}\n"
        ));
        assert_eq!(c.balancers[0].access_log.path, "-");
        let e = err(&format!("{MINIMAL}access_log = {{ format = \"clf\" }}\n"));
        check(
            &e,
            4,
            "balancer[0].access_log.format",
            "expected one of combined, json, off",
        );
        let e = err(&format!(
            "{MINIMAL}access_log = {{ format = \"json\", fields = [\"status\", \"colour\"] }}\n"
        ));
        check(
            &e,
            4,
            "balancer[0].access_log.fields[1]",
            "unknown access log field \"colour\"",
        );
        let e = err(&format!(
            "{MINIMAL}access_log = {{ format = \"combined\", fields = [\"status\"] }}\n"
        ));
        check(&e, 4, "balancer[0].access_log.fields", "apply to format");
        let e = err(&format!(
            "{MINIMAL}access_log = {{ format = \"json\", file = \"x\" }}\n"
        ));
        check(&e, 4, "balancer[0].access_log.file", "`path`");
    }

    #[test]
    fn unknown_keys_are_named_with_the_valid_ones() {
        let e = err("[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackend = [\"127.0.0.1:1\"]\n");
        check(&e, 3, "balancer[0].backend", "unknown key `backend`");
        assert!(e.message.contains("`backends`"), "{e}");
        assert_eq!(e.column, Some(1));

        let e = err("[server]\nport = 1\n");
        check(
            &e,
            1,
            "server",
            "expected one of `admin`, `resolver`, `etcd`, `app`, `balancer`",
        );

        let e = err(&format!("{MINIMAL}timeouts = {{ conect = \"1s\" }}\n"));
        check(&e, 4, "balancer[0].timeouts.conect", "`connect`");

        let e = err("[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = [{ address = \"127.0.0.1:1\", wieght = 2 }]\n");
        check(&e, 3, "balancer[0].backends[0].wieght", "`weight`");

        let e =
            err("[[app]]\nname = \"a\"\ncommand = [\"x\"]\nhealth = { path = \"/h\", rize = 2 }\n");
        check(&e, 4, "app[0].health.rize", "`rise`");
    }

    #[test]
    fn bad_duration_names_key_and_value() {
        let text = format!("{MINIMAL}\n[balancer.timeouts]\nconnect = \"1 sec\"\nidle = \"10x\"\n");
        let e = err(&text);
        check(
            &e,
            7,
            "balancer[0].timeouts.idle",
            "invalid duration \"10x\"",
        );
        assert_eq!(e.column, Some(8));

        let e = err(&format!("{MINIMAL}drain_timeout = 30\n"));
        check(&e, 4, "balancer[0].drain_timeout", "\"30s\"");
        let e = err(&format!("{MINIMAL}shutdown_delay = \"soon\"\n"));
        check(
            &e,
            4,
            "balancer[0].shutdown_delay",
            "invalid duration \"soon\"",
        );

        let e = err(&format!("{MINIMAL}timeouts = {{ connect = \"0s\" }}\n"));
        check(&e, 4, "balancer[0].timeouts.connect", "greater than 0");

        // The request timeout alone may be "off"; nothing else is a word.
        let e = err(&format!("{MINIMAL}timeouts = {{ connect = \"off\" }}\n"));
        check(
            &e,
            4,
            "balancer[0].timeouts.connect",
            "invalid duration \"off\"",
        );
        for (bad, says) in [
            ("\"none\"", "invalid duration \"none\""),
            ("\"0s\"", "greater than 0, or \"off\""),
            ("30", "\"30s\""),
            ("false", "or \"off\""),
        ] {
            let e = err(&format!("{MINIMAL}timeouts = {{ request = {bad} }}\n"));
            check(&e, 4, "balancer[0].timeouts.request", says);
        }
        let off = ok(&format!("{MINIMAL}timeouts = {{ request = \"off\" }}\n"));
        assert_eq!(off.balancers[0].timeouts.request, None);
    }

    #[test]
    fn bad_watch_settings_are_named() {
        let app = "[[app]]\nname = \"a\"\ncommand = [\"node\", \"a.js\"]\n";
        let e = err(&format!("{app}watch = 3\n"));
        assert_eq!(e.key, "app[0].watch", "{e}");
        assert!(
            e.to_string()
                .contains("true, false, a path or a list of paths"),
            "{e}"
        );
        let e = err(&format!("{app}watch = [\"src\", 1]\n"));
        assert!(e.to_string().contains("app[0].watch"), "{e}");
        let e = err(&format!("{app}ignore_watch = [\"logs\"]\n"));
        assert!(
            e.to_string()
                .contains("app[0].ignore_watch: ignore_watch applies to watched files"),
            "{e}"
        );
        let e = err(&format!("{app}watch = true\nwatch_delay = \"soon\"\n"));
        assert!(e.to_string().contains("invalid duration \"soon\""), "{e}");
        let c = ok(&format!("{app}watch = true\n"));
        assert_eq!(
            c.apps[0].spec.watch.as_ref().unwrap().paths,
            [Path::new(".")]
        );
        let c = ok(&format!("{app}watch = false\n"));
        assert_eq!(c.apps[0].spec.watch, None);
    }

    #[test]
    fn bad_listen_address() {
        let e = err("[[balancer]]\nlisten = \"8000x\"\nbackends = [\"127.0.0.1:1\"]\n");
        check(&e, 2, "balancer[0].listen", "invalid address \"8000x\"");
        assert_eq!(e.column, Some(10));
        let e = err("[[balancer]]\nlisten = \"example.com:8000\"\nbackends = [\"127.0.0.1:1\"]\n");
        check(&e, 2, "balancer[0].listen", "host names are not resolved");
        let e = err("[[balancer]]\nlisten = \"127.0.0.1:80000\"\nbackends = [\"127.0.0.1:1\"]\n");
        check(&e, 2, "balancer[0].listen", "port 80000 is past 65535");
        let e = err("[[balancer]]\nlisten = 8000\nbackends = [\"127.0.0.1:1\"]\n");
        check(&e, 2, "balancer[0].listen", "expected a string");
    }

    #[test]
    fn listen_addresses_as_nginx_and_haproxy_users_write_them() {
        for (text, addr) in [
            ("8000", "0.0.0.0:8000"),
            (":8000", "0.0.0.0:8000"),
            ("localhost:8000", "127.0.0.1:8000"),
            ("127.0.0.1:0", "127.0.0.1:0"),
            ("[::1]:8000", "[::1]:8000"),
        ] {
            assert_eq!(listen_addr(text), Ok(addr.parse().unwrap()), "{text}");
        }
        for bad in [
            "",
            ":",
            "80000",
            ":80000",
            "localhost",
            "localhost:x",
            "host:80",
        ] {
            assert!(listen_addr(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_target("localhost:9001"),
            Ok(Target::Addr("127.0.0.1:9001".parse().unwrap()))
        );
        let e = parse_target("http://127.0.0.1:9001").unwrap_err();
        assert!(e.contains("not a URL: write \"127.0.0.1:9001\""), "{e}");
        let e = parse_target("https://10.0.0.1:443").unwrap_err();
        assert!(e.contains("backend_tls"), "{e}");
    }

    #[test]
    fn missing_required_keys_are_named() {
        let e = err("[[balancer]]\nbackends = [\"127.0.0.1:1\"]\n");
        check(&e, 1, "balancer[0].listen", "required key is missing");
        let e = err(&format!(
            "{MINIMAL}[[balancer]]\nlisten = \"127.0.0.1:8001\"\n"
        ));
        check(&e, 4, "balancer[1].backends", "required key is missing");
        let e = err("[[app]]\ncommand = [\"x\"]\n");
        check(&e, 1, "app[0].name", "required key is missing");
    }

    #[test]
    fn unknown_strategy_lists_the_known_ones() {
        let e = err("[[balancer]]\nlisten = \"127.0.0.1:8000\"\nstrategy = \"fastest\"\nbackends = [\"127.0.0.1:1\"]\n");
        assert_eq!(
            e.to_string(),
            "t.toml:3:12: balancer[0].strategy: unknown strategy \"fastest\": expected one of \
             round-robin, weighted, least-conn, random, p2c, peak-ewma, hash, sticky"
        );
    }

    #[test]
    fn every_strategy_name_is_accepted() {
        for s in Strategy::ALL {
            let extra = match s.name() {
                "hash" => "hash = { key = \"client-ip\" }\n",
                _ => "",
            };
            let c = ok(&format!("{MINIMAL}strategy = \"{s}\"\n{extra}"));
            assert_eq!(c.balancers[0].strategy, s);
        }
    }

    #[test]
    fn hash_key_required_with_hash_and_only_with_hash() {
        let e = err(&format!("{MINIMAL}strategy = \"hash\"\n"));
        check(&e, 4, "balancer[0].hash", "needs a hash key");

        let e = err(&format!("{MINIMAL}hash = {{ key = \"path\" }}\n"));
        check(
            &e,
            4,
            "balancer[0].hash",
            "only used with strategy = \"hash\"",
        );

        let e = err(&format!(
            "{MINIMAL}strategy = \"hash\"\nhash = {{ key = \"query:x\" }}\n"
        ));
        check(
            &e,
            5,
            "balancer[0].hash.key",
            "invalid hash key \"query:x\"",
        );

        let e = err(&format!(
            "{MINIMAL}strategy = \"hash\"\nhash = {{ key = \"header:\" }}\n"
        ));
        check(&e, 5, "balancer[0].hash.key", "not a valid header name");

        for (text, want) in [
            ("cookie:sid", HashKey::Cookie("sid".into())),
            ("client-ip", HashKey::ClientIp),
            ("path", HashKey::Path),
        ] {
            let c = ok(&format!(
                "{MINIMAL}strategy = \"hash\"\nhash = {{ key = \"{text}\" }}\n"
            ));
            assert_eq!(c.balancers[0].hash, Some(want));
        }
    }

    #[test]
    fn mode_tcp_relays_connections_with_the_settings_that_apply() {
        assert_eq!(ok(MINIMAL).balancers[0].mode, Protocol::Http);
        let c = ok(&format!(
            "{MINIMAL}mode = \"tcp\"\nstrategy = \"hash\"\nhash = {{ key = \"client-ip\" }}\n\
             health = {{ tcp = true }}\ntimeouts = {{ connect = \"1s\", idle = \"5m\", half_close = \"3s\" }}\n"
        ));
        let b = &c.balancers[0];
        assert_eq!(b.mode, Protocol::Tcp);
        assert_eq!(b.timeouts.idle, Duration::from_secs(300));
        assert_eq!(b.timeouts.half_close, Duration::from_secs(3));
        // No cap unless given one: "auto" learns from request latency.
        assert_eq!(b.max_conns, ConnLimit::Fixed(0));
        assert_eq!(b.handoff, drover_proxy::Handoff::Never);
        let plan = crate::plan::BalancerPlan::from_config(b).unwrap();
        assert_eq!(plan.proxy.protocol, Protocol::Tcp);
        assert_eq!(plan.proxy.timeouts.half_close, Duration::from_secs(3));
        assert!(!plan.pool.adaptive_limit);
        // Behind another balancer: the PROXY header is read, by header_read (which a
        // TCP balancer without one refuses: see the test below).
        let behind = ok(&format!(
            "{MINIMAL}mode = \"tcp\"\nproxy_protocol = {{ trusted = [\"10.0.0.0/8\"] }}\n\
             timeouts = {{ header_read = \"2s\" }}\n"
        ));
        let b = &behind.balancers[0];
        assert_eq!(b.proxy_protocol, Some("10.0.0.0/8".parse().unwrap()));
        assert_eq!(b.timeouts.header_read, Duration::from_secs(2));
        let plan = crate::plan::BalancerPlan::from_config(b).unwrap();
        assert_eq!(plan.proxy.proxy_protocol, b.proxy_protocol);
        assert_eq!(plan.proxy.timeouts.header_read, Duration::from_secs(2));
        // A line per connection, in JSON.
        let logged = ok(&format!(
            "{MINIMAL}mode = \"tcp\"\naccess_log = {{ format = \"json\", path = \"/var/log/x.log\" }}\n"
        ));
        let log = &logged.balancers[0].access_log;
        assert_eq!(
            (log.format, log.path.as_str()),
            (crate::AccessLogFormat::Json, "/var/log/x.log")
        );
        let capped = ok(&format!("{MINIMAL}mode = \"tcp\"\nmax_conns = 100\n"));
        assert_eq!(capped.balancers[0].max_conns, ConnLimit::Fixed(100));
        for strategy in ["least-conn", "p2c", "round-robin", "weighted", "random"] {
            let c = ok(&format!(
                "{MINIMAL}mode = \"tcp\"\nstrategy = \"{strategy}\"\n"
            ));
            assert_eq!(c.balancers[0].strategy.name(), strategy);
        }
    }

    #[test]
    fn a_tcp_check_may_send_and_must_receive() {
        let c = ok(&format!(
            "{MINIMAL}health = {{ tcp = true, receive = \"SSH-2.0\" }}\n"
        ));
        assert_eq!(
            c.balancers[0].health.as_ref().unwrap().kind,
            CheckKind::TcpExchange {
                send: Box::default(),
                receive: b"SSH-2.0".as_slice().into()
            }
        );
        let cases = [
            (
                "health = { tcp = true, send = \"PING\" }",
                "balancer[0].health.send",
                "send needs receive",
            ),
            (
                "health = { tcp = true, receive = \"\" }",
                "balancer[0].health.receive",
                "empty receive",
            ),
            (
                "health = { path = \"/\", receive = \"x\" }",
                "balancer[0].health.receive",
                "set tcp = true",
            ),
            (
                "health = { tcp = true, expect = 200 }",
                "balancer[0].health.expect",
                "receive = ",
            ),
        ];
        for (line, key, part) in cases {
            check(&err(&format!("{MINIMAL}{line}\n")), 4, key, part);
        }
    }

    #[test]
    fn mode_tcp_refuses_what_only_http_has_naming_it() {
        let tcp = format!("{MINIMAL}mode = \"tcp\"\n");
        check(
            &err(&format!("{MINIMAL}mode = \"udp\"\n")),
            4,
            "balancer[0].mode",
            "invalid mode \"udp\": expected \"http\" or \"tcp\"",
        );
        let cases: &[(&str, &str, &str)] = &[
            (
                "strategy = \"peak-ewma\"",
                "balancer[0].strategy",
                "request latency",
            ),
            (
                "strategy = \"sticky\"",
                "balancer[0].strategy",
                "HTTP cookie",
            ),
            (
                "strategy = \"hash\"\nhash = { key = \"header:x-user\" }",
                "balancer[0].hash.key",
                "only \"client-ip\"",
            ),
            (
                "max_conns = \"auto\"",
                "balancer[0].max_conns",
                "learns from request latency",
            ),
            (
                "health = { path = \"/health\" }",
                "balancer[0].health.path",
                "tcp = true",
            ),
            (
                "access_log = { format = \"combined\" }",
                "balancer[0].access_log.format",
                "use format = \"json\", a line per connection",
            ),
            (
                "access_log = { format = \"json\", fields = [\"status\"] }",
                "balancer[0].access_log.fields",
                "fixed fields (time, client, endpoint",
            ),
            (
                "limits = { max_headers = 10 }",
                "balancer[0].limits",
                "request head to bound",
            ),
            (
                "limits = { max_body_bytes = \"1M\" }",
                "balancer[0].limits.max_body_bytes",
                "no request body to bound",
            ),
            (
                "timeouts = { header_read = \"1s\" }",
                "balancer[0].timeouts.header_read",
                "no request head",
            ),
            (
                "timeouts = { request = \"1s\" }",
                "balancer[0].timeouts.request",
                "no response",
            ),
            (
                "timeouts = { client = \"1s\" }",
                "balancer[0].timeouts.client",
                "no request in flight",
            ),
            (
                "timeouts = { body = \"1s\" }",
                "balancer[0].timeouts.body",
                "no request body",
            ),
            (
                "timeouts = { body_min_rate = 10 }",
                "balancer[0].timeouts.body_min_rate",
                "no request body",
            ),
            (
                "redirect_to_https = 443",
                "balancer[0].redirect_to_https",
                "HTTP request",
            ),
            ("http2 = true", "balancer[0].http2", "frame by frame"),
            ("h2c = true", "balancer[0].h2c", "frame by frame"),
        ];
        for (line, key, part) in cases {
            let e = err(&format!("{tcp}{line}\n"));
            check(&e, 5 + line.matches('\n').count(), key, part);
            assert!(e.message.to_lowercase().contains("tcp"), "{e}");
        }
        check(
            &err(&format!("{MINIMAL}timeouts = {{ half_close = \"1s\" }}\n")),
            4,
            "balancer[0].timeouts.half_close",
            "applies to mode = \"tcp\" only",
        );
    }

    #[test]
    fn max_body_bytes_is_a_size_and_0_is_no_limit() {
        let body = |v: &str| {
            ok(&format!("{MINIMAL}limits = {{ max_body_bytes = {v} }}\n")).balancers[0]
                .limits
                .max_body_bytes
        };
        assert_eq!(body("\"10M\""), Some(10 << 20));
        assert_eq!(body("65536"), Some(65536));
        assert_eq!(body("0"), None);
        assert_eq!(ok(MINIMAL).balancers[0].limits.max_body_bytes, None);
        for bad in ["\"lots\"", "-1", "\"10Q\"", "true"] {
            let e = err(&format!("{MINIMAL}limits = {{ max_body_bytes = {bad} }}\n"));
            check(&e, 4, "balancer[0].limits.max_body_bytes", "");
        }
    }

    #[test]
    fn mode_tcp_takes_tls_and_a_header_read_that_bounds_its_handshake() {
        let tcp = format!(
            "{MINIMAL}mode = \"tcp\"\ntls = {{ cert = \"a.pem\", key = \"a.key\" }}\ntimeouts = {{ header_read = \"2s\" }}\n"
        );
        let b = &ok(&tcp).balancers[0];
        assert_eq!(b.mode, Protocol::Tcp);
        assert_eq!(
            b.tls.as_ref().map(|t| t.certs[0].cert.clone()),
            Some(PathBuf::from("a.pem"))
        );
        assert_eq!(b.timeouts.header_read, Duration::from_secs(2));
        assert!(b.tls.as_ref().is_some_and(|t| t.alpn.is_empty()));

        // ALPN: for a TCP listener only, each name checked.
        let alpn = |mode: &str, list: &str| {
            format!("{MINIMAL}mode = \"{mode}\"\ntls = {{ cert = \"a.pem\", alpn = {list} }}\n")
        };
        let b = &ok(&alpn("tcp", "[\"h2\", \"http/1.1\"]")).balancers[0];
        assert_eq!(b.tls.as_ref().unwrap().alpn, ["h2", "http/1.1"]);
        check(
            &err(&alpn("http", "[\"h2\"]")),
            5,
            "balancer[0].tls.alpn",
            "alpn is for mode = \"tcp\"",
        );
        check(
            &err(&alpn("tcp", "[\"h2\", \"my proto\"]")),
            5,
            "balancer[0].tls.alpn[1]",
            "only visible ASCII",
        );
        check(
            &err(&alpn("tcp", "[\"\"]")),
            5,
            "balancer[0].tls.alpn[0]",
            "1 to 255 characters",
        );
    }

    #[test]
    fn backend_tls_takes_its_keys_and_names_each_mistake_by_its_place() {
        assert_eq!(ok(MINIMAL).balancers[0].backend_tls, None);
        let b = &ok(&format!("{MINIMAL}backend_tls = {{}}\n")).balancers[0];
        assert_eq!(b.backend_tls, Some(BackendTlsConfig::default()));
        let b = &ok(&format!(
            "{MINIMAL}backend_tls = {{ ca = \"ca.pem\", server_name = \"api.internal\", cert = \"c.pem\", key = \"c.key\" }}\n"
        ))
        .balancers[0];
        assert_eq!(
            b.backend_tls,
            Some(BackendTlsConfig {
                ca: Some("ca.pem".into()),
                server_name: Some("api.internal".into()),
                client_cert: Some(TlsCertFiles {
                    cert: "c.pem".into(),
                    key: "c.key".into(),
                }),
                insecure_skip_verify: false,
            })
        );
        let b = &ok(&format!(
            "{MINIMAL}[balancer.backend_tls]\ncert = \"both.pem\"\n"
        ))
        .balancers[0];
        let client = b
            .backend_tls
            .as_ref()
            .unwrap()
            .client_cert
            .as_ref()
            .unwrap();
        assert_eq!(client.key, client.cert, "a combined PEM");

        // Where a file's error points: the key that named it, or the table for the
        // system's trust store.
        let (_, origins) = parse_with_origins(
            &format!("{MINIMAL}backend_tls = {{ ca = \"ca.pem\", cert = \"c.pem\" }}\n"),
            "t.toml",
        )
        .unwrap();
        assert_eq!(
            origins.error("balancer[0].backend_tls.ca", "bad"),
            "t.toml:4:22: balancer[0].backend_tls.ca: bad"
        );
        assert_eq!(
            origins.error("balancer[0].backend_tls.key", "bad"),
            "t.toml:4:39: balancer[0].backend_tls.key: bad"
        );
        assert_eq!(
            origins.error("balancer[0].backend_tls", "bad"),
            "t.toml:4:15: balancer[0].backend_tls: bad"
        );

        let e = err(&format!("{MINIMAL}backend_tls = {{ ca = \"\" }}\n"));
        check(&e, 4, "balancer[0].backend_tls.ca", "empty path");
        let e = err(&format!("{MINIMAL}backend_tls = {{ key = \"k.pem\" }}\n"));
        check(
            &e,
            4,
            "balancer[0].backend_tls.key",
            "a client key without its certificate",
        );
        let e = err(&format!(
            "{MINIMAL}backend_tls = {{ ca = \"ca.pem\", insecure_skip_verify = true }}\n"
        ));
        check(&e, 4, "balancer[0].backend_tls.ca", "verifies nothing");
        let e = err(&format!(
            "{MINIMAL}backend_tls = {{ server_name = \"a b\" }}\n"
        ));
        check(
            &e,
            4,
            "balancer[0].backend_tls.server_name",
            "is not a DNS name or an IP address",
        );
        let e = err(&format!("{MINIMAL}backend_tls = {{ verify = false }}\n"));
        check(&e, 4, "balancer[0].backend_tls.verify", "unknown key");
        let e = err(&format!("{MINIMAL}backend_tls = true\n"));
        check(&e, 4, "balancer[0].backend_tls", "");
        let e = err(
            "[[app]]\nname = \"pi\"\ncommand = [\"node\", \"pi.js\"]\n[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = [\"app:pi\"]\nbackend_tls = {}\n",
        );
        check(
            &e,
            7,
            "balancer[0].backend_tls",
            "does not apply to the workers of app \"pi\"",
        );
        // A TCP balancer encrypts what it relays towards its backends too.
        let c = ok(&format!(
            "{MINIMAL}mode = \"tcp\"\nmax_conns = 0\nbackend_tls = {{}}\n"
        ));
        assert!(c.balancers[0].backend_tls.is_some());
    }

    #[test]
    fn tls_takes_one_certificate_or_a_list_and_names_each_file_by_its_place() {
        assert_eq!(ok(MINIMAL).balancers[0].tls, None);
        let files = |c: &Config| -> Vec<(String, String)> {
            c.balancers[0]
                .tls
                .as_ref()
                .unwrap()
                .certs
                .iter()
                .map(|f| (f.cert.display().to_string(), f.key.display().to_string()))
                .collect()
        };
        let pair = |c: &str, k: &str| (c.to_string(), k.to_string());
        let one = ok(&format!(
            "{MINIMAL}tls = {{ cert = \"a.pem\", key = \"a.key\" }}\n"
        ));
        assert_eq!(files(&one), [pair("a.pem", "a.key")]);
        let combined = ok(&format!("{MINIMAL}tls = {{ cert = \"both.pem\" }}\n"));
        assert_eq!(files(&combined), [pair("both.pem", "both.pem")]);
        let text = format!(
            "{MINIMAL}[balancer.tls]\ncerts = [\n  {{ cert = \"a.pem\", key = \"a.key\" }},\n  {{ cert = \"b.pem\" }},\n]\n"
        );
        let (list, origins) = parse_with_origins(&text, "t.toml").unwrap();
        assert_eq!(
            files(&list),
            [pair("a.pem", "a.key"), pair("b.pem", "b.pem")]
        );
        // Where a file's error will point: its own string, or the cert's for a key in it.
        assert_eq!(
            origins.error("balancer[0].tls.certs[0].key", "bad"),
            "t.toml:6:27: balancer[0].tls.certs[0].key: bad"
        );
        assert_eq!(
            origins.error("balancer[0].tls.certs[1].key", "bad"),
            "t.toml:7:12: balancer[0].tls.certs[1].key: bad"
        );
        let (_, origins) = parse_with_origins(
            &format!("{MINIMAL}tls = {{ cert = \"a.pem\", key = \"a.key\" }}\n"),
            "t.toml",
        )
        .unwrap();
        assert_eq!(
            origins.error("balancer[0].tls.certs[0].cert", "bad"),
            "t.toml:4:16: balancer[0].tls.certs[0].cert: bad"
        );

        let e = err(&format!("{MINIMAL}tls = {{}}\n"));
        check(&e, 4, "balancer[0].tls", "no certificate");
        let e = err(&format!("{MINIMAL}tls = {{ key = \"a.key\" }}\n"));
        check(&e, 4, "balancer[0].tls.key", "a key without its cert");
        let e = err(&format!("{MINIMAL}tls = {{ certs = [] }}\n"));
        check(&e, 4, "balancer[0].tls.certs", "no certificate");
        let e = err(&format!(
            "{MINIMAL}tls = {{ cert = \"a.pem\", certs = [{{ cert = \"b.pem\" }}] }}\n"
        ));
        check(&e, 4, "balancer[0].tls.certs", "not both");
        let e = err(&format!("{MINIMAL}tls = {{ cert = \"\" }}\n"));
        check(&e, 4, "balancer[0].tls.cert", "empty path");
        let e = err(&format!(
            "{MINIMAL}tls = {{ certs = [{{ cert = \"a.pem\", key = \"\" }}] }}\n"
        ));
        check(&e, 4, "balancer[0].tls.certs[0].key", "empty path");
        let e = err(&format!("{MINIMAL}tls = {{ crt = \"a.pem\" }}\n"));
        check(&e, 4, "balancer[0].tls.crt", "unknown key");
        let e = err(&format!("{MINIMAL}tls = \"a.pem\"\n"));
        check(&e, 4, "balancer[0].tls", "");
    }

    #[test]
    fn http2_and_h2c() {
        let c = ok(MINIMAL);
        assert!(c.balancers[0].http2 && !c.balancers[0].h2c);
        let c = ok(&format!("{MINIMAL}h2c = true\n"));
        assert!(c.balancers[0].h2c);
        let plan = crate::plan::BalancerPlan::from_config(&c.balancers[0]).unwrap();
        assert!(plan.proxy.http2 && plan.proxy.h2c);
        let c = ok(&format!("{MINIMAL}http2 = false\n"));
        let plan = crate::plan::BalancerPlan::from_config(&c.balancers[0]).unwrap();
        assert!(!plan.proxy.http2);
        let e = err(&format!("{MINIMAL}http2 = \"on\"\n"));
        check(&e, 4, "balancer[0].http2", "");
        let e = err(&format!("{MINIMAL}h2c = 1\n"));
        check(&e, 4, "balancer[0].h2c", "");
        let e = err(&format!(
            "{MINIMAL}tls = {{ cert = \"a.pem\", key = \"a.key\" }}\nh2c = true\n"
        ));
        check(&e, 5, "balancer[0].h2c", "offered by ALPN");
        let e = err(&format!("{MINIMAL}http2 = false\nh2c = true\n"));
        check(&e, 5, "balancer[0].h2c", "http2 = false");
    }

    #[test]
    fn http2_max_streams() {
        let c = ok(MINIMAL);
        assert_eq!(c.balancers[0].http2_max_streams, 128, "nginx's default");
        let c = ok(&format!("{MINIMAL}h2c = true\nhttp2_max_streams = 16\n"));
        let plan = crate::plan::BalancerPlan::from_config(&c.balancers[0]).unwrap();
        assert_eq!(plan.proxy.http2_max_streams, 16);
        for (value, msg) in [("0", "1"), ("10001", "10000"), ("\"8\"", "")] {
            let e = err(&format!(
                "{MINIMAL}h2c = true\nhttp2_max_streams = {value}\n"
            ));
            check(&e, 5, "balancer[0].http2_max_streams", msg);
        }
        let e = err(&format!("{MINIMAL}http2_max_streams = 16\n"));
        check(&e, 4, "balancer[0].http2_max_streams", "needs tls");
        let e = err(&format!(
            "{MINIMAL}tls = {{ cert = \"a.pem\", key = \"a.key\" }}\nhttp2 = false\nhttp2_max_streams = 16\n"
        ));
        check(&e, 6, "balancer[0].http2_max_streams", "needs tls");
        let e = err(
            "[[balancer]]\nmode = \"tcp\"\nlisten = \"127.0.0.1:8000\"\nbackends = [\"127.0.0.1:9001\"]\nhttp2_max_streams = 16\n",
        );
        check(
            &e,
            5,
            "balancer[0].http2_max_streams",
            "TCP mode reads nothing",
        );
    }

    #[test]
    fn redirect_to_https_needs_no_backends_and_no_tls() {
        let plain =
            "[[balancer]]\nlisten = \"127.0.0.1:80\"\nbackends = []\nredirect_to_https = 8443\n";
        let c = ok(plain);
        assert_eq!(c.balancers[0].redirect_to_https, Some(8443));
        assert_eq!(ok(MINIMAL).balancers[0].redirect_to_https, None);
        let plan = crate::plan::BalancerPlan::from_config(&c.balancers[0]).unwrap();
        assert_eq!(plan.proxy.redirect_to_https, Some(8443));
        let e = err(&format!("{MINIMAL}redirect_to_https = 443\n"));
        check(&e, 3, "balancer[0].backends", "backends = []");
        let e = err(&format!("{plain}tls = {{ cert = \"a.pem\" }}\n"));
        check(&e, 4, "balancer[0].redirect_to_https", "give it no tls");
        let e = err(&plain.replace("8443", "0"));
        check(&e, 4, "balancer[0].redirect_to_https", "");
        let e = err(&plain.replace("8443", "\"https\""));
        check(&e, 4, "balancer[0].redirect_to_https", "");
        // Without it, an empty pool still needs an [admin] table.
        let e = err(&plain.replace("redirect_to_https = 8443\n", ""));
        check(&e, 3, "balancer[0].backends", "must not be empty");
    }

    #[test]
    fn forwarded_headers_trust_the_listed_senders_in_place_of_private_addresses() {
        assert_eq!(ok(MINIMAL).balancers[0].forwarded_headers, None);
        let c = ok(&format!(
            "{MINIMAL}forwarded_headers = {{ trusted = [\"173.245.48.0/20\", \"127.0.0.1\"] }}\n"
        ));
        let trusted = c.balancers[0].forwarded_headers.clone().unwrap();
        assert!(trusted.trusts("173.245.48.9".parse().unwrap()));
        assert!(!trusted.trusts("10.2.3.4".parse().unwrap()));
        let plan = crate::plan::BalancerPlan::from_config(&c.balancers[0]).unwrap();
        assert_eq!(plan.proxy.forwarded_headers_from, Some(trusted));
        // None at all: nobody's (at the edge); the PROXY protocol must name someone.
        let c = ok(&format!(
            "{MINIMAL}forwarded_headers = {{ trusted = [] }}\n"
        ));
        let nobody = c.balancers[0].forwarded_headers.clone().unwrap();
        assert!(!nobody.trusts("127.0.0.1".parse().unwrap()));
        let e = err(&format!("{MINIMAL}proxy_protocol = {{ trusted = [] }}\n"));
        check(
            &e,
            4,
            "balancer[0].proxy_protocol.trusted",
            "no sender to trust",
        );
    }

    #[test]
    fn proxy_protocol_trusts_the_listed_senders_only_when_asked() {
        assert_eq!(ok(MINIMAL).balancers[0].proxy_protocol, None);
        let c = ok(&format!(
            "{MINIMAL}proxy_protocol = {{ trusted = [\"10.0.0.0/8\", \"::1\"] }}\n"
        ));
        let trusted = c.balancers[0].proxy_protocol.clone().unwrap();
        assert!(trusted.trusts("10.2.3.4".parse().unwrap()));
        assert!(trusted.trusts("::1".parse().unwrap()));
        assert!(!trusted.trusts("192.0.2.1".parse().unwrap()));
        let plan = crate::plan::BalancerPlan::from_config(&c.balancers[0]).unwrap();
        assert_eq!(plan.proxy.proxy_protocol, Some(trusted));
    }

    #[test]
    fn send_proxy_protocol_reaches_the_plan() {
        assert_eq!(ok(MINIMAL).balancers[0].send_proxy_protocol, None);
        let c = ok(&format!("{MINIMAL}send_proxy_protocol = \"v1\"\n"));
        let plan = crate::plan::BalancerPlan::from_config(&c.balancers[0]).unwrap();
        assert_eq!(plan.proxy.send_proxy_protocol, Some(SendVersion::V1));
    }

    #[test]
    fn backend_protocol_reaches_the_plan_and_refuses_what_cannot_go_with_it() {
        use drover_proxy::BackendProtocol;
        assert_eq!(
            ok(MINIMAL).balancers[0].backend_protocol,
            BackendProtocol::Http1
        );
        let c = ok(&format!("{MINIMAL}backend_protocol = \"h2c\"\n"));
        let plan = crate::plan::BalancerPlan::from_config(&c.balancers[0]).unwrap();
        assert_eq!(plan.proxy.backend_protocol, BackendProtocol::H2c);
        let h2 = ok(&format!(
            "{MINIMAL}backend_protocol = \"h2\"\nbackend_tls = {{ insecure_skip_verify = true }}\n"
        ));
        assert_eq!(h2.balancers[0].backend_protocol, BackendProtocol::H2);

        let e = err(&format!("{MINIMAL}backend_protocol = \"h3\"\n"));
        check(
            &e,
            4,
            "balancer[0].backend_protocol",
            "expected \"http1\", \"h2c\"",
        );
        let e = err(&format!("{MINIMAL}backend_protocol = \"h2\"\n"));
        check(&e, 4, "balancer[0].backend_protocol", "no backend TLS");
        let e = err(&format!(
            "{MINIMAL}backend_tls = {{}}\nbackend_protocol = \"h2c\"\n"
        ));
        check(&e, 5, "balancer[0].backend_protocol", "use \"h2\"");
        let e = err(&format!(
            "{MINIMAL}send_proxy_protocol = \"v2\"\nbackend_protocol = \"h2c\"\n"
        ));
        check(
            &e,
            5,
            "balancer[0].backend_protocol",
            "PROXY protocol header",
        );
        let e = err(&format!(
            "{MINIMAL}mode = \"tcp\"\nbackend_protocol = \"h2c\"\n"
        ));
        check(
            &e,
            5,
            "balancer[0].backend_protocol",
            "does not apply to mode = \"tcp\"",
        );
        // gRPC workers of an app: each call placed, no connection handed over.
        let app = "[[app]]\nname = \"web\"\ncommand = [\"x\"]\n";
        let grpc = "[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = [\"app:web\"]\nbackend_protocol = \"h2c\"\n";
        let c = ok(&format!("{app}{grpc}"));
        assert_eq!(c.balancers[0].backend_protocol, BackendProtocol::H2c);
        assert_eq!(c.balancers[0].handoff, drover_proxy::Handoff::Never);
        let e = err(&format!("{app}mode = \"handoff\"\n{grpc}"));
        check(
            &e,
            7,
            "balancer[0].backends",
            "speaks HTTP/2 to the workers",
        );
    }

    #[test]
    fn grpc_health_checks_need_http2_and_stand_alone() {
        let c = ok(&format!(
            "{MINIMAL}backend_protocol = \"h2c\"\nhealth = {{ grpc = true, service = \"pkg.Svc\" }}\n"
        ));
        assert_eq!(
            c.balancers[0].health.as_ref().unwrap().kind,
            CheckKind::Grpc {
                service: "pkg.Svc".into()
            }
        );
        let e = err(&format!("{MINIMAL}health = {{ grpc = true }}\n"));
        check(&e, 4, "balancer[0].health.grpc", "spoken over HTTP/2");
        let e = err(&format!(
            "{MINIMAL}backend_protocol = \"h2c\"\nhealth = {{ grpc = true, path = \"/h\" }}\n"
        ));
        check(&e, 5, "balancer[0].health.grpc", "or path, not both");
        let e = err(&format!(
            "{MINIMAL}backend_protocol = \"h2c\"\nhealth = {{ path = \"/h\", service = \"x\" }}\n"
        ));
        check(&e, 5, "balancer[0].health.service", "set grpc = true");
        // An app's workers are checked over HTTP/2 when the balancer in front speaks
        // it to them; a gRPC check of workers reached in HTTP/1.1 cannot be made.
        let app = "[[app]]\nname = \"web\"\ncommand = [\"x\"]\nhealth = { grpc = true }\n";
        let e = err(app);
        check(
            &e,
            4,
            "app[0].health.grpc",
            "no balancer speaks it to app \"web\"",
        );
        let e = err(&format!(
            "{app}[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = [\"app:web\"]\n"
        ));
        check(&e, 4, "app[0].health.grpc", "backend_protocol = \"h2c\"");
        let c = ok(&format!(
            "{app}[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = [\"app:web\"]\nbackend_protocol = \"h2c\"\n"
        ));
        let spec = &c.apps[0].spec;
        assert!(spec.h2c);
        assert_eq!(
            spec.health.as_ref().unwrap().kind,
            CheckKind::Grpc { service: "".into() }
        );
        // A path check of workers behind an HTTP/2 balancer is a stream too.
        let c = ok("[[app]]\nname = \"web\"\ncommand = [\"x\"]\nhealth = { path = \"/up\" }\n[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = [\"app:web\"]\nbackend_protocol = \"h2c\"\n");
        assert!(c.apps[0].spec.h2c);
        let c = ok("[[app]]\nname = \"web\"\ncommand = [\"x\"]\n[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = [\"app:web\"]\n");
        assert!(!c.apps[0].spec.h2c);
    }

    #[test]
    fn sticky_defaults_its_cookie_and_is_refused_elsewhere() {
        let c = ok(&format!("{MINIMAL}strategy = \"sticky\"\n"));
        assert_eq!(
            c.balancers[0].sticky,
            Some(StickyConfig {
                cookie: "drover_sticky".into()
            })
        );
        let e = err(&format!("{MINIMAL}sticky = {{ cookie = \"s\" }}\n"));
        check(
            &e,
            4,
            "balancer[0].sticky",
            "only used with strategy = \"sticky\"",
        );
        let e = err(&format!(
            "{MINIMAL}strategy = \"sticky\"\nsticky = {{ cookie = \"a b\" }}\n"
        ));
        check(&e, 5, "balancer[0].sticky.cookie", "invalid cookie name");
    }

    #[test]
    fn app_backend_must_name_a_defined_app() {
        let e = err("[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = [\"127.0.0.1:1\", \"app:nope\"]\n");
        check(&e, 3, "balancer[0].backends[1]", "app:nope");
        assert!(e.message.contains("no [[app]] is defined"), "{e}");

        let e = err("[[app]]\nname = \"pi\"\ncommand = [\"x\"]\n[[app]]\nname = \"web\"\ncommand = [\"y\"]\n\n[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = [\"app:api\"]\n");
        check(&e, 10, "balancer[0].backends[0]", "defined apps: pi, web");

        let e = err("[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = [\"app:Bad\"]\n");
        check(&e, 3, "balancer[0].backends[0]", "[a-z0-9_-]+");
    }

    #[test]
    fn an_app_serves_beside_fixed_dns_and_etcd_backends() {
        let c = ok(r#"
[etcd]
endpoints = ["http://127.0.0.1:2379"]

[[app]]
name = "web"
command = ["node", "server.js"]

[[balancer]]
listen = "127.0.0.1:8000"
backends = ["app:web", { address = "127.0.0.1:9001", max_conns = 4 }, "dns:api.internal:80", "etcd:/drover/pools/web"]
"#);
        let b = &c.balancers[0];
        assert_eq!(b.backends[0], BackendRef::App("web".into()));
        assert_eq!(b.backends.len(), 4);
        // Beside other backends every request is placed by the balancer: a connection
        // handed to a worker would never reach them.
        assert_eq!(b.handoff, drover_proxy::Handoff::Never);
        // So is each of a connection's requests, as a proxy's.
        assert!(!b.connection_affinity);
        let alone = ok("[[app]]\nname = \"web\"\ncommand = [\"x\"]\n[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = [\"app:web\"]\n");
        assert_eq!(alone.balancers[0].handoff, drover_proxy::Handoff::WhenEven);
        assert!(alone.balancers[0].connection_affinity);

        let plan = crate::plan::BalancerPlan::from_config(b).unwrap();
        assert_eq!(plan.app.as_deref(), Some("web"));
        assert_eq!(plan.backends, [(addr("127.0.0.1:9001"), 1)]);
        assert_eq!(plan.max_conns, [(addr("127.0.0.1:9001"), 4)]);
        assert_eq!(plan.dns.len(), 1);
        assert_eq!(plan.etcd.as_deref(), Some("/drover/pools/web"));
        assert!(
            plan.pool.expects_members,
            "requests wait for the app's workers"
        );
    }

    #[test]
    fn an_app_is_behind_one_balancer_and_a_balancer_over_one_app() {
        let two_apps = "[[app]]\nname = \"web\"\ncommand = [\"x\"]\n[[app]]\nname = \"api\"\ncommand = [\"y\"]\n";
        let e = err(&format!(
            "{two_apps}[[balancer]]\nname = \"a\"\nlisten = \"127.0.0.1:8000\"\nbackends = [\"app:web\"]\n\n[[balancer]]\nname = \"b\"\nlisten = \"127.0.0.1:8001\"\nbackends = [\"127.0.0.1:9001\",\n  \"app:web\"]\n"
        ));
        check(
            &e,
            16,
            "balancer[1].backends[1]",
            "app \"web\" is behind balancer[0] already",
        );
        assert_eq!(e.column, Some(3), "{e}");

        let e = err(&format!(
            "{two_apps}[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = [\"app:web\", \"app:api\"]\n"
        ));
        check(&e, 9, "balancer[0].backends[1]", "one app per balancer");

        let e = err(&format!(
            "{two_apps}mode = \"handoff\"\n[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = [\"app:api\", \"127.0.0.1:9001\"]\n"
        ));
        check(&e, 10, "balancer[0].backends", "runs in handoff mode");
    }

    #[test]
    fn retries_and_other_numbers_out_of_range() {
        let e = err(&format!("{MINIMAL}retries = 11\n"));
        check(
            &e,
            4,
            "balancer[0].retries",
            "11 is out of range: expected 0..=10",
        );
        let e = err(&format!("{MINIMAL}retries = -1\n"));
        check(&e, 4, "balancer[0].retries", "expected 0..=10");
        let e = err(&format!("{MINIMAL}retries = \"2\"\n"));
        check(&e, 4, "balancer[0].retries", "an integer in 0..=10");
        let e = err(&format!("{MINIMAL}limits = {{ max_headers = 0 }}\n"));
        check(&e, 4, "balancer[0].limits.max_headers", "1..=10000");
        let e = err(&format!("{MINIMAL}threads = 0\n"));
        check(&e, 4, "balancer[0].threads", "1..=1024");
        let e = err(&format!("{MINIMAL}queue = {{ max = \"lots\" }}\n"));
        check(&e, 4, "balancer[0].queue.max", "\"unlimited\" or a number");
        let e = err(&format!("{MINIMAL}queue = {{ max = -1 }}\n"));
        check(&e, 4, "balancer[0].queue.max", "out of range");
        let e = err("[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = [{ address = \"127.0.0.1:1\", weight = 0 }]\n");
        check(&e, 3, "balancer[0].backends[0].weight", "1..=1000");
    }

    #[test]
    fn dns_and_etcd_backends() {
        let c = ok("[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = [\"dns:api.internal:80\", \"dns+srv:_http._tcp.api.internal\"]\n");
        assert_eq!(
            c.balancers[0].backends,
            [
                BackendRef::Dns(drover_dns::DnsTarget::A {
                    host: "api.internal".into(),
                    port: 80
                }),
                BackendRef::Dns(drover_dns::DnsTarget::Srv {
                    name: "_http._tcp.api.internal".into()
                }),
            ]
        );
        let e = err(
            "[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = [\"etcd:/drover/pools/web\"]\n",
        );
        check(&e, 3, "balancer[0].backends[0]", "needs an [etcd] table");
        let c = ok("[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = [\"etcd:/drover/pools/web\"]\n");
        assert_eq!(
            c.balancers[0].backends,
            [BackendRef::Etcd("/drover/pools/web".into())]
        );
        let e = err("[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = [\"etcd:/a\", \"etcd:/b\"]\n");
        check(
            &e,
            5,
            "balancer[0].backends[1]",
            "one etcd: prefix per balancer",
        );
        // Malformed ones are syntax errors, reported as such.
        let e =
            err("[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = [\"dns:api.internal\"]\n");
        check(
            &e,
            3,
            "balancer[0].backends[0]",
            "expected \"dns:HOST:PORT\"",
        );
        let e = err("[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = [\"etcd:pools\"]\n");
        check(
            &e,
            3,
            "balancer[0].backends[0]",
            "expected \"etcd:/PREFIX\"",
        );
        assert_eq!(
            parse_target("dns:api.internal:80"),
            Ok(Target::Dns {
                host: "api.internal".into(),
                port: 80
            })
        );
        assert_eq!(parse_target("etcd:/a/b"), Ok(Target::Etcd("/a/b".into())));
    }

    #[test]
    fn malformed_backends() {
        let e =
            err("[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = [\"api.internal:9001\"]\n");
        check(&e, 3, "balancer[0].backends[0]", "dns:HOST:PORT");
        let e = err("[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = []\n");
        check(&e, 3, "balancer[0].backends", "must not be empty");
        // With an admin API, members may register at runtime: an empty start is fine.
        let c = parse(
            "[admin]\n[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = []\n",
            "t.toml",
        )
        .unwrap();
        assert!(c.balancers[0].backends.is_empty());
        let e = err("[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = [1]\n");
        check(&e, 3, "balancer[0].backends[0]", "a backend string");
        let e = err("[[app]]\nname = \"pi\"\ncommand = [\"x\"]\n[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = [{ address = \"app:pi\", weight = 2 }]\n");
        check(
            &e,
            6,
            "balancer[0].backends[0].weight",
            "only to IP:PORT backends",
        );
    }

    #[test]
    fn duplicate_backends() {
        let e = err("[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = [\"127.0.0.1:1\",\n  { address = \"127.0.0.1:1\", weight = 2 }]\n");
        check(
            &e,
            4,
            "balancer[0].backends[1]",
            "duplicate backend (same as backends[0])",
        );
        let e = err("[[app]]\nname = \"pi\"\ncommand = [\"x\"]\n[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = [\"app:pi\", \"app:pi\"]\n");
        check(&e, 6, "balancer[0].backends[1]", "duplicate backend");
    }

    #[test]
    fn listen_addresses_must_not_clash() {
        let two = |a: &str, b: &str| {
            format!("[[balancer]]\nlisten = \"{a}\"\nbackends = [\"127.0.0.1:1\"]\n[[balancer]]\nlisten = \"{b}\"\nbackends = [\"127.0.0.1:1\"]\n")
        };
        let e = err(&two("127.0.0.1:8000", "127.0.0.1:8000"));
        check(
            &e,
            5,
            "balancer[1].listen",
            "already used by balancer[0].listen",
        );
        let e = err(&two("127.0.0.1:8000", "0.0.0.0:8000"));
        check(&e, 5, "balancer[1].listen", "already used");
        let e = err(
            &format!("[admin]\nlisten = \"127.0.0.1:9900\"\n{MINIMAL}").replace("8000", "9900")
        );
        check(&e, 4, "balancer[0].listen", "already used by admin.listen");
        // Different ports, different IPs, and ephemeral ports are all fine.
        let c = ok(&two("127.0.0.1:8000", "127.0.0.1:8001"));
        assert_eq!(c.balancers[1].name, "balancer-1");
        ok(&two("127.0.0.1:8000", "127.0.0.2:8000"));
        ok(&two("127.0.0.1:0", "127.0.0.1:0"));
    }

    #[test]
    fn balancer_names_are_unique_and_valid() {
        let text = format!("{MINIMAL}name = \"web\"\n[[balancer]]\nname = \"web\"\nlisten = \"127.0.0.1:8001\"\nbackends = [\"127.0.0.1:1\"]\n");
        let e = err(&text);
        check(&e, 6, "balancer[1].name", "duplicate balancer name \"web\"");
        let e = err(&format!("{MINIMAL}name = \"Web Server\"\n"));
        check(&e, 4, "balancer[0].name", "a-z, 0-9");
        // An explicit name may collide with a generated one.
        let text = format!("{MINIMAL}name = \"balancer-1\"\n[[balancer]]\nlisten = \"127.0.0.1:8001\"\nbackends = [\"127.0.0.1:1\"]\n");
        let e = err(&text);
        check(
            &e,
            5,
            "balancer[1]",
            "duplicate balancer name \"balancer-1\"",
        );
    }

    #[test]
    fn app_checks() {
        let e = err("[[app]]\nname = \"Pi\"\ncommand = [\"x\"]\n");
        check(&e, 2, "app[0].name", "invalid app name \"Pi\"");
        let e = err("[[app]]\nname = \"pi\"\ncommand = [\"x\"]\n[[app]]\nname = \"pi\"\ncommand = [\"y\"]\n");
        check(&e, 5, "app[1].name", "duplicate app name \"pi\"");
        let e = err("[[app]]\nname = \"pi\"\ncommand = []\n");
        check(&e, 3, "app[0].command", "must not be empty");
        let e = err("[[app]]\nname = \"pi\"\ncommand = [\"\"]\n");
        check(&e, 3, "app[0].command", "command[0]");
        let e = err("[[app]]\nname = \"pi\"\ncommand = \"node app.js\"\n");
        check(&e, 3, "app[0].command", "expected a sequence");
        check(&e, 3, "app[0].command", "command = [\"node\", \"app.js\"]");
        let e = err("[[balancer]]\nlisten = 8000\nbackends = [\"127.0.0.1:9001\"]\n");
        check(
            &e,
            2,
            "balancer[0].listen",
            "listen = \"8000\" (every address)",
        );
        let e = err("[[app]]\nname = \"pi\"\ncommand = [\"x\"]\nworkers = 0\n");
        check(&e, 4, "app[0].workers", "1..=1024 or \"auto\"");
        let e = err("[[app]]\nname = \"pi\"\ncommand = [\"x\"]\nworkers = \"many\"\n");
        check(&e, 4, "app[0].workers", "invalid workers \"many\"");
        let e = err("[[app]]\nname = \"pi\"\ncommand = [\"x\"]\nenv = { PORT = 8080 }\n");
        check(&e, 4, "app[0].env.PORT", "expected a string");
        let e = err("[[app]]\nname = \"pi\"\ncommand = [\"x\"]\nenv = { \"A=B\" = \"1\" }\n");
        check(&e, 4, "app[0].env", "invalid environment variable \"A=B\"");
        let e = err("[[app]]\nname = \"pi\"\ncommand = [\"x\"]\nready_timeout = \"soon\"\n");
        check(&e, 4, "app[0].ready_timeout", "invalid duration \"soon\"");
        // An app alone is a valid config: drover just supervises it.
        let c = ok("[[app]]\nname = \"pi\"\ncommand = [\"x\"]\n");
        assert_eq!(c.apps[0], AppConfig::new("pi", vec!["x".into()]));
    }

    #[test]
    fn health_checks() {
        let app = |h: &str| format!("[[app]]\nname = \"pi\"\ncommand = [\"x\"]\nhealth = {h}\n");
        let c = ok(&app("{ expect = 204 }"));
        assert_eq!(
            c.apps[0].spec.health.as_ref().unwrap().kind,
            CheckKind::Http {
                path: "/health".into(),
                expect: StatusRange::exact(204)
            }
        );
        let c = ok(&app("{ path = \"/up\", expect = \"200\" }"));
        assert_eq!(
            c.apps[0].spec.health.as_ref().unwrap().kind,
            CheckKind::Http {
                path: "/up".into(),
                expect: StatusRange::exact(200)
            }
        );
        let e = err(&app("{ path = \"/up\", tcp = true }"));
        check(&e, 4, "app[0].health.tcp", "not both");
        let e = err(&app("{ tcp = true, expect = 200 }"));
        check(&e, 4, "app[0].health.expect", "only to HTTP checks");
        let e = err(&app("{ path = \"health\" }"));
        check(&e, 4, "app[0].health.path", "absolute path");
        let e = err(&app("{ expect = \"399-200\" }"));
        check(&e, 4, "app[0].health.expect", "399 is above 200");
        let e = err(&app("{ expect = 700 }"));
        check(&e, 4, "app[0].health.expect", "100..=599");
        let e = err(&app("{ expect = \"2xx\" }"));
        check(&e, 4, "app[0].health.expect", "invalid expect \"2xx\"");
        let e = err(&app("{ rise = 0 }"));
        check(&e, 4, "app[0].health.rise", "1..=100");

        // A balancer's backends may not serve /health, so it must choose.
        let e = err(&format!("{MINIMAL}health = {{ interval = \"1s\" }}\n"));
        check(&e, 4, "balancer[0].health", "tcp = true");
        let c = ok(&format!("{MINIMAL}health = {{ tcp = true }}\n"));
        assert_eq!(c.balancers[0].health.as_ref().unwrap().kind, CheckKind::Tcp);
    }

    #[test]
    fn passive_ejection_bounds() {
        let e = err(&format!(
            "{MINIMAL}passive = {{ ejection = \"5s\", max_ejection = \"1s\" }}\n"
        ));
        check(
            &e,
            4,
            "balancer[0].passive.max_ejection",
            "must not be below ejection (5s)",
        );
        // Raising only `ejection` past the default cap lifts the cap instead of erroring.
        let c = ok(&format!("{MINIMAL}passive = {{ ejection = \"2m\" }}\n"));
        assert_eq!(
            c.balancers[0].passive.max_ejection,
            Duration::from_secs(120)
        );
    }

    #[test]
    fn admin_token_required_off_loopback() {
        let e = err(&format!("[admin]\nlisten = \"0.0.0.0:9900\"\n{MINIMAL}"));
        check(&e, 2, "admin.token", "not a loopback address");
        let e = err(&format!(
            "[admin]\nlisten = \"[::1]:9900\"\ntoken = \" \"\n{MINIMAL}"
        ));
        check(&e, 3, "admin.token", "must not be empty");
        let c = ok(&format!("[admin]\nlisten = \"[::1]:9900\"\n{MINIMAL}"));
        assert_eq!(c.admin.unwrap().listen, addr("[::1]:9900"));
        let c = ok(&format!("[admin]\n{MINIMAL}"));
        assert_eq!(c.admin.unwrap().listen, addr("127.0.0.1:9900"));
    }

    #[test]
    fn empty_config_is_an_error_without_position() {
        let e = err("# nothing here\n");
        assert_eq!(e.line, None);
        assert_eq!(
            e.to_string(),
            "t.toml: nothing to run: add at least one [[balancer]] or [[app]]"
        );
        let e = err("[admin]\n");
        assert!(e.message.contains("nothing to run"), "{e}");
    }

    #[test]
    fn single_bracket_table_gets_a_hint() {
        let e = err("[balancer]\nlisten = \"127.0.0.1:8000\"\nbackends = [\"127.0.0.1:1\"]\n");
        assert_eq!(e.key, "balancer", "{e}");
        assert!(e.message.contains("[[balancer]]"), "{e}");
        assert_eq!(e.line, Some(1), "{e}");
    }

    #[test]
    fn syntax_errors_have_a_position() {
        let e = err("[[balancer]]\nlisten = \"127.0.0.1:8000\nbackends = []\n");
        assert_eq!(e.line, Some(2), "{e}");
        assert!(!e.message.contains('\n'), "{e}");
        let e = err("[[balancer]]\nlisten = \"127.0.0.1:8000\"\nlisten = \"127.0.0.1:8001\"\n");
        assert_eq!(e.line, Some(3), "{e}");
        assert!(e.message.contains("duplicate key"), "{e}");
    }

    #[test]
    fn line_and_column_count_characters() {
        assert_eq!(line_col("abc", 0), (1, 1));
        assert_eq!(line_col("a\nbc", 3), (2, 2));
        assert_eq!(line_col("é\néé", 5), (2, 2));
        assert_eq!(line_col("ab", 99), (1, 3));
        // Column counts characters, so a multibyte name shifts it by one, not two.
        let e = err("# é\n[[balancer]]\nlisten = \"x\"\n");
        assert_eq!((e.line, e.column), (Some(3), Some(10)), "{e}");
    }

    #[test]
    fn display_omits_unknown_parts() {
        let mut e = ConfigError {
            file: "f.toml".into(),
            line: Some(7),
            column: Some(12),
            key: "a.b".into(),
            message: "bad".into(),
        };
        assert_eq!(e.to_string(), "f.toml:7:12: a.b: bad");
        e.key.clear();
        assert_eq!(e.to_string(), "f.toml:7:12: bad");
        e.line = None;
        e.column = None;
        assert_eq!(e.to_string(), "f.toml: bad");
    }

    #[test]
    fn quoted_keys_are_quoted_in_paths() {
        let e = err("[[app]]\nname = \"pi\"\ncommand = [\"x\"]\nenv = { \"MY.VAR\" = 1 }\n");
        assert_eq!(e.key, "app[0].env.\"MY.VAR\"", "{e}");
    }

    #[test]
    fn instance_var_is_read() {
        let app = |extra: &str| format!("[[app]]\nname = \"web\"\ncommand = [\"node\"]\n{extra}");
        assert_eq!(
            ok(&app("instance_var = \"INSTANCE_ID\"\n")).apps[0]
                .spec
                .instance_var
                .as_deref(),
            Some("INSTANCE_ID")
        );
    }

    #[test]
    fn shared_mode_apps_are_checked() {
        let app = |extra: &str| format!("[[app]]\nname = \"web\"\ncommand = [\"node\"]\n{extra}");
        assert_eq!(
            ok(&app("app_port = 3000\n")).apps[0].spec.app_port,
            Some(3000)
        );
        check(
            &err(&app("app_port = 0\n")),
            4,
            "app[0].app_port",
            "1..=65535",
        );
        check(
            &err(&app("app_port = 70000\n")),
            4,
            "app[0].app_port",
            "1..=65535",
        );
        check(
            &err(&app(
                "mode = \"shared\"\nlisten = \"127.0.0.1:8000\"\napp_port = 3000\n",
            )),
            6,
            "app[0].app_port",
            "drover runs no balancer for the app",
        );
        let c = ok(&app("mode = \"shared\"\nlisten = \"127.0.0.1:8000\"\nmax_memory = \"512M\"\ndrain_timeout = \"5s\"\nmax_restarts = 3\n"));
        assert_eq!(c.apps[0].spec.restart.max_restarts, Some(3));
        assert_eq!(ok(&app("")).apps[0].spec.restart.max_restarts, None);
        check(
            &err(&app("max_restarts = -1\n")),
            4,
            "app[0].max_restarts",
            "-1",
        );
        let ports = ok(&app("worker_ports = \"24100-24199\"\n")).apps[0]
            .spec
            .worker_ports;
        assert_eq!(ports.map(|p| (p.low, p.high)), Some((24100, 24199)));
        for (bad, says) in [
            ("\"24199-24100\"", "LOW is above HIGH"),
            ("\"24100\"", "expected LOW-HIGH"),
            ("\"0-10\"", "expected LOW-HIGH"),
            ("\"a-b\"", "expected LOW-HIGH"),
        ] {
            check(
                &err(&app(&format!("worker_ports = {bad}\n"))),
                4,
                "app[0].worker_ports",
                says,
            );
        }
        check(
            &err(&app(
                "mode = \"background\"\nworker_ports = \"24100-24199\"\n",
            )),
            5,
            "app[0].worker_ports",
            "no worker has a port of its own",
        );
        assert_eq!(c.apps[0].spec.mode, Mode::Shared);
        assert_eq!(c.apps[0].listen, Some(addr("127.0.0.1:8000")));
        assert_eq!(c.apps[0].spec.max_memory, Some(512 << 20));
        assert_eq!(c.apps[0].spec.drain_timeout, Duration::from_secs(5));
        check(
            &err(&app("mode = \"shared\"\n")),
            4,
            "app[0].listen",
            "needs listen",
        );
        check(
            &err(&app("mode = \"cluster\"\n")),
            4,
            "app[0].mode",
            "unknown mode \"cluster\"",
        );
        check(
            &err(&app("listen = \"127.0.0.1:8000\"\n")),
            4,
            "app[0].listen",
            "listen is for mode = \"shared\"",
        );
        check(
            &err(&app(
                "mode = \"shared\"\nlisten = \"127.0.0.1:8000\"\nhealth = { path = \"/h\" }\n",
            )),
            6,
            "app[0].health",
            "port per worker",
        );
        let port_app = |extra: &str| {
            format!("[[app]]\nname = \"web\"\ncommand = [\"app\", \"--bind=127.0.0.1:{{port}}\"]\n{extra}")
        };
        check(
            &err(&port_app(
                "mode = \"shared\"\nlisten = \"127.0.0.1:8000\"\n",
            )),
            3,
            "app[0].command",
            "{port} needs a port per worker, which mode = \"shared\" does not have",
        );
        // In proxy mode it is what `{port}` is for.
        let c = ok(&port_app(""));
        assert_eq!(c.apps[0].spec.command[1], "--bind=127.0.0.1:{port}");
        check(
            &err(&app("max_memory = \"12X\"\n")),
            4,
            "app[0].max_memory",
            "unknown unit",
        );
        check(
            &err(&app("max_memory = 0\n")),
            4,
            "app[0].max_memory",
            "greater than 0",
        );
        check(
            &err(&app("max_memory = -5\n")),
            4,
            "app[0].max_memory",
            "negative",
        );
        check(
            &err(&app("mode = \"shared\"\nlisten = \"127.0.0.1:8000\"\n[[balancer]]\nlisten = \"127.0.0.1:8000\"\nbackends = [\"127.0.0.1:9\"]\n")),
            7,
            "balancer[0].listen",
            "already used by app[0].listen",
        );
        check(
            &err(&app("mode = \"shared\"\nlisten = \"127.0.0.1:8000\"\n[[balancer]]\nlisten = \"127.0.0.1:8001\"\nbackends = [\"app:web\"]\n")),
            8,
            "balancer[0].backends",
            "runs in shared mode",
        );
    }

    #[test]
    fn background_apps_serve_no_port_and_no_balancer_names_them() {
        let app = |extra: &str| {
            format!("[[app]]\nname = \"mailer\"\ncommand = [\"node\", \"consumer.js\"]\n{extra}")
        };
        let c = ok(&app(
            "mode = \"background\"\nworkers = 2\nmax_memory = \"256M\"\n",
        ));
        assert_eq!(c.apps[0].spec.mode, Mode::Background);
        assert_eq!(c.apps[0].listen, None);
        assert!(c.balancers.is_empty());
        check(
            &err(&app("mode = \"background\"\nhealth = { path = \"/h\" }\n")),
            5,
            "app[0].health",
            "the workers serve none",
        );
        check(
            &err(&app("mode = \"background\"\napp_port = 3000\n")),
            5,
            "app[0].app_port",
            "drover runs no balancer for the app",
        );
        check(
            &err(&app("mode = \"background\"\nlisten = \"127.0.0.1:8000\"\n")),
            5,
            "app[0].listen",
            "with mode = \"background\" the workers serve no port",
        );
        check(
            &err("[[app]]\nname = \"mailer\"\ncommand = [\"app\", \"--port={port}\"]\nmode = \"background\"\n"),
            3,
            "app[0].command",
            "{port} needs a port per worker, and with mode = \"background\"",
        );
        check(
            &err(&app("mode = \"background\"\n[[balancer]]\nlisten = \"127.0.0.1:8001\"\nbackends = [\"app:mailer\"]\n")),
            7,
            "balancer[0].backends",
            "runs in background mode",
        );
    }

    #[test]
    fn load_reads_files_and_names_them() {
        let dir = std::env::temp_dir().join(format!("drover-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.toml");
        std::fs::write(&good, MINIMAL).unwrap();
        assert_eq!(load(&good).unwrap().balancers.len(), 1);

        let bad = dir.join("bad.toml");
        std::fs::write(&bad, format!("{MINIMAL}retries = 99\n")).unwrap();
        let e = load(&bad).unwrap_err();
        assert!(
            e.to_string()
                .starts_with(&format!("{}:4:11: balancer[0].retries: ", bad.display())),
            "{e}"
        );

        let missing = dir.join("missing.toml");
        let e = load(&missing).unwrap_err();
        assert_eq!(e.file, missing.display().to_string());
        assert!(e.message.contains("cannot read config file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
