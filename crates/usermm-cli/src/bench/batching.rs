//! `bench munmap`, `bench dontneed`, `bench fork`: the v6.9 PTE-batching
//! experiments (F2 and F1). For each folio size, a region populated with
//! folios of that size is unmapped, MADV_DONTNEED'd or forked, with the
//! batching tunable off (the pre-v6.9 per-PTE path) and on, interleaved, and
//! the same operation is timed on the host kernel in the same invocation.
//!
//! `bench cow` has the same shape for the tunable `wp_reuse_large`
//! (docs/extending.md's worked example): after a fork whose child has
//! exited, the parent writes a byte to every page, each write a fault on a
//! write-protected PTE that v6.15 answers by reusing the page of a large
//! folio in place and earlier kernels by copying it.

use std::time::Instant;

use anyhow::{anyhow, Context};
use serde::Serialize;
use usermm::madvise::MADV_DONTNEED;
use usermm::mmap::{MAP_ANONYMOUS, MAP_PRIVATE, MAP_SHARED, PROT_READ, PROT_WRITE};
use usermm::tunable::Tunable;
use usermm::vmstat::{MthpStat, NodeStat};
use usermm::{Machine, OnCpu};

use super::stats::{self, median, Estimate, Rounds};
use super::BenchArgs;
use crate::{native, plot};

pub const MUNMAP: super::Experiment = super::Experiment {
    name: "munmap",
    description: "munmap of a region of folios of one size, with zap_batch off and on (F2, v6.9)",
    run: |a| experiment(a, Op::Munmap),
    budget_s: 20,
    full_budget_s: 60,
};

pub const DONTNEED: super::Experiment = super::Experiment {
    name: "dontneed",
    description:
        "MADV_DONTNEED of a region of folios of one size, with zap_batch off and on (F2, v6.9)",
    run: |a| experiment(a, Op::Dontneed),
    budget_s: 15,
    full_budget_s: 40,
};

pub const FORK: super::Experiment = super::Experiment {
    name: "fork",
    description: "fork of a process mapping a region of folios of one size, with fork_batch off and on (F1, v6.9)",
    run: |a| experiment(a, Op::Fork),
    budget_s: 15,
    full_budget_s: 40,
};

pub const COW: super::Experiment = super::Experiment {
    name: "cow",
    description: "after fork and the child's exit, the parent writes every page of a region of folios of one size, with wp_reuse_large off and on (v6.15)",
    run: |a| experiment(a, Op::Cow),
    budget_s: 10,
    full_budget_s: 30,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Munmap,
    Dontneed,
    Fork,
    /// Write faults after fork, once the child has exited.
    Cow,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Munmap => "munmap",
            Op::Dontneed => "dontneed",
            Op::Fork => "fork",
            Op::Cow => "cow",
        }
    }

    /// The seed's published change (patched vs. base, percent) per folio
    /// size in KiB, PTE-mapped (Xeon Silver 4210R; F2 seed v1 and F1 seed).
    fn seed_change(self, kb: u64) -> Option<f64> {
        let table: &[(u64, f64)] = match self {
            Op::Munmap => &[
                (4, -1.0),
                (16, -20.0),
                (32, -31.0),
                (64, -37.0),
                (128, -47.0),
                (256, -53.0),
                (512, -56.0),
                (1024, -57.0),
                (2048, -58.0),
            ],
            Op::Fork => &[
                (4, -2.0),
                (16, -16.0),
                (32, -24.0),
                (64, -26.0),
                (128, -28.0),
                (256, -29.0),
                (512, -30.0),
                (1024, -30.0),
                (2048, -30.0),
            ],
            // The seed published no MADV_DONTNEED table, and the v6.15
            // series no figures for its reuse.
            Op::Dontneed | Op::Cow => &[],
        };
        table.iter().find(|&&(k, _)| k == kb).map(|&(_, c)| c)
    }

    /// The tunable the experiment compares, `off` against `on`.
    pub fn tunable(self) -> Tunable {
        match self {
            Op::Fork => Tunable::ForkBatch,
            Op::Munmap | Op::Dontneed => Tunable::ZapBatch,
            Op::Cow => Tunable::WpReuseLarge,
        }
    }

    fn set_batching(self, m: &Machine, on: bool) {
        m.tunables.set_on(self.tunable(), on)
    }
}

