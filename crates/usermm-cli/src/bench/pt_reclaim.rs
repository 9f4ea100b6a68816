//! `bench pt_reclaim`: F4, freeing emptied user PTE tables. The seed's
//! loop (mmap 50 GiB MAP_NORESERVE, then for each 2 MiB chunk: write every
//! page, give the chunk back) in four modes, with every design of the
//! `pt_reclaim` tunable (and each that frees tables again with
//! `pt_reclaim_pmd`), VmPTE before and after beside the seed's published
//! figures and the host kernel's for the same loop run natively; then the
//! cost on the fault path: 4 KiB write-fault throughput per design, the
//! designs interleaved round by round.

use std::time::Instant;

use anyhow::anyhow;
use serde::Serialize;
use usermm::mmap::{MAP_ANONYMOUS, MAP_NORESERVE, MAP_PRIVATE, PROT_READ, PROT_WRITE};
use usermm::tunable::Tunable;
use usermm::Machine;

use super::stats::{self, Estimate, Rounds};
use super::{experiment_machine, progress, region_machine_bytes, BenchArgs};
use crate::host_pt_reclaim::{self, Figures, LoopResult, Mode, CHUNK, PAGE};
use crate::{native, plot};

pub const EXPERIMENT: super::Experiment = super::Experiment {
    name: "pt_reclaim",
    description: "the seed's loop (50 GiB; per 2 MiB chunk: write it, give it back) in four modes with each pt_reclaim design: VmPTE after, against the seed and the host kernel; and 4 KiB fault throughput per design (F4)",
    run,
    budget_s: 5,
    full_budget_s: 10,
};

/// The seed's loop: 25 x 1024 chunks of 2 MiB, 50 GiB.
const SEED_ITERATIONS: usize = 25 * 1024;

/// The seed series' VmPTE after the `whole` loop of [`SEED_ITERATIONS`], in kB: the kernel without
/// any of them (the cover letters' "before"), the percpu_ref RFC (Apr 2022)
/// and the merged series' v1 (Oct 2024).
fn seed_vmpte_after_kb(design: &str, mode: Mode) -> Option<u64> {
    match (design, mode) {
        ("off", Mode::Whole) => Some(102_640),
        ("upstream", Mode::Whole) => Some(240),
        ("pte_ref", Mode::Whole) => Some(96),
        _ => None,
    }
}

/// One arm of the loop: a `pt_reclaim` design, with or without
/// `pt_reclaim_pmd`.
#[derive(Clone, Copy)]
struct Arm {
    design: &'static str,
    pmd: bool,
}

impl Arm {
    /// Every design without PMD reclaim, then each design that frees PTE
    /// tables with it.
    fn all() -> Vec<Arm> {
        let designs = Tunable::PtReclaim.info().values;
        let plain = designs.iter().map(|d| Arm {
            design: d.name,
            pmd: false,
        });
        let pmd = designs.iter().filter(|d| d.name != "off").map(|d| Arm {
            design: d.name,
            pmd: true,
        });
        plain.chain(pmd).collect()
    }

    fn label(self) -> String {
        if self.pmd {
            format!("{}+pmd", self.design)
        } else {
            self.design.to_string()
        }
    }

    fn select(self, m: &Machine) -> anyhow::Result<()> {
        m.tunables
            .set(Tunable::PtReclaim.info().name, self.design)?;
        let pmd = if self.pmd { "on" } else { "off" };
        m.tunables.set(Tunable::PtReclaimPmd.info().name, pmd)?;
        Ok(())
    }
}

#[derive(Serialize)]
struct LoopRow {
    design: &'static str,
    /// Whether `pt_reclaim_pmd` freed emptied PMD tables too.
    pt_reclaim_pmd: bool,
    mode: &'static str,
    iterations: usize,
    vmsize_before_kb: u64,
    vmrss_before_kb: u64,
    vmpte_before_kb: u64,
    vmsize_after_kb: u64,
    vmrss_after_kb: u64,
    vmpte_after_kb: u64,
    loop_s: f64,
    /// PTE tables the design reclaimed during the loop (the model's
    /// counters).
    tables_reclaimed: u64,
    /// PMD tables reclaimed during the loop (`pt_reclaim_pmd`).
    pmd_tables_reclaimed: u64,
    seed_vmpte_after_kb: Option<u64>,
    host_vmpte_after_kb: Option<u64>,
    host_vmrss_after_kb: Option<u64>,
    host_loop_s: Option<f64>,
}

