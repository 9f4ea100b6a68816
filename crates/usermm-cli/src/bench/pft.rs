//! `bench pft`: page-fault scalability under each `fault_lock` mode (F5),
//! the loop of mmtests' pft as the seed ran it and as
//! `../reference/pft.c` runs it on the host: fault threads write-fault their
//! own slices of one mapping page by page (4 KiB folios: MADV_NOHUGEPAGE),
//! alone or beside a writer thread that loops mmap(64 KiB) / touch one page
//! / munmap (`touch`), or the same without the touch (`notouch`).
//!
//! Per arm: faults/s over the fault threads' wall time, the latency of each
//! fault (p50, p99, timed around the faulting store), the fraction of
//! lockless attempts that fell back to mmap_lock, and the writes to shared
//! cache lines per fault (`usermm_shared_line_writes`, fault threads only).
//! The host kernel (6.18, per-VMA locks) runs the same loops natively in
//! the same invocation. The arms run in rounds, in an order that turns from
//! round to round; each row gives the median over the rounds, and each
//! mode its faults/s over `mmap_lock`'s in the same round, the median of
//! those ratios with its 95% interval.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use serde::Serialize;
use usermm::madvise::MADV_NOHUGEPAGE;
use usermm::mmap::{MAP_ANONYMOUS, MAP_PRIVATE, PROT_READ, PROT_WRITE};
use usermm::tunable::FaultLock;
use usermm::vmstat::Event;
use usermm::{Machine, MachineConfig};

use super::stats::{self, Estimate, Rounds};
use super::{progress, BenchArgs};
use crate::plot;

pub const EXPERIMENT: super::Experiment = super::Experiment {
    name: "pft",
    description: "page-fault scalability (F5): 1, 2 (and, given the cores, more) threads \
        write-fault their own slices, with no writer, a writer that mmaps/touches/munmaps, or one that does not touch; \
        per fault_lock mode and on the host",
    run,
    budget_s: 10,
    full_budget_s: 20,
};

const PAGE: u64 = 4096;
const WRITER_LEN: u64 = 64 << 10;
const MODES: [(&str, FaultLock); 3] = [
    ("mmap_lock", FaultLock::MmapLock),
    ("spf", FaultLock::Spf),
    ("vma_lock", FaultLock::VmaLock),
];
const WRITERS: [&str; 3] = ["none", "touch", "notouch"];
/// The most fault threads `--threads` may ask for.
pub const MAX_THREADS: usize = 64;

/// Whether an arm's fault threads and writer outnumber the host's cores.
fn oversubscribed(threads: usize, writer: &str, cores: usize) -> bool {
    threads + usize::from(writer != "none") > cores
}

/// The fault-thread counts: the user's, or 1, 2 and each power of two
/// below the host's cores (a core left for the writer).
fn thread_counts(a: &BenchArgs, cores: usize) -> Vec<usize> {
    if !a.threads.is_empty() {
        let mut t = a.threads.clone();
        t.sort_unstable();
        t.dedup();
        return t;
    }
    let mut t = vec![1, 2];
    while t[t.len() - 1] * 2 < cores {
        t.push(t[t.len() - 1] * 2);
    }
    t
}

/// One arm's result, as the JSON rows carry it.
#[derive(Serialize, Clone)]
struct Row {
    mode: &'static str,
    threads: usize,
    writer: &'static str,
    /// The fault and writer threads outnumber the host's cores.
    oversubscribed: bool,
    /// The median over the rounds.
    faults_per_s: f64,
    /// faults/s over `mmap_lock`'s in the same round (engine rows): the
    /// median of the per-round ratios, and its 95% interval.
    ratio: Option<f64>,
    ci_low: Option<f64>,
    ci_high: Option<f64>,
    p50_ns: f64,
    p99_ns: f64,
    /// Lockless attempts that fell back to mmap_lock (None on the host).
    abort_rate: Option<f64>,
    shared_writes_per_fault: Option<f64>,
    /// The writer's mmap/munmap rounds per second.
    writer_ops_per_s: f64,
    /// Why speculative faults aborted, by the seed's counter (spf rows).
    #[serde(skip_serializing_if = "Option::is_none")]
    spf_abort_reasons: Option<std::collections::BTreeMap<&'static str, u64>>,
    runs: usize,
    /// Every round's faults/s.
    samples_faults_per_s: Vec<f64>,
}