/// One folio size and how it is mapped.
#[derive(Clone, Copy, Debug)]
struct Case {
    kb: u64,
    pmd: bool,
}

const CASES: [Case; 10] = [
    Case { kb: 4, pmd: false },
    Case { kb: 16, pmd: false },
    Case { kb: 32, pmd: false },
    Case { kb: 64, pmd: false },
    Case {
        kb: 128,
        pmd: false,
    },
    Case {
        kb: 256,
        pmd: false,
    },
    Case {
        kb: 512,
        pmd: false,
    },
    Case {
        kb: 1024,
        pmd: false,
    },
    Case {
        kb: 2048,
        pmd: false,
    },
    Case {
        kb: 2048,
        pmd: true,
    },
];

impl Case {
    fn order(self) -> u32 {
        (self.kb / 4).trailing_zeros()
    }
    fn label(self) -> String {
        format!("{}K{}", self.kb, if self.pmd { " PMD" } else { "" })
    }
}

#[derive(Serialize)]
pub struct Row {
    pub op: &'static str,
    pub folio_kb: u64,
    /// "pte" or "pmd": how the folios are mapped.
    pub mapping: &'static str,
    pub baseline_s: f64,
    pub batched_s: f64,
    /// batched / baseline: the median of the per-round ratios, and its
    /// 95% interval.
    pub ratio: f64,
    pub ci_low: f64,
    pub ci_high: f64,
    /// Rounds run.
    pub runs: usize,
    pub host_s: Option<f64>,
    /// batched / host.
    pub batched_host_ratio: Option<f64>,
    pub seed_change_pct: Option<f64>,
    /// `cow`: pages allocated during the timed writes, per arm (the median
    /// over the rounds): the copies that reuse avoids.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pages_allocated: Option<PagesAllocated>,
    pub host_note: Option<String>,
    /// Every round's times: baseline, batched and host (in the first six
    /// rounds under `--runs auto`, every round under a fixed count).
    pub samples: Samples,
}

#[derive(Serialize, Clone, Copy)]
pub struct PagesAllocated {
    pub baseline: u64,
    pub batched: u64,
}

#[derive(Serialize, Default, Clone)]
pub struct Samples {
    pub baseline_s: Vec<f64>,
    pub batched_s: Vec<f64>,
    pub host_s: Vec<f64>,
    /// Pages allocated in each round's timed part, per arm.
    pub baseline_pages: Vec<u64>,
    pub batched_pages: Vec<u64>,
}

impl Row {
    /// `64K`, `2048K PMD`.
    pub fn label(&self) -> String {
        Case {
            kb: self.folio_kb,
            pmd: self.mapping == "pmd",
        }
        .label()
    }

    /// batched / baseline with its interval.
    pub fn estimate(&self) -> Estimate {
        Estimate {
            value: self.ratio,
            ci_low: self.ci_low,
            ci_high: self.ci_high,
            n: self.runs,
        }
    }
}

/// What backs an experiment's region (`--backing`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backing {
    /// Private anonymous memory, write-faulted.
    Anon,
    /// A file's page cache, mapped private and read-faulted.
    File,
    /// Shared anonymous memory (shmem), write-faulted, its file held open.
    Shmem,
}

impl Backing {
    fn of(a: &BenchArgs) -> Backing {
        match a.backing.as_str() {
            "file" => Backing::File,
            "shmem" => Backing::Shmem,
            _ => Backing::Anon,
        }
    }
}

