//! `bench tiering`: the memory-tiering loop, end to end, on the tiered
//! machine. A process writes a working set larger than the fast node,
//! bound to it (`mbind MPOL_BIND | MPOL_F_NUMA_BALANCING`: a plain bind
//! would take it out of NUMA balancing's scan): with demotion on, reclaim
//! demotes its oldest pages to the slow node to make room. Then it keeps
//! reading a hot part of it, which began on the slow node: NUMA balancing
//! in tiering mode finds it by its hinting faults and promotes it, and
//! kswapd demotes colder pages to make room. Every interval the table gives how
//! much of the hot part is on the fast node, and the counters so far.
//!
//! It compares no arms: the table is one run's trajectory, so it carries
//! no ratio and no interval (the counters and shares are read, not timed).
//!
//! Scaled for the model: `scan_period_min_ms` is 100 (the kernel's default
//! of 1 s, shared among the four 256 MB scans of the 1 GiB set, would scan
//! every 250 ms at first; at 100, the floor of 2560 MB a second holds it
//! to 100 ms), and the first scan starts at once (its delay is 1 s); the
//! period then doubles at the first promotion of each later pass, up to
//! `scan_period_max_ms` shared likewise (15 s), as the kernel's does; the
//! hot threshold (1 s), the scan size (256 MB) and the rate limit are the
//! kernel's defaults.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use serde::Serialize;
use usermm::mempolicy::{MPOL_BIND, MPOL_F_NUMA_BALANCING};
use usermm::mmap::{MAP_ANONYMOUS, MAP_PRIVATE, PROT_READ, PROT_WRITE};
use usermm::numa_balancing::NUMA_BALANCING_MEMORY_TIERING;
use usermm::vmstat::{Event, NodeStat};
use usermm::{Machine, MachineConfig, OnCpu};

use super::BenchArgs;

/// `scan_period_min_ms` (the kernel's default is 1000).
const SCAN_PERIOD_MIN_MS: u64 = 100;
use crate::plot;

pub const EXPERIMENT: super::Experiment = super::Experiment {
    name: "tiering",
    description: "a working set larger than the fast node is demoted, then its hot part is \
        promoted by NUMA balancing (tiering mode) while kswapd demotes colder pages",
    run: experiment,
    budget_s: 0,
    full_budget_s: 0,
};

const PAGE: u64 = 4096;
/// The hot part, as a share of the working set (at most 64 MiB).
const HOT_MAX: u64 = 64 << 20;
/// How long the hot part is read for, at most, and how often the table
/// looks.
const HOT_FOR: Duration = Duration::from_secs(10);
const INTERVAL: Duration = Duration::from_millis(250);

#[derive(Serialize)]
struct Row {
    /// Seconds since the hot loop began (0: after the working set was
    /// written).
    t_s: f64,
    /// Share of the hot part on the fast node.
    hot_fast: f64,
    /// Share of the working set on the fast node.
    set_fast: f64,
    pgdemote_kswapd: u64,
    pgdemote_direct: u64,
    pgpromote_success: i64,
    numa_pte_updates: u64,
    numa_hint_faults: u64,
    numa_pages_migrated: u64,
}

fn experiment(a: &BenchArgs) -> anyhow::Result<serde_json::Value> {
    let config = a.machine.config(MachineConfig::tiered())?;
    if config.nodes.len() < 2 {
        anyhow::bail!("machine: bench tiering needs a fast and a slow node");
    }
    let m = Machine::new(config).map_err(|e| anyhow!("machine: {e}"))?;
    a.tunables.apply(&m.tunables)?;
    let fast = m.config.nodes[0].size_bytes;
    let len = (a.size_mb << 20).max(fast + fast / 4);
    anyhow::ensure!(
        len < fast + m.config.nodes[1].size_bytes * 3 / 4,
        "--size-mb {}: the working set must fit both nodes",
        a.size_mb
    );
    m.prefault();
    m.set_demotion_enabled(true);
    m.thp.only_order(0);
    m.numa.mode.store(NUMA_BALANCING_MEMORY_TIERING, Relaxed);
    m.numa.scan_delay_ms.store(0, Relaxed);
    m.numa.scan_period_min_ms.store(SCAN_PERIOD_MIN_MS, Relaxed);
    let _pinned = crate::native::pin_thread(0);
    let c = m.bind(0).map_err(|e| anyhow!("bind: {e}"))?;
    let mm = c.new_mm().map_err(|e| anyhow!("mm: {e}"))?;
    let w = c
        .mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS)
        .map_err(|e| anyhow!("mmap: {e}"))?;
    c.mbind(w, len, MPOL_BIND | MPOL_F_NUMA_BALANCING, &[1], 64, 0)
        .map_err(|e| anyhow!("mbind: {e}"))?;
    for p in (w..w + len).step_by(PAGE as usize) {
        c.store_u64(p, p).map_err(|e| anyhow!("write: {e}"))?;
    }
    // The hot part: the first pages written, the oldest, demoted first.
    let hot_len = HOT_MAX.min(len / 8) & !(PAGE - 1);
    let mut rows = vec![row(&m, &c, w, len, hot_len, 0.0)?];
    let t0 = Instant::now();
    let mut next = INTERVAL;
    while t0.elapsed() < HOT_FOR {
        for p in (w..w + hot_len).step_by(PAGE as usize) {
            let v = c.load_u64(p).map_err(|e| anyhow!("read: {e}"))?;
            anyhow::ensure!(v == p, "page {p:#x} read {v:#x}: contents lost");
        }
        if t0.elapsed() >= next {
            next += INTERVAL;
            let r = row(&m, &c, w, len, hot_len, t0.elapsed().as_secs_f64())?;
            let done = r.hot_fast >= 0.95;
            rows.push(r);
            if done {
                break;
            }
        }
    }
    c.idle();
    m.kswapd_quiesce();
    if !a.json {
        print_table(&rows, len, hot_len, &m);
    }
    plot_rows(a, &rows)?;
    Ok(serde_json::json!({
        "experiment": "tiering",
        "machine": m.config.to_string(),
        "working_set_mb": len >> 20,
        "hot_mb": hot_len >> 20,
        "scan_period_min_ms": SCAN_PERIOD_MIN_MS,
        // What the process's period had come to at the end.
        "scan_period_ms": mm.numa_scan.period_ms.load(Relaxed),
        "rows": rows,
    }))
}

