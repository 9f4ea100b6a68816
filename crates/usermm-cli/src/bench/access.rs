//! `bench access`: what a user access costs in the engine, beside the same
//! loops on host memory (the physical limit).
//!
//! Four loops, each on 1 and 2 CPUs (threads of one process, each on its
//! own data, pinned to the first two of the process's host CPUs as the
//! reference programs pin theirs):
//! - `load_tlb_hit`, `store_tlb_hit`: 8-byte loads (stores) walking
//!   [`HIT_PAGES`] pages over and over, which every TLB holds;
//! - `load_tlb_miss`: 8-byte loads at random 4 KiB pages of a `--size-mb`
//!   region (1 GiB by default), shared by the CPUs, so that nearly every
//!   load walks the page tables (the engine's TLB covers 8 MiB of 4 KiB
//!   pages);
//! - `byte_copy`: a 2 MiB region copied to another, per CPU, through a
//!   1 MiB buffer (`read_bytes`, then `write_bytes`), [`COPY_PASSES`] times,
//!   in GB/s of bytes copied; natively two `memcpy`s. Both regions lie
//!   within the TLB's reach, so that the row measures the copy itself.
//!
//! The engine and the host loop of each row run interleaved, round by
//! round; the ratio is engine / host with its interval ([`super::stats`]).

use std::sync::Barrier;
use std::time::Instant;

use anyhow::anyhow;
use serde::Serialize;
use std::sync::Arc;
use usermm::mm::Mm;
use usermm::mmap::{MAP_ANONYMOUS, MAP_PRIVATE, PROT_READ, PROT_WRITE};
use usermm::{Machine, OnCpu};

use super::stats::{self, Estimate, Rounds};
use super::{experiment_machine, BenchArgs};
use crate::{native, plot};

pub const EXPERIMENT: super::Experiment = super::Experiment {
    name: "access",
    description: "loads and stores per second on TLB hits and misses, and byte-range copies, in the engine beside host memory",
    run,
    budget_s: 10,
    full_budget_s: 20,
};

const PAGE: u64 = 4096;
/// Pages the TLB-hit loops walk: fewer than any TLB's ways times sets.
const HIT_PAGES: u64 = 16;
/// Accesses per CPU per TLB-hit sample.
const HIT_OPS: u64 = 20_000_000;
/// Loads per CPU per TLB-miss sample.
const MISS_OPS: u64 = 2_000_000;
/// The size of each CPU's two copy regions: together within the reach of
/// the engine's TLB (8 MiB of 4 KiB pages), so that the copy loop measures
/// the copy (the walks have a row of their own).
const COPY_BYTES: u64 = 2 << 20;
/// Passes over the region per sample.
const COPY_PASSES: u64 = 32;
/// The bounce buffer of a copy.
const COPY_CHUNK: usize = 1 << 20;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    LoadTlbHit,
    StoreTlbHit,
    LoadTlbMiss,
    ByteCopy,
}

const OPS: [Op; 4] = [
    Op::LoadTlbHit,
    Op::StoreTlbHit,
    Op::LoadTlbMiss,
    Op::ByteCopy,
];

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::LoadTlbHit => "load_tlb_hit",
            Op::StoreTlbHit => "store_tlb_hit",
            Op::LoadTlbMiss => "load_tlb_miss",
            Op::ByteCopy => "byte_copy",
        }
    }

    /// Units per CPU per sample: accesses, or bytes for a copy.
    fn units(self) -> u64 {
        match self {
            Op::LoadTlbHit | Op::StoreTlbHit => HIT_OPS,
            Op::LoadTlbMiss => MISS_OPS,
            Op::ByteCopy => COPY_BYTES * COPY_PASSES,
        }
    }

    /// A rate per CPU from `units` done in `secs`: per second, or GB/s.
    fn rate(self, secs: f64) -> f64 {
        let r = self.units() as f64 / secs;
        if self == Op::ByteCopy {
            r / 1e9
        } else {
            r
        }
    }
}

#[derive(Serialize)]
struct Row {
    op: &'static str,
    cpus: usize,
    /// Accesses per second per CPU (loads and stores).
    #[serde(skip_serializing_if = "Option::is_none")]
    per_s: Option<f64>,
    /// GB/s per CPU (copies).
    #[serde(skip_serializing_if = "Option::is_none")]
    gbps: Option<f64>,
    native: bool,
    /// Engine / host (median of the per-round ratios); none on host rows.
    ratio: Option<f64>,
    ci_low: Option<f64>,
    ci_high: Option<f64>,
    runs: usize,
    /// The rate of every round.
    samples: Vec<f64>,
}