/// Run one batching experiment; returns its rows and the machine it ran on.
pub fn run(a: &BenchArgs, op: Op) -> anyhow::Result<(Vec<Row>, String)> {
    let len = a.size_mb << 20;
    let backing = Backing::of(a);
    let m = super::experiment_machine(a, super::region_machine_bytes(a.size_mb))?;
    // CPU 0's thread (this one) on host CPU 0, as the reference programs
    // pin theirs, with the host's loop on the same CPU; after the machine
    // is made, whose own threads (kswapd, RCU) must not inherit the pin.
    let _pinned = native::pin_thread(0);
    m.prefault();
    let cases: Vec<Case> = CASES
        .into_iter()
        .filter(|c| a.sizes.is_empty() || a.sizes.contains(&c.kb))
        .collect();
    let pb = super::progress(op.name(), (cases.len() * Rounds::expected(a.runs())) as u64);
    // Per case: its samples, and why the host's figure is missing or not
    // to be trusted.
    let mut state: Vec<(Samples, Option<String>)> = cases
        .iter()
        .map(|_| (Samples::default(), a.no_host.then(|| "not run".to_string())))
        .collect();
    let mut knobs = native::KnobsBySize::default();
    let round = |(s, note): &mut (Samples, Option<String>), i: usize, k: usize| {
        let case = cases[i];
        pb.set_message(case.label());
        // Alternate which arm goes first, so that neither always runs on
        // the allocator state the other left.
        let first = k.is_multiple_of(2);
        for on in [!first, first] {
            let (t, pages) = engine_once(&m, op, case, len, on, backing)
                .with_context(|| format!("{} {}", op.name(), case.label()))?;
            if on {
                s.batched_s.push(t);
                s.batched_pages.push(pages);
            } else {
                s.baseline_s.push(t);
                s.baseline_pages.push(pages);
            }
        }
        // The host's time is a column, not part of the ratio: its median
        // is over the first rounds only, and the rounds that narrow an
        // interval run the engine alone.
        if !a.no_host && note.is_none() && k < Rounds::expected(a.runs()) {
            match knobs.only_size(case.kb, backing == Backing::Shmem) {
                Ok(()) => match host_once(op, case, len as usize, backing) {
                    Ok(t) => s.host_s.push(t),
                    Err(e) => *note = Some(e),
                },
                Err(e) => *note = Some(e),
            }
        }
        Ok(())
    };
    let spread =
        |(s, _): &(Samples, Option<String>)| Estimate::ratio(&s.batched_s, &s.baseline_s).spread();
    stats::rounds_by_row(a.runs(), a.budget(), &pb, &mut state, round, spread)?;
    let mut rows = vec![];
    for (case, (s, note)) in cases.into_iter().zip(state) {
        let r = Estimate::ratio(&s.batched_s, &s.baseline_s);
        let (b, p) = (median(&s.baseline_s), median(&s.batched_s));
        let host_s = (!s.host_s.is_empty() && note.is_none()).then(|| median(&s.host_s));
        rows.push(Row {
            op: op.name(),
            folio_kb: case.kb,
            mapping: if case.pmd { "pmd" } else { "pte" },
            baseline_s: b,
            batched_s: p,
            ratio: r.value,
            ci_low: r.ci_low,
            ci_high: r.ci_high,
            runs: r.n,
            host_s,
            batched_host_ratio: host_s.map(|h| p / h),
            seed_change_pct: (!case.pmd).then(|| op.seed_change(case.kb)).flatten(),
            pages_allocated: (op == Op::Cow).then(|| PagesAllocated {
                baseline: median_u64(&s.baseline_pages),
                batched: median_u64(&s.batched_pages),
            }),
            host_note: note,
            samples: s,
        });
    }
    pb.finish_and_clear();
    // The other tunables the user set, if any, belong to the machine.
    let others: Vec<String> = m
        .tunables
        .changed()
        .into_iter()
        .filter(|(n, _)| *n != op.tunable().info().name)
        .map(|(n, v)| format!("{n}={v}"))
        .collect();
    let mut machine = m.config.to_string();
    if !others.is_empty() {
        machine += &format!("; tunables {}", others.join(" "));
    }
    Ok((rows, machine))
}

/// The median of counts (the lower middle one of an even number).
fn median_u64(v: &[u64]) -> u64 {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0)
}

