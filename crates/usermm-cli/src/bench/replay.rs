//! `bench replay`: the seeds on real programs. Each trace (by default the
//! corpus in tests/traces, run from the repository; `--trace FILE` names
//! others) is replayed under each series' tunable at its baseline and its
//! change, rounds interleaved (docs/traces.md): `fork_batch` and
//! `zap_batch` off and on, `pt_reclaim` off and upstream, `fault_lock`
//! `mmap_lock` and `vma_lock`. A row gives the replay's time (its events
//! loop) in both arms, their ratio with its interval, whether each arm
//! agreed with the kernel on every call and figure, and what the change is
//! about: page faults and TLB shootdowns sent in the changed arm, VmPTE
//! summed over the processes at exit in each. MIGRC and LUF need a tiered machine whose
//! fast node the program outgrows; the corpus's programs are too small
//! for that (not run here).
//!
//! The corpus's C programs are built (with the system's C compiler) where
//! the traces name them, as the corpus test builds them; a trace whose
//! files differ here is left out with a message.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::stats::{Estimate, Rounds};
use super::BenchArgs;
use crate::trace::format::Trace;

pub const EXPERIMENT: super::Experiment = super::Experiment {
    name: "replay",
    description: "real programs (the trace corpus) replayed under each series' tunable, \
        baseline against change, with the replay's agreement with the kernel",
    run: experiment,
    budget_s: 20,
    full_budget_s: 60,
};

/// Each series' tunable, its baseline value and its change.
const SERIES: [(&str, &str, &str); 4] = [
    ("fork_batch", "off", "on"),
    ("zap_batch", "off", "on"),
    ("pt_reclaim", "off", "upstream"),
    ("fault_lock", "mmap_lock", "vma_lock"),
];

/// Where the corpus's C programs are built (tests/traces/record.sh).
const CORPUS_BUILD: &str = "/tmp/usermm-corpus";

#[derive(Serialize)]
struct Row {
    trace: String,
    tunable: &'static str,
    base: &'static str,
    arm: &'static str,
    events: usize,
    base_ms: f64,
    arm_ms: f64,
    ratio: f64,
    ci_low: f64,
    ci_high: f64,
    runs: usize,
    /// Each arm agreed with the kernel on every call and figure, in every
    /// round (the kernel runs one algorithm of each series: a baseline
    /// that is not it may differ, as PT reclaim off leaves VmPTE higher).
    base_agrees: bool,
    arm_agrees: bool,
    pgfault: i64,
    tlb_shootdowns: i64,
    /// VmPTE summed over the processes at exit, in each arm.
    base_vm_pte_kb: i64,
    arm_vm_pte_kb: i64,
}

/// One replay: its events loop's seconds, whether it agreed, and the
/// changed-arm figures.
struct Sample {
    seconds: f64,
    agrees: bool,
    pgfault: i64,
    tlb_shootdowns: i64,
    vm_pte_kb: i64,
}

fn replay_once(
    t: &Trace,
    a: &BenchArgs,
    config: &usermm::MachineConfig,
    (tunable, value): (&str, &str),
) -> anyhow::Result<Sample> {
    let b = crate::scenario::engine::EngineBackend::new(config.clone())?;
    a.tunables.apply(b.tunables())?;
    b.tunables()
        .set(tunable, value)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let r = crate::trace::replay::replay(t, b, false)?;
    let vm_pte_kb = r
        .processes
        .iter()
        .flat_map(|p| p.figures.iter())
        .filter(|f| f.0 == "VmPTE")
        .map(|f| f.2)
        .sum();
    Ok(Sample {
        seconds: r.seconds,
        agrees: r.agrees() && r.files_changed.is_empty(),
        pgfault: r.counters.get("pgfault").copied().unwrap_or(0),
        tlb_shootdowns: r.counters.get("nr_tlb_remote_flush").copied().unwrap_or(0),
        vm_pte_kb,
    })
}

/// The traces: `--trace`, or the corpus (its C programs built first).
fn traces(a: &BenchArgs) -> anyhow::Result<Vec<PathBuf>> {
    if !a.trace.is_empty() {
        return Ok(a.trace.clone());
    }
    let dir = Path::new("tests/traces");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(Vec::new());
    };
    let mut v: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".trace.gz"))
        .collect();
    v.sort();
    build_corpus_programs(Path::new("crates/usermm-cli/tests/programs"));
    Ok(v)
}