/// The addresses of one CPU's data in the engine or on the host.
#[derive(Clone, Copy)]
struct Layout {
    /// [`HIT_PAGES`] pages per CPU, CPU after CPU.
    hit: u64,
    /// The shared region of the miss loop, and its pages.
    miss: u64,
    miss_pages: u64,
    /// Per CPU: a source then a destination of [`COPY_BYTES`] each.
    copy: u64,
}

impl Layout {
    fn hit_base(&self, cpu: usize) -> u64 {
        self.hit + cpu as u64 * HIT_PAGES * PAGE
    }
    fn copy_src(&self, cpu: usize) -> u64 {
        self.copy + cpu as u64 * 2 * COPY_BYTES
    }
    fn copy_dst(&self, cpu: usize) -> u64 {
        self.copy_src(cpu) + COPY_BYTES
    }
}

/// The address of the `i`th hit access: word after word, page after page.
#[inline(always)]
fn hit_addr(base: u64, i: u64) -> u64 {
    base + ((i * 8) & (HIT_PAGES * PAGE - 1))
}

/// xorshift64: the miss loop's random pages, the same in both loops.
#[inline(always)]
fn next_random(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

#[inline(always)]
fn miss_addr(l: &Layout, x: u64) -> u64 {
    l.miss + (x % l.miss_pages) * PAGE + ((x >> 40) & 511) * 8
}

fn run(a: &BenchArgs) -> anyhow::Result<serde_json::Value> {
    let cpus_list = [1usize, 2];
    let miss_len = a.size_mb << 20;
    let copy_len = 2 * 2 * COPY_BYTES;
    let hit_len = 2 * HIT_PAGES * PAGE;
    let need = super::region_machine_bytes(a.size_mb) + copy_len + hit_len;
    let m = experiment_machine(a, need)?;
    m.prefault();
    m.thp.only_order(0);
    let eng = engine_layout(&m, miss_len, copy_len, hit_len)?;
    let host = HostMemory::new(miss_len, copy_len, hit_len);
    let arms: Vec<(Op, usize)> = OPS
        .iter()
        .flat_map(|&op| cpus_list.iter().map(move |&c| (op, c)))
        .collect();
    let pb = super::progress("access", (arms.len() * Rounds::expected(a.runs())) as u64);
    // Per arm: the engine's rates and the host's, round by round.
    let mut state: Vec<(Vec<f64>, Vec<f64>)> = vec![(vec![], vec![]); arms.len()];
    let round = |(e, h): &mut (Vec<f64>, Vec<f64>), i: usize, k: usize| {
        let (op, cpus) = arms[i];
        pb.set_message(format!("{} x{cpus}", op.name()));
        let order = k.is_multiple_of(2);
        for engine_first in [order, !order] {
            if engine_first {
                e.push(op.rate(engine_sample(&m, &eng, op, cpus)?));
            } else {
                h.push(op.rate(host_sample(&host.layout, op, cpus)));
            }
        }
        anyhow::Ok(())
    };
    let spread = |(e, h): &(Vec<f64>, Vec<f64>)| Estimate::ratio(e, h).spread();
    stats::rounds_by_row(a.runs(), a.budget(), &pb, &mut state, round, spread)?;
    let mut rows = vec![];
    for (&(op, cpus), (e, h)) in arms.iter().zip(&state) {
        let r = Estimate::ratio(e, h);
        rows.push(row(op, cpus, false, e, Some(r)));
        rows.push(row(op, cpus, true, h, None));
    }
    pb.finish_and_clear();
    drop(host);
    if !a.json {
        print_table(&rows, a);
        outln!("machine: {}", m.config);
        outln!();
    }
    plot_rows(&rows, a)?;
    Ok(serde_json::json!({
        "experiment": "access",
        "machine": m.config.to_string(),
        "size_mb": a.size_mb,
        "runs": a.runs().to_string(),
        "rows": rows,
    }))
}

fn row(op: Op, cpus: usize, native: bool, samples: &[f64], r: Option<Estimate>) -> Row {
    let v = Estimate::of(samples).value;
    Row {
        op: op.name(),
        cpus,
        per_s: (op != Op::ByteCopy).then_some(v),
        gbps: (op == Op::ByteCopy).then_some(v),
        native,
        ratio: r.map(|r| r.value),
        ci_low: r.map(|r| r.ci_low),
        ci_high: r.map(|r| r.ci_high),
        runs: samples.len(),
        samples: samples.to_vec(),
    }
}

/// Map and populate the engine's regions on CPU 0 (4 KiB pages).
fn engine_layout(
    m: &Machine,
    miss_len: u64,
    copy_len: u64,
    hit_len: u64,
) -> anyhow::Result<(Layout, Arc<Mm>)> {
    let c = m.bind(0).map_err(|e| anyhow!("bind: {e}"))?;
    c.new_mm().map_err(|e| anyhow!("mm: {e}"))?;
    let map = |len: u64| {
        let addr = c
            .mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS)
            .map_err(|e| anyhow!("mmap: {e}"))?;
        c.touch_pages(addr, addr + len, 1)
            .map_err(|e| anyhow!("populate: {e}"))?;
        anyhow::Ok(addr)
    };
    let l = Layout {
        hit: map(hit_len)?,
        miss: map(miss_len)?,
        miss_pages: miss_len / PAGE,
        copy: map(copy_len)?,
    };
    let mm = c.mm().map_err(|e| anyhow!("mm: {e}"))?;
    c.idle();
    Ok((l, mm))
}

