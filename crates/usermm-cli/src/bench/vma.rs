//! `bench vma`: how VMA operations scale with the number of VMAs, and how
//! long a deep chain of forks takes to tear down.
//!
//! An address space gets N one-page VMAs with a one-page hole after each
//! (so none merge). Then, for K VMAs spread over the range, one at a time:
//! `mmap` of a read-only page into the hole after it (MAP_FIXED_NOREPLACE),
//! `munmap` of that page, and `mprotect` of the VMA to read-only and back.
//! Each call is timed on its own, after one untimed pass of the same calls;
//! the table gives the mean per call. The same loop runs natively on the
//! host kernel in this process. The fork
//! chain: processes 0..D, each the child of the one before, each having
//! written its own copy of one page of its one VMA; teardown exits them
//! from the youngest up. On the host it runs in a helper process
//! ([`crate::host_chain`]), which finds the cost of one such VMA.

use std::time::Instant;

use anyhow::anyhow;
use serde::Serialize;
use usermm::mmap::*;
use usermm::{Machine, OnCpu};

use super::stats::{self, Estimate, Rounds};
use super::{progress, BenchArgs};

/// VMA counts of the scaling rows.
const NR_VMAS: [usize; 3] = [1000, 10_000, 65_000];
/// Fork-chain depths.
const CHAIN_DEPTHS: [usize; 2] = [1000, 5000];
/// The depth the host's chain is measured at, once: a run takes it about
/// half a minute (forking is quadratic in the depth there too), and 5,000
/// would take minutes.
const HOST_CHAIN_DEPTH: usize = 1000;
/// Teardowns of each fork chain timed: the rounds asked for, at most three.
/// The engine's chain is deterministic work with no arm to compare, so its
/// median is reported without an interval.
fn chain_runs(a: &BenchArgs) -> usize {
    Rounds::expected(a.runs()).min(3)
}
/// Calls of each kind timed per run.
const CALLS: usize = 1000;
/// Where the engine's VMAs start (the host's start wherever it has room).
const BASE: u64 = 0x1000_0000;
const PAGE: u64 = 4096;

#[derive(Serialize)]
struct Row {
    op: &'static str,
    /// VMAs in the address space, or the chain's depth for `fork_chain_exit`.
    n: usize,
    /// Mean seconds per call (per teardown for the fork chain): the median
    /// over the rounds.
    engine_s: f64,
    /// The same on the host; for the fork chain, the host's cost of one
    /// chained VMA (see [`crate::host_chain`]).
    host_s: Option<f64>,
    /// engine / host: the median of the per-round ratios, and its 95%
    /// interval.
    ratio: Option<f64>,
    ci_low: Option<f64>,
    ci_high: Option<f64>,
    /// The engine's per-call time against the same call's at the smallest
    /// N in the same round: the median, and its 95% interval.
    scaling: Option<f64>,
    scaling_ci_low: Option<f64>,
    scaling_ci_high: Option<f64>,
    runs: usize,
    /// Every round's seconds.
    samples_engine_s: Vec<f64>,
    samples_host_s: Vec<f64>,
}

impl Row {
    fn ratio(&self) -> Option<Estimate> {
        Estimate::from_fields(self.ratio, self.ci_low, self.ci_high, self.runs)
    }

    fn scaling(&self) -> Option<Estimate> {
        Estimate::from_fields(
            self.scaling,
            self.scaling_ci_low,
            self.scaling_ci_high,
            self.runs,
        )
    }
}

/// The scaling loop's samples: per N, per round, the engine's and the
/// host's [`Times`] (the host's absent where it refused).
#[derive(Default)]
struct LoopSamples {
    engine: Vec<Vec<Times>>,
    host: Vec<Vec<Times>>,
}

impl LoopSamples {
    /// Op `i` at the `j`-th N: the engine's seconds, round by round.
    fn engine(&self, j: usize, i: usize) -> Vec<f64> {
        self.engine[j].iter().map(|t| t[i]).collect()
    }

    fn host(&self, j: usize, i: usize) -> Vec<f64> {
        self.host[j].iter().map(|t| t[i]).collect()
    }

    /// engine / host for op `i` at the `j`-th N, when the host ran every
    /// round.
    fn ratio(&self, j: usize, i: usize) -> Option<Estimate> {
        (self.host[j].len() == self.engine[j].len())
            .then(|| Estimate::ratio(&self.engine(j, i), &self.host(j, i)))
    }