/// Populate a fresh process with folios of the case's size, then time `op`
/// with the tunable `on`: its seconds and the pages allocated meanwhile.
/// Everything is torn down before returning.
fn engine_once(
    m: &Machine,
    op: Op,
    case: Case,
    len: u64,
    on: bool,
    backing: Backing,
) -> anyhow::Result<(f64, u64)> {
    // Start every arm from the same allocator state: everything in the
    // buddy lists, none on the per-CPU lists (contiguity otherwise depends
    // on which arm ran before).
    m.mem.drain_all_pages();
    let c = m.bind(0).map_err(|e| anyhow!("bind: {e}"))?;
    c.new_mm().map_err(|e| anyhow!("mm: {e}"))?;
    // A file-backed region's file stays open until the end, as a
    // program keeps its descriptor (the unmap does not evict it).
    let (addr, _open_file) = match backing {
        Backing::File => {
            let (addr, f) = engine_populate_file(m, &c, case, len)?;
            (addr, Some(f))
        }
        Backing::Shmem => {
            let (addr, f) = engine_populate_shmem(m, &c, case, len)?;
            (addr, Some(f))
        }
        Backing::Anon => (engine_populate(m, &c, case, len)?, None),
    };
    op.set_batching(m, on);
    if op == Op::Cow {
        // Untimed: the fork that write-protects the parent's PTEs, and the
        // child's exit, which leaves the parent the folios' only mapper.
        let parent = c.mm().map_err(|e| anyhow!("{e}"))?;
        let child = c.fork().map_err(|e| anyhow!("fork: {e}"))?;
        c.switch_mm(&child);
        c.exit_mm().map_err(|e| anyhow!("child exit: {e}"))?;
        c.switch_mm(&parent);
    }
    let allocated = || m.vmstat().event(usermm::vmstat::Event::PGALLOC);
    let before = allocated();
    let t = Instant::now();
    let child = match op {
        Op::Munmap => {
            c.munmap(addr, len).map_err(|e| anyhow!("munmap: {e}"))?;
            None
        }
        Op::Dontneed => {
            c.madvise(addr, len, MADV_DONTNEED)
                .map_err(|e| anyhow!("madvise: {e}"))?;
            None
        }
        Op::Fork => Some(c.fork().map_err(|e| anyhow!("fork: {e}"))?),
        Op::Cow => {
            c.touch_pages(addr, addr + len, 2)
                .map_err(|e| anyhow!("write: {e}"))?;
            None
        }
    };
    let dt = t.elapsed().as_secs_f64();
    let pages = allocated() - before;
    if let Some(child) = child {
        let parent = c.mm().map_err(|e| anyhow!("{e}"))?;
        c.switch_mm(&child);
        c.exit_mm().map_err(|e| anyhow!("child exit: {e}"))?;
        c.switch_mm(&parent);
    }
    c.exit_mm().map_err(|e| anyhow!("exit: {e}"))?;
    m.rcu_barrier();
    Ok((dt, pages))
}

/// Map `len` bytes and populate them by write faults with folios of the
/// case's size, checking through the mTHP counters that the engine gave
/// that size; for 2M mapped by PTEs, split every PMD mapping afterwards.
fn engine_populate(m: &Machine, c: &OnCpu, case: Case, len: u64) -> anyhow::Result<u64> {
    m.thp.only_order(case.order());
    let addr = c
        .mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS)
        .map_err(|e| anyhow!("mmap: {e}"))?;
    let before = m.vmstat().mthp(case.order(), MthpStat::ANON_FAULT_ALLOC);
    c.touch_pages(addr, addr + len, 1)
        .map_err(|e| anyhow!("populate: {e}"))?;
    if case.kb > 4 {
        let got = m.vmstat().mthp(case.order(), MthpStat::ANON_FAULT_ALLOC) - before;
        anyhow::ensure!(
            got as u64 == len / (case.kb << 10),
            "the engine gave {got} folios of {}K, not {}",
            case.kb,
            len / (case.kb << 10)
        );
    }
    if case.kb == 2048 && !case.pmd {
        for blk in (addr..addr + len).step_by(2 << 20) {
            c.mprotect(blk + 4096, 4096, PROT_READ)
                .and_then(|_| c.mprotect(blk + 4096, 4096, PROT_READ | PROT_WRITE))
                .map_err(|e| anyhow!("mprotect: {e}"))?;
        }
    }
    let thp_pages = m.vmstat().node(NodeStat::NR_ANON_THPS) as u64;
    let want = if case.pmd { len >> 12 } else { 0 };
    anyhow::ensure!(
        thp_pages == want,
        "{}: {thp_pages} pages PMD-mapped, expected {want}",
        case.label()
    );
    Ok(addr)
}

