//! `bench migrate`: moving a region between two nodes with move_pages(2),
//! with migration's batched TLB flush off (one flush per PTE, before v6.3)
//! and on (one per batch of 512 pages, v6.3+), while the mm runs on one
//! CPU or on two (the second in user mode, loading from a page of its own,
//! so that it receives the shootdowns).
//!
//! For each folio size the region is populated on node 0 and moved to node
//! 1 by one move_pages call naming the first page of each folio (naming
//! every page would end the kernel's queue at each folio's second page,
//! which is busy, and migrate folio by folio), the four arms interleaved
//! round by round: the time of the move_pages call and the TLB counters it
//! caused (`nr_tlb_remote_flush` is one per shootdown sent, `_received` one
//! per CPU that handled one), per arm the median over the rounds, and for
//! the batched arms the ratio of their time to the unbatched arm's with as
//! many CPUs, with its 95% interval. The host has one node here, so there
//! is no host column: the figures are the engine's. A 2 MiB folio is mapped by a PMD
//! and migrates by its PTEs in the model (see usermm's `migrate` module).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::anyhow;
use serde::Serialize;
use usermm::mmap::{MAP_ANONYMOUS, MAP_PRIVATE, PROT_READ, PROT_WRITE};
use usermm::vmstat::Event;
use usermm::{Machine, MachineConfig, OnCpu};

use super::stats::{self, Estimate, Rounds};
use super::{progress, BenchArgs, SIZES_KB};
use crate::{native, plot};

pub const EXPERIMENT: super::Experiment = super::Experiment {
    name: "migrate",
    description: "move_pages of a region from node 0 to node 1 per folio size, with \
        migrate_batch_flush off and on, the mm on 1 and 2 CPUs: time and TLB flushes (v6.3)",
    run: experiment,
    budget_s: 15,
    full_budget_s: 35,
};

const PAGE: u64 = 4096;

/// The counters of a row, by their vmstat names.
const COUNTERS: [Event; 5] = [
    Event::NR_TLB_REMOTE_FLUSH,
    Event::NR_TLB_REMOTE_FLUSH_RECEIVED,
    Event::NR_TLB_LOCAL_FLUSH_ALL,
    Event::NR_TLB_LOCAL_FLUSH_ONE,
    Event::PGMIGRATE_SUCCESS,
];

#[derive(Serialize)]
struct Row {
    folio_kb: u64,
    batch_flush: bool,
    cpus: usize,
    runs: usize,
    /// Median seconds of the move_pages call.
    time_s: f64,
    /// Batched rows: the time over the unbatched arm's with as many CPUs
    /// in the same round, the median of those ratios, and its 95%
    /// interval.
    ratio: Option<f64>,
    ci_low: Option<f64>,
    ci_high: Option<f64>,
    nr_tlb_remote_flush: u64,
    nr_tlb_remote_flush_received: u64,
    nr_tlb_local_flush_all: u64,
    nr_tlb_local_flush_one: u64,
    pgmigrate_success: u64,
    /// Shootdowns sent per MiB moved.
    remote_flush_per_mib: f64,
    /// Every round's seconds.
    samples_time_s: Vec<f64>,
}

impl Row {
    fn estimate(&self) -> Option<Estimate> {
        Estimate::from_fields(self.ratio, self.ci_low, self.ci_high, self.runs)
    }
}

/// One arm of one run: seconds, and the counters' changes.
type Sample = (f64, [u64; COUNTERS.len()]);

/// Two nodes of the region and half as much again each: node 0 DRAM with
/// the two CPUs, node 1 slow; or the user's machine, which must have two
/// nodes with room.
fn machine(a: &BenchArgs, len: u64) -> anyhow::Result<std::sync::Arc<Machine>> {
    let need = super::region_machine_bytes(len >> 20);
    let default = MachineConfig::two_tiers(need, need, 2);
    let config = a.machine.config(default)?;
    if config.nodes.len() < 2 || config.nodes.iter().take(2).any(|n| n.size_bytes < need) {
        anyhow::bail!(
            "machine: bench migrate needs two nodes of at least {} MiB each",
            need >> 20
        );
    }
    if config.cpus.iter().take_while(|&&n| n == 0).count() < 2 {
        anyhow::bail!("machine: bench migrate runs on CPUs 0 and 1, both on node 0");
    }
    let m = Machine::new(config).map_err(|e| anyhow!("machine: {e}"))?;
    a.tunables.apply(&m.tunables)?;
    Ok(m)
}

