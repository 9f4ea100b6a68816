//! `usermm`: run the experiments, in the engine and on the host kernel.

#[macro_use]
mod out;
mod bench;
mod host_chain;
mod host_pt_reclaim;
mod knob_guard;
mod machine_args;
mod native;
mod plot;
mod report;
mod scenario;
mod stress;
mod trace;
mod tunable_args;

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
    Bench(Box<bench::BenchArgs>),
    /// Run a scenario file in usermm, or with --native on the host kernel.
    /// Exit status: 0 every expectation held, 1 one failed, 2 malformed
    /// file, 3 skipped (host knobs could not be set), 4 unreadable file.
    Run(RunArgs),
    /// Run a scenario in usermm, then show the VMAs, page tables, folios,
    /// TLBs and counters (a `dump` line in the scenario shows them there).
    Inspect(InspectArgs),
    /// Write one HTML page from a results folder: every experiment's table
    /// and plots, the run's command and host, and a scenario's page tables.
    Report(report::ReportArgs),
    /// Random operations on one CPU while the others load and store, with
    /// the shadow memory, the invariant checker, a watchdog and a leak check.
    /// Exit status: 0 clean, 1 something broke, 3 a stall.
    Stress(stress::StressArgs),
    /// Real programs: record one on the host kernel, summarise a trace,
    /// replay it in usermm against what the kernel did (docs/traces.md).
    Trace(trace::TraceArgs),
    /// `trace record`'s workload: write this pid to W, wait for a byte on
    /// R, turn randomisation off and exec CMD.
    #[command(hide = true)]
    TraceStub {
        w: i32,
        r: i32,
        /// Start CMD with only `PATH=/usr/bin:/bin` in its environment.
        #[arg(long)]
        clean_env: bool,
        #[arg(last = true)]
        cmd: Vec<String>,
    },
    /// Build a chain of forked processes on the host and print how long it
    /// takes to tear down (`bench vma` runs it).
    #[command(hide = true)]
    HostForkChain {
        depth: usize,
        /// Extra 16-page VMAs each process writes a page of.
        #[arg(long, default_value_t = 0)]
        vmas: usize,
    },
    /// Run the seed's PT-reclaim loop on the host and print its figures as
    /// JSON (`bench pt_reclaim` runs it).
    #[command(hide = true)]
    HostPtReclaim {
        mode: host_pt_reclaim::Mode,
        iterations: usize,
    },
    /// Put the host settings a run changed back once it has ended, however
    /// it ended (each run that changes them starts one; see knob_guard).
    #[command(hide = true)]
    RestoreHostSettings,
    /// A native scenario's vfork child that execs: serve the scenario's
    /// requests on descriptors IN and OUT for PROGRAM, exec'd and traced.
    #[command(hide = true)]
    ServeExec {
        inp: i32,
        out: i32,
        program: Vec<String>,
    },
}

#[derive(clap::Args)]
struct InspectArgs {
    /// The scenario file.
    file: std::path::PathBuf,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    machine: machine_args::MachineArgs,
    #[command(flatten)]
    tunables: tunable_args::TunableArgs,
}

/// This host's memory in bytes (0 if it cannot be told).
pub fn host_memory_bytes() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
    // SAFETY: as above.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    (pages.max(0) as u64).saturating_mul(size.max(0) as u64)
}

/// Exit status of `run` and `inspect` when the file cannot be read.
const EXIT_UNREADABLE: i32 = 4;

/// The scenario file's bytes, or `None` after saying why it cannot be read.
fn read_scenario(path: &std::path::Path) -> Option<Vec<u8>> {
    std::fs::read(path)
        .map_err(|e| eprintln!("{}: {e}", path.display()))
        .ok()
}

fn inspect(a: InspectArgs) -> anyhow::Result<i32> {
    let config = a
        .machine
        .config(scenario::engine::EngineBackend::default_machine())?;
    a.tunables.parsed()?;
    let Some(src) = read_scenario(&a.file) else {
        return Ok(EXIT_UNREADABLE);
    };
    let stmts = match scenario::parse::parse(&String::from_utf8_lossy(&src)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{}:{e}", a.file.display());
            return Ok(2);
        }
    };
    let mut b = scenario::engine::EngineBackend::new(config)?;
    a.tunables.apply(b.tunables())?;
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
        outln!(
            "{}",
            serde_json::json!({ "processes": b.process_ids(), "inspection": ins })
        );
    } else {
        outln!("{}", b.processes_line());
        out!("{ins}");
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
    /// The machine usermm runs the scenario on (not with --native).
    #[command(flatten)]
    machine: machine_args::MachineArgs,
    /// Tunables of the engine (not with --native, but for the host
    /// kernel's own values).
    #[command(flatten)]
    tunables: tunable_args::TunableArgs,
}

fn run_scenario(a: RunArgs) -> anyhow::Result<i32> {
    if a.native && a.machine.given() {
        anyhow::bail!("--native runs on this host: --machine, --mem and --cpus are for usermm");
    }
    a.tunables.parsed()?;
    if a.native {
        a.tunables.check_native()?;
    }
    let config = a
        .machine
        .config(scenario::engine::EngineBackend::default_machine())?;
    let Some(src) = read_scenario(&a.file) else {
        return Ok(EXIT_UNREADABLE);
    };
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
        let mut b = scenario::engine::EngineBackend::new(config)?;
        a.tunables.apply(b.tunables())?;
        scenario::run(&stmts, &mut b, "usermm")
    };
    if a.json {
        outln!("{}", serde_json::to_string(&report)?);
    } else {
        report.print();
    }
    Ok(report.exit_code())
}

/// Errors are one line on stderr and exit status 1, never a panic or a
/// backtrace: they are the user's to read.
fn main() {
    // The CPUs to pin to, read before any thread is pinned.
    native::process_cpus();
    let code = match run_command(Cli::parse().cmd) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("usermm: {e:#}");
            1
        }
    };
    std::process::exit(code);
}

fn run_command(cmd: Cmd) -> anyhow::Result<i32> {
    match cmd {
        Cmd::Bench(a) => bench::run(*a).map(|()| 0),
        Cmd::Run(a) => run_scenario(a),
        Cmd::Inspect(a) => inspect(a),
        Cmd::Report(a) => report::run(a),
        Cmd::Stress(a) => stress::run(a),
        Cmd::Trace(a) => trace::run(a),
        Cmd::TraceStub {
            w,
            r,
            clean_env,
            cmd,
        } => trace::record::stub(w, r, clean_env, &cmd),
        Cmd::HostForkChain { depth, vmas } => host_chain::main(depth, vmas),
        Cmd::HostPtReclaim { mode, iterations } => host_pt_reclaim::main(mode, iterations),
        Cmd::RestoreHostSettings => knob_guard::main(),
        Cmd::ServeExec { inp, out, program } => scenario::host::serve_exec(inp, out, &program),
    }
}