/// Write a file of `len` bytes in writes of the case's folio size (the
/// page cache's folios then have that size), map it private and
/// read-only, and read-fault every page: the folios mapped by PTEs, or a
/// PMD-sized one by its PMD (by PTEs with `MADV_NOHUGEPAGE` first),
/// checked through the page cache and the counters.
fn engine_populate_file(
    m: &Machine,
    c: &OnCpu,
    case: Case,
    len: u64,
) -> anyhow::Result<(u64, std::sync::Arc<usermm::fs::File>)> {
    use usermm::fs::{FMode, File, FsKind};
    let inode = m.create_file(FsKind::Ext4, 0);
    let mode = FMode {
        read: true,
        write: true,
    };
    let file = File::open(&inode, mode).map_err(|e| anyhow!("open: {e}"))?;
    let chunk = case.kb << 10;
    let buf = vec![1u8; chunk as usize];
    let mut pos = 0;
    while pos < len {
        let n = chunk.min(len - pos);
        c.pwrite(&file, pos, &buf[..n as usize])
            .map_err(|e| anyhow!("write: {e}"))?;
        pos += n;
    }
    c.fsync(&file).map_err(|e| anyhow!("fsync: {e}"))?;
    let wrong = file
        .mapping()
        .folios()
        .into_iter()
        .filter(|(_, f)| f.order(&m.mem) != case.order())
        .count();
    anyhow::ensure!(wrong == 0, "{wrong} page-cache folios not of {}K", case.kb);
    let addr = c
        .mmap_file(0, len, PROT_READ, MAP_PRIVATE, Some(&file), 0)
        .map_err(|e| anyhow!("mmap: {e}"))?;
    if case.kb == 2048 && !case.pmd {
        c.madvise(addr, len, usermm::madvise::MADV_NOHUGEPAGE)
            .map_err(|e| anyhow!("madvise: {e}"))?;
    }
    for p in (addr..addr + len).step_by(4096) {
        c.load_u8(p).map_err(|e| anyhow!("read: {e}"))?;
    }
    let mm = c.mm().map_err(|e| anyhow!("{e}"))?;
    let rss = mm.get_rss(usermm::mm::MmCounter::FilePages) as u64;
    anyhow::ensure!(rss == len >> 12, "{rss} file pages mapped of {}", len >> 12);
    let pmd_pages = m.vmstat().node(NodeStat::NR_FILE_PMDMAPPED) as u64;
    let want = if case.pmd { len >> 12 } else { 0 };
    anyhow::ensure!(
        pmd_pages == want,
        "{}: {pmd_pages} file pages PMD-mapped, expected {want}",
        case.label()
    );
    Ok((addr, file))
}

/// Map `len` bytes of shared anonymous memory with the case's size the
/// only one shmem may take (`shmem_enabled` always), write-fault every
/// page, and check through the counters that every folio has that size
/// and is mapped by PTEs or by its PMD as the case wants (2M by PTEs: the
/// range is `MADV_NOHUGEPAGE` and its mappings zapped, so that the
/// faults map the cached THPs by PTEs). Returns the region and its shmem
/// file, held so that the unmap does not also evict it.
fn engine_populate_shmem(
    m: &Machine,
    c: &OnCpu,
    case: Case,
    len: u64,
) -> anyhow::Result<(u64, std::sync::Arc<usermm::fs::File>)> {
    m.thp
        .only_shmem_order(if case.kb > 4 { case.order() } else { 0 });
    let addr = c
        .mmap(0, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS)
        .map_err(|e| anyhow!("mmap: {e}"))?;
    let before = m.vmstat().mthp(case.order(), MthpStat::SHMEM_ALLOC);
    c.touch_pages(addr, addr + len, 1)
        .map_err(|e| anyhow!("populate: {e}"))?;
    if case.kb > 4 {
        let got = m.vmstat().mthp(case.order(), MthpStat::SHMEM_ALLOC) - before;
        anyhow::ensure!(
            got as u64 == len / (case.kb << 10),
            "the engine gave {got} shmem folios of {}K, not {}",
            case.kb,
            len / (case.kb << 10)
        );
    }
    if case.kb == 2048 && !case.pmd {
        c.madvise(addr, len, usermm::madvise::MADV_NOHUGEPAGE)
            .and_then(|_| c.madvise(addr, len, usermm::madvise::MADV_DONTNEED))
            .map_err(|e| anyhow!("madvise: {e}"))?;
        c.touch_pages(addr, addr + len, 1)
            .map_err(|e| anyhow!("populate: {e}"))?;
    }
    let mm = c.mm().map_err(|e| anyhow!("{e}"))?;
    let rss = mm.get_rss(usermm::mm::MmCounter::ShmemPages) as u64;
    anyhow::ensure!(
        rss == len >> 12,
        "{rss} shmem pages mapped of {}",
        len >> 12
    );
    let pmd_pages = m.vmstat().node(NodeStat::NR_SHMEM_PMDMAPPED) as u64;
    let want = if case.pmd { len >> 12 } else { 0 };
    anyhow::ensure!(
        pmd_pages == want,
        "{}: {pmd_pages} shmem pages PMD-mapped, expected {want}",
        case.label()
    );
    let file = {
        let _mmap = mm.mmap_lock.read();
        let guard = usermm::sync::epoch::pin();
        mm.vma_tree(&guard)
            .vma_lookup(addr)
            .and_then(|v| v.file().cloned())
    };
    let file = file.ok_or_else(|| anyhow!("no shmem file at {addr:#x}"))?;
    Ok((addr, file))
}