#[derive(Serialize)]
struct FaultCostRow {
    op: &'static str,
    design: &'static str,
    /// The median over rounds.
    faults_per_s: f64,
    /// The median over rounds of this design's throughput over `off`'s in
    /// the same round, and its 95% interval.
    ratio: f64,
    ci_low: f64,
    ci_high: f64,
    runs: usize,
    /// Every round's throughput.
    samples_faults_per_s: Vec<f64>,
}

impl FaultCostRow {
    fn estimate(&self) -> Estimate {
        Estimate {
            value: self.ratio,
            ci_low: self.ci_low,
            ci_high: self.ci_high,
            n: self.runs,
        }
    }
}

fn run(a: &BenchArgs) -> anyhow::Result<serde_json::Value> {
    let iterations = a.iterations;
    let designs = Tunable::PtReclaim.info().values;
    let arms = Arm::all();
    // The lanes' machines, populated before the host's THP knobs change
    // (and before any lane is pinned: a machine's own threads float).
    let lanes = lanes();
    let machines = (0..lanes)
        .map(|_| loop_machine(a))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let host_knobs = if a.no_host {
        Err("not run".to_string())
    } else {
        native::HostKnobs::only_size(4, false).map_err(|e| e.to_string())
    };
    let mut jobs: Vec<Job> = vec![];
    if host_knobs.is_ok() {
        jobs.extend(Mode::ALL.map(Job::Host));
    }
    for mode in Mode::ALL {
        jobs.extend(arms.iter().map(|&arm| Job::Engine(mode, arm)));
    }
    let pb = progress(
        "pt_reclaim",
        (jobs.len() + Rounds::expected(a.runs()) * designs.len()) as u64,
    );
    let done = run_loops(a, &jobs, &machines, &pb)?;
    drop(machines);
    // Per mode, the host's loop, or why it did not run.
    let not_run = host_knobs.as_ref().err().cloned().unwrap_or_default();
    let mut host: Vec<Result<LoopResult, String>> = vec![Err(not_run); Mode::ALL.len()];
    let mut engine = vec![];
    for d in done {
        match d {
            Done::Host(mode, r) => host[mode.index()] = r,
            Done::Engine(mode, arm, figures) => engine.push((mode, arm, figures)),
        }
    }
    drop(host_knobs);
    let mut rows = vec![];
    for (mode, arm, (r, reclaimed, pmd_reclaimed)) in engine {
        let h = host[mode.index()].as_ref().ok();
        rows.push(LoopRow {
            design: arm.design,
            pt_reclaim_pmd: arm.pmd,
            mode: mode.name(),
            iterations,
            vmsize_before_kb: r.before.vmsize_kb,
            vmrss_before_kb: r.before.vmrss_kb,
            vmpte_before_kb: r.before.vmpte_kb,
            vmsize_after_kb: r.after.vmsize_kb,
            vmrss_after_kb: r.after.vmrss_kb,
            vmpte_after_kb: r.after.vmpte_kb,
            loop_s: r.loop_s,
            tables_reclaimed: reclaimed,
            pmd_tables_reclaimed: pmd_reclaimed,
            seed_vmpte_after_kb: (iterations == SEED_ITERATIONS && !arm.pmd)
                .then(|| seed_vmpte_after_kb(arm.design, mode))
                .flatten(),
            host_vmpte_after_kb: h.map(|h| h.after.vmpte_kb),
            host_vmrss_after_kb: h.map(|h| h.after.vmrss_kb),
            host_loop_s: h.map(|h| h.loop_s),
        });
    }
    // The fault cost is timed alone, on CPU 0, in a machine of its own.
    let m = experiment_machine(a, region_machine_bytes(a.size_mb))?;
    let costs = {
        let _pinned = native::pin_thread(0);
        m.prefault();
        m.thp.only_order(0);
        fault_cost(a, &m, &pb)?
    };
    pb.finish_and_clear();
    let host_note = host.iter().find_map(|h| h.as_ref().err().cloned());
    if !a.json {
        print_tables(a, &m, &rows, &costs, host_note.as_deref(), lanes);
    }
    plot_vmpte(a, &rows)?;
    let mut json_rows: Vec<serde_json::Value> = rows
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<_, _>>()?;
    for c in &costs {
        json_rows.push(serde_json::to_value(c)?);
    }
    Ok(serde_json::json!({
        "experiment": "pt_reclaim",
        "machine": m.config.to_string(),
        "iterations": iterations,
        "fault_region_mb": a.size_mb,
        "loops_at_a_time": lanes,
        "runs": a.runs().to_string(),
        "host_note": host_note,
        "rows": json_rows,
    }))
}

