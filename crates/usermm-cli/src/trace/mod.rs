//! Real programs: `usermm trace record` runs one on the host kernel and
//! writes what its memory management did ([`format`], docs/traces.md),
//! `usermm trace show` summarises a trace, `usermm trace replay` runs it in
//! the engine and compares, `usermm trace scenario` writes it as a
//! scenario file.

pub mod format;
pub mod record;
pub mod replay;
pub mod scenario;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;

use clap::Subcommand;
use serde::Serialize;

use crate::{machine_args, tunable_args};
use format::{Access, Trace, What};

#[derive(clap::Args)]
pub struct TraceArgs {
    #[command(subcommand)]
    cmd: TraceCmd,
}

#[derive(Subcommand)]
enum TraceCmd {
    /// Run a program on the host kernel (address-space randomisation
    /// off, its children, threads and execs followed) and write its trace.
    /// Needs `perf` and the rights to its tracepoints (root).
    Record {
        /// The trace file (gzip-compressed; `.txt` for plain text).
        /// Default: NAME.trace.gz after the program's name.
        #[arg(short, long)]
        out: Option<PathBuf>,
        /// Start the program with only `PATH=/usr/bin:/bin` in its
        /// environment (for traces to share: the environment is recorded).
        #[arg(long)]
        clean_env: bool,
        /// The program and its arguments.
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// Summarise a trace: its calls and faults by kind, its processes,
    /// threads and files, its footprint.
    Show {
        file: PathBuf,
        /// Print the summary as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Write a trace as a scenario file (docs/scenarios.md) on stdout:
    /// each event the statement that does it, the kernel's answers as
    /// comments.
    Scenario { file: PathBuf },
    /// Replay a trace in usermm and compare each call's result, each
    /// exec's address space and each process's figures with the host
    /// kernel's. Exit status 0 when everything agreed, 1 otherwise.
    Replay {
        file: PathBuf,
        /// Print the report as one JSON object.
        #[arg(long)]
        json: bool,
        /// Start with nothing in the page cache (by default each mapped
        /// file is read whole when the replay first opens it, as the
        /// host most likely had it cached).
        #[arg(long)]
        cold_cache: bool,
        #[command(flatten)]
        machine: machine_args::MachineArgs,
        #[command(flatten)]
        tunables: tunable_args::TunableArgs,
    },
}

pub fn run(a: TraceArgs) -> anyhow::Result<i32> {
    match a.cmd {
        TraceCmd::Record {
            out,
            clean_env,
            cmd,
        } => {
            let out = out.unwrap_or_else(|| record::default_out(&cmd));
            let t = record::record(&out, &cmd, clean_env)?;
            let s = Summary::of(&t);
            outln!(
                "{}: {} events ({} calls, {} faults), {} processes, {} threads{}",
                out.display(),
                t.events.len(),
                s.calls.values().sum::<u64>(),
                s.faults.values().sum::<u64>(),
                s.processes,
                s.threads,
                if t.lost > 0 {
                    format!("; {} records LOST (the trace is incomplete)", t.lost)
                } else {
                    String::new()
                }
            );
            Ok(0)
        }
        TraceCmd::Show { file, json } => {
            let t = Trace::load(&file)?;
            let s = Summary::of(&t);
            if json {
                outln!("{}", serde_json::to_string(&s)?);
            } else {
                s.print();
            }
            Ok(0)
        }
        TraceCmd::Scenario { file } => {
            let t = Trace::load(&file)?;
            crate::out!("{}", scenario::to_scenario(&t));
            Ok(0)
        }
        TraceCmd::Replay {
            file,
            json,
            cold_cache,
            machine,
            tunables,
        } => {
            tunables.parsed()?;
            let t = Trace::load(&file)?;
            let config = machine.config(replay_machine(&t))?;
            let b = crate::scenario::engine::EngineBackend::new(config)?;
            tunables.apply(b.tunables())?;
            let r = replay::replay(&t, b, cold_cache)?;
            if json {
                outln!("{}", serde_json::to_string(&r)?);
            } else {
                r.print(&t);
            }
            Ok(if r.agrees() { 0 } else { 1 })
        }
    }
}

/// The default machine of a replay: one node of four times the pages the
/// trace faulted and 512 MiB more (1 to 16 GiB), with a CPU for each of
/// its threads (at least two, at most 16).
pub fn replay_machine(t: &Trace) -> usermm::MachineConfig {
    let s = Summary::of(t);
    let bytes = (s.pages_touched as u64 * 4 * 4096 + (512 << 20)).clamp(1 << 30, 16 << 30);
    usermm::MachineConfig::single_node(bytes, s.threads.clamp(2, 16))
}

/// What `usermm trace show` prints.
#[derive(Debug, Default, Serialize)]
pub struct Summary {
    pub cmd: Vec<String>,
    pub kernel: String,
    pub events: usize,
    pub seconds: f64,
    pub calls: BTreeMap<&'static str, u64>,
    /// `read`, `write`, `exec`, each `user` or `kernel` mode.
    pub faults: BTreeMap<String, u64>,
    pub processes: usize,
    pub threads: usize,
    pub execs: Vec<String>,
    pub files: usize,
    /// Distinct pages faulted (all processes).
    pub pages_touched: usize,
    /// The largest VmRSS at a process's exit (kB).
    pub peak_rss_kb: i64,
    pub lost: u64,
}

impl Summary {
    pub fn of(t: &Trace) -> Summary {
        let mut s = Summary {
            cmd: t.cmd.clone(),
            kernel: t.kernel.clone(),
            events: t.events.len(),
            seconds: t.events.last().map_or(0.0, |e| e.t_us as f64 / 1e6),
            files: t.files.len(),
            lost: t.lost,
            ..Default::default()
        };
        let mut pids = HashSet::new();
        let mut tids = HashSet::new();
        let mut pages = HashSet::new();
        for e in &t.events {
            pids.insert(e.pid);
            tids.insert(e.tid);
            match &e.what {
                What::Call(c) => *s.calls.entry(c.sys.name()).or_default() += 1,
                What::Fault {
                    addr,
                    access,
                    kernel,
                } => {
                    let k = match access {
                        Access::Read => "read",
                        Access::Write => "write",
                        Access::Exec => "exec",
                    };
                    let mode = if *kernel { "kernel" } else { "user" };
                    *s.faults.entry(format!("{k} ({mode})")).or_default() += 1;
                    pages.insert((e.pid, addr >> 12));
                }
                What::Exec { path, .. } => s.execs.push(path.clone()),
                What::Figures(f) => s.peak_rss_kb = s.peak_rss_kb.max(f.get("VmRSS").unwrap_or(0)),
                _ => {}
            }
        }
        s.processes = pids.len();
        s.threads = tids.len();
        s.pages_touched = pages.len();
        s
    }

    pub fn print(&self) {
        outln!(
            "`{}`, recorded on Linux {}",
            self.cmd.join(" "),
            self.kernel
        );
        outln!(
            "{} events over {:.3} s; {} processes, {} threads, {} files mapped",
            self.events,
            self.seconds,
            self.processes,
            self.threads,
            self.files
        );
        outln!("programs: {}", self.execs.join(", "));
        outln!("calls:");
        for (n, c) in &self.calls {
            outln!("  {n:<14} {c:>9}");
        }
        outln!("faults:");
        for (n, c) in &self.faults {
            outln!("  {n:<14} {c:>9}");
        }
        outln!(
            "footprint: {} pages faulted ({} MiB); largest VmRSS at exit {} kB",
            self.pages_touched,
            (self.pages_touched * 4096) >> 20,
            self.peak_rss_kb
        );
        if self.lost > 0 {
            outln!("{} records were LOST while recording", self.lost);
        }
    }
}