impl Row {
    fn estimate(&self) -> Option<Estimate> {
        Estimate::from_fields(self.ratio, self.ci_low, self.ci_high, self.runs)
    }
}

/// Per-round faults/s of an arm.
fn rates(samples: &[Sample]) -> Vec<f64> {
    samples.iter().map(|s| s.faults_per_s).collect()
}

/// The seed's abort reasons the model can count.
const SPF_REASONS: [Event; 11] = [
    Event::SPF_ABORT_ODD,
    Event::SPF_ABORT_UNMAPPED,
    Event::SPF_ABORT_VMA_COPY,
    Event::SPF_ABORT_ACCESS_ERROR,
    Event::SPF_ABORT_PUD,
    Event::SPF_ABORT_PMD,
    Event::SPF_ABORT_ANON_VMA,
    Event::SPF_ABORT_PTE_MAP_LOCK_SEQ1,
    Event::SPF_ABORT_PTE_MAP_LOCK_PMD,
    Event::SPF_ABORT_PTE_MAP_LOCK_PTL,
    Event::SPF_ABORT_PTE_MAP_LOCK_SEQ2,
];

/// What one run of one arm measured.
#[derive(Default)]
struct Sample {
    faults_per_s: f64,
    latencies: Vec<u32>,
    attempts: u64,
    fallbacks: u64,
    shared_writes: u64,
    faults: u64,
    writer_ops_per_s: f64,
    reasons: [u64; SPF_REASONS.len()],
}

