//! `usermm`: run the experiments, in the engine and on the host kernel.

mod batching;
mod bench;
mod native;
mod plot;
mod scenario;
mod vma_bench;

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
    /// Run a scenario file in usermm, or with --native on the host kernel.
    /// Exit status: 0 every expectation held, 1 one failed, 2 malformed
    /// file, 3 skipped (host knobs could not be set).
    Run(RunArgs),
    /// Run a scenario in usermm, then show the VMAs, page tables, folios,
    /// TLBs and counters (a `dump` line in the scenario shows them there).
    Inspect(InspectArgs),
}

#[derive(clap::Args)]
struct InspectArgs {
    /// The scenario file.
    file: std::path::PathBuf,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

fn inspect(a: InspectArgs) -> anyhow::Result<i32> {
    let src = std::fs::read(&a.file).map_err(|e| anyhow::anyhow!("{}: {e}", a.file.display()))?;
    let stmts = match scenario::parse::parse(&String::from_utf8_lossy(&src)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{}:{e}", a.file.display());
            return Ok(2);
        }
    };
    let mut b = scenario::engine::EngineBackend::new()?;
    let report = scenario::run(&stmts, &mut b, "usermm");
    for o in report.outcomes.iter().filter(|o| o.failed.is_some()) {
        eprintln!(
            "line {}: {}: {}",
            o.line,
            o.text,
            o.failed.as_deref().unwrap_or("")
        );
    }
    let ins = b.inspection();
    if a.json {
        println!(
            "{}",
            serde_json::json!({ "processes": b.process_ids(), "inspection": ins })
        );
    } else {
        println!("{}", b.processes_line());
        print!("{ins}");
    }
    Ok(report.exit_code())
}

#[derive(clap::Args)]
struct RunArgs {
    /// The scenario file (see docs/scenarios.md).
    file: std::path::PathBuf,
    /// Run on the host kernel instead of in usermm.
    #[arg(long)]
    native: bool,
    /// Print the outcomes as JSON.
    #[arg(long)]
    json: bool,
}

fn run_scenario(a: RunArgs) -> anyhow::Result<i32> {
    let src = std::fs::read(&a.file).map_err(|e| anyhow::anyhow!("{}: {e}", a.file.display()))?;
    let src = String::from_utf8_lossy(&src);
    let stmts = match scenario::parse::parse(&src) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{}:{e}", a.file.display());
            return Ok(2);
        }
    };
    let report = if a.native {
        let mut b = scenario::host::HostBackend::new()?;
        scenario::run(&stmts, &mut b, "native")
    } else {
        let mut b = scenario::engine::EngineBackend::new()?;
        scenario::run(&stmts, &mut b, "usermm")
    };
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        report.print();
    }
    Ok(report.exit_code())
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Bench(a) => bench::run(a),
        Cmd::Run(a) => {
            let code = run_scenario(a)?;
            std::process::exit(code);
        }
        Cmd::Inspect(a) => {
            let code = inspect(a)?;
            std::process::exit(code);
        }
    }
}
