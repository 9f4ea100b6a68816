//! `usermm stress`: a long randomized run with every oracle on.
//!
//! CPU 0 is the operator: it runs random mmap (MAP_FIXED, some with
//! MAP_NORESERVE, MAP_POPULATE, MAP_GROWSDOWN or MAP_STACK), munmap,
//! mprotect, madvise (MADV_COLLAPSE among them), the mlock family,
//! mremap (moves within the window,
//! some leaving the old range empty, and shrinks), brk (the first process
//! is given its heap in the window's top quarter, as exec would give it a
//! `start_brk`; children inherit it), fork, exec of this program by a
//! child, exit,
//! context switches between the processes, `move_pages` and `mbind`
//! between the nodes, THP knob, NUMA-balancing, tunable and overcommit
//! changes, and loads and stores of its own; and, in a window of their
//! own, mappings of four files (ext4 with PMD-sized and with small folios,
//! tmpfs, a memfd), shared and private, with msync, ftruncate, writes and
//! MADV_PAGEOUT among them. Every other CPU is a thread of the first
//! process and loads and stores at random in both windows all the while. Every access goes through the shadow memory, which checks each
//! loaded value against the history of stores and zaps; at quiescent points
//! (the accessors parked, page tables freed after their grace period) the
//! invariant checker runs over the whole machine. A watchdog ends the run if
//! nothing progresses for too long. At the end every process exits and the
//! machine must have every frame back and nothing committed.
//!
//! The operator's sequence is reproducible from the seed; its interleaving
//! with the accessors is not.
//!
//! Exit status: 0 clean, 1 a violation, a broken invariant, a leak or an
//! unexpected error, 3 a stall.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use usermm::check::shadow::Shadow;
use usermm::madvise::{
    MADV_COLLAPSE, MADV_DONTNEED, MADV_FREE, MADV_HUGEPAGE, MADV_NOHUGEPAGE, MADV_NORMAL,
    MADV_POPULATE_READ, MADV_POPULATE_WRITE,
};
use usermm::mm::Mm;
use usermm::mmap::*;
use usermm::{Errno, Machine, MachineConfig, OnCpu, ThpMode};

use crate::machine_args::MachineArgs;

#[derive(clap::Args)]
pub struct StressArgs {
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Seed of the operator's random sequence.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Seconds without progress after which the watchdog ends the run.
    #[arg(long, default_value_t = 60)]
    pub stall_seconds: u64,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// The machine (default: a 256 MiB DRAM node with 4 CPUs and a 256 MiB
    /// slow node); CPU 0 operates, the others access memory.
    #[command(flatten)]
    pub machine: MachineArgs,
}

/// Where each process's mappings live: a fixed window, so that operations
/// and accesses meet.
const WINDOW: u64 = 0x6000_0000_0000;
const WINDOW_LEN: u64 = 32 << 20;
/// Where file, shmem and memfd mappings are made: beside the anonymous
/// window, which the shadow memory checks. Accesses here are made without
/// it (a shared mapping's words are the file's, not the address space's):
/// the invariant checker and the leak check are their oracles.
const FILE_WINDOW: u64 = 0x6100_0000_0000;
const FILE_WINDOW_LEN: u64 = 16 << 20;
/// Where the first process's heap starts: brk moves its break within
/// [`HEAP_START`, `HEAP_START + HEAP_LEN`), below it now and then (refused).
const HEAP_START: u64 = WINDOW + WINDOW_LEN - HEAP_LEN;
const HEAP_LEN: u64 = WINDOW_LEN / 4;
/// The size of each of the stress's files.
const FILE_SIZE: u64 = 4 << 20;
const PAGE: u64 = 4096;
/// Children alive at once, besides the first process.
const MAX_CHILDREN: usize = 3;
/// An accessor with no access under way ([`Control::accessor_at`]).
const IDLE: u64 = u64::MAX;
/// Operations between invariant checks.
const CHECK_EVERY: u64 = 256;
/// How long a check waits for kswapd to finish its run.
const KSWAPD_WAIT: Duration = Duration::from_secs(10);

/// What the accessor threads and the watchdog share with the operator.
#[derive(Default)]
struct Control {
    stop: AtomicBool,
    /// The operator wants the accessors parked (quiescent machine).
    pause: AtomicBool,
    parked: AtomicUsize,
    /// Bumped by every operation of the operator.
    progress: AtomicU64,
    /// Bumped by each accessor (by CPU) every 1,024 accesses and while it
    /// is parked: the watchdog wants every thread alive, not only some.
    accessor_progress: Vec<AtomicU64>,
    /// The address each accessor (by CPU) has a load or store of under
    /// way, or `IDLE`: where a stalled run's threads were.
    accessor_at: Vec<AtomicU64>,
    stores: AtomicU64,
    /// An accessor's unexpected error, which fails the run.
    failure: Mutex<Option<String>>,
    last_op: Mutex<String>,
}

#[derive(Default, serde::Serialize)]
struct Summary {
    seconds: f64,
    seed: u64,
    machine: String,
    operations: u64,
    by_kind: BTreeMap<&'static str, u64>,
    errors_returned: BTreeMap<String, u64>,
    loads_checked: u64,
    stores: u64,
    invariant_checks: u64,
    violations: usize,
    leaked_frames: i64,
    /// Pages MIGRC still kept after the last exit, given back by a final
    /// flush before the frames are counted (a kept source is not a leak:
    /// the next batched flush would release it).
    migrc_kept_at_end: u64,
    /// The first leaked frames, each with its flags and refcount.
    leaked: Vec<String>,
    committed_left_pages: u64,
    failure: Option<String>,
}

/// Two tiers, so that pages migrate between them (move_pages, mbind, NUMA
/// balancing's promotions).
fn default_machine() -> MachineConfig {
    MachineConfig::two_tiers(256 << 20, 256 << 20, 4)
}