fn run(a: &BenchArgs) -> anyhow::Result<serde_json::Value> {
    let slice = (a.size_mb / 4).clamp(1, 256) << 20;
    let cores = crate::native::host_cpus();
    let counts = thread_counts(a, cores);
    let max_threads = *counts.last().expect("at least one thread count");
    let need = max_threads as u64 * slice * 3 / 2 + (64 << 20);
    let host_bytes = crate::host_memory_bytes();
    if host_bytes > 0 && need > host_bytes {
        anyhow::bail!(
            "pft: {max_threads} threads of {} MiB need {} MiB of host memory for the model; this host has {} MiB",
            slice >> 20,
            need >> 20,
            host_bytes >> 20
        );
    }
    let config = a
        .machine
        .config(MachineConfig::single_node(need, max_threads + 1))?;
    if config.cpus.len() < max_threads + 1 {
        anyhow::bail!("machine: pft runs on CPUs 0..={max_threads}");
    }
    let m = Machine::new(config).map_err(|e| anyhow::anyhow!("machine: {e}"))?;
    a.tunables.apply(&m.tunables)?;
    m.prefault();
    let arms: Vec<(usize, &'static str)> = counts
        .iter()
        .flat_map(|&t| WRITERS.iter().map(move |&w| (t, w)))
        .collect();
    let pb = progress("pft", (Rounds::expected(a.runs()) * arms.len()) as u64);
    let mut engine: Vec<Vec<Sample>> = (0..arms.len() * MODES.len()).map(|_| vec![]).collect();
    let mut host: Vec<Vec<Sample>> = (0..arms.len()).map(|_| vec![]).collect();
    // Every mode's ratio to mmap_lock's narrow, in every arm whose threads
    // each have a core: an oversubscribed arm's rates are the host
    // scheduler's to choose, and more rounds would not settle them.
    let narrow = |engine: &[Vec<Sample>]| {
        engine
            .chunks(MODES.len())
            .zip(&arms)
            .filter(|(_, &(threads, writer))| !oversubscribed(threads, writer, cores))
            .all(|(modes, _)| {
                modes
                    .iter()
                    .all(|e| !Estimate::ratio(&rates(e), &rates(&modes[0])).wide())
            })
    };
    // The first arm once in the engine and once on the host, thrown away:
    // it warms up what the rounds share.
    engine_pft(&m, arms[0].0, arms[0].1, slice)?;
    if !a.no_host {
        host_pft(arms[0].0, arms[0].1, slice);
    }
    let mut rounds = Rounds::new(a.runs(), a.budget());
    while rounds.more(|| narrow(&engine)) {
        rounds.lengthen(&pb, arms.len() as u64);
        for (i, &(threads, writer)) in arms.iter().enumerate() {
            pb.inc(1);
            pb.set_message(format!("{threads} threads, writer {writer}"));
            // The modes and the host in an order that turns round by round.
            let n = MODES.len() + 1;
            for k in 0..n {
                match (k + rounds.done()) % n {
                    j if j < MODES.len() => {
                        m.tunables.set_fault_lock(MODES[j].1);
                        engine[i * MODES.len() + j].push(engine_pft(&m, threads, writer, slice)?);
                    }
                    _ if !a.no_host => host[i].push(host_pft(threads, writer, slice)),
                    _ => {}
                }
            }
        }
    }
    pb.finish_and_clear();
    let mut rows = vec![];
    for (i, &(threads, writer)) in arms.iter().enumerate() {
        let oversubscribed = oversubscribed(threads, writer, cores);
        for (j, &(mode, _)) in MODES.iter().enumerate() {
            let arm = &engine[i * MODES.len() + j];
            let mut row = summarize(mode, threads, writer, oversubscribed, arm, true);
            let q = Estimate::ratio(&rates(arm), &rates(&engine[i * MODES.len()]));
            (row.ratio, row.ci_low, row.ci_high) = Estimate::fields(Some(q));
            rows.push(row);
        }
        if !host[i].is_empty() {
            rows.push(summarize(
                "host",
                threads,
                writer,
                oversubscribed,
                &host[i],
                false,
            ));
        }
    }
    if !a.json {
        print_table(&rows, slice, a, cores, &m);
    }
    plot_rows(a, &rows)?;
    if counts.len() > 2 {
        plot_scaling(a, &rows, &counts)?;
    }
    Ok(serde_json::json!({
        "experiment": "pft",
        "machine": m.config.to_string(),
        "slice_mb": slice >> 20,
        "runs": a.runs().to_string(),
        "host_cores": cores,
        "rows": rows,
    }))
}

fn summarize(
    mode: &'static str,
    threads: usize,
    writer: &'static str,
    oversubscribed: bool,
    samples: &[Sample],
    engine: bool,
) -> Row {
    let rates = rates(samples);
    let mut lat: Vec<u32> = samples
        .iter()
        .flat_map(|s| s.latencies.iter().copied())
        .collect();
    lat.sort_unstable();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 - 1.0) * p) as usize)
            .map_or(0.0, |&v| v as f64)
    };
    let sum = |f: fn(&Sample) -> u64| samples.iter().map(f).sum::<u64>() as f64;
    let lockless = mode == "spf" || mode == "vma_lock";
    Row {
        mode,
        threads,
        writer,
        oversubscribed,
        faults_per_s: stats::median(&rates),
        ratio: None,
        ci_low: None,
        ci_high: None,
        p50_ns: pct(0.5),
        p99_ns: pct(0.99),
        abort_rate: (engine && lockless)
            .then(|| sum(|s| s.fallbacks) / sum(|s| s.attempts).max(1.0)),
        shared_writes_per_fault: engine
            .then(|| sum(|s| s.shared_writes) / sum(|s| s.faults).max(1.0)),
        writer_ops_per_s: super::median(samples.iter().map(|s| s.writer_ops_per_s).collect()),
        spf_abort_reasons: (engine && mode == "spf").then(|| {
            SPF_REASONS
                .iter()
                .enumerate()
                .map(|(i, e)| (e.name(), samples.iter().map(|s| s.reasons[i]).sum::<u64>()))
                .filter(|&(_, n)| n > 0)
                .collect()
        }),
        runs: samples.len(),
        samples_faults_per_s: rates,
    }
}