/// The same on the host kernel (knobs already set): Err explains why the
/// timing cannot be trusted.
fn host_once(op: Op, case: Case, len: usize, backing: Backing) -> Result<f64, String> {
    match backing {
        Backing::File => return host_once_file(op, case, len),
        Backing::Shmem => return host_once_shmem(op, case, len),
        Backing::Anon => {}
    }
    let before = native::anon_fault_alloc(case.kb);
    let mut r = native::HostRegion::populate(len, case.kb == 2048 && !case.pmd);
    if case.kb > 4 {
        let got = native::anon_fault_alloc(case.kb) - before;
        if got < (len as u64 / (case.kb << 10)) * 9 / 10 {
            return Err(format!("host gave {got} folios of {}K", case.kb));
        }
    }
    if case.kb == 2048 {
        let thp_kb = native::smaps_range_kb(r.ptr as usize, len, "AnonHugePages").unwrap_or(0);
        let pmd_mapped = thp_kb >= (len as u64 >> 10) * 9 / 10;
        if pmd_mapped != case.pmd {
            return Err(format!("host has {thp_kb} kB PMD-mapped"));
        }
    }
    Ok(match op {
        Op::Munmap => r.munmap(),
        Op::Dontneed => r.dontneed(),
        Op::Fork => r.fork(),
        Op::Cow => r.write_after_fork(),
    })
}

/// [`host_once`] over a file mapping ([`native::HostRegion::populate_file`]),
/// its mapping checked in smaps: every page resident, and PMD-mapped
/// exactly for the PMD case.
fn host_once_file(op: Op, case: Case, len: usize) -> Result<f64, String> {
    let nohuge = case.kb == 2048 && !case.pmd;
    let mut r = native::HostRegion::populate_file(len, (case.kb << 10) as usize, nohuge)
        .map_err(|e| format!("host file: {e}"))?;
    let rss = native::smaps_range_kb(r.ptr as usize, len, "Rss").unwrap_or(0);
    if rss < (len as u64 >> 10) * 9 / 10 {
        return Err(format!("host mapped {rss} kB of the file"));
    }
    let pmd_kb = native::smaps_range_kb(r.ptr as usize, len, "FilePmdMapped").unwrap_or(0);
    if (pmd_kb >= (len as u64 >> 10) * 9 / 10) != case.pmd {
        return Err(format!("host has {pmd_kb} kB of the file PMD-mapped"));
    }
    Ok(match op {
        Op::Munmap => r.munmap(),
        Op::Dontneed => r.dontneed(),
        Op::Fork | Op::Cow => unreachable!("--backing file is refused for {}", op.name()),
    })
}

/// [`host_once`] over shared anonymous memory
/// ([`native::HostRegion::populate_shmem`]), checked in the mTHP counter
/// and smaps: every folio of the case's size, every page resident, and
/// PMD-mapped exactly for the PMD case.
fn host_once_shmem(op: Op, case: Case, len: usize) -> Result<f64, String> {
    let before = native::mthp_stat(case.kb, "shmem_alloc");
    let nohuge = case.kb == 2048 && !case.pmd;
    let mut r =
        native::HostRegion::populate_shmem(len, nohuge).map_err(|e| format!("host shmem: {e}"))?;
    if case.kb > 4 {
        let got = native::mthp_stat(case.kb, "shmem_alloc") - before;
        if got < (len as u64 / (case.kb << 10)) * 9 / 10 {
            return Err(format!("host gave {got} shmem folios of {}K", case.kb));
        }
    }
    let rss = native::smaps_range_kb(r.ptr as usize, len, "Rss").unwrap_or(0);
    if rss < (len as u64 >> 10) * 9 / 10 {
        return Err(format!("host mapped {rss} kB of the shmem"));
    }
    let pmd_kb = native::smaps_range_kb(r.ptr as usize, len, "ShmemPmdMapped").unwrap_or(0);
    if (pmd_kb >= (len as u64 >> 10) * 9 / 10) != case.pmd {
        return Err(format!("host has {pmd_kb} kB of the shmem PMD-mapped"));
    }
    Ok(match op {
        Op::Munmap => r.munmap(),
        Op::Dontneed => r.dontneed(),
        Op::Fork | Op::Cow => unreachable!("--backing shmem is refused for {}", op.name()),
    })
}