pub fn run(a: StressArgs) -> anyhow::Result<i32> {
    let config = a.machine.config(default_machine())?;
    if config.cpus.len() < 2 {
        anyhow::bail!("machine: stress needs at least 2 CPUs (one operates, the others access)");
    }
    let m = Machine::new(config).map_err(|e| anyhow::anyhow!("machine: {e}"))?;
    let free0 = m.mem.nr_free_pages();
    let held0 = held_frames(&m);
    let ctl = Control {
        accessor_progress: (0..m.cpus.len()).map(|_| AtomicU64::new(0)).collect(),
        accessor_at: (0..m.cpus.len()).map(|_| AtomicU64::new(IDLE)).collect(),
        ..Default::default()
    };
    let shadow = Shadow::new();
    let nr_accessors = m.cpus.len() - 1;
    let t = Instant::now();
    let mut sum = Summary {
        seed: a.seed,
        machine: m.config.to_string(),
        ..Default::default()
    };
    let c0 = m.bind(0).map_err(|e| anyhow::anyhow!("bind: {e}"))?;
    let main = c0.new_mm().map_err(|e| anyhow::anyhow!("mm: {e}"))?;
    {
        let g = main.mmap_lock.write();
        main.set_layout(&g, |l| (l.start_brk, l.brk) = (HEAP_START, HEAP_START));
    }
    let files = make_files(&c0)?;
    let watchdog_stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let accessors: Vec<_> = (1..=nr_accessors)
            .map(|id| {
                let (m, main, ctl, shadow) = (&m, main.clone(), &ctl, &shadow);
                let seed = a.seed.wrapping_mul(1000).wrapping_add(id as u64);
                s.spawn(move || accessor(m, id, &main, ctl, shadow, seed))
            })
            .collect();
        s.spawn(|| watchdog(&ctl, &watchdog_stop, a.stall_seconds));
        let mut op = Operator {
            c: &c0,
            shadow: &shadow,
            ctl: &ctl,
            rng: SmallRng::seed_from_u64(a.seed),
            main: main.clone(),
            cur: main.clone(),
            children: vec![],
            seq: 0,
            sum: &mut sum,
            recent: Default::default(),
            files,
        };
        let deadline = Duration::from_secs(a.seconds);
        let result = op.run(deadline, nr_accessors);
        ctl.stop.store(true, Ordering::Relaxed);
        for h in accessors {
            if h.join().is_err() {
                op.sum
                    .failure
                    .get_or_insert_with(|| "an accessor panicked".into());
            }
        }
        if let Err(e) = result {
            op.sum.failure = Some(e);
        }
        // No thread of the first process runs any more: everyone exits.
        op.exit_all();
        watchdog_stop.store(true, Ordering::Relaxed);
    });
    drop(main);
    c0.idle();
    drop(c0);
    sum.seconds = t.elapsed().as_secs_f64();
    // A kswapd still reclaiming holds what it works on (an address space
    // found by the reverse map keeps its PGD): wait for it before counting.
    let kswapd_idle = m.kswapd_wait_idle(KSWAPD_WAIT);
    m.rcu_barrier();
    if sum.failure.is_none() {
        if let Some(f) = ctl.failure.lock().unwrap().take() {
            sum.failure = Some(f);
        } else if !kswapd_idle {
            sum.failure = Some(format!(
                "kswapd still busy after {KSWAPD_WAIT:?} at the end"
            ));
        } else {
            sum.invariant_checks += 1;
            if let Err(e) = usermm::check::check_invariants(&m) {
                sum.failure = Some(format!("after the last exit: {e}"));
            }
        }
    }
    // What the CPUs' LRU batches still hold goes first (folios whose
    // last mapping is gone wait there for their batch to drain).
    usermm::swap::lru_add_drain_all(&m.mem, m.mem.vmstat.no_cpu());
    // The huge zero folio stays allocated once made, as in the kernel.
    let huge_zero = m
        .huge_zero_pfn_if_allocated()
        .map_or(0, |_| usermm::phys::HPAGE_PMD_NR);
    sum.leaked_frames = free0 as i64 - m.mem.nr_free_pages() as i64 - huge_zero as i64;
    if sum.leaked_frames != 0 {
        sum.leaked = describe_leaked(&m, &held0);
    }
    sum.committed_left_pages = m.overcommit.vm_memory_committed();
    sum.loads_checked = shadow.loads_checked();
    sum.stores = ctl.stores.load(Ordering::Relaxed);
    let violations = shadow.violations();
    sum.violations = violations.len();
    let pass = sum.failure.is_none()
        && sum.violations == 0
        && sum.leaked_frames == 0
        && sum.committed_left_pages == 0;
    if a.json {
        outln!("{}", serde_json::to_string(&sum)?);
    } else {
        print_summary(&sum, pass);
    }
    for v in violations.iter().take(5) {
        eprint!("{v}");
    }
    Ok(if pass { 0 } else { 1 })
}

fn print_summary(s: &Summary, pass: bool) {
    let kinds: Vec<String> = s.by_kind.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let errs: Vec<String> = s
        .errors_returned
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    outln!(
        "stress: {:.0} s, seed {}, machine: {}",
        s.seconds,
        s.seed,
        s.machine
    );
    outln!("operations: {} ({})", s.operations, kinds.join(", "));
    outln!(
        "errors returned (expected kinds): {}",
        if errs.is_empty() {
            "none".into()
        } else {
            errs.join(", ")
        }
    );
    outln!(
        "loads checked: {}, stores: {}, invariant checks: {}",
        s.loads_checked,
        s.stores,
        s.invariant_checks
    );
    outln!(
        "violations: {}, leaked frames: {}, committed pages left: {}",
        s.violations,
        s.leaked_frames,
        s.committed_left_pages
    );
    if s.migrc_kept_at_end > 0 {
        outln!(
            "MIGRC kept {} pages at the end (released by a final flush)",
            s.migrc_kept_at_end
        );
    }
    for l in &s.leaked {
        outln!("leaked: {l}");
    }
    if let Some(f) = &s.failure {
        outln!("failure: {f}");
    }
    outln!("{}", if pass { "PASS" } else { "FAIL" });
}