/// One run in the engine: fault threads on CPUs 0..threads, the writer (or
/// the waiting main thread) on CPU `threads`.
fn engine_pft(
    m: &Arc<Machine>,
    threads: usize,
    writer: &str,
    slice: u64,
) -> anyhow::Result<Sample> {
    let c = m.bind(threads).map_err(|e| anyhow::anyhow!("bind: {e}"))?;
    let mm = c.new_mm().map_err(|e| anyhow::anyhow!("mm: {e}"))?;
    let len = slice * threads as u64;
    let base = c
        .mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS)
        .map_err(|e| anyhow::anyhow!("mmap: {e}"))?;
    c.madvise(base, len, MADV_NOHUGEPAGE)
        .map_err(|e| anyhow::anyhow!("madvise: {e}"))?;
    let v = m.vmstat();
    let counters = |cpus: usize| -> [u64; 7] {
        let on = |e| (0..cpus).map(|cpu| v.event_on(cpu, e)).sum::<u64>();
        [
            on(Event::PGFAULT),
            on(Event::SHARED_LINE_WRITES),
            on(Event::SPF_ATTEMPT),
            on(Event::SPF_ABORT),
            on(Event::VMA_LOCK_SUCCESS),
            on(Event::VMA_LOCK_ABORT),
            on(Event::VMA_LOCK_RETRY),
        ]
    };
    let reasons = |cpus: usize| -> [u64; SPF_REASONS.len()] {
        SPF_REASONS.map(|e| (0..cpus).map(|cpu| v.event_on(cpu, e)).sum::<u64>())
    };
    // Lines the setup wrote (or an earlier run's threads) are not shared
    // with this run's fault threads.
    usermm::cacheline::begin_measurement();
    let before = counters(threads);
    let reasons_before = reasons(threads);
    let start = Barrier::new(threads + 1);
    let done = AtomicUsize::new(0);
    let (elapsed, latencies, writer_ops) = std::thread::scope(|s| -> anyhow::Result<_> {
        let handles: Vec<_> = (0..threads)
            .map(|id| {
                let (m, mm, start, done) = (&**m, mm.clone(), &start, &done);
                s.spawn(move || -> anyhow::Result<(Instant, Instant, Vec<u32>)> {
                    // Pinned as the host's fault threads are.
                    crate::native::pin_to_cpu(id);
                    let c = m.bind(id).map_err(|e| anyhow::anyhow!("bind: {e}"))?;
                    c.switch_mm(&mm);
                    let mine = base + id as u64 * slice;
                    let mut lat = Vec::with_capacity((slice / PAGE) as usize);
                    start.wait();
                    // Each thread times itself from the barrier: the main
                    // thread may not run again until they have finished.
                    let begin = Instant::now();
                    for p in (mine..mine + slice).step_by(PAGE as usize) {
                        let t = Instant::now();
                        c.store_u8(p, 1)
                            .map_err(|e| anyhow::anyhow!("fault: {e}"))?;
                        lat.push(t.elapsed().as_nanos().min(u32::MAX as u128) as u32);
                    }
                    let end = Instant::now();
                    done.fetch_add(1, Ordering::Release);
                    c.idle();
                    Ok((begin, end, lat))
                })
            })
            .collect();
        start.wait();
        let t0 = Instant::now();
        let mut ops = 0u64;
        if writer != "none" {
            while done.load(Ordering::Acquire) < threads {
                let q = c
                    .mmap(
                        0,
                        WRITER_LEN,
                        PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS,
                    )
                    .map_err(|e| anyhow::anyhow!("writer mmap: {e}"))?;
                if writer == "touch" {
                    c.store_u8(q, 1)
                        .map_err(|e| anyhow::anyhow!("writer touch: {e}"))?;
                }
                c.munmap(q, WRITER_LEN)
                    .map_err(|e| anyhow::anyhow!("writer munmap: {e}"))?;
                ops += 1;
            }
        }
        let writer_wall = t0.elapsed().as_secs_f64();
        c.idle();
        let (mut begin, mut end) = (None::<Instant>, None::<Instant>);
        let mut lat = vec![];
        for h in handles {
            let (b, e, l) = h.join().expect("fault thread")?;
            begin = Some(begin.map_or(b, |x| x.min(b)));
            end = Some(end.map_or(e, |x| x.max(e)));
            lat.extend(l);
        }
        let (Some(begin), Some(end)) = (begin, end) else {
            anyhow::bail!("no fault thread ran");
        };
        let wall = end.duration_since(begin).as_secs_f64();
        Ok((wall, lat, ops as f64 / writer_wall))
    })?;
    let after = counters(threads);
    let mut why = reasons(threads);
    for (w, b) in why.iter_mut().zip(reasons_before) {
        *w -= b;
    }
    let d: Vec<u64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
    c.exit_mm().map_err(|e| anyhow::anyhow!("exit: {e}"))?;
    drop(c);
    m.rcu_barrier();
    let faults = slice / PAGE * threads as u64;
    Ok(Sample {
        faults_per_s: faults as f64 / elapsed,
        latencies,
        faults: d[0],
        shared_writes: d[1],
        attempts: d[2] + d[4] + d[5] + d[6],
        fallbacks: d[3] + d[5] + d[6],
        writer_ops_per_s: writer_ops,
        reasons: why,
    })
}

