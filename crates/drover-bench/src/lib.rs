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
//! microseconds; errors are counted by kind. [`cli::BenchArgs`] is the command line,
//! shared by `drover-loadgen` and (later) `drover bench`.

pub mod cli;
pub mod http;
pub mod mix;
pub mod run;
pub mod schedule;
pub mod stats;

pub use mix::{Mix, MixError};
pub use run::{run, Config, Mode, Reuse, RunError};
pub use schedule::Schedule;
pub use stats::{Errors, Percentiles, Report};
