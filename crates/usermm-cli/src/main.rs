//! `usermm`: run the experiments, in the engine and on the host kernel.

mod batching;
mod bench;
mod native;
mod plot;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "usermm",
    version,
    about = "The Linux memory-management core, executable in user space"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run experiments (all of them when none is named).
    Bench(bench::BenchArgs),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Bench(a) => bench::run(a),
    }
}