    /// The engine's time at the `j`-th N over the first N's, round by round.
    fn scaling(&self, j: usize, i: usize) -> Estimate {
        Estimate::ratio(&self.engine(j, i), &self.engine(0, i))
    }

    fn narrow(&self) -> bool {
        (0..self.engine.len()).all(|j| {
            (0..3).all(|i| !self.scaling(j, i).wide() && self.ratio(j, i).is_none_or(|q| !q.wide()))
        })
    }
}

/// Per-call seconds of one run: (mmap, munmap, mprotect).
type Times = [f64; 3];

/// The operations the loop makes, on the engine or on the host.
trait Space {
    fn map(&mut self, addr: u64, prot: u32) -> anyhow::Result<()>;
    fn unmap(&mut self, addr: u64) -> anyhow::Result<()>;
    fn protect(&mut self, addr: u64, prot: u32) -> anyhow::Result<()>;
}

/// Lay out `n` VMAs from `base`, then time `CALLS` calls of each kind.
fn vma_loop(s: &mut dyn Space, base: u64, n: usize) -> anyhow::Result<Times> {
    let rw = PROT_READ | PROT_WRITE;
    for i in 0..n as u64 {
        s.map(base + 2 * i * PAGE, rw)?;
    }
    let stride = (n / CALLS).max(1) as u64;
    // One untimed pass first: the allocators (the engine's and the host's)
    // reach their steady state, and the timed pass measures the calls.
    timed_calls(s, base, n, stride)?;
    let t = timed_calls(s, base, n, stride)?;
    for i in 0..n as u64 {
        s.unmap(base + 2 * i * PAGE)?;
    }
    Ok(t)
}

/// `CALLS` calls of each kind on VMAs spread `stride` apart; per-call means.
fn timed_calls(s: &mut dyn Space, base: u64, n: usize, stride: u64) -> anyhow::Result<Times> {
    let rw = PROT_READ | PROT_WRITE;
    let mut t = [0.0; 3];
    for k in 0..CALLS as u64 {
        let vma = base + 2 * ((k * stride) % n as u64) * PAGE;
        let hole = vma + PAGE;
        let t0 = Instant::now();
        s.map(hole, PROT_READ)?;
        let t1 = Instant::now();
        s.unmap(hole)?;
        let t2 = Instant::now();
        s.protect(vma, PROT_READ)?;
        s.protect(vma, rw)?;
        let t3 = Instant::now();
        t[0] += (t1 - t0).as_secs_f64();
        t[1] += (t2 - t1).as_secs_f64();
        t[2] += (t3 - t2).as_secs_f64() / 2.0;
    }
    Ok(t.map(|x| x / CALLS as f64))
}

struct Engine<'a>(&'a OnCpu<'a>);

impl Space for Engine<'_> {
    fn map(&mut self, addr: u64, prot: u32) -> anyhow::Result<()> {
        let flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE;
        self.0
            .mmap(addr, PAGE, prot, flags)
            .map(drop)
            .map_err(|e| anyhow!("mmap {addr:#x}: {e}"))
    }
    fn unmap(&mut self, addr: u64) -> anyhow::Result<()> {
        self.0
            .munmap(addr, PAGE)
            .map_err(|e| anyhow!("munmap {addr:#x}: {e}"))
    }
    fn protect(&mut self, addr: u64, prot: u32) -> anyhow::Result<()> {
        self.0
            .mprotect(addr, PAGE, prot)
            .map_err(|e| anyhow!("mprotect {addr:#x}: {e}"))
    }
}

/// This process on the host kernel.
struct Host;