/// One run of the seed's loop: on the host kernel, or in the engine with
/// one arm.
#[derive(Clone, Copy)]
enum Job {
    Host(Mode),
    Engine(Mode, Arm),
}

/// What a [`Job`] measured.
enum Done {
    Host(Mode, Result<LoopResult, String>),
    /// The figures, and the PTE and PMD tables reclaimed.
    Engine(Mode, Arm, (LoopResult, u64, u64)),
}

/// How many loops run at once: one per host CPU, at most two. The loops
/// are single-threaded and their VmPTE, VmRSS and reclaim counts do not
/// depend on what runs beside them; their seconds do, a little (the two
/// share the memory bus), which the table says.
fn lanes() -> usize {
    native::host_cpus().min(2)
}

/// Run `jobs` on one thread per machine, each pinned to its own host CPU,
/// taking the next job as it finishes one; the results in the jobs' order.
fn run_loops(
    a: &BenchArgs,
    jobs: &[Job],
    machines: &[std::sync::Arc<Machine>],
    pb: &indicatif::ProgressBar,
) -> anyhow::Result<Vec<Done>> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<Done>>> =
        jobs.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|s| {
        let lanes: Vec<_> = machines
            .iter()
            .enumerate()
            .map(|(lane, m)| {
                let (next, results) = (&next, &results);
                s.spawn(move || -> anyhow::Result<()> {
                    // A spawned host loop inherits this thread's CPU.
                    let _pinned = native::pin_thread(lane);
                    let r = (|| loop {
                        // Relaxed: the counter only hands out indices;
                        // the results are published by their mutexes.
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&job) = jobs.get(i) else {
                            return Ok(());
                        };
                        let done = match job {
                            Job::Host(mode) => {
                                pb.set_message(format!("host {}", mode.name()));
                                Done::Host(
                                    mode,
                                    host_pt_reclaim::run(mode, a.iterations)
                                        .map_err(|e| e.to_string()),
                                )
                            }
                            Job::Engine(mode, arm) => {
                                pb.set_message(format!("{} {}", arm.label(), mode.name()));
                                arm.select(m)?;
                                Done::Engine(mode, arm, engine_loop(m, mode, a.iterations)?)
                            }
                        };
                        *results[i].lock().expect("no lane panics") = Some(done);
                        pb.inc(1);
                    })();
                    if r.is_err() {
                        // The other lanes stop after their current loop.
                        next.store(jobs.len(), std::sync::atomic::Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        lanes
            .into_iter()
            .try_for_each(|l| l.join().expect("a loop lane panicked"))
    })?;
    Ok(results
        .into_iter()
        .map(|r| {
            r.into_inner()
                .expect("no lane panics")
                .expect("every job ran")
        })
        .collect())
}

/// A lane's machine, populated, with 4 KiB folios only, as the seed
/// measured and the host runs. It holds the loop's own memory: one table
/// per chunk when none is freed, the chunk being written, and slack.
fn loop_machine(a: &BenchArgs) -> anyhow::Result<std::sync::Arc<Machine>> {
    let need = (a.iterations as u64 * PAGE as u64 + (64 << 20)).next_multiple_of(1 << 20);
    let m = experiment_machine(a, need)?;
    m.prefault();
    m.thp.only_order(0);
    Ok(m)
}

/// Tables reclaimed so far, by every design's counter.
fn tables_reclaimed(m: &Machine) -> u64 {
    usermm::vmstat::Event::PT_RECLAIMED_BY_DESIGN
        .iter()
        .map(|&e| m.vmstat().event(e))
        .sum()
}

/// The seed's loop in a fresh process of the engine. Returns its figures
/// and the PTE and PMD tables reclaimed meanwhile.
fn engine_loop(
    m: &Machine,
    mode: Mode,
    iterations: usize,
) -> anyhow::Result<(LoopResult, u64, u64)> {
    let err = |what: &'static str| move |e| anyhow!("{what}: {e}");
    let c = m.bind(0).map_err(err("bind"))?;
    let mm = c.new_mm().map_err(err("mm"))?;
    let len = mode.mapping_len(iterations) as u64;
    let base = c
        .mmap(
            0,
            len,
            PROT_READ | PROT_WRITE,
            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
        )
        .map_err(err("mmap"))?;
    let figures = || {
        m.rcu_barrier();
        let s = usermm::proc::status(&mm);
        Figures {
            vmsize_kb: s.vm_size,
            vmrss_kb: s.vm_rss,
            vmpte_kb: s.vm_pte,
        }
    };
    let before = figures();
    let reclaimed = tables_reclaimed(m);
    let pmd_event = usermm::vmstat::Event::PT_RECLAIM_PMD;
    let pmd_reclaimed = m.vmstat().event(pmd_event);
    let t = Instant::now();
    for i in 0..iterations as u64 {
        let chunk = base + mode.offset() as u64 + i * CHUNK as u64;
        c.touch_pages(chunk, chunk + CHUNK as u64, 1)
            .map_err(err("write"))?;
        for &(at, n, advice) in mode.calls() {
            c.madvise(chunk + at as u64, n as u64, advice)
                .map_err(err("madvise"))?;
        }
    }
    let loop_s = t.elapsed().as_secs_f64();
    let after = figures();
    let reclaimed = tables_reclaimed(m) - reclaimed;
    let pmd_reclaimed = m.vmstat().event(pmd_event) - pmd_reclaimed;
    c.munmap(base, len).map_err(err("munmap"))?;
    c.exit_mm().map_err(err("exit"))?;
    drop(mm);
    m.rcu_barrier();
    Ok((
        LoopResult {
            before,
            after,
            loop_s,
            aligned: base.is_multiple_of(CHUNK as u64),
        },
        reclaimed,
        pmd_reclaimed,
    ))
}

/// 4 KiB write-fault throughput of each design: every round populates a
/// fresh `--size-mb` region once per design, in an order that turns from
/// round to round, until every ratio to `off` is narrow (`--runs auto`).
fn fault_cost(
    a: &BenchArgs,
    m: &Machine,
    pb: &indicatif::ProgressBar,
) -> anyhow::Result<Vec<FaultCostRow>> {
    let designs = Tunable::PtReclaim.info().values;
    let len = a.size_mb << 20;
    let faults = (len / PAGE as u64) as f64;
    let mut fps: Vec<Vec<f64>> = vec![vec![]; designs.len()];
    let narrow = |fps: &[Vec<f64>]| fps.iter().all(|f| !Estimate::ratio(f, &fps[0]).wide());
    // One population thrown away first: it warms up what the rounds share.
    populate_s(m, len)?;
    let mut rounds = Rounds::new(a.runs(), a.budget());
    while rounds.more(|| narrow(&fps)) {
        rounds.lengthen(pb, designs.len() as u64);
        pb.set_message(format!("fault cost, round {}", rounds.done()));
        let n = designs.len();
        for k in 0..n {
            let i = (k + rounds.done()) % n;
            m.tunables
                .set(Tunable::PtReclaim.info().name, designs[i].name)?;
            fps[i].push(faults / populate_s(m, len)?);
        }
        pb.inc(n as u64);
    }
    m.tunables.set(
        Tunable::PtReclaim.info().name,
        Tunable::PtReclaim.info().default_name(),
    )?;
    Ok(designs
        .iter()
        .zip(&fps)
        .map(|(d, f)| {
            let r = Estimate::ratio(f, &fps[0]);
            FaultCostRow {
                op: "fault_cost",
                design: d.name,
                faults_per_s: stats::median(f),
                ratio: r.value,
                ci_low: r.ci_low,
                ci_high: r.ci_high,
                runs: r.n,
                samples_faults_per_s: f.clone(),
            }
        })
        .collect())
}

/// Seconds to write-fault every page of a fresh `len`-byte region.
fn populate_s(m: &Machine, len: u64) -> anyhow::Result<f64> {
    let err = |what: &'static str| move |e| anyhow!("{what}: {e}");
    let c = m.bind(0).map_err(err("bind"))?;
    c.new_mm().map_err(err("mm"))?;
    let addr = c
        .mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS)
        .map_err(err("mmap"))?;
    let t = Instant::now();
    c.touch_pages(addr, addr + len, 1)
        .map_err(err("populate"))?;
    let s = t.elapsed().as_secs_f64();
    c.munmap(addr, len).map_err(err("munmap"))?;
    c.exit_mm().map_err(err("exit"))?;
    m.rcu_barrier();
    Ok(s)
}

fn kb(v: Option<u64>) -> String {
    v.map_or("-".into(), |v| v.to_string())
}

fn print_tables(
    a: &BenchArgs,
    m: &Machine,
    rows: &[LoopRow],
    costs: &[FaultCostRow],
    host_note: Option<&str>,
    lanes: usize,
) {
    outln!(
        "bench pt_reclaim: mmap 50 GiB MAP_NORESERVE; {} times write every 4 KiB page of the next 2 MiB and give it back",
        a.iterations
    );
    outln!("  whole: MADV_DONTNEED 2 MiB; halves: two of 1 MiB; offset4k: 2 MiB chunks 4 KiB past a 2 MiB boundary;");
    outln!("  free: MADV_FREE 2 MiB, then MADV_PAGEOUT discards the clean lazyfree pages. Figures in kB.");
    outln!(
        "{:<13} {:<9} {:>10} {:>10} {:>10} {:>9} {:>9} {:>7} {:>10} {:>10} {:>9}",
        "design",
        "mode",
        "VmPTE bef",
        "VmPTE aft",
        "VmRSS aft",
        "loop(s)",
        "PTE rec",
        "PMD rec",
        "seed aft",
        "host aft",
        "host(s)"
    );
    for r in rows {
        let arm = Arm {
            design: r.design,
            pmd: r.pt_reclaim_pmd,
        };
        outln!(
            "{:<13} {:<9} {:>10} {:>10} {:>10} {:>9.2} {:>9} {:>7} {:>10} {:>10} {:>9}",
            arm.label(),
            r.mode,
            r.vmpte_before_kb,
            r.vmpte_after_kb,
            r.vmrss_after_kb,
            r.loop_s,
            r.tables_reclaimed,
            r.pmd_tables_reclaimed,
            kb(r.seed_vmpte_after_kb),
            kb(r.host_vmpte_after_kb),
            r.host_loop_s.map_or("-".into(), |s| format!("{s:.2}"))
        );
    }
    if let Some(n) = host_note {
        outln!("host: {n}");
    }
    if lanes > 1 {
        outln!("The loops ran {lanes} at a time, each on a host CPU of its own: the figures do not depend on it; the seconds are each loop's with another beside it.");
    }
    outln!();
    outln!(
        "fault cost: write faults on a fresh {} MiB region, 4 KiB folios; medians of the rounds, designs interleaved (runs {})",
        a.size_mb,
        a.runs()
    );
    outln!(
        "{:<9} {:>12} {:>22}",
        "design",
        "faults/s",
        "vs off [95% CI]"
    );
    for c in costs {
        outln!(
            "{:<9} {:>12.0} {:>22}",
            c.design,
            c.faults_per_s,
            c.estimate().ratio_text()
        );
    }
    outln!(
        "{}",
        stats::footnote(&format!("{} rounds", costs.first().map_or(0, |c| c.runs)))
    );
    outln!("machine: {}", m.config);
    outln!();
}

/// Bars of VmPTE after the loop, per mode, one per design and the host.
fn plot_vmpte(a: &BenchArgs, rows: &[LoopRow]) -> anyhow::Result<()> {
    let modes: Vec<String> = Mode::ALL.iter().map(|m| m.name().to_string()).collect();
    let mut bars: Vec<plot::Bars> = Arm::all()
        .into_iter()
        .map(|arm| plot::Bars {
            label: format!("usermm, {}", arm.label()),
            values: Mode::ALL
                .iter()
                .map(|m| {
                    rows.iter()
                        .find(|r| {
                            r.design == arm.design
                                && r.pt_reclaim_pmd == arm.pmd
                                && r.mode == m.name()
                        })
                        .map(|r| r.vmpte_after_kb as f64)
                })
                .collect(),
        })
        .collect();
    bars.push(plot::Bars {
        label: "host kernel".into(),
        values: Mode::ALL
            .iter()
            .map(|m| {
                rows.iter()
                    .find(|r| r.mode == m.name())
                    .and_then(|r| r.host_vmpte_after_kb)
                    .map(|v| v as f64)
            })
            .collect(),
    });
    plot::bar_plot(
        &a.out.join("pt_reclaim.svg"),
        &format!("VmPTE after {} x (write 2 MiB, give it back)", a.iterations),
        &modes,
        "VmPTE after the loop (kB, log scale)",
        &bars,
    )
}