/// The frames that are not free (in the buddy or per-CPU lists).
fn held_frames(m: &Machine) -> std::collections::HashSet<u64> {
    let mut free = std::collections::HashSet::new();
    m.mem
        .for_each_free_block(|head, order| free.extend(head..head + (1 << order)));
    m.mem
        .nodes
        .iter()
        .flat_map(|n| n.start_pfn()..n.start_pfn() + n.nr_pages)
        .filter(|p| !free.contains(p))
        .collect()
}

/// The frames held now that were free at the start (the huge zero folio
/// aside), the first few described.
fn describe_leaked(m: &Machine, held0: &std::collections::HashSet<u64>) -> Vec<String> {
    let huge_zero = m
        .huge_zero_pfn_if_allocated()
        .map(|hz| hz..hz + usermm::phys::HPAGE_PMD_NR);
    let mut leaked: Vec<u64> = held_frames(m)
        .into_iter()
        .filter(|p| !held0.contains(p) && !huge_zero.as_ref().is_some_and(|r| r.contains(p)))
        .collect();
    leaked.sort_unstable();
    leaked
        .iter()
        .take(8)
        .map(|&pfn| {
            let page = m.mem.page(pfn);
            format!(
                "frame {pfn:#x}: flags {:#x}, refcount {}, mapcount {}, mapping {:#x}",
                page.flags.load(Ordering::Relaxed),
                page.refcount.load(Ordering::Relaxed),
                page.mapcount.load(Ordering::Relaxed),
                page.mapping.load(Ordering::Relaxed)
            )
        })
        .collect()
}

/// A thread of the first process: loads and stores at random in the window,
/// a few hot words per 64 KiB so that they meet the operator's changes.
fn accessor(m: &Machine, id: usize, main: &Arc<Mm>, ctl: &Control, shadow: &Shadow, seed: u64) {
    let Ok(c) = m.bind(id) else {
        *ctl.failure.lock().unwrap() = Some(format!("CPU {id} could not be bound"));
        return;
    };
    // A panic here stops the run instead of leaving the operator waiting
    // for this CPU to park.
    let _stop = StopOnDrop(&ctl.stop);
    c.switch_mm(main);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut seq = 0u64;
    let mut n = 0u64;
    while !ctl.stop.load(Ordering::Relaxed) {
        if ctl.pause.load(Ordering::Acquire) {
            park(&c, ctl);
            ctl.accessor_progress[id].fetch_add(1, Ordering::Relaxed);
            continue;
        }
        if rng.gen_bool(0.125) {
            if let Err(e) = file_window_access(&c, &mut rng, ((id as u64) << 56) | seq) {
                *ctl.failure.lock().unwrap() = Some(format!("CPU {id}: {e}"));
                ctl.stop.store(true, Ordering::Relaxed);
            }
            continue;
        }
        let addr = WINDOW + rng.gen_range(0..WINDOW_LEN / 65536) * 65536 + rng.gen_range(0..4) * 8;
        ctl.accessor_at[id].store(addr, Ordering::Relaxed);
        let r = if rng.gen_bool(0.5) {
            seq += 1;
            ctl.stores.fetch_add(1, Ordering::Relaxed);
            shadow.store_u64(&c, addr, ((id as u64) << 56) | seq)
        } else {
            shadow.load_u64(&c, addr).map(|_| ())
        };
        ctl.accessor_at[id].store(IDLE, Ordering::Relaxed);
        match r {
            Ok(()) | Err(Errno::EFAULT) | Err(Errno::ENOMEM) => {}
            Err(e) => {
                *ctl.failure.lock().unwrap() = Some(format!("CPU {id}: access at {addr:#x}: {e}"));
                ctl.stop.store(true, Ordering::Relaxed);
            }
        }
        n += 1;
        if n.is_multiple_of(1024) {
            ctl.accessor_progress[id].fetch_add(1, Ordering::Relaxed);
        }
    }
    c.exit_thread();
}

/// A load or a store at a random word of the file window, unchecked: the
/// answers a mapping there may give (EFAULT where nothing or no access
/// is mapped, SIGBUS past a truncated file's end, ENOMEM) are allowed.
fn file_window_access(c: &OnCpu, rng: &mut SmallRng, v: u64) -> Result<(), String> {
    let addr =
        FILE_WINDOW + rng.gen_range(0..FILE_WINDOW_LEN / PAGE) * PAGE + rng.gen_range(0..4) * 8;
    let r = if rng.gen_bool(0.5) {
        c.store_u64(addr, v)
    } else {
        c.load_u64(addr).map(|_| ())
    };
    match r {
        Ok(()) | Err(Errno::EFAULT) | Err(Errno::ENOMEM) | Err(Errno::SIGBUS) => Ok(()),
        Err(e) => Err(format!("access at {addr:#x} of the file window: {e}")),
    }
}

/// The stress's files: an ext4 file written in one write (PMD-sized
/// folios), one written in 4K writes (small folios), a tmpfs file and a
/// memfd (shmem), each [`FILE_SIZE`] bytes.
fn make_files(c: &OnCpu) -> anyhow::Result<Vec<Arc<usermm::fs::File>>> {
    use usermm::fs::{FMode, File, FsKind};
    let rw = FMode {
        read: true,
        write: true,
    };
    let mut files = vec![];
    for (kind, chunk) in [
        (FsKind::Ext4, FILE_SIZE),
        (FsKind::Ext4, PAGE),
        (FsKind::Tmpfs, FILE_SIZE),
    ] {
        let inode = c.m.create_file(kind, 0);
        let f = File::open(&inode, rw).map_err(|e| anyhow::anyhow!("open: {e}"))?;
        let buf = vec![0x5au8; chunk as usize];
        for pos in (0..FILE_SIZE).step_by(chunk as usize) {
            c.pwrite(&f, pos, &buf)
                .map_err(|e| anyhow::anyhow!("write: {e}"))?;
        }
        files.push(f);
    }
    let memfd = c
        .memfd_create()
        .map_err(|e| anyhow::anyhow!("memfd: {e}"))?;
    c.ftruncate(&memfd, FILE_SIZE)
        .map_err(|e| anyhow::anyhow!("ftruncate: {e}"))?;
    files.push(memfd);
    Ok(files)
}