/// Where the pages are, and the counters, now.
fn row(m: &Machine, c: &OnCpu, w: u64, len: u64, hot_len: u64, t_s: f64) -> anyhow::Result<Row> {
    let share = |start: u64, n: u64| -> anyhow::Result<f64> {
        let pages: Vec<u64> = (start..start + n).step_by(PAGE as usize).collect();
        let mut status = vec![0; pages.len()];
        c.move_pages(&pages, None, &mut status)
            .map_err(|e| anyhow!("move_pages: {e}"))?;
        Ok(status.iter().filter(|&&s| s == 0).count() as f64 / pages.len() as f64)
    };
    let v = m.vmstat();
    Ok(Row {
        t_s,
        hot_fast: share(w, hot_len)?,
        set_fast: share(w, len)?,
        pgdemote_kswapd: v.event(Event::PGDEMOTE_KSWAPD),
        pgdemote_direct: v.event(Event::PGDEMOTE_DIRECT),
        pgpromote_success: v.node(NodeStat::PGPROMOTE_SUCCESS),
        numa_pte_updates: v.event(Event::NUMA_PTE_UPDATES),
        numa_hint_faults: v.event(Event::NUMA_HINT_FAULTS),
        numa_pages_migrated: v.event(Event::NUMA_PAGE_MIGRATE),
    })
}

fn print_table(rows: &[Row], len: u64, hot_len: u64, m: &Machine) {
    crate::outln!(
        "bench tiering: a {} MiB working set bound to the fast node, then its first {} MiB read in a loop\n",
        len >> 20,
        hot_len >> 20
    );
    crate::outln!(
        "{:>6} {:>9} {:>9} {:>12} {:>12} {:>11} {:>11} {:>11}",
        "t (s)",
        "hot fast",
        "set fast",
        "demoted (k)",
        "demoted (d)",
        "promoted",
        "pte upd.",
        "hint faults"
    );
    for r in rows {
        crate::outln!(
            "{:>6.2} {:>8.1}% {:>8.1}% {:>12} {:>12} {:>11} {:>11} {:>11}",
            r.t_s,
            100.0 * r.hot_fast,
            100.0 * r.set_fast,
            r.pgdemote_kswapd,
            r.pgdemote_direct,
            r.pgpromote_success,
            r.numa_pte_updates,
            r.numa_hint_faults
        );
    }
    crate::outln!("machine: {}\n", m.config);
}

/// The hot part's share on the fast node over time.
fn plot_rows(a: &BenchArgs, rows: &[Row]) -> anyhow::Result<()> {
    let labels: Vec<String> = rows.iter().map(|r| format!("{:.2}s", r.t_s)).collect();
    let series = vec![
        plot::Series {
            label: "hot part on the fast node".into(),
            points: rows
                .iter()
                .enumerate()
                .map(|(i, r)| (i, 100.0 * r.hot_fast))
                .collect(),
            dashed: false,
        },
        plot::Series {
            label: "working set on the fast node".into(),
            points: rows
                .iter()
                .enumerate()
                .map(|(i, r)| (i, 100.0 * r.set_fast))
                .collect(),
            dashed: true,
        },
    ];
    plot::change_plot(
        &a.out.join("tiering.svg"),
        "tiering: share on the fast node (%) while the hot part is read",
        &labels,
        ("time since the hot part's first read", "%"),
        &series,
    )
}