/// Build each C program of `src` into [`CORPUS_BUILD`] (quietly: without
/// a compiler, the traces that need them are left out as changed).
fn build_corpus_programs(src: &Path) {
    let Ok(entries) = std::fs::read_dir(src) else {
        return;
    };
    if std::fs::create_dir_all(CORPUS_BUILD).is_err() {
        return;
    }
    for e in entries.flatten() {
        let p = e.path();
        let (Some(stem), Some("c")) = (
            p.file_stem().and_then(|s| s.to_str()),
            p.extension().and_then(|s| s.to_str()),
        ) else {
            continue;
        };
        let tmp = Path::new(CORPUS_BUILD).join(format!(".{stem}.{}", std::process::id()));
        let ok = std::process::Command::new("cc")
            .args(["-O1", "-pthread", "-o"])
            .arg(&tmp)
            .arg(&p)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            let _ = std::fs::rename(&tmp, Path::new(CORPUS_BUILD).join(stem));
        }
    }
}

fn experiment(a: &BenchArgs) -> anyhow::Result<serde_json::Value> {
    let mut rows = Vec::new();
    let paths = traces(a)?;
    if paths.is_empty() && !a.json {
        outln!("replay: no traces (run from the repository for tests/traces, or give --trace)");
    }
    let pb = super::progress("replay", (paths.len() * SERIES.len()) as u64);
    for path in &paths {
        let t = Trace::load(path)?;
        let name = path
            .file_name()
            .map(|n| {
                n.to_string_lossy()
                    .trim_end_matches(".trace.gz")
                    .to_string()
            })
            .unwrap_or_default();
        if !crate::trace::replay::changed_files(&t).is_empty() {
            if !a.json {
                outln!("replay: {name} left out: its files differ here");
            }
            pb.inc(SERIES.len() as u64);
            continue;
        }
        let config = a.machine.config(crate::trace::replay_machine(&t))?;
        for (tunable, base, arm) in SERIES {
            let (mut b, mut c) = (Vec::new(), Vec::new());
            let (mut base_agrees, mut arm_agrees) = (true, true);
            let (mut last, mut last_base) = (None, None);
            let budget = a.budget() / (paths.len() * SERIES.len()).max(1) as u32;
            let mut rounds = Rounds::new(a.runs(), budget);
            while rounds.more(|| Estimate::ratio(&c, &b).spread() <= super::stats::NARROW) {
                // Alternate which arm goes first.
                let order = if rounds.done().is_multiple_of(2) {
                    [base, arm]
                } else {
                    [arm, base]
                };
                for v in order {
                    let s = replay_once(&t, a, &config, (tunable, v))?;
                    if v == base {
                        base_agrees &= s.agrees;
                        b.push(s.seconds);
                        last_base = Some(s);
                    } else {
                        arm_agrees &= s.agrees;
                        c.push(s.seconds);
                        last = Some(s);
                    }
                }
            }
            let e = Estimate::ratio(&c, &b);
            let s = last.expect("at least one round");
            let sb = last_base.expect("at least one round");
            rows.push(Row {
                trace: name.clone(),
                tunable,
                base,
                arm,
                events: t.events.len(),
                base_ms: super::median(b.clone()) * 1e3,
                arm_ms: super::median(c.clone()) * 1e3,
                ratio: e.value,
                ci_low: e.ci_low,
                ci_high: e.ci_high,
                runs: rounds.done(),
                base_agrees,
                arm_agrees,
                pgfault: s.pgfault,
                tlb_shootdowns: s.tlb_shootdowns,
                base_vm_pte_kb: sb.vm_pte_kb,
                arm_vm_pte_kb: s.vm_pte_kb,
            });
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    if !a.json {
        outln!(
            "{:<11} {:<11} {:>9} {:>9} {:>22} {:>9} {:>8} {:>13}",
            "trace",
            "tunable",
            "base ms",
            "arm ms",
            "arm/base [95%]",
            "agree b/a",
            "pgfault",
            "VmPTE b/a kB"
        );
        for r in &rows {
            let e = Estimate {
                value: r.ratio,
                ci_low: r.ci_low,
                ci_high: r.ci_high,
                n: r.runs,
            };
            let yes = |b: bool| if b { "yes" } else { "NO" };
            outln!(
                "{:<11} {:<11} {:>9.2} {:>9.2} {:>22} {:>9} {:>8} {:>13}",
                r.trace,
                r.tunable,
                r.base_ms,
                r.arm_ms,
                e.change_pct(),
                format!("{}/{}", yes(r.base_agrees), yes(r.arm_agrees)),
                r.pgfault,
                format!("{}/{}", r.base_vm_pte_kb, r.arm_vm_pte_kb)
            );
        }
        outln!();
    }
    Ok(serde_json::json!({
        "experiment": "replay",
        "machine": "each trace's: at least 1 GiB, a CPU per thread (or --machine)",
        "rows": rows,
    }))
}