/// One run on the host kernel: the same loops, fault threads pinned to
/// CPUs 0..threads (as the reference program pins them), the writer not.
fn host_pft(threads: usize, writer: &str, slice: u64) -> Sample {
    let len = (slice * threads as u64) as usize;
    let region = crate::native::HostRegion::map(len);
    // SAFETY: the region is ours, mapped above.
    unsafe { libc::madvise(region.ptr, len, libc::MADV_NOHUGEPAGE) };
    let base = region.ptr as usize;
    let start = Barrier::new(threads + 1);
    let done = AtomicUsize::new(0);
    let (elapsed, latencies, ops) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|id| {
                let (start, done) = (&start, &done);
                s.spawn(move || {
                    crate::native::pin_to_cpu(id);
                    let mine = base + id * slice as usize;
                    let mut lat = Vec::with_capacity((slice / PAGE) as usize);
                    start.wait();
                    let begin = Instant::now();
                    for p in (mine..mine + slice as usize).step_by(PAGE as usize) {
                        let t = Instant::now();
                        // SAFETY: inside this thread's slice of the region.
                        unsafe { std::ptr::write_volatile(p as *mut u8, 1) };
                        lat.push(t.elapsed().as_nanos().min(u32::MAX as u128) as u32);
                    }
                    let end = Instant::now();
                    done.fetch_add(1, Ordering::Release);
                    (begin, end, lat)
                })
            })
            .collect();
        start.wait();
        let t0 = Instant::now();
        let mut ops = 0u64;
        if writer != "none" {
            while done.load(Ordering::Acquire) < threads {
                let q = crate::native::HostRegion::map(WRITER_LEN as usize);
                if writer == "touch" {
                    // SAFETY: the first byte of the region just mapped.
                    unsafe { std::ptr::write_volatile(q.ptr as *mut u8, 1) };
                }
                drop(q);
                ops += 1;
            }
        }
        let writer_wall = t0.elapsed().as_secs_f64();
        let joined: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().expect("host fault thread"))
            .collect();
        let begin = joined.iter().map(|j| j.0).min().expect("a fault thread");
        let end = joined.iter().map(|j| j.1).max().expect("a fault thread");
        let lat = joined.into_iter().flat_map(|j| j.2).collect();
        (
            end.duration_since(begin).as_secs_f64(),
            lat,
            ops as f64 / writer_wall,
        )
    });
    drop(region);
    Sample {
        faults_per_s: (slice / PAGE * threads as u64) as f64 / elapsed,
        latencies,
        writer_ops_per_s: ops,
        ..Sample::default()
    }
}