/// Sets the flag when dropped, also while unwinding.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Wait, out of user mode, while the operator wants the machine quiet.
fn park(c: &OnCpu, ctl: &Control) {
    c.idle();
    // Release: the operator's Acquire load of `parked` sees this CPU out of
    // user mode (its idle() done) before it starts checking.
    ctl.parked.fetch_add(1, Ordering::Release);
    while ctl.pause.load(Ordering::Acquire) && !ctl.stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_micros(200));
    }
    ctl.parked.fetch_sub(1, Ordering::Release);
}

/// End the process if the operator, or any accessor, makes no progress for
/// `stall` seconds (one stuck thread while the others run is a stall too:
/// the run would never end).
fn watchdog(ctl: &Control, done: &AtomicBool, stall: u64) {
    // The operator's counter, then each accessor's (CPU 0's is unused).
    let counters = || {
        std::iter::once(&ctl.progress)
            .chain(ctl.accessor_progress.iter().skip(1))
            .map(|c| c.load(Ordering::Relaxed))
            .collect::<Vec<u64>>()
    };
    let mut last: Vec<(u64, Instant)> = counters()
        .into_iter()
        .map(|p| (p, Instant::now()))
        .collect();
    while !done.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(200));
        for (who, (p, (seen, at))) in counters().into_iter().zip(last.iter_mut()).enumerate() {
            if p != *seen {
                *seen = p;
                *at = Instant::now();
            } else if at.elapsed() > Duration::from_secs(stall) {
                let op = ctl.last_op.lock().map(|s| s.clone()).unwrap_or_default();
                let thread = if who == 0 {
                    "the operator".to_string()
                } else {
                    format!("the accessor on CPU {who}")
                };
                let at: Vec<String> = ctl
                    .accessor_at
                    .iter()
                    .enumerate()
                    .skip(1)
                    .map(|(cpu, a)| match a.load(Ordering::Relaxed) {
                        IDLE => format!("CPU {cpu} between accesses"),
                        a => format!("CPU {cpu} in an access at {a:#x}"),
                    })
                    .collect();
                eprintln!(
                    "stress: stalled: no progress by {thread} for {stall} s; the operator's last operation: {op}; {}",
                    at.join(", ")
                );
                std::process::exit(3);
            }
        }
    }
}

struct Operator<'a, 'm> {
    c: &'a OnCpu<'m>,
    shadow: &'a Shadow,
    ctl: &'a Control,
    rng: SmallRng,
    /// The first process, which the accessors run; it never exits.
    main: Arc<Mm>,
    /// The process CPU 0 runs now.
    cur: Arc<Mm>,
    children: Vec<Arc<Mm>>,
    seq: u64,
    sum: &'a mut Summary,
    /// The latest operations with their span on the shadow memory's clock,
    /// shown when a violation is found.
    recent: std::collections::VecDeque<(u64, u64, String)>,
    /// The files the file window maps.
    files: Vec<Arc<usermm::fs::File>>,
}

/// Operations kept in [`Operator::recent`].
const RECENT: usize = 512;

impl Operator<'_, '_> {
    fn run(&mut self, deadline: Duration, nr_accessors: usize) -> Result<(), String> {
        let t = Instant::now();
        while t.elapsed() < deadline && !self.ctl.stop.load(Ordering::Relaxed) {
            let t0 = self.shadow.now();
            let kind = self.step()?;
            let op = self
                .ctl
                .last_op
                .lock()
                .map(|s| s.clone())
                .unwrap_or_default();
            if self.recent.len() == RECENT {
                self.recent.pop_front();
            }
            self.recent.push_back((t0, self.shadow.now(), op));
            self.sum.operations += 1;
            *self.sum.by_kind.entry(kind).or_default() += 1;
            self.ctl.progress.fetch_add(1, Ordering::Relaxed);
            if self.sum.operations.is_multiple_of(CHECK_EVERY) {
                self.check(nr_accessors)?;
            }
        }
        self.check(nr_accessors)
    }

    /// Park the accessors, wait for freed page tables, run the checker.
    fn check(&mut self, nr_accessors: usize) -> Result<(), String> {
        self.set_last_op("invariant check".into());
        // Out of user mode first: an accessor's fault may be waiting for
        // this CPU to acknowledge a TLB shootdown before it can park.
        self.c.idle();
        self.ctl.pause.store(true, Ordering::Release);
        while self.ctl.parked.load(Ordering::Acquire) < nr_accessors {
            if self.ctl.stop.load(Ordering::Relaxed) {
                break;
            }
            std::thread::yield_now();
        }
        // kswapd too: its reclaim holds folios, mms and locks while it
        // runs, which a check would see half done.
        let r = if self.c.m.kswapd_wait_idle(KSWAPD_WAIT) {
            self.c.m.rcu_barrier();
            usermm::check::check_invariants(self.c.m)
        } else {
            Err(format!("kswapd still busy after {KSWAPD_WAIT:?}"))
        };
        self.sum.invariant_checks += 1;
        self.ctl.pause.store(false, Ordering::Release);
        self.c.switch_mm(&self.cur);
        r.map_err(|e| format!("invariant check {}: {e}", self.sum.invariant_checks))?;
        // Stop at the first violation, while the operations that led to it
        // are still at hand.
        if self.shadow.nr_violations() > 0 {
            let ops: Vec<String> = self
                .recent
                .iter()
                .map(|(a, b, op)| format!("  [{a}, {b}] {op}"))
                .collect();
            let what = self.shadow.verdict().err().unwrap_or_default();
            return Err(format!(
                "the shadow memory found a violation: {what}; the latest operations:\n{}",
                ops.join("\n")
            ));
        }
        Ok(())
    }

