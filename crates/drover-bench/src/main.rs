//! `drover-loadgen`: the load generator as a stand-alone binary.

use std::process::ExitCode;

use clap::Parser;
use drover_bench::cli::{main_with, BenchArgs};

#[derive(Parser)]
#[command(
    name = "drover-loadgen",
    version,
    about = "HTTP/1.1 load generator: closed and open loop, HdrHistogram latency"
)]
struct Cli {
    #[command(flatten)]
    args: BenchArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    main_with(&cli.args)
}