impl Space for Host {
    fn map(&mut self, addr: u64, prot: u32) -> anyhow::Result<()> {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE;
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping,
        // so nothing of this process's is touched.
        let p = unsafe { libc::mmap(addr as *mut _, PAGE as usize, prot as i32, flags, -1, 0) };
        if p as u64 != addr {
            return Err(anyhow!(
                "host mmap {addr:#x}: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    }
    fn unmap(&mut self, addr: u64) -> anyhow::Result<()> {
        // SAFETY: only pages this loop mapped itself are unmapped.
        if unsafe { libc::munmap(addr as *mut _, PAGE as usize) } != 0 {
            return Err(anyhow!("host munmap: {}", std::io::Error::last_os_error()));
        }
        Ok(())
    }
    fn protect(&mut self, addr: u64, prot: u32) -> anyhow::Result<()> {
        // SAFETY: only pages this loop mapped itself are changed.
        if unsafe { libc::mprotect(addr as *mut _, PAGE as usize, prot as i32) } != 0 {
            return Err(anyhow!(
                "host mprotect: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    }
}

/// A free stretch of this process's address space for `n` VMAs and their
/// holes: reserve it, then give it back for the loop to map into.
fn host_base(n: usize) -> anyhow::Result<u64> {
    let len = 2 * n * PAGE as usize;
    // SAFETY: a fresh PROT_NONE reservation, unmapped right away.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(anyhow!("host reserve: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: the reservation just made.
    unsafe { libc::munmap(p, len) };
    Ok(p as u64)
}

fn engine_run(m: &Machine, n: usize) -> anyhow::Result<Times> {
    let c = m.bind(0).map_err(|e| anyhow!("bind: {e}"))?;
    c.new_mm().map_err(|e| anyhow!("mm: {e}"))?;
    let t = vma_loop(&mut Engine(&c), BASE, n)?;
    c.exit_mm().map_err(|e| anyhow!("exit: {e}"))?;
    m.rcu_barrier();
    Ok(t)
}

/// Seconds to tear down a chain of `depth` processes, youngest first.
fn fork_chain_teardown(m: &Machine, depth: usize) -> anyhow::Result<f64> {
    let c = m.bind(0).map_err(|e| anyhow!("bind: {e}"))?;
    let root = c.new_mm().map_err(|e| anyhow!("mm: {e}"))?;
    let rw = PROT_READ | PROT_WRITE;
    let a = c
        .mmap(0, 16 * PAGE, rw, MAP_PRIVATE | MAP_ANONYMOUS)
        .map_err(|e| anyhow!("mmap: {e}"))?;
    c.store_u64(a, 0).map_err(|e| anyhow!("store: {e}"))?;
    let mut chain = vec![root];
    for i in 1..depth as u64 {
        let child = c.fork().map_err(|e| anyhow!("fork {i}: {e}"))?;
        c.switch_mm(&child);
        c.store_u64(a, i).map_err(|e| anyhow!("store: {e}"))?;
        chain.push(child);
    }
    let t = Instant::now();
    for mm in chain.iter().rev() {
        c.switch_mm(mm);
        c.exit_mm().map_err(|e| anyhow!("exit: {e}"))?;
    }
    let secs = t.elapsed().as_secs_f64();
    drop(chain);
    m.rcu_barrier();
    Ok(secs)
}

pub const EXPERIMENT: super::Experiment = super::Experiment {
    name: "vma",
    description: "mmap, munmap and mprotect among N one-page VMAs, and the teardown of a deep fork chain; engine against the host kernel",
    run,
    budget_s: 5,
    full_budget_s: 10,
};

fn run(a: &BenchArgs) -> anyhow::Result<serde_json::Value> {
    // Room for the largest chain's page tables and pages (five frames a
    // process) and the VMA loop's tables.
    let m = super::experiment_machine(a, 512 << 20)?;
    // CPU 0's thread (this one) on host CPU 0, the host's loop beside it
    // (after the machine is made: its own threads float).
    let _pinned = crate::native::pin_thread(0);
    let pb = progress(
        "vma",
        (Rounds::expected(a.runs()) + CHAIN_DEPTHS.len()) as u64,
    );
    let ops = ["mmap", "munmap", "mprotect"];
    let mut l = LoopSamples {
        engine: vec![vec![]; NR_VMAS.len()],
        host: vec![vec![]; NR_VMAS.len()],
    };
    // Per N: the host refused once (max_map_count and this process's own
    // VMAs), and is not asked again at that N.
    let mut host_refused = [false; NR_VMAS.len()];
    // No round is thrown away: each run makes one untimed pass of its
    // calls before the timed one (`vma_loop`).
    let mut rounds = Rounds::new(a.runs(), a.budget());
    while rounds.more(|| l.narrow()) {
        rounds.lengthen(&pb, 1);
        pb.set_message(format!("round {}", rounds.done()));
        // Every N in each round, so that scaling is a ratio within one;
        // the host first in every other round.
        let host_first = rounds.done().is_multiple_of(2);
        for (j, &n) in NR_VMAS.iter().enumerate() {
            for engine in [!host_first, host_first] {
                if engine {
                    l.engine[j].push(engine_run(&m, n)?);
                } else if !a.no_host && !host_refused[j] {
                    // The host may refuse (max_map_count and this process's
                    // own VMAs): then it has no figure, and says why.
                    match host_base(n).and_then(|b| vma_loop(&mut Host, b, n)) {
                        Ok(t) => l.host[j].push(t),
                        Err(err) => {
                            eprintln!("bench vma: host run at {n} VMAs: {err}");
                            host_refused[j] = true;
                        }
                    }
                }
            }
        }
        pb.inc(1);
    }
    let mut rows: Vec<Row> = Vec::new();
    for (j, &n) in NR_VMAS.iter().enumerate() {
        for (i, op) in ops.iter().enumerate() {
            let q = l.ratio(j, i);
            let sc = l.scaling(j, i);
            let host = l.host(j, i);
            rows.push(Row {
                op,
                n,
                engine_s: stats::median(&l.engine(j, i)),
                host_s: (!host_refused[j] && !host.is_empty()).then(|| stats::median(&host)),
                ratio: q.map(|q| q.value),
                ci_low: q.map(|q| q.ci_low),
                ci_high: q.map(|q| q.ci_high),
                scaling: Some(sc.value),
                scaling_ci_low: Some(sc.ci_low),
                scaling_ci_high: Some(sc.ci_high),
                runs: sc.n,
                samples_engine_s: l.engine(j, i),
                samples_host_s: host,
            });
        }
    }
    for &d in &CHAIN_DEPTHS {
        pb.set_message(format!("fork chain {d}"));
        let mut e = vec![];
        for _ in 0..chain_runs(a) {
            e.push(fork_chain_teardown(&m, d)?);
        }
        pb.inc(1);
        let host_s = if a.no_host || d != HOST_CHAIN_DEPTH {
            None
        } else {
            match crate::host_chain::teardown_one_vma(d) {
                Ok(s) => Some(s),
                Err(err) => {
                    eprintln!("bench vma: host fork chain: {err:#}");
                    None
                }
            }
        };
        rows.push(Row {
            op: "fork_chain_exit",
            n: d,
            engine_s: stats::median(&e),
            host_s,
            ratio: None,
            ci_low: None,
            ci_high: None,
            scaling: None,
            scaling_ci_low: None,
            scaling_ci_high: None,
            runs: e.len(),
            samples_engine_s: e,
            samples_host_s: vec![],
        });
    }
    pb.finish_and_clear();
    if !a.json {
        print_table(&rows, a);
        outln!("machine: {}", m.config);
        outln!();
    }
    Ok(serde_json::json!({
        "experiment": "vma",
        "machine": m.config.to_string(),
        "runs": a.runs().to_string(),
        "chain_runs": chain_runs(a),
        "calls_per_run": CALLS,
        "rows": rows,
    }))
}

fn print_table(rows: &[Row], a: &BenchArgs) {
    outln!(
        "bench vma: mean time per call over {CALLS} calls, N one-page VMAs; every N in each round, engine and host interleaved; medians of the rounds (runs {})",
        a.runs()
    );
    outln!(
        "{:<16} {:>7} {:>12} {:>12} {:>22} {:>22}",
        "op",
        "N",
        "engine (us)",
        "host (us)",
        "eng/host [95% CI]",
        "vs N=1000 [95% CI]"
    );
    let text = |e: Option<Estimate>| e.map_or("-".into(), |e| e.ratio_text());
    let looped = || rows.iter().filter(|r| r.op != "fork_chain_exit");
    for r in looped() {
        let h = r.host_s.map_or("-".into(), |h| format!("{:.3}", h * 1e6));
        outln!(
            "{:<16} {:>7} {:>12.3} {:>12} {:>22} {:>22}",
            r.op,
            r.n,
            r.engine_s * 1e6,
            h,
            text(r.ratio()),
            text(r.scaling())
        );
    }
    outln!(
        "{}",
        stats::footnote(&format!("{} rounds", looped().next().map_or(0, |r| r.runs)))
    );
    outln!(
        "fork chain, teardown of every process (youngest first), medians of {} runs; host: one run, the cost of one chained VMA:",
        chain_runs(a)
    );
    outln!(
        "{:<16} {:>7} {:>12} {:>12}",
        "",
        "depth",
        "engine (s)",
        "host (s)"
    );
    for r in rows.iter().filter(|r| r.op == "fork_chain_exit") {
        let h = r.host_s.map_or("-".into(), |h| format!("{h:.3}"));
        outln!(
            "{:<16} {:>7} {:>12.3} {:>12}",
            "fork_chain_exit",
            r.n,
            r.engine_s,
            h
        );
    }
}