/// The region moved: a quarter of `--size-mb` (256 MiB by default). The
/// counters scale with it, and a move of 256 MiB takes a tenth of a second
/// or more, long enough to time; a quarter keeps the rounds of all nine
/// sizes within the main job's time.
pub fn region_mb(a: &BenchArgs) -> u64 {
    (a.size_mb / 4).max(1)
}

/// The arms, in their rows' order: (batched flush, CPUs).
const ARMS: [(bool, usize); 4] = [(false, 1), (false, 2), (true, 1), (true, 2)];

/// The index in [`ARMS`] of the unbatched arm with the same CPUs.
fn base_arm(ai: usize) -> usize {
    ARMS.iter()
        .position(|&(b, c)| !b && c == ARMS[ai].1)
        .expect("an unbatched arm per CPU count")
}

fn experiment(a: &BenchArgs) -> anyhow::Result<serde_json::Value> {
    let len = region_mb(a) << 20;
    let m = machine(a, len)?;
    // CPU 0's thread (this one) on host CPU 0, the second CPU's on host
    // CPU 1 (after the machine is made: its own threads float).
    let _pinned = native::pin_thread(0);
    m.prefault();
    let sizes: Vec<u64> = SIZES_KB
        .into_iter()
        .filter(|k| a.sizes.is_empty() || a.sizes.contains(k))
        .collect();
    let pb = progress("migrate", (Rounds::expected(a.runs()) * sizes.len()) as u64);
    let times = |s: &[Sample]| -> Vec<f64> { s.iter().map(|x| x.0).collect() };
    // The batched arms' time over the unbatched's, CPUs alike.
    let ratio =
        |s: &[Vec<Sample>], ai: usize| Estimate::ratio(&times(&s[ai]), &times(&s[base_arm(ai)]));
    let mut state: Vec<Vec<Vec<Sample>>> = vec![vec![vec![]; ARMS.len()]; sizes.len()];
    let round = |arms: &mut Vec<Vec<Sample>>, si: usize, k: usize| {
        let kb = sizes[si];
        pb.set_message(format!("{kb}K"));
        // The arms in an order that turns round by round.
        for j in 0..ARMS.len() {
            let ai = (j + k) % ARMS.len();
            let (batch, cpus) = ARMS[ai];
            m.tunables.set_migrate_batch_flush(batch);
            arms[ai].push(move_once(&m, kb, len, cpus)?);
        }
        anyhow::Ok(())
    };
    let spread = |arms: &Vec<Vec<Sample>>| {
        (0..ARMS.len())
            .filter(|&ai| ARMS[ai].0)
            .map(|ai| ratio(arms, ai).spread())
            .fold(0.0, f64::max)
    };
    stats::rounds_by_row(a.runs(), a.budget(), &pb, &mut state, round, spread)?;
    let mut rows = Vec::new();
    for (&kb, samples) in sizes.iter().zip(&state) {
        for (ai, &(batch, cpus)) in ARMS.iter().enumerate() {
            let s = &samples[ai];
            let c = |i: usize| super::median(s.iter().map(|x| x.1[i] as f64).collect()) as u64;
            let q = batch.then(|| ratio(samples, ai));
            rows.push(Row {
                folio_kb: kb,
                batch_flush: batch,
                cpus,
                runs: s.len(),
                time_s: stats::median(&times(s)),
                ratio: q.map(|q| q.value),
                ci_low: q.map(|q| q.ci_low),
                ci_high: q.map(|q| q.ci_high),
                nr_tlb_remote_flush: c(0),
                nr_tlb_remote_flush_received: c(1),
                nr_tlb_local_flush_all: c(2),
                nr_tlb_local_flush_one: c(3),
                pgmigrate_success: c(4),
                remote_flush_per_mib: c(0) as f64 / region_mb(a) as f64,
                samples_time_s: times(s),
            });
        }
    }
    pb.finish_and_clear();
    m.tunables.set_migrate_batch_flush(true);
    if !a.json {
        print_table(&rows, region_mb(a), a, &m);
    }
    plot_rows(a, &sizes, &rows)?;
    Ok(serde_json::json!({
        "experiment": "migrate",
        "machine": m.config.to_string(),
        "region_mb": region_mb(a),
        "runs": a.runs().to_string(),
        "rows": rows,
    }))
}