fn print_table(rows: &[Row], slice: u64, a: &BenchArgs, cores: usize, m: &Machine) {
    outln!(
        "bench pft: each fault thread write-faults its own {} MiB, 4 KiB folios; arms interleaved; medians of the rounds (runs {}); this host has {cores} cores",
        slice >> 20,
        a.runs()
    );
    outln!(
        "{:>7} {:<8} {:<10} {:>12} {:>22} {:>8} {:>8} {:>8} {:>9}",
        "threads",
        "writer",
        "mode",
        "faults/s",
        "vs mmap_lock [95% CI]",
        "p50 ns",
        "p99 ns",
        "abort %",
        "shared/f"
    );
    for r in rows {
        outln!(
            "{:>7} {:<8} {:<10} {:>12.0} {:>22} {:>8.0} {:>8.0} {:>8} {:>9}{}",
            r.threads,
            r.writer,
            r.mode,
            r.faults_per_s,
            r.estimate().map_or("-".into(), |e| e.ratio_text()),
            r.p50_ns,
            r.p99_ns,
            r.abort_rate
                .map_or("-".into(), |x| format!("{:.2}", x * 100.0)),
            r.shared_writes_per_fault
                .map_or("-".into(), |x| format!("{x:.3}")),
            if r.oversubscribed {
                "  (oversubscribed)"
            } else {
                ""
            }
        );
    }
    for r in rows
        .iter()
        .filter(|r| r.spf_abort_reasons.as_ref().is_some_and(|x| !x.is_empty()))
    {
        outln!(
            "spf aborts, {} threads, writer {}: {:?}",
            r.threads,
            r.writer,
            r.spf_abort_reasons.as_ref().expect("filtered")
        );
    }
    outln!(
        "{}",
        stats::footnote(&format!("{} rounds", rows.first().map_or(0, |r| r.runs)))
    );
    outln!("machine: {}", m.config);
    outln!();
}

/// One line per fault_lock mode and the host: each row's faults/s
/// (thousands) at the x position `x_of` gives it (None: not plotted).
fn mode_series(rows: &[Row], x_of: impl Fn(&Row) -> Option<usize>) -> Vec<plot::Series> {
    ["mmap_lock", "spf", "vma_lock", "host"]
        .iter()
        .map(|mode| plot::Series {
            label: if *mode == "host" {
                "host kernel (6.18, per-VMA locks)".into()
            } else {
                format!("usermm, fault_lock={mode}")
            },
            points: rows
                .iter()
                .filter(|r| r.mode == *mode)
                .filter_map(|r| Some((x_of(r)?, r.faults_per_s / 1000.0)))
                .collect(),
            dashed: *mode == "host",
        })
        .filter(|s| !s.points.is_empty())
        .collect()
}

fn plot_rows(a: &BenchArgs, rows: &[Row]) -> anyhow::Result<()> {
    let mut labels: Vec<String> = vec![];
    for r in rows {
        let l = format!("{}t {}", r.threads, r.writer);
        if !labels.contains(&l) {
            labels.push(l);
        }
    }
    let series = mode_series(rows, |r| {
        let l = format!("{}t {}", r.threads, r.writer);
        labels.iter().position(|x| *x == l)
    });
    plot::change_plot(
        &a.out.join("pft.svg"),
        "pft: 4 KiB write faults per second (thousands), per fault_lock",
        &labels,
        ("fault threads and writer", "k faults/s"),
        &series,
    )
}

/// The scaling curve: faults/s against fault threads with no writer, per
/// mode and on the host (`pft_scaling.svg`, when more than two counts ran).
fn plot_scaling(a: &BenchArgs, rows: &[Row], counts: &[usize]) -> anyhow::Result<()> {
    let labels: Vec<String> = counts.iter().map(|t| t.to_string()).collect();
    let series = mode_series(rows, |r| {
        (r.writer == "none")
            .then(|| counts.iter().position(|&t| t == r.threads))
            .flatten()
    });
    plot::change_plot(
        &a.out.join("pft_scaling.svg"),
        "pft: 4 KiB write faults per second (thousands) by fault threads, no writer",
        &labels,
        ("fault threads", "k faults/s"),
        &series,
    )
}