/// The table in the seeds' shape, with the host beside it.
pub fn print_table(op: Op, rows: &[Row], a: &BenchArgs) {
    let backing = match Backing::of(a) {
        Backing::File => " of a file's page cache (mapped private, read-faulted)",
        Backing::Shmem => " of shared anonymous memory (write-faulted, its file held open)",
        Backing::Anon => "",
    };
    outln!(
        "bench {}: {} MiB of folios of one size{backing}; tunable {} off (baseline) vs on, interleaved; medians of the rounds (runs {})",
        op.name(),
        a.size_mb,
        op.tunable().info().name,
        a.runs()
    );
    let (off, on, on_host) = match op {
        Op::Cow => ("copy(s)", "reuse(s)", "reuse/host"),
        _ => ("baseline(s)", "batched(s)", "bat/host"),
    };
    outln!(
        "{:<10} {:>12} {:>12} {:>20} {:>8} {:>12} {:>9}",
        "folio",
        off,
        on,
        "change [95% CI]",
        "seed",
        "host(s)",
        on_host
    );
    for r in rows {
        let seed = r
            .seed_change_pct
            .map_or("-".into(), |c| format!("{c:+.0}%"));
        let host = r.host_s.map_or("-".into(), |h| format!("{h:.6}"));
        let bh = r
            .batched_host_ratio
            .map_or("-".into(), |q| format!("{q:.2}"));
        outln!(
            "{:<10} {:>12.6} {:>12.6} {:>20} {:>8} {:>12} {:>9}  {}",
            r.label(),
            r.baseline_s,
            r.batched_s,
            r.estimate().change_pct(),
            seed,
            host,
            bh,
            r.pages_allocated.map_or_else(
                || r.host_note.clone().unwrap_or_default(),
                |p| format!("pages allocated {} / {}", p.baseline, p.batched)
            )
        );
    }
    let n: Vec<usize> = rows.iter().map(|r| r.runs).collect();
    let (lo, hi) = (n.iter().min(), n.iter().max());
    if let (Some(lo), Some(hi)) = (lo, hi) {
        let rounds = if lo == hi {
            format!("{lo} rounds")
        } else {
            format!("{lo} to {hi} rounds")
        };
        outln!("{}", super::stats::footnote(&rounds));
    }
}

/// One batching experiment: the runs, the table, the plot, the JSON.
fn experiment(a: &BenchArgs, op: Op) -> anyhow::Result<serde_json::Value> {
    let name = op.name();
    let (rows, machine) = run(a, op)?;
    if !a.json {
        print_table(op, &rows, a);
        outln!("machine: {machine}");
        outln!();
    }
    let labels: Vec<String> = rows.iter().map(|r| r.label()).collect();
    let (what, change) = match op {
        Op::Cow => ("reuse vs copy", "reuse of large folios"),
        _ => ("batched vs baseline", "PTE batching"),
    };
    let mut series = vec![plot::Series {
        label: format!("usermm: {what}"),
        points: rows
            .iter()
            .enumerate()
            .map(|(i, r)| (i, (r.ratio - 1.0) * 100.0))
            .collect(),
        dashed: false,
    }];
    let seed: Vec<(usize, f64)> = rows
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.seed_change_pct.map(|c| (i, c)))
        .collect();
    if !seed.is_empty() {
        series.push(plot::Series {
            label: "seed (v6.9 series, Xeon 4210R)".into(),
            points: seed,
            dashed: true,
        });
    }
    plot::change_plot(
        &a.out.join(format!("{name}.svg")),
        &format!("{name}: change with {change}, {} MiB", a.size_mb),
        &labels,
        ("folio size", "change (%)"),
        &series,
    )?;
    Ok(serde_json::json!({
        "experiment": name,
        "backing": a.backing,
        "tunable": op.tunable().info().name,
        "machine": machine,
        "size_mb": a.size_mb,
        "runs": a.runs().to_string(),
        "rows": rows,
    }))
}