/// One sample in the engine: `cpus` threads, each bound to its CPU and
/// running the process's mm; returns the slowest thread's seconds.
fn engine_sample(
    m: &Machine,
    (l, mm): &(Layout, Arc<Mm>),
    op: Op,
    cpus: usize,
) -> anyhow::Result<f64> {
    let start = Barrier::new(cpus);
    let secs = std::thread::scope(|s| {
        let threads: Vec<_> = (0..cpus)
            .map(|id| {
                let start = &start;
                s.spawn(move || -> anyhow::Result<f64> {
                    native::pin_to_cpu(id);
                    let c = m.bind(id).map_err(|e| anyhow!("bind: {e}"))?;
                    c.switch_mm(mm);
                    start.wait();
                    let t = Instant::now();
                    engine_loop(&c, l, op, id).map_err(|e| anyhow!("{}: {e}", op.name()))?;
                    let dt = t.elapsed().as_secs_f64();
                    c.idle();
                    Ok(dt)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("an access thread panicked"))
            .collect::<anyhow::Result<Vec<f64>>>()
    })?;
    Ok(secs.into_iter().fold(0.0, f64::max))
}

fn engine_loop(c: &OnCpu, l: &Layout, op: Op, cpu: usize) -> usermm::KResult<()> {
    let mut acc = 0u64;
    match op {
        Op::LoadTlbHit => {
            let base = l.hit_base(cpu);
            for i in 0..HIT_OPS {
                acc ^= c.load_u64(hit_addr(base, i))?;
            }
        }
        Op::StoreTlbHit => {
            let base = l.hit_base(cpu);
            for i in 0..HIT_OPS {
                c.store_u64(hit_addr(base, i), i)?;
            }
        }
        Op::LoadTlbMiss => {
            let mut x = 0x9e37_79b9_7f4a_7c15 ^ cpu as u64;
            for _ in 0..MISS_OPS {
                acc ^= c.load_u64(miss_addr(l, next_random(&mut x)))?;
            }
        }
        Op::ByteCopy => {
            let mut buf = vec![0u8; COPY_CHUNK];
            let (src, dst) = (l.copy_src(cpu), l.copy_dst(cpu));
            for _ in 0..COPY_PASSES {
                for off in (0..COPY_BYTES).step_by(COPY_CHUNK) {
                    c.read_bytes(src + off, &mut buf)?;
                    c.write_bytes(dst + off, &buf)?;
                }
            }
        }
    }
    std::hint::black_box(acc);
    Ok(())
}

/// The host's regions, populated by write faults, 4 KiB pages (unmapped
/// when dropped).
struct HostMemory {
    _regions: Vec<native::HostRegion>,
    layout: Layout,
}

impl HostMemory {
    fn new(miss_len: u64, copy_len: u64, hit_len: u64) -> HostMemory {
        let map = |len: u64| {
            let mut r = native::HostRegion::map(len as usize);
            // SAFETY: the region is ours, mapped just above.
            unsafe { libc::madvise(r.ptr, r.len, libc::MADV_NOHUGEPAGE) };
            r.touch();
            r
        };
        let regions = vec![map(hit_len), map(miss_len), map(copy_len)];
        let layout = Layout {
            hit: regions[0].ptr as u64,
            miss: regions[1].ptr as u64,
            miss_pages: miss_len / PAGE,
            copy: regions[2].ptr as u64,
        };
        HostMemory {
            _regions: regions,
            layout,
        }
    }
}

/// One sample on the host: the same loops on the host's memory.
fn host_sample(l: &Layout, op: Op, cpus: usize) -> f64 {
    let start = Barrier::new(cpus);
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..cpus)
            .map(|id| {
                let start = &start;
                s.spawn(move || {
                    native::pin_to_cpu(id);
                    start.wait();
                    let t = Instant::now();
                    host_loop(l, op, id);
                    t.elapsed().as_secs_f64()
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a host access thread panicked"))
            .fold(0.0, f64::max)
    })
}

fn host_loop(l: &Layout, op: Op, cpu: usize) {
    let mut acc = 0u64;
    // SAFETY (every access below): the addresses lie inside the regions
    // HostMemory mapped and keeps mapped until the samples are done, 8-byte
    // aligned; each CPU stores only into its own pages.
    match op {
        Op::LoadTlbHit => {
            let base = l.hit_base(cpu);
            for i in 0..HIT_OPS {
                // SAFETY: see above.
                acc ^= unsafe { std::ptr::read_volatile(hit_addr(base, i) as *const u64) };
            }
        }
        Op::StoreTlbHit => {
            let base = l.hit_base(cpu);
            for i in 0..HIT_OPS {
                // SAFETY: see above.
                unsafe { std::ptr::write_volatile(hit_addr(base, i) as *mut u64, i) };
            }
        }
        Op::LoadTlbMiss => {
            let mut x = 0x9e37_79b9_7f4a_7c15 ^ cpu as u64;
            for _ in 0..MISS_OPS {
                let a = miss_addr(l, next_random(&mut x));
                // SAFETY: see above.
                acc ^= unsafe { std::ptr::read_volatile(a as *const u64) };
            }
        }
        Op::ByteCopy => {
            let mut buf = vec![0u8; COPY_CHUNK];
            let (src, dst) = (l.copy_src(cpu), l.copy_dst(cpu));
            for off in (0..COPY_BYTES * COPY_PASSES).step_by(COPY_CHUNK) {
                let off = off % COPY_BYTES;
                // SAFETY: see above; the buffer and the regions are disjoint.
                unsafe {
                    let s = std::slice::from_raw_parts((src + off) as *const u8, COPY_CHUNK);
                    buf.copy_from_slice(s);
                    let d = std::slice::from_raw_parts_mut((dst + off) as *mut u8, COPY_CHUNK);
                    d.copy_from_slice(&buf);
                }
                std::hint::black_box(&mut buf);
            }
        }
    }
    std::hint::black_box(acc);
}

fn print_table(rows: &[Row], a: &BenchArgs) {
    outln!(
        "bench access: per CPU, engine beside host memory; TLB misses over {} MiB of 4 KiB pages; runs {}",
        a.size_mb,
        a.runs()
    );
    outln!(
        "{:<14} {:>4} {:>14} {:>14} {:>26}",
        "op",
        "cpus",
        "engine",
        "host",
        "engine/host"
    );
    for pair in rows.chunks(2) {
        let (e, h) = (&pair[0], &pair[1]);
        let fmt = |r: &Row| match (r.per_s, r.gbps) {
            (Some(p), _) => format!("{:.1} M/s", p / 1e6),
            (_, Some(g)) => format!("{g:.2} GB/s"),
            _ => "-".into(),
        };
        let est = Estimate {
            value: e.ratio.unwrap_or(f64::NAN),
            ci_low: e.ci_low.unwrap_or(f64::NAN),
            ci_high: e.ci_high.unwrap_or(f64::NAN),
            n: e.runs,
        };
        outln!(
            "{:<14} {:>4} {:>14} {:>14} {:>26}",
            e.op,
            e.cpus,
            fmt(e),
            fmt(h),
            est.ratio_text()
        );
    }
    outln!(
        "{}",
        super::stats::footnote("over the rounds, engine and host interleaved")
    );
}

fn plot_rows(rows: &[Row], a: &BenchArgs) -> anyhow::Result<()> {
    let engine: Vec<&Row> = rows.iter().filter(|r| !r.native).collect();
    let labels: Vec<String> = engine
        .iter()
        .map(|r| format!("{} x{}", r.op, r.cpus))
        .collect();
    let series = vec![plot::Series {
        label: "usermm vs host memory".into(),
        points: engine
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.ratio.map(|q| (i, q * 100.0)))
            .collect(),
        dashed: false,
    }];
    plot::change_plot(
        &a.out.join("access.svg"),
        "access: engine speed as a share of host memory's",
        &labels,
        ("loop", "engine / host (%)"),
        &series,
    )
}