    fn set_last_op(&self, s: String) {
        if let Ok(mut g) = self.ctl.last_op.lock() {
            *g = s;
        }
    }

    /// A page-aligned range in the window: mostly small, sometimes whole
    /// PMDs, clipped to the window.
    fn range(&mut self) -> (u64, u64) {
        const LENS: [u64; 8] = [
            4 << 10,
            16 << 10,
            64 << 10,
            256 << 10,
            1 << 20,
            2 << 20,
            4 << 20,
            8 << 20,
        ];
        let len = LENS[self.rng.gen_range(0..LENS.len())];
        let mut start = WINDOW + self.rng.gen_range(0..WINDOW_LEN / PAGE) * PAGE;
        if self.rng.gen_bool(0.3) {
            start &= !((2 << 20) - 1);
        }
        (start, len.min(WINDOW + WINDOW_LEN - start))
    }

    fn note(&mut self, r: Result<(), Errno>) {
        if let Err(e) = r {
            *self
                .sum
                .errors_returned
                .entry(e.name().to_string())
                .or_default() += 1;
        }
    }

    /// One operation on the file window: a mapping of one of the files
    /// (shared or private, at a 2M-aligned offset), munmap, mprotect, an
    /// madvise, msync, a truncate or a write of a file, or accesses.
    fn file_step(&mut self) -> Result<&'static str, String> {
        let c = self.c;
        let mm = self.cur.id;
        const LENS: [u64; 5] = [PAGE, 16 * PAGE, 512 * PAGE, 1 << 20, 4 << 20];
        let len = LENS[self.rng.gen_range(0..LENS.len())];
        let start = FILE_WINDOW
            + self.rng.gen_range(0..FILE_WINDOW_LEN / (2 << 20)) * (2 << 20)
            + if self.rng.gen_bool(0.3) {
                self.rng.gen_range(0..512) * PAGE
            } else {
                0
            };
        let len = len.min(FILE_WINDOW + FILE_WINDOW_LEN - start);
        let fi = self.rng.gen_range(0..self.files.len());
        let file = self.files[fi].clone();
        let kind = match self.rng.gen_range(0..10) {
            0..=2 => {
                let off = self.rng.gen_range(0..2) * (2 << 20);
                let prot = [PROT_READ | PROT_WRITE, PROT_READ][self.rng.gen_range(0..2)];
                let mut flags = [MAP_SHARED, MAP_PRIVATE][self.rng.gen_range(0..2)] | MAP_FIXED;
                if self.rng.gen_bool(0.1) {
                    flags |= MAP_POPULATE;
                }
                if self.rng.gen_bool(0.05) {
                    flags |= usermm::mmap::MAP_LOCKED;
                }
                self.set_last_op(format!(
                    "mm {mm}: mmap {start:#x} {len:#x} prot {prot} flags {flags:#x} file {fi} off {off:#x}"
                ));
                let r = c.mmap_file(start, len, prot, flags, Some(&file), off);
                self.note(r.map(|_| ()));
                "file mmap"
            }
            3 => {
                self.set_last_op(format!("mm {mm}: munmap {start:#x} {len:#x} (file window)"));
                let r = c.munmap(start, len);
                self.note(r);
                "file munmap"
            }
            4 => {
                let prot = [PROT_READ | PROT_WRITE, PROT_READ, PROT_NONE][self.rng.gen_range(0..3)];
                self.set_last_op(format!(
                    "mm {mm}: mprotect {start:#x} {len:#x} {prot} (file window)"
                ));
                let r = c.mprotect(start, len, prot);
                self.note(r);
                "file mprotect"
            }
            5 => {
                use usermm::madvise::{MADV_PAGEOUT, MADV_REMOVE};
                let advice = [
                    MADV_DONTNEED,
                    MADV_PAGEOUT,
                    MADV_FREE,
                    MADV_NOHUGEPAGE,
                    MADV_REMOVE,
                ][self.rng.gen_range(0..5)];
                self.set_last_op(format!(
                    "mm {mm}: madvise {start:#x} {len:#x} {advice} (file window)"
                ));
                let r = c.madvise(start, len, advice);
                self.note(r);
                "file madvise"
            }
            6 => {
                use usermm::msync::{MS_ASYNC, MS_SYNC};
                let flags = [MS_SYNC, MS_ASYNC][self.rng.gen_range(0..2)];
                self.set_last_op(format!("mm {mm}: msync {start:#x} {len:#x} {flags}"));
                let r = c.msync(start, len, flags);
                self.note(r);
                "msync"
            }
            7 => {
                let size = [0, 1 << 20, (2 << 20) + PAGE, FILE_SIZE][self.rng.gen_range(0..4)];
                self.set_last_op(format!("ftruncate file {fi} to {size:#x}"));
                let r = c.ftruncate(&file, size);
                self.note(r);
                "ftruncate"
            }
            8 => {
                let pos = self.rng.gen_range(0..FILE_SIZE / PAGE) * PAGE;
                let n = [8, PAGE, 64 * PAGE][self.rng.gen_range(0..3)] as usize;
                self.set_last_op(format!("pwrite file {fi} at {pos:#x}, {n} bytes"));
                let r = c.pwrite(&file, pos, &vec![0xa5; n]);
                self.note(r.map(|_| ()));
                "pwrite"
            }
            _ => {
                self.set_last_op(format!("mm {mm}: loads and stores (file window)"));
                for _ in 0..32 {
                    self.seq += 1;
                    file_window_access(c, &mut self.rng, self.seq)
                        .map_err(|e| format!("mm {mm}: {e}"))?;
                }
                "file access"
            }
        };
        Ok(kind)
    }

    /// One random operation; returns its kind.
    fn step(&mut self) -> Result<&'static str, String> {
        if self.rng.gen_bool(0.15) {
            return self.file_step();
        }
        let (c, shadow) = (self.c, self.shadow);
        let mm = self.cur.id;
        let pick = self.rng.gen_range(0..100);
        let kind = match pick {
            0..=11 => {
                let (start, len) = self.range();
                let prot = match self.rng.gen_range(0..20) {
                    0..=14 => PROT_READ | PROT_WRITE,
                    15..=17 => PROT_READ,
                    _ => PROT_NONE,
                };
                let mut flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED;
                if self.rng.gen_bool(0.1) {
                    flags |= MAP_NORESERVE;
                }
                if self.rng.gen_bool(0.1) {
                    flags |= MAP_POPULATE;
                }
                // Stacks: one that grows down when an access falls below
                // it, one that gets no THPs.
                if self.rng.gen_bool(0.05) {
                    flags |= MAP_GROWSDOWN;
                } else if self.rng.gen_bool(0.05) {
                    flags |= MAP_STACK;
                }
                self.set_last_op(format!(
                    "mm {mm}: mmap {start:#x} {len:#x} prot {prot} flags {flags:#x}"
                ));
                let r = shadow.zap_if_ok(c, mm, start, start + len, || {
                    c.mmap(start, len, prot, flags)
                });
                self.note(r.map(|_| ()));
                "mmap"
            }
            12..=19 => {
                let (start, len) = self.range();
                self.set_last_op(format!("mm {mm}: munmap {start:#x} {len:#x}"));
                let r = shadow.zap_if_ok(c, mm, start, start + len, || c.munmap(start, len));
                self.note(r);
                "munmap"
            }
            20..=29 => {
                let (start, len) = self.range();
                let prot = [PROT_READ | PROT_WRITE, PROT_READ, PROT_NONE, PROT_WRITE]
                    [self.rng.gen_range(0..4)];
                self.set_last_op(format!("mm {mm}: mprotect {start:#x} {len:#x} {prot}"));
                let r = c.mprotect(start, len, prot);
                self.note(r);
                "mprotect"
            }
            39..=41 => {
                let (start, len) = self.range();
                let call = self.rng.gen_range(0..8);
                let r = match call {
                    0..=2 => {
                        let flags = self.rng.gen_range(0..2) * usermm::mlock::MLOCK_ONFAULT;
                        self.set_last_op(format!("mm {mm}: mlock2 {start:#x} {len:#x} {flags}"));
                        c.mlock2(start, len, flags)
                    }
                    3..=5 => {
                        self.set_last_op(format!("mm {mm}: munlock {start:#x} {len:#x}"));
                        c.munlock(start, len)
                    }
                    6 => {
                        use usermm::mlock::{MCL_CURRENT, MCL_FUTURE, MCL_ONFAULT};
                        let flags = [MCL_FUTURE, MCL_CURRENT | MCL_ONFAULT, MCL_CURRENT]
                            [self.rng.gen_range(0..3)];
                        self.set_last_op(format!("mm {mm}: mlockall {flags}"));
                        c.mlockall(flags)
                    }
                    _ => {
                        self.set_last_op(format!("mm {mm}: munlockall"));
                        c.munlockall()
                    }
                };
                self.note(r);
                "mlock"
            }
            30..=38 => {
                let (start, len) = self.range();
                let advice = [
                    MADV_DONTNEED,
                    MADV_FREE,
                    MADV_HUGEPAGE,
                    MADV_NOHUGEPAGE,
                    MADV_NORMAL,
                    MADV_POPULATE_READ,
                    MADV_POPULATE_WRITE,
                    MADV_COLLAPSE,
                ][self.rng.gen_range(0..8)];
                self.set_last_op(format!("mm {mm}: madvise {start:#x} {len:#x} {advice}"));
                // MADV_DONTNEED zaps what is mapped even when a hole makes it
                // return ENOMEM. MADV_FREE keeps the contents: the model has
                // no reclaim to discard lazily freed pages.
                let zap_end = self.dontneed_end(start, start + len);
                let r = if advice == MADV_DONTNEED && zap_end > start {
                    shadow.zap(c, mm, start, zap_end, || c.madvise(start, len, advice))
                } else {
                    c.madvise(start, len, advice)
                };
                self.note(r);
                "madvise"
            }
            42..=44 => {
                let (start, len) = self.range();
                let nodes = c.m.mem.nodes.len();
                let node = self.rng.gen_range(0..nodes) as i32;
                let pages: Vec<u64> = (start..start + len).step_by(PAGE as usize).collect();
                self.set_last_op(format!(
                    "mm {mm}: move_pages {start:#x} {len:#x} to node {node}"
                ));
                let mut status = vec![0; pages.len()];
                let r = c.move_pages(&pages, Some(&vec![node; pages.len()]), &mut status);
                self.note(r.map(|_| ()));
                "move_pages"
            }
            45..=46 => {
                use usermm::mempolicy::{MPOL_BIND, MPOL_DEFAULT, MPOL_MF_MOVE, MPOL_PREFERRED};
                let (start, len) = self.range();
                let nodes = c.m.mem.nodes.len() as u64;
                let mask = self.rng.gen_range(1..(1u64 << nodes));
                let mode = [MPOL_DEFAULT, MPOL_BIND, MPOL_PREFERRED][self.rng.gen_range(0..3)];
                let (nmask, maxnode) = if mode == MPOL_DEFAULT {
                    (vec![], 0)
                } else if mode == MPOL_PREFERRED {
                    (vec![1u64 << mask.trailing_zeros()], nodes + 1)
                } else {
                    (vec![mask], nodes + 1)
                };
                let flags = if self.rng.gen_bool(0.5) {
                    MPOL_MF_MOVE
                } else {
                    0
                };
                self.set_last_op(format!(
                    "mm {mm}: mbind {start:#x} {len:#x} mode {mode} nodes {nmask:?} flags {flags}"
                ));
                let r = c.mbind(start, len, mode, &nmask, maxnode, flags);
                self.note(r);
                "mbind"
            }
            78..=79 => {
                use usermm::mremap::{MREMAP_DONTUNMAP, MREMAP_FIXED, MREMAP_MAYMOVE};
                let (start, len) = self.range();
                // A move is shadowed exactly only from within one VMA (a
                // move of several leaves the destination between them as
                // it was); there is no hole in it for a stack to grow into
                // meanwhile.
                let in_one_vma = {
                    let guard = usermm::sync::epoch::pin();
                    self.cur
                        .vma_tree(&guard)
                        .vma_lookup(start)
                        .is_some_and(|v| v.end() >= start + len)
                };
                let r = if !in_one_vma || self.rng.gen_bool(0.25) {
                    // Shrunk in place: the tail goes.
                    let new_len = (len / 2).max(PAGE) & !(PAGE - 1);
                    self.set_last_op(format!("mm {mm}: mremap {start:#x} {len:#x} {new_len:#x}"));
                    shadow.zap_if_ok(c, mm, start + new_len, start + len, || {
                        c.mremap(start, len, new_len, 0, 0).map(|_| ())
                    })
                } else {
                    // Moved within the window, the old range unmapped or
                    // left empty; a target overlapping it is EINVAL.
                    let target =
                        WINDOW + self.rng.gen_range(0..(WINDOW_LEN - len) / PAGE + 1) * PAGE;
                    let mut flags = MREMAP_MAYMOVE | MREMAP_FIXED;
                    if self.rng.gen_bool(0.25) {
                        flags |= MREMAP_DONTUNMAP;
                    }
                    self.set_last_op(format!(
                        "mm {mm}: mremap {start:#x} {len:#x} to {target:#x} flags {flags}"
                    ));
                    shadow
                        .remap(c, mm, start, target, len, || {
                            c.mremap(start, len, len, flags, target)
                        })
                        .map(|_| ())
                };
                self.note(r);
                "mremap"
            }
            76..=77 => self.brk(),
            47..=75 => {
                self.set_last_op(format!("mm {mm}: loads and stores"));
                for _ in 0..32 {
                    let addr = WINDOW
                        + self.rng.gen_range(0..WINDOW_LEN / 65536) * 65536
                        + self.rng.gen_range(0..4) * 8;
                    let r = if self.rng.gen_bool(0.5) {
                        self.seq += 1;
                        self.ctl.stores.fetch_add(1, Ordering::Relaxed);
                        shadow.store_u64(c, addr, self.seq)
                    } else {
                        shadow.load_u64(c, addr).map(|_| ())
                    };
                    match r {
                        Ok(()) | Err(Errno::EFAULT) | Err(Errno::ENOMEM) => {}
                        Err(e) => return Err(format!("mm {mm}: access at {addr:#x}: {e}")),
                    }
                }
                "access"
            }
            80..=83 => {
                if self.children.len() >= MAX_CHILDREN {
                    return Ok("fork (skipped: enough children)");
                }
                self.set_last_op(format!("mm {mm}: fork"));
                let r = shadow.fork(c, mm, || c.fork().map(|ch| (ch.clone(), ch.id)));
                match r {
                    Ok(child) => self.children.push(child),
                    Err(e) => self.note(Err(e)),
                }
                "fork"
            }
            84..=89 => {
                let i = self.rng.gen_range(0..=self.children.len());
                self.cur = if i == 0 {
                    self.main.clone()
                } else {
                    self.children[i - 1].clone()
                };
                self.set_last_op(format!("switch to mm {}", self.cur.id));
                c.switch_mm(&self.cur);
                "switch"
            }
            92 if self.cur.id != self.main.id => self.exec(),
            90..=92 => {
                if self.children.is_empty() {
                    return Ok("exit (skipped: no child)");
                }
                let i = self.rng.gen_range(0..self.children.len());
                let child = self.children.swap_remove(i);
                self.set_last_op(format!("exit mm {}", child.id));
                self.exit_one(&child);
                "exit"
            }
            93..=95 => {
                let t = &c.m.thp;
                let modes = [ThpMode::Always, ThpMode::Madvise, ThpMode::Never];
                let _ = t.set_enabled(modes[self.rng.gen_range(0..3)]);
                let order = self.rng.gen_range(2..=9);
                let modes = [
                    ThpMode::Always,
                    ThpMode::Inherit,
                    ThpMode::Madvise,
                    ThpMode::Never,
                ];
                let _ = t.set_order(order, modes[self.rng.gen_range(0..4)]);
                // shmem's sizes: the internal mount's huge, and one size's
                // own knob (shared anonymous memory).
                use usermm::machine::{ShmemHuge, ShmemOrderMode};
                let huge = [
                    ShmemHuge::Always,
                    ShmemHuge::WithinSize,
                    ShmemHuge::Advise,
                    ShmemHuge::Never,
                ];
                t.set_shmem_enabled(huge[self.rng.gen_range(0..4)]);
                let sizes = [
                    ShmemOrderMode::Always,
                    ShmemOrderMode::Inherit,
                    ShmemOrderMode::WithinSize,
                    ShmemOrderMode::Advise,
                    ShmemOrderMode::Never,
                ];
                let _ =
                    t.set_shmem_order(self.rng.gen_range(1..=9), sizes[self.rng.gen_range(0..5)]);
                t.use_zero_page
                    .store(self.rng.gen_bool(0.8), std::sync::atomic::Ordering::Relaxed);
                // NUMA balancing off or in tiering mode, scanning as often
                // as the kernel does at all (16 MB each 6 ms), and no
                // slower after the passes that promote.
                let numa = &c.m.numa;
                let mode = [0, usermm::numa_balancing::NUMA_BALANCING_MEMORY_TIERING]
                    [self.rng.gen_range(0..2)];
                numa.scan_delay_ms.store(0, Ordering::Relaxed);
                numa.scan_size_mb.store(16, Ordering::Relaxed);
                numa.scan_period_min_ms.store(0, Ordering::Relaxed);
                numa.scan_period_max_ms.store(0, Ordering::Relaxed);
                numa.mode.store(mode, Ordering::Relaxed);
                self.set_last_op(format!("THP knobs, numa_balancing {mode}"));
                "knob"
            }
            96..=97 => {
                // Every tunable of the registry, each to one of its values.
                let mut set = vec![];
                for info in usermm::tunable::TUNABLES.iter() {
                    let v = info.values[self.rng.gen_range(0..info.values.len())].name;
                    c.m.tunables.set(info.name, v).expect("a registry value");
                    set.push(format!("{}={v}", info.name));
                }
                self.set_last_op(format!("tunables {}", set.join(" ")));
                "tunable"
            }
            _ => {
                let mode = [0, 0, 0, 1, 2][self.rng.gen_range(0..5)];
                let _ = c.m.overcommit.set_sysctl("overcommit_memory", mode);
                self.set_last_op(format!("overcommit_memory {mode}"));
                "sysctl"
            }
        };
        Ok(kind)
    }

    /// brk(2) of the current process: a query, a break below the heap's
    /// start (refused), or one anywhere in the heap's quarter, unaligned
    /// at times. Where the break's page moved, the range between the old
    /// and the new is zero from then on (unmapped, or a new mapping).
    fn brk(&mut self) -> &'static str {
        let (c, shadow, mm) = (self.c, self.shadow, self.cur.id);
        let l = self.cur.layout();
        let (start, old) = (l.start_brk, l.brk);
        let want = match self.rng.gen_range(0..10) {
            0 => 0,
            1 => start - PAGE,
            _ => start + self.rng.gen_range(0..HEAP_LEN / 16) * 16,
        };
        let page = |a: u64| (a + PAGE - 1) & !(PAGE - 1);
        let (lo, hi) = (page(old.min(want)), page(old.max(want)));
        self.set_last_op(format!("mm {mm}: brk {want:#x} (the break at {old:#x})"));
        // Refused (or a query): the old break comes back, nothing changed;
        // an Err tells the shadow memory so.
        let r = shadow.zap_if_ok(c, mm, lo, hi.max(lo + PAGE), || {
            c.brk(want).and_then(|got| {
                if got == want && want != 0 && lo != hi {
                    Ok(got)
                } else {
                    Err(Errno::ENOMEM)
                }
            })
        });
        if r.is_ok() {
            "brk"
        } else {
            "brk (kept)"
        }
    }

    /// execve of this very program by the current process, a child (the
    /// first process's threads are the accessors): its old mm goes, and
    /// the operations go on in the one exec built, whose heap is the
    /// program's and whose window starts empty.
    fn exec(&mut self) -> &'static str {
        let c = self.c;
        let Some(exe) = std::env::current_exe()
            .ok()
            .and_then(|p| p.to_str().map(String::from))
        else {
            return "exec (skipped: no path)";
        };
        let old = self.cur.clone();
        self.set_last_op(format!("mm {}: exec {exe}", old.id));
        match c.execve(&exe, &[&exe, "stress"], &["USERMM=1"]) {
            Ok(mm) => {
                self.shadow.exit(old.id);
                if let Some(ch) = self.children.iter_mut().find(|ch| ch.id == old.id) {
                    *ch = mm.clone();
                }
                self.cur = mm;
                "exec"
            }
            Err(e) => {
                self.note(Err(e));
                "exec (failed)"
            }
        }
    }

    /// Where MADV_DONTNEED of `[start, end)` stops: at the first locked
    /// VMA, which it refuses (EINVAL) after zapping the VMAs before it.
    /// (Only this thread changes the address space, so the VMAs read now
    /// are those the call will see.)
    fn dontneed_end(&self, start: u64, end: u64) -> u64 {
        let guard = usermm::sync::epoch::pin();
        let stop = self
            .cur
            .vma_tree(&guard)
            .range(start, end)
            .find(|v| v.flags() & usermm::mm::vma::VM_LOCKED != 0)
            .map_or(end, |v| v.start().max(start));
        stop
    }

    /// Exit `child` from CPU 0 and come back to the current process.
    fn exit_one(&mut self, child: &Arc<Mm>) {
        let c = self.c;
        c.switch_mm(child);
        let _ = c.exit_mm();
        self.shadow.exit(child.id);
        if self.cur.id == child.id {
            self.cur = self.main.clone();
        }
        c.switch_mm(&self.cur);
    }

    /// The end: the accessors have stopped; every process exits.
    fn exit_all(&mut self) {
        for child in std::mem::take(&mut self.children) {
            self.exit_one(&child);
        }
        let c = self.c;
        c.switch_mm(&self.main);
        let _ = c.exit_mm();
        self.shadow.exit(self.main.id);
        // What MIGRC still keeps waits for a batched flush that no one
        // will send any more: send it, as the allocator would once it
        // needed the pages; after kswapd is done, whose demotions keep
        // sources too (a kswapd still busy fails the run at the end).
        c.idle();
        c.m.kswapd_wait_idle(KSWAPD_WAIT);
        self.sum.migrc_kept_at_end =
            c.m.mem
                .migrc
                .kept()
                .iter()
                .map(|f| f.nr_pages(&c.m.mem))
                .sum();
        usermm::migrc::migrc_flush_free_folios(c, usermm::vmstat::Event::MIGRC_FLUSH_WATERMARK);
    }
}