/// Populate a fresh process on node 0 with folios of `kb`, and time moving
/// it to node 1 from CPU 0 while `cpus - 1` other CPUs run it too.
fn move_once(m: &Machine, kb: u64, len: u64, cpus: usize) -> anyhow::Result<Sample> {
    let c0 = m.bind(0).map_err(|e| anyhow!("bind: {e}"))?;
    let mm = c0.new_mm().map_err(|e| anyhow!("mm: {e}"))?;
    m.thp.only_order((kb / 4).trailing_zeros());
    let rw = PROT_READ | PROT_WRITE;
    let flags = MAP_PRIVATE | MAP_ANONYMOUS;
    let a = c0
        .mmap(0, len, rw, flags)
        .map_err(|e| anyhow!("mmap: {e}"))?;
    let own = c0
        .mmap(0, PAGE, rw, flags)
        .map_err(|e| anyhow!("mmap: {e}"))?;
    c0.touch_pages(a, a + len, 1)
        .map_err(|e| anyhow!("populate: {e}"))?;
    c0.store_u64(own, 1).map_err(|e| anyhow!("store: {e}"))?;
    // One address per folio: move_pages isolates a folio at its first page
    // and reports its later pages busy (EBUSY), each of which would migrate
    // the queue so far on its own (`do_pages_move`).
    let pages: Vec<u64> = (a..a + len).step_by((kb << 10) as usize).collect();
    let nodes = vec![1; pages.len()];
    let mut status = vec![0; pages.len()];
    let (stop, running) = (AtomicBool::new(false), AtomicBool::new(false));
    let counters = || COUNTERS.map(|e| m.vmstat().event(e));
    let sample = std::thread::scope(|s| -> anyhow::Result<Sample> {
        let other = (cpus > 1).then(|| {
            let (mm, stop, running) = (mm.clone(), &stop, &running);
            s.spawn(move || -> anyhow::Result<()> {
                native::pin_to_cpu(1);
                let c1 = m.bind(1).map_err(|e| anyhow!("bind: {e}"))?;
                c1.switch_mm(&mm);
                c1.load_u64(own).map_err(|e| anyhow!("load: {e}"))?;
                // Release: the move starts after this CPU runs the mm.
                running.store(true, Ordering::Release);
                while !stop.load(Ordering::Relaxed) {
                    c1.load_u64(own).map_err(|e| anyhow!("load: {e}"))?;
                }
                c1.idle();
                Ok(())
            })
        });
        while cpus > 1
            && !running.load(Ordering::Acquire)
            && !other.as_ref().is_some_and(|h| h.is_finished())
        {
            std::thread::yield_now();
        }
        let before = counters();
        let t = Instant::now();
        let left = move_pages(&c0, &pages, &nodes, &mut status);
        let secs = t.elapsed().as_secs_f64();
        let after = counters();
        stop.store(true, Ordering::Relaxed);
        if let Some(h) = other {
            h.join().expect("the second CPU")?;
        }
        let left = left?;
        anyhow::ensure!(left == 0, "{left} folios of {kb}K were not moved");
        Ok((secs, std::array::from_fn(|i| after[i] - before[i])))
    })?;
    c0.exit_mm().map_err(|e| anyhow!("exit: {e}"))?;
    drop(c0);
    m.rcu_barrier();
    Ok(sample)
}

