//! drover-bench: an HTTP/1.1 load generator for measuring balancers.
//!
//! * closed loop: `connections` keep-alive connections, each sending its next request
//!   when the previous one is answered (what wrk does);
//! * open loop: requests on a fixed schedule at `rate` requests/s, latency measured from
//!   each request's scheduled send time so stalls are not hidden (coordinated omission,
//!   as wrk2 and `oha -q` handle it), connections from a pool that grows up to
//!   `connections`.
//!
//! Requests pick their path from a weighted [`Mix`]. Latency goes into HdrHistograms in
//! microseconds; errors are counted by kind and per second. [`cli::BenchCommand`] is the
//! command line of `drover bench`; the report prints as text, `--json` ([`stats`]) or
//! one HTML page ([`html`]), and is checked against `--slo`s ([`slo`]). `drover bench
//! compare` ([`compare`]) tells two runs apart from their noise, and `--admin`
//! ([`admin`]) adds what drover's own `/metrics` saw.

pub mod admin;
pub mod cli;
pub mod compare;
pub mod html;
pub mod http;
pub mod human;
pub mod mix;
pub mod run;
pub mod schedule;
pub mod slo;
pub mod stats;
pub mod tls;

pub use mix::{Mix, MixError};
pub use run::{run, Config, Mode, Reuse, RunError};
pub use schedule::Schedule;
pub use stats::{Errors, Percentiles, Report};