fn move_pages(
    c: &OnCpu,
    pages: &[u64],
    nodes: &[i32],
    status: &mut [i32],
) -> anyhow::Result<usize> {
    c.move_pages(pages, Some(nodes), status)
        .map_err(|e| anyhow!("move_pages: {e}"))
}

fn print_table(rows: &[Row], size_mb: u64, a: &BenchArgs, m: &Machine) {
    crate::outln!(
        "bench migrate: move_pages of {size_mb} MiB from node 0 to node 1; arms interleaved; medians of the rounds (runs {})\n",
        a.runs()
    );
    crate::outln!(
        "{:<7} {:>4} {:>5} {:>10} {:>22} {:>12} {:>10} {:>10} {:>10} {:>11}",
        "folio",
        "CPUs",
        "batch",
        "time (s)",
        "on/off [95% CI]",
        "remote/MiB",
        "received",
        "local all",
        "local one",
        "migrated"
    );
    for r in rows {
        crate::outln!(
            "{:<7} {:>4} {:>5} {:>10.4} {:>22} {:>12.2} {:>10} {:>10} {:>10} {:>11}",
            format!("{}K", r.folio_kb),
            r.cpus,
            if r.batch_flush { "on" } else { "off" },
            r.time_s,
            r.estimate().map_or("-".into(), |e| e.ratio_text()),
            r.remote_flush_per_mib,
            r.nr_tlb_remote_flush_received,
            r.nr_tlb_local_flush_all,
            r.nr_tlb_local_flush_one,
            r.pgmigrate_success
        );
    }
    // The aim: 2 CPUs, 4 KiB folios, at least 90% fewer shootdowns.
    let pick = |b: bool| {
        rows.iter()
            .find(|r| r.folio_kb == 4 && r.cpus == 2 && r.batch_flush == b)
    };
    if let (Some(off), Some(on)) = (pick(false), pick(true)) {
        if off.remote_flush_per_mib > 0.0 {
            crate::outln!(
                "\n4K, 2 CPUs: {:.2} shootdowns per MiB batched against {:.2} one per PTE: {:.1}% fewer",
                on.remote_flush_per_mib,
                off.remote_flush_per_mib,
                100.0 * (1.0 - on.remote_flush_per_mib / off.remote_flush_per_mib)
            );
        }
    }
    let n: Vec<usize> = rows.iter().map(|r| r.runs).collect();
    crate::outln!(
        "{}",
        stats::footnote(&format!(
            "{}-{} rounds",
            n.iter().min().unwrap_or(&0),
            n.iter().max().unwrap_or(&0)
        ))
    );
    crate::outln!("machine: {}\n", m.config);
}

/// Milliseconds per move, per folio size, one line per arm.
fn plot_rows(a: &BenchArgs, sizes: &[u64], rows: &[Row]) -> anyhow::Result<()> {
    let labels: Vec<String> = sizes.iter().map(|k| format!("{k}K")).collect();
    let series: Vec<plot::Series> = [(false, 1), (false, 2), (true, 1), (true, 2)]
        .into_iter()
        .map(|(b, c)| plot::Series {
            label: format!(
                "batch_flush {}, {c} CPU{}",
                if b { "on" } else { "off" },
                if c > 1 { "s" } else { "" }
            ),
            points: rows
                .iter()
                .filter(|r| r.batch_flush == b && r.cpus == c)
                .filter_map(|r| {
                    let i = sizes.iter().position(|&k| k == r.folio_kb)?;
                    Some((i, r.time_s * 1000.0))
                })
                .collect(),
            dashed: !b,
        })
        .collect();
    plot::change_plot(
        &a.out.join("migrate.svg"),
        &format!(
            "migrate: move_pages of {} MiB to the slow node (ms)",
            region_mb(a)
        ),
        &labels,
        ("folio size", "ms"),
        &series,
    )
}
