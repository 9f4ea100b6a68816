//! `bench migrc`: the MIGRC seed's experiment (XSBench on a two-tier
//! machine, NUMA balancing in tiering mode, demotion on), scaled to the
//! model, with the tunable `migrc` at `off`, `migrc` (the seed) and `luf`
//! (its successor), arms interleaved.
//!
//! The workload is an XSBench-like lookup kernel: a grid of sorted keys,
//! half again as large as the fast node, is written once by CPU 0; then
//! every CPU of the machine takes lookups from a shared count, a hundred
//! at a time, as XSBench's `omp parallel for schedule(dynamic, 100)`
//! hands them out, each a binary search for a random key through the
//! CPU's TLB followed by reads of the entries after the one found
//! (XSBench's nuclide data), and a store of its result into a small array
//! of its own. NUMA balancing's hinting faults promote the grid pages in
//! use to the fast node throughout, and kswapd demotes others to make
//! room: the migrations MIGRC and LUF defer.
//!
//! Why the lookups are shared rather than split evenly: a CPU that has
//! finished goes idle, and a shootdown does not wait for an idle CPU, so
//! while the others finish kswapd demotes, and the hinting faults promote,
//! many times faster than while all four run (the model's CPUs share the
//! host's cores, and a shootdown waits for each target's thread to be
//! scheduled). With fixed shares the CPUs finished up to a second apart,
//! and that tail, a different length in each round, decided how many
//! pages a round migrated; with shared ones they finish within a hundred
//! lookups of each other.
//!
//! Every load of the grid is checked against the key its index must hold,
//! and every result slot read back against what the CPU stored there last:
//! a mismatch is a stale read or a lost write, counted (the model's shadow
//! oracle for this workload; `tests/migrc.rs` checks MIGRC's rules with
//! the full shadow memory).
//!
//! # Scaled for the model
//!
//! The seed's guest had 1 GiB of DRAM, 8 GiB of slow memory, 16 CPUs and
//! `XSBench -p 100000000` (about 5.6 GB of grids, a run of 38 minutes),
//! and NUMA balancing scanned 256 MB (`scan_size_mb`, the kernel's
//! default) every 2.7 s for most of its run: under a thousand scans,
//! some 30,000 pages migrated in each with MIGRC off. Here the fast node
//! holds 170 MiB and the slow one 680 MiB, the grid 255 MiB, with 4 CPUs
//! (2 on a two-core host), and the scan keeps the kernel's 256 MB, which
//! covers the whole grid: some 17,000 to 21,000 pages migrate a scan
//! with MIGRC off. What was kept is what decides the seed's counters:
//!
//! * **Pages migrated a scan.** A scan sends its own shootdowns (its range
//!   flush, and a flush of the mm at each PTE table where it finds one
//!   pending, `flush_tlb_batched_pending`, up to 128 a scan of 256 MB),
//!   alike in every arm; the pages migrated between scans set what those
//!   weigh against the migrations' own. The table counts them apart
//!   (`usermm_numa_scan_remote_flush`); the seed's counters do not.
//! * **A scan's pending flush lasts as long as a scan of 256 MB takes.**
//!   A promotion of a hinting entry while the scan's flush is pending
//!   (`mm->tlb_flush_pending`, from its mmu_gather until its shootdown is
//!   done) counts as accessible (`pte_accessible`) and queues a flush,
//!   local and remote: `off`'s hinting-fault migrations send some 1,700
//!   shootdowns a round, which MIGRC defers. That is where
//!   `nr_tlb_local_flush_all` falls (by 76% to 80% here in three runs of
//!   six rounds; the seed's: 57.5%).
//!
//! That is `--full` ([`Scale::FULL`]). By default the bench runs its
//! earlier, reduced scale ([`Scale::REDUCED`]), which takes a minute or
//! two: a 16 MiB fast node beside 64 MiB, a 24 MiB grid, a scan of 1 MB,
//! which the kernel rounds up to one 2 MiB PTE table (a twelfth of the
//! grid, as 256 MB was a twenty-second of the seed's), every 40 ms, and
//! 300,000 lookups measured after 5,400,000. A scan there migrates a few
//! hundred pages (per page migrated, over a hundred times as many scans as
//! the seed's run made), so that the scan's flushes were 24 of the 34
//! MIGRC still sent (0.101× `off`'s, on the aim's line, over twelve
//! rounds); and a scan of one PTE table is over too soon for promotions to
//! land in its pending flush, so that `nr_tlb_local_flush_all`, nearly all
//! the scan's own, does not move (26 and 26). The counters keep their
//! direction there with weaker margins; the figures compared with the
//! seed's come from `--full`. `--machine`, `--scan-size-mb`, `--lookups`
//! and `--warmup` set each size on its own (and `--migration-entry-ad
//! both` runs the arms both ways).
//!
//! The measured part is 2,000,000 lookups per CPU, some five seconds on
//! two CPUs: five scans, so that a round's migrations do not step with
//! whether one more scan landed in it, as they did in rounds of 500,000
//! (one or two scans: one round's `migrc` migrated 2.2 times `off`'s
//! pages, and ran 1.29 times as long). The scan period starts as the
//! kernel's does (`task_scan_min`, at its default `scan_period_min_ms` of
//! 1 s, shared among the scans that cover what the process has resident:
//! here one, so 1 s). In tiering mode the kernel's then doubles at the
//! first promotion of each later pass, up to `task_scan_max`
//! (`scan_period_max_ms`, 60 s); the seed's reached 2.7 s within about a
//! minute of its 38. A round here lasts seconds, in which the doubling
//! would leave a scan or none: `scan_period_max_ms` is set to the
//! minimum's 1 s, and the period stays there.
//!
//! # The host's cores
//!
//! Why the machine has no more CPUs than the host has cores: four, or two
//! on a two-core host (`--machine` can give more). A shootdown waits for
//! each target CPU's thread to take its request, which costs the
//! mailbox's round trip while that thread has a host core of its own, and
//! a scheduler slice (milliseconds, where an IPI costs microseconds) while
//! it waits for one. Four CPUs on two cores, as this bench had before
//! (at the smaller scale, and when each node had the reserve of a machine
//! of its own size; see the reserve, below):
//! * kswapd, whose demotions make the room every promotion needs, spent
//!   its runs waiting on those slices. MIGRC skips most of those waits, so
//!   there it migrated a third more pages than `off` (+31% to +37% in
//!   three runs), where with two CPUs on the same two cores the two
//!   migrated within 13% of each other (−13% to +10% in seven runs).
//! * A scan's flush stays pending for as long as those waits last, and
//!   promotions meanwhile queue flushes: `off` sent 184 to 211 shootdowns
//!   per 1000 pages migrated there, 94 to 113 with two CPUs (the seed's:
//!   113). MIGRC defers those of clean pages, so its ratio to `off`
//!   looked better there than it is.
//! * The runtime swung with how the host scheduled five threads on two
//!   cores: `migrc`'s over `off`'s 0.89 to 1.08 in three runs, with 95%
//!   intervals as wide as [0.67, 1.24].
//!
//! kswapd runs on node 0's CPUs, as the kernel's runs on its node's: a
//! run that finds both CPUs running lookups takes one, whose thread stops
//! (lazy) while kswapd runs there, and at each `cond_resched` past a
//! scheduler slice gives it back for a slice, as EEVDF shares a CPU between
//! two tasks ([`usermm::sched`]; the table's `on a workload CPU` counts
//! the runs begun so; the others began while a CPU was in a fault, and
//! take one at their next `cond_resched`). Before it did, kswapd was one
//! more host thread beside the two CPUs' on the host's two cores, and each
//! of its shootdowns waited for a target's thread to get a core back:
//! `off`'s kswapd waited 2.0 s of a 2.4 s round at this scale (500,000
//! lookups), and demotions, and with them the room for promotions, ran at
//! a sixth of MIGRC's pace. Now a taken CPU is skipped by kswapd's
//! shootdowns, and the other has its host core: `off`'s kswapd waits 7
//! to 18 ms of a round of 5 to 6 s, the arms migrate within 9% of each
//! other (three runs of six rounds), and the time kswapd takes from the
//! lookups counts in the runtime, as it does on the seed's guest.
//!
//! # The arms
//!
//! Each arm runs on a fresh machine (`--arms` chooses them, `off` among
//! them), by default with `migration_entry_ad` off: migrated pages come
//! back clean, which the seed's figures imply. With it on
//! (`--migration-entry-ad on` or `both`), as on the host, a written page
//! keeps its dirty bit across migration, so it never becomes eligible and
//! MIGRC and LUF defer nothing.
//!
//! # The reserve
//!
//! THP is set to `madvise` (with 2 MiB at `inherit`; `--thp`
//! sets the top level), as a machine of the seed's size boots with a
//! kernel built with `CONFIG_TRANSPARENT_HUGEPAGE_MADVISE`, as most
//! distributions' are. (Under the Kconfig default, `always`, the seed's
//! grid would have been in THPs, which MIGRC does not defer.) That leaves
//! the grid, which is not madvised, in 4 KiB folios, but has khugepaged
//! raise `min_free_kbytes` to what it recommends for THPs: 43,240 kB
//! here, of which node 0's share gives it watermarks of 2,162, 2,702,
//! 3,242 and 3,782 pages (min, low, high, promo). kswapd reclaims the high
//! watermark's worth a pass, and a promotion needs room above the high
//! watermark, so the reserve sets both how many pages a demotion batch
//! flushes at once and how many promotions fit between kswapd's runs.
//! With `--thp never` the machine's own reserve, smaller, made a round at
//! the smaller scale migrate 1,688 pages where `madvise` made it migrate
//! 4,134, and `off` send 136 shootdowns per 1000 pages migrated where
//! `madvise` made it send 82 (one run of six rounds each). The seed's
//! guest, 1 GiB beside 8 GiB, had a reserve of 12,288 kB without THPs
//! (its fast node's high watermark some 865 pages) and some 90,000 kB
//! with them (some 3,750); which it ran is not said.
//!
//! # The warm-up
//!
//! Why it is long: the build leaves every grid page writable and
//! dirty, and such a page is never eligible; it becomes so once a hinting
//! fault has promoted it (its migration entry is made from the hinting
//! fault's PROT_NONE entry, so it comes back read-only) and, with
//! `migration_entry_ad` off, clean. A page the build left on the fast
//! node must first be demoted, with a flush, and the lukewarm ones reach
//! the tail of the LRU late. The seed measured a 38-minute run, in which
//! that start is a small part. The table counts the folios still not
//! eligible (`usermm_migrc_can_migrc_fail`) and the shootdowns of
//! demotions: in a `migrc` round of 500,000 lookups, after 5,000,000 to
//! warm up, 451 such folios made 216 demotion shootdowns and 92 by
//! hinting-fault migrations (`off`: 2,500 and 613); after 15,000,000, the
//! default, 55 made 46 and 1 (one round each). `--warmup` sets it.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Barrier;
use std::time::Instant;

use anyhow::anyhow;
use serde::Serialize;
use usermm::mmap::{MAP_ANONYMOUS, MAP_PRIVATE, PROT_READ, PROT_WRITE};
use usermm::numa_balancing::NUMA_BALANCING_MEMORY_TIERING;
use usermm::vmstat::Event;
use usermm::{Machine, MachineConfig, OnCpu, ThpMode};

use super::stats::{self, Estimate, Rounds};
use super::{progress, BenchArgs};
use crate::plot;

pub const EXPERIMENT: super::Experiment = super::Experiment {
    name: "migrc",
    description: "XSBench-like lookups on a grid larger than the fast node, promoted and \
        demoted throughout (tiering), with migrc off, migrc and luf: TLB flushes, misses, runtime (F3)",
    run: experiment,
    // At the full scale six rounds of the three arms take some sixteen
    // minutes on two CPUs: the budget allows little more than those.
    budget_s: 60,
    full_budget_s: 960,
};

const PAGE: u64 = 4096;

/// The sizes of one scale of this bench: `--full` is the ten-times scale
/// the module doc describes, where the counters behave as in the seed's
/// run; the default is the smaller scale this bench had before, which
/// runs in a minute or two and shows the same direction with weaker
/// margins (see the module doc).
#[derive(Clone, Copy, Debug)]
pub struct Scale {
    /// The fast node: the grid, half again as large, is then just under
    /// one scan of `scan_size_mb` at the full scale.
    pub fast: u64,
    /// The slow node, four times the fast one.
    pub slow: u64,
    /// Lookups per CPU, measured (`--lookups`), after the warm-up
    /// (`--warmup`): the pages the build left writable cycle through the
    /// tiers first, as they would early in a long run. The CPUs share the
    /// phase's lookups (as many times more as there are CPUs), a
    /// [`LOOKUP_CHUNK`] at a time.
    pub lookups: u64,
    pub warmup: u64,
    /// NUMA balancing's scan size (`scan_size_mb`, `--scan-size-mb`).
    pub scan_size_mb: u64,
}

impl Scale {
    /// A 170 MiB fast node beside 680 MiB, a 255 MiB grid, the kernel's
    /// 256 MB scan; 2,000,000 lookups measured (some five seconds on two
    /// CPUs: five scans) after 15,000,000 (some thirty-five seconds).
    pub const FULL: Scale = Scale {
        fast: 170 << 20,
        slow: 680 << 20,
        lookups: 2_000_000,
        warmup: 15_000_000,
        scan_size_mb: 256,
    };
    /// A 16 MiB fast node beside 64 MiB, a 24 MiB grid, a scan of 1 MB
    /// (one PTE table); 300,000 lookups measured after 5,400,000.
    pub const REDUCED: Scale = Scale {
        fast: 16 << 20,
        slow: 64 << 20,
        lookups: 300_000,
        warmup: 5_400_000,
        scan_size_mb: 1,
    };
}

/// The most CPUs the built-in machine has; it has fewer where the host
/// has fewer cores ([`bench_cpus`]).
const CPUS: usize = 4;
/// Lookups a CPU takes from the shared count at a time: XSBench's
/// `schedule(dynamic, 100)`.
const LOOKUP_CHUNK: u64 = 100;
/// Entries read after the one found (the nuclide data).
const NUCLIDE_READS: u64 = 4;
/// Result slots per CPU (one page).
const RESULTS: u64 = PAGE / 8;

/// The arms: the tunable's values.
const ARMS: [&str; 3] = ["off", "migrc", "luf"];

/// The seed's vmstat set, by their names.
const COUNTERS: [Event; 6] = [
    Event::NUMA_PAGE_MIGRATE,
    Event::PGMIGRATE_SUCCESS,
    Event::NR_TLB_REMOTE_FLUSH,
    Event::NR_TLB_REMOTE_FLUSH_RECEIVED,
    Event::NR_TLB_LOCAL_FLUSH_ALL,
    Event::NR_TLB_LOCAL_FLUSH_ONE,
];

/// Where the shootdowns came from (model-only counts, each a part of
/// `nr_tlb_remote_flush`), with the table's label: those sent by
/// migrations, by reason (`MR_DEMOTION`, `MR_NUMA_MISPLACED`), and by
/// MIGRC's forced flushes, by the point that forced them (a write fault in
/// `do_wp_page`, an allocation short of its watermark with sources kept
/// in its zone, the allocator's slow path, a publication refused while a
/// batched flush was under way); and the folios MIGRC could have deferred
/// but for a dirty or writable PTE (`can_migrc_fail`).
const ATTRIBUTED: [(Event, &str); 7] = [
    (Event::MR_DEMOTION_REMOTE_FLUSH, "remote flush by demotions"),
    (
        Event::MR_NUMA_MISPLACED_REMOTE_FLUSH,
        "  by hinting-fault migrations",
    ),
    (Event::MIGRC_FLUSH_WP_FAULT, "  by MIGRC: write fault"),
    (Event::MIGRC_FLUSH_WATERMARK, "  by MIGRC: watermark"),
    (Event::MIGRC_FLUSH_PRESSURE, "  by MIGRC: slow path"),
    (Event::MIGRC_FLUSH_REFUSED, "  by MIGRC: refused"),
    (Event::MIGRC_CAN_MIGRC_FAIL, "folios MIGRC could not defer"),
];

/// The tiering path, by the counters' names (events and node statistics,
/// read from a snapshot), with the table's label: the hinting faults (all
/// on the slow node's pages: in tiering mode the scan passes over the top
/// tier's, as `change_prot_numa`'s caller does); the pages hot enough to promote
/// (`pgpromote_candidate`, and `_nrl`, those promoted with room to spare
/// whatever their heat); the pages of those refused for want of room
/// above the fast node's high watermark (`migrate_balanced_pgdat`,
/// model-only); the pages promoted; those kswapd and direct reclaim
/// demoted; and kswapd's runs, those made on a CPU taken from the
/// workload (the others ran beside the CPUs, none of them running user
/// code when kswapd woke), those that reclaimed nothing, and the wakeups it
/// slept through, its node hopeless after 16 such runs (model-only
/// counts); and the time every sender, and kswapd alone, waited
/// for shootdowns to be acknowledged (model-only, microseconds: hardware's
/// IPIs take a few, the model's targets answer between their accesses and
/// may wait for a host core). A difference in pages migrated between the
/// arms shows here first.
const TIERING: [(&str, &str); 12] = [
    ("numa_hint_faults", "hinting faults"),
    ("pgpromote_candidate", "pages hot enough to promote"),
    ("pgpromote_candidate_nrl", "  with room to spare"),
    (
        "usermm_numa_promote_refused",
        "  refused: no room above high",
    ),
    ("pgpromote_success", "pages promoted"),
    ("pgdemote_kswapd", "pages demoted by kswapd"),
    ("pgdemote_direct", "  by direct reclaim"),
    ("pageoutrun", "kswapd runs"),
    ("usermm_kswapd_run_on_cpu", "  on a workload CPU"),
    ("usermm_kswapd_failure", "  that reclaimed nothing"),
    (
        "usermm_kswapd_wakeup_hopeless",
        "wakeups of a hopeless kswapd",
    ),
    ("usermm_tlb_shootdown_wait_us", "us waiting for shootdowns"),
];

/// One run of one arm.
#[derive(Clone, Copy, Default)]
struct Sample {
    counters: [u64; COUNTERS.len()],
    dtlb_load_misses: u64,
    dtlb_store_misses: u64,
    kept_peak: u64,
    luf_takeoff_flushes: u64,
    luf_forced_flushes: u64,
    /// LUF's flushes over the whole run, warm-up included.
    luf_flushes_whole_run: u64,
    /// The folios LUF freed with their flush owed, over the whole run.
    luf_deferred_whole_run: u64,
    /// Shootdowns the NUMA scan sent (`usermm_numa_scan_remote_flush`).
    scan_remote_flushes: u64,
    /// [`ATTRIBUTED`]'s counts.
    attributed: [u64; ATTRIBUTED.len()],
    /// [`TIERING`]'s counts.
    tiering: [u64; TIERING.len()],
    /// Of `usermm_tlb_shootdown_wait_us`, kswapd's (the row of threads
    /// that play no CPU).
    kswapd_shootdown_wait_us: u64,
    /// The process's time between scans (`task_scan_min`).
    scan_period_ms: u64,
    stale_reads: u64,
    lost_writes: u64,
    runtime_s: f64,
}

#[derive(Serialize)]
struct Row {
    arm: &'static str,
    migration_entry_ad: bool,
    runs: usize,
    numa_pages_migrated: u64,
    pgmigrate_success: u64,
    nr_tlb_remote_flush: u64,
    nr_tlb_remote_flush_received: u64,
    nr_tlb_local_flush_all: u64,
    nr_tlb_local_flush_one: u64,
    dtlb_load_misses: u64,
    dtlb_store_misses: u64,
    kept_peak: u64,
    /// LUF's flushes: at takeoff, and forced (after faults in writable
    /// VMAs, at `tlb_end_vma`).
    luf_takeoff_flushes: u64,
    luf_forced_flushes: u64,
    /// The same over the whole run, warm-up included, as `kept_peak` is.
    luf_flushes_whole_run: u64,
    /// The folios LUF freed with their flush owed (`usermm_luf_deferred`),
    /// over the whole run: what those flushes are owed for.
    luf_deferred_whole_run: u64,
    /// Of `nr_tlb_remote_flush`, those the NUMA scan sent: its own range
    /// flushes and the batched flushes it found pending, alike in every
    /// arm (the seed's counters do not tell them apart: see the module
    /// doc).
    usermm_numa_scan_remote_flush: u64,
    /// [`ATTRIBUTED`]'s medians, each under its event's name.
    #[serde(flatten)]
    attributed: std::collections::BTreeMap<&'static str, u64>,
    /// [`TIERING`]'s medians, each under its counter's name.
    #[serde(flatten)]
    tiering: std::collections::BTreeMap<&'static str, u64>,
    kswapd_shootdown_wait_us: u64,
    /// Medians per run of shootdowns sent, and of CPUs that handled one,
    /// per 1000 pages migrated (the migrations a run makes vary widely).
    remote_flush_per_k_migrated: f64,
    remote_flush_received_per_k_migrated: f64,
    /// The same for the shootdowns sent outside the NUMA scan.
    remote_flush_outside_scan_per_k_migrated: f64,
    /// Summed over the runs (any is a failure).
    stale_reads: u64,
    lost_writes: u64,
    /// Median seconds of the lookups.
    runtime_s: f64,
    /// migrc and luf rows: the runtime over `off`'s with the same
    /// `migration_entry_ad` in the same round, the median of those ratios,
    /// and its 95% interval.
    ratio: Option<f64>,
    ci_low: Option<f64>,
    ci_high: Option<f64>,
    /// The same for the shootdowns sent per 1000 pages migrated.
    remote_flush_ratio: Option<f64>,
    remote_flush_ratio_ci_low: Option<f64>,
    remote_flush_ratio_ci_high: Option<f64>,
    /// And for those sent outside the NUMA scan.
    outside_scan_ratio: Option<f64>,
    outside_scan_ratio_ci_low: Option<f64>,
    outside_scan_ratio_ci_high: Option<f64>,
    /// Every round's seconds.
    samples_runtime_s: Vec<f64>,
    /// Every round's `pgmigrate_success` and `nr_tlb_remote_flush`: a
    /// round may migrate several times what another of the same arm does
    /// (the churn between the tiers comes and goes), which the medians
    /// alone hide.
    samples_pgmigrate_success: Vec<u64>,
    samples_nr_tlb_remote_flush: Vec<u64>,
}

impl Row {
    fn estimate(&self) -> Option<Estimate> {
        Estimate::from_fields(self.ratio, self.ci_low, self.ci_high, self.runs)
    }

    fn remote_flush_estimate(&self) -> Option<Estimate> {
        Estimate::from_fields(
            self.remote_flush_ratio,
            self.remote_flush_ratio_ci_low,
            self.remote_flush_ratio_ci_high,
            self.runs,
        )
    }

    fn outside_scan_estimate(&self) -> Option<Estimate> {
        Estimate::from_fields(
            self.outside_scan_ratio,
            self.outside_scan_ratio_ci_low,
            self.outside_scan_ratio_ci_high,
            self.runs,
        )
    }
}

impl Sample {
    /// Counter `i` per 1000 pages migrated (the migrations a run makes
    /// vary widely).
    fn per_k(&self, i: usize) -> f64 {
        1000.0 * self.counters[i] as f64 / self.counters[1].max(1) as f64
    }

    /// Shootdowns sent outside the NUMA scan, per 1000 pages migrated.
    fn outside_scan_per_k(&self) -> f64 {
        let outside = self.counters[2].saturating_sub(self.scan_remote_flushes);
        1000.0 * outside as f64 / self.counters[1].max(1) as f64
    }
}

/// The key at grid index `i`: odd, strictly increasing.
fn key(i: u64) -> u64 {
    2 * i + 1
}

/// The built-in machine's CPUs: [`CPUS`], or as many as this process has
/// host cores where that is fewer, but at least two (a shootdown needs a
/// CPU to go to). The module doc says why no CPU shares a core.
fn bench_cpus() -> usize {
    crate::native::host_cpus().clamp(2, CPUS)
}

fn machine(a: &BenchArgs) -> anyhow::Result<std::sync::Arc<Machine>> {
    let scale = if a.full { Scale::FULL } else { Scale::REDUCED };
    let config = a.machine.config(MachineConfig::two_tiers(
        scale.fast,
        scale.slow,
        bench_cpus(),
    ))?;
    if config.nodes.len() < 2 {
        anyhow::bail!("machine: bench migrc needs a fast and a slow node");
    }
    let m = Machine::new(config).map_err(|e| anyhow!("machine: {e}"))?;
    a.tunables.apply(&m.tunables)?;
    Ok(m)
}

/// What `--ipi-cost` asks for.
pub enum IpiCostArg {
    Off,
    Host,
    Given { send_ns: u64, recv_ns: u64 },
}

pub fn parse_ipi_cost(s: &str) -> anyhow::Result<IpiCostArg> {
    match s {
        "off" => Ok(IpiCostArg::Off),
        "host" => Ok(IpiCostArg::Host),
        _ => {
            let parsed = s
                .split_once(',')
                .and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)));
            match parsed {
                Some((send_ns, recv_ns)) if send_ns <= 1_000_000 && recv_ns <= 1_000_000 => {
                    Ok(IpiCostArg::Given { send_ns, recv_ns })
                }
                _ => anyhow::bail!(
                    "--ipi-cost {s:?}: expected off, host, or SEND_NS,RECV_NS (each at most 1000000)"
                ),
            }
        }
    }
}

/// Calibrations `--ipi-cost host` makes, and shootdowns in each.
const CALIBRATIONS: usize = 7;
const CALIBRATION_ZAPS: u64 = 20_000;

/// The cost model's (send, receive) nanoseconds, how they were had, and
/// the calibration when measured.
struct IpiCost {
    send_ns: u64,
    recv_ns: u64,
    from: &'static str,
    calibration: Option<crate::native::ShootdownCost>,
}

fn ipi_cost(a: &BenchArgs) -> anyhow::Result<IpiCost> {
    let given = |send_ns, recv_ns, from| IpiCost {
        send_ns,
        recv_ns,
        from,
        calibration: None,
    };
    Ok(match parse_ipi_cost(&a.ipi_cost)? {
        IpiCostArg::Off => given(0, 0, "off"),
        IpiCostArg::Given { send_ns, recv_ns } => given(send_ns, recv_ns, "given"),
        IpiCostArg::Host => {
            let c = crate::native::shootdown_cost(CALIBRATION_ZAPS, CALIBRATIONS)
                .ok_or_else(|| anyhow!("--ipi-cost host: calibrating needs two host CPUs"))?;
            IpiCost {
                send_ns: c.send_ns,
                recv_ns: c.recv_ns,
                from: "host",
                calibration: Some(c),
            }
        }
    })
}

impl IpiCost {
    /// The table's footnote, when the model is on.
    fn describe(&self) -> Option<String> {
        let (send, recv) = (self.send_ns, self.recv_ns);
        match &self.calibration {
            _ if self.from == "off" => None,
            None => Some(format!(
                "shootdown cost model ({}): {send} ns per shootdown sent, {recv} ns per request handled",
                self.from
            )),
            Some(c) => Some(format!(
                "shootdown cost model (host, the median of {} calibrations of {} shootdowns, [least, most]): \
                 {send} ns [{}, {}] per shootdown sent, {recv} ns [{}, {}] per request handled",
                c.trials,
                c.samples,
                c.send_ns_range[0],
                c.send_ns_range[1],
                c.recv_ns_range[0],
                c.recv_ns_range[1]
            )),
        }
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "from": self.from,
            "send_ns": self.send_ns,
            "recv_ns": self.recv_ns,
            "calibration": self.calibration,
        })
    }
}

/// `--arms`: indices into [`ARMS`], in its order, `off` among them (all
/// when none are named).
pub fn parse_arms(names: &[String]) -> anyhow::Result<Vec<usize>> {
    if names.is_empty() {
        return Ok((0..ARMS.len()).collect());
    }
    if let Some(bad) = names.iter().find(|n| !ARMS.contains(&n.as_str())) {
        anyhow::bail!("--arms: {bad:?} is not an arm (known: {})", ARMS.join(", "));
    }
    if !names.iter().any(|n| n == ARMS[0]) {
        anyhow::bail!("--arms must include off, the baseline every other arm is compared with");
    }
    Ok((0..ARMS.len())
        .filter(|&i| names.iter().any(|n| n == ARMS[i]))
        .collect())
}

/// `--migration-entry-ad`: the settings to run, off first.
pub fn parse_migration_entry_ad(s: &str) -> anyhow::Result<Vec<bool>> {
    match s {
        "both" => Ok(vec![false, true]),
        "off" => Ok(vec![false]),
        "on" => Ok(vec![true]),
        _ => Err(anyhow!(
            "--migration-entry-ad must be on, off or both, not {s:?}"
        )),
    }
}

fn experiment(a: &BenchArgs) -> anyhow::Result<serde_json::Value> {
    let cost = ipi_cost(a)?;
    let chosen = parse_arms(&a.arms)?;
    let arms: Vec<(bool, usize)> = parse_migration_entry_ad(&a.migration_entry_ad)?
        .into_iter()
        .flat_map(|ad| chosen.iter().map(move |&i| (ad, i)))
        .collect();
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); arms.len()];
    let pb = progress("migrc", (Rounds::expected(a.runs()) * arms.len()) as u64);
    let mut machine_desc = String::new();
    let mut reserve = (0, [0; 4]);
    let mut grid_mb = 0;
    let mut scan_period_min_ms = 0;
    // The index of `off` with the same migration_entry_ad.
    let off_of = |k: usize| {
        arms.iter()
            .position(|&(ad, arm)| ad == arms[k].0 && arm == 0)
            .expect("an off arm per setting")
    };
    let runtime = |s: &[Sample]| -> Vec<f64> { s.iter().map(|x| x.runtime_s).collect() };
    let flushes = |s: &[Sample]| -> Vec<f64> { s.iter().map(|x| x.per_k(2)).collect() };
    let narrow = |samples: &[Vec<Sample>]| {
        (0..arms.len()).all(|k| {
            let base = &samples[off_of(k)];
            !Estimate::ratio(&runtime(&samples[k]), &runtime(base)).wide()
        })
    };
    let mut rounds = Rounds::new(a.runs(), a.budget());
    while rounds.more(|| narrow(&samples)) {
        rounds.lengthen(&pb, arms.len() as u64);
        // The arms in an order that turns round by round.
        for i in 0..arms.len() {
            let k = (i + rounds.done()) % arms.len();
            let (ad, arm) = arms[k];
            let m = machine(a)?;
            m.tunables
                .set("migrc", ARMS[arm])
                .map_err(|e| anyhow!("{e}"))?;
            m.tunables.set_migration_entry_ad(ad);
            m.set_ipi_cost(cost.send_ns, cost.recv_ns);
            let (s, grid) = run_once(&m, a)?;
            samples[k].push(s);
            machine_desc = m.config.to_string();
            reserve = (m.mem.min_free_kbytes(), m.mem.nodes[0].zone.watermarks());
            scan_period_min_ms = m.numa.scan_period_min_ms.load(Relaxed);
            grid_mb = grid >> 20;
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    let rows: Vec<Row> = arms
        .iter()
        .enumerate()
        .map(|(k, &(ad, arm))| {
            let mut r = row(ARMS[arm], ad, &samples[k]);
            if arm != 0 {
                let base = &samples[off_of(k)];
                let q = Estimate::ratio(&runtime(&samples[k]), &runtime(base));
                (r.ratio, r.ci_low, r.ci_high) = Estimate::fields(Some(q));
                let f = Estimate::ratio(&flushes(&samples[k]), &flushes(base));
                (
                    r.remote_flush_ratio,
                    r.remote_flush_ratio_ci_low,
                    r.remote_flush_ratio_ci_high,
                ) = Estimate::fields(Some(f));
                let o =
                    Estimate::ratio(&outside_scan_per_k(&samples[k]), &outside_scan_per_k(base));
                (
                    r.outside_scan_ratio,
                    r.outside_scan_ratio_ci_low,
                    r.outside_scan_ratio_ci_high,
                ) = Estimate::fields(Some(o));
            }
            r
        })
        .collect();
    if !a.json {
        let scan_ms = scan_period_ms(&samples);
        let [min, low, high, promo] = reserve.1;
        let machine = format!(
            "{machine_desc}; THP {}, min_free_kbytes {} kB, node 0's watermarks min {min}, low {low}, high {high}, promo {promo} pages",
            a.thp, reserve.0
        );
        print_table(&rows, a, grid_mb, &machine, scan_ms);
        if let Some(line) = cost.describe() {
            crate::outln!("{line}\n");
        }
    }
    plot_rows(a, &rows)?;
    Ok(serde_json::json!({
        "experiment": "migrc",
        "machine": machine_desc,
        "grid_mb": grid_mb,
        "lookups_per_cpu": a.lookups,
        "warmup_lookups_per_cpu": a.warmup,
        // The kernel's default scan_period_min_ms (and scan_period_max_ms
        // set to it), and what it made of it for this process
        // (task_scan_min).
        "scan_period_min_ms": scan_period_min_ms,
        "scan_period_max_ms": scan_period_min_ms,
        "scan_period_ms": scan_period_ms(&samples),
        "scan_size_mb": a.scan_size_mb,
        "thp": a.thp,
        "min_free_kbytes": reserve.0,
        "fast_node_watermarks": reserve.1,
        "ipi_cost": cost.json(),
        "seed": SEED
            .iter()
            .map(|&(metric, off, migrc)| serde_json::json!({ "metric": metric, "off": off, "migrc": migrc }))
            .collect::<Vec<_>>(),
        "rows": rows,
    }))
}

fn row(arm: &'static str, ad: bool, s: &[Sample]) -> Row {
    let med =
        |f: &dyn Fn(&Sample) -> u64| super::median(s.iter().map(|x| f(x) as f64).collect()) as u64;
    let c = |i: usize| med(&|x| x.counters[i]);
    let times: Vec<f64> = s.iter().map(|x| x.runtime_s).collect();
    Row {
        arm,
        migration_entry_ad: ad,
        runs: s.len(),
        numa_pages_migrated: c(0),
        pgmigrate_success: c(1),
        nr_tlb_remote_flush: c(2),
        nr_tlb_remote_flush_received: c(3),
        nr_tlb_local_flush_all: c(4),
        nr_tlb_local_flush_one: c(5),
        dtlb_load_misses: med(&|x| x.dtlb_load_misses),
        dtlb_store_misses: med(&|x| x.dtlb_store_misses),
        kept_peak: med(&|x| x.kept_peak),
        luf_takeoff_flushes: med(&|x| x.luf_takeoff_flushes),
        luf_forced_flushes: med(&|x| x.luf_forced_flushes),
        luf_flushes_whole_run: med(&|x| x.luf_flushes_whole_run),
        luf_deferred_whole_run: med(&|x| x.luf_deferred_whole_run),
        usermm_numa_scan_remote_flush: med(&|x| x.scan_remote_flushes),
        attributed: ATTRIBUTED
            .iter()
            .enumerate()
            .map(|(i, (e, _))| (e.name(), med(&|x| x.attributed[i])))
            .collect(),
        tiering: TIERING
            .iter()
            .enumerate()
            .map(|(i, (name, _))| (*name, med(&|x| x.tiering[i])))
            .collect(),
        kswapd_shootdown_wait_us: med(&|x| x.kswapd_shootdown_wait_us),
        remote_flush_per_k_migrated: per_k(s, 2),
        remote_flush_received_per_k_migrated: per_k(s, 3),
        remote_flush_outside_scan_per_k_migrated: super::median(outside_scan_per_k(s)),
        stale_reads: s.iter().map(|x| x.stale_reads).sum(),
        lost_writes: s.iter().map(|x| x.lost_writes).sum(),
        runtime_s: stats::median(&times),
        ratio: None,
        ci_low: None,
        ci_high: None,
        remote_flush_ratio: None,
        remote_flush_ratio_ci_low: None,
        remote_flush_ratio_ci_high: None,
        outside_scan_ratio: None,
        outside_scan_ratio_ci_low: None,
        outside_scan_ratio_ci_high: None,
        samples_runtime_s: times,
        samples_pgmigrate_success: s.iter().map(|x| x.counters[1]).collect(),
        samples_nr_tlb_remote_flush: s.iter().map(|x| x.counters[2]).collect(),
    }
}

/// The median over the runs of counter `i` per 1000 pages migrated.
fn per_k(s: &[Sample], i: usize) -> f64 {
    super::median(s.iter().map(|x| x.per_k(i)).collect())
}

/// Every run's shootdowns sent outside the NUMA scan per 1000 pages
/// migrated.
fn outside_scan_per_k(s: &[Sample]) -> Vec<f64> {
    s.iter().map(Sample::outside_scan_per_k).collect()
}

/// The process's time between scans in the runs (the same in each: the
/// grid is resident when NUMA balancing is switched on).
fn scan_period_ms(samples: &[Vec<Sample>]) -> u64 {
    samples
        .iter()
        .flatten()
        .map(|s| s.scan_period_ms)
        .max()
        .unwrap_or(0)
}

/// [`TIERING`]'s counters in `snap` (each only grows: events, and node
/// statistics that count promotions).
fn tiering_counts(snap: &usermm::vmstat::VmStatSnapshot) -> [u64; TIERING.len()] {
    TIERING.map(|(name, _)| snap.get(name).expect("TIERING names counters") as u64)
}

/// `--thp`: a top-level THP mode (`inherit` is not one).
pub fn parse_thp(s: &str) -> anyhow::Result<ThpMode> {
    ThpMode::parse(s)
        .filter(|&m| m != ThpMode::Inherit)
        .ok_or_else(|| anyhow!("--thp must be never, madvise or always, not {s:?}"))
}

/// Build the grid, then run the lookups on every CPU; the counters over
/// the lookups, and the grid's size.
fn run_once(m: &Machine, a: &BenchArgs) -> anyhow::Result<(Sample, u64)> {
    let (warmup, lookups) = (a.warmup, a.lookups);
    let fast = m.config.nodes[0].size_bytes;
    let grid_len = (fast + fast / 2) & !(PAGE - 1);
    m.prefault();
    m.set_demotion_enabled(true);
    // Setting the mode sets the reserve, and the watermarks, with it.
    m.thp
        .set_enabled(parse_thp(&a.thp)?)
        .map_err(|e| anyhow!("thp: {e}"))?;
    m.numa.scan_delay_ms.store(0, Relaxed);
    m.numa.scan_size_mb.store(a.scan_size_mb, Relaxed);
    // The period stays at its start (see the module doc).
    let min = m.numa.scan_period_min_ms.load(Relaxed);
    m.numa.scan_period_max_ms.store(min, Relaxed);
    let cpus = m.cpus.len();
    let _pinned = crate::native::pin_thread(0);
    let c0 = m.bind(0).map_err(|e| anyhow!("bind: {e}"))?;
    let mm = c0.new_mm().map_err(|e| anyhow!("mm: {e}"))?;
    let rw = PROT_READ | PROT_WRITE;
    let anon = MAP_PRIVATE | MAP_ANONYMOUS;
    let grid = c0
        .mmap(0, grid_len, rw, anon)
        .map_err(|e| anyhow!("mmap: {e}"))?;
    let results = c0
        .mmap(0, cpus as u64 * PAGE, rw, anon)
        .map_err(|e| anyhow!("mmap: {e}"))?;
    let n = grid_len / 8;
    for i in 0..n {
        c0.store_u64(grid + 8 * i, key(i))
            .map_err(|e| anyhow!("building the grid: {e}"))?;
    }
    c0.idle();
    m.numa.mode.store(NUMA_BALANCING_MEMORY_TIERING, Relaxed);
    let read = || {
        let v = m.vmstat();
        (
            COUNTERS.map(|e| v.event(e)),
            v.event(Event::TLB_MISS),
            v.event(Event::DTLB_STORE_MISS),
            v.event(Event::LUF_TAKEOFF_FLUSH),
            v.event(Event::LUF_FORCED_FLUSH),
            v.event(Event::NUMA_SCAN_REMOTE_FLUSH),
            ATTRIBUTED.map(|(e, _)| v.event(e)),
            tiering_counts(&v.snapshot()),
            v.event_on(v.no_cpu(), Event::TLB_SHOOTDOWN_WAIT_US),
            v.event(Event::LUF_DEFERRED),
        )
    };
    let stale = AtomicU64::new(0);
    let lost = AtomicU64::new(0);
    let warm_pool = LookupPool::new(warmup * cpus as u64);
    let pool = LookupPool::new(lookups * cpus as u64);
    // Every CPU warms up, then all measure together: between the two
    // barriers CPU 0 reads the counters and the clock.
    let barrier = Barrier::new(cpus);
    let mut t0 = Instant::now();
    let mut before = read();
    let mut errors = Vec::new();
    std::thread::scope(|s| {
        let handles: Vec<_> = (1..cpus)
            .map(|id| {
                let (mm, stale, lost, barrier) = (mm.clone(), &stale, &lost, &barrier);
                let (warm_pool, pool) = (&warm_pool, &pool);
                s.spawn(move || -> anyhow::Result<()> {
                    // CPU i on host CPU i modulo the host's: a core
                    // each, unless `--machine` gave more CPUs.
                    crate::native::pin_to_cpu(id);
                    let c = m.bind(id).map_err(|e| anyhow!("bind: {e}"))?;
                    c.switch_mm(&mm);
                    let mut cpu = LookupCpu::new(&c, id, grid, n, results, stale, lost);
                    let warm = cpu.lookups(warm_pool);
                    c.idle();
                    barrier.wait();
                    barrier.wait();
                    let r = warm.and_then(|()| cpu.lookups(pool));
                    c.idle();
                    r
                })
            })
            .collect();
        let mut cpu = LookupCpu::new(&c0, 0, grid, n, results, &stale, &lost);
        let warm = cpu.lookups(&warm_pool);
        c0.idle();
        barrier.wait();
        before = read();
        t0 = Instant::now();
        barrier.wait();
        errors.push(warm.and_then(|()| cpu.lookups(&pool)));
        c0.idle();
        for h in handles {
            errors.push(h.join().expect("a lookup thread panicked"));
        }
    });
    let runtime_s = t0.elapsed().as_secs_f64();
    m.numa.mode.store(0, Relaxed);
    errors.into_iter().collect::<anyhow::Result<()>>()?;
    let after = read();
    let misses = after.1 - before.1;
    let store_misses = after.2 - before.2;
    let sample = Sample {
        counters: std::array::from_fn(|i| after.0[i] - before.0[i]),
        dtlb_load_misses: misses - store_misses,
        dtlb_store_misses: store_misses,
        kept_peak: m.mem.migrc.kept_peak(),
        luf_takeoff_flushes: after.3 - before.3,
        luf_forced_flushes: after.4 - before.4,
        luf_flushes_whole_run: after.3 + after.4,
        luf_deferred_whole_run: after.9,
        scan_remote_flushes: after.5 - before.5,
        attributed: std::array::from_fn(|i| after.6[i] - before.6[i]),
        tiering: std::array::from_fn(|i| after.7[i] - before.7[i]),
        kswapd_shootdown_wait_us: after.8 - before.8,
        scan_period_ms: mm.numa_scan.period_ms.load(Relaxed),
        stale_reads: stale.load(Relaxed),
        lost_writes: lost.load(Relaxed),
        runtime_s,
    };
    c0.exit_mm().map_err(|e| anyhow!("exit: {e}"))?;
    c0.idle();
    m.kswapd_quiesce();
    Ok((sample, grid_len))
}

/// A phase's lookups, shared by the CPUs: each takes the next
/// [`LOOKUP_CHUNK`] (or what is left) until none are.
struct LookupPool {
    left: AtomicU64,
}

impl LookupPool {
    fn new(lookups: u64) -> Self {
        LookupPool {
            left: AtomicU64::new(lookups),
        }
    }

    /// The number of lookups this CPU is to do next, 0 when all are
    /// taken.
    fn take(&self) -> u64 {
        // Only the count is shared: Relaxed suffices.
        self.left
            .fetch_update(Relaxed, Relaxed, |left| {
                (left > 0).then(|| left - left.min(LOOKUP_CHUNK))
            })
            .map_or(0, |left| left.min(LOOKUP_CHUNK))
    }
}

/// One CPU's lookups, with what it stored in its result slots.
struct LookupCpu<'a, 'm> {
    c: &'a OnCpu<'m>,
    grid: u64,
    n: u64,
    /// This CPU's result page.
    mine: u64,
    rng: u64,
    /// Lookups done, and the value last stored in each slot.
    done: u64,
    last: Vec<u64>,
    stale: &'a AtomicU64,
    lost: &'a AtomicU64,
}

impl<'a, 'm> LookupCpu<'a, 'm> {
    fn new(
        c: &'a OnCpu<'m>,
        id: usize,
        grid: u64,
        n: u64,
        results: u64,
        stale: &'a AtomicU64,
        lost: &'a AtomicU64,
    ) -> Self {
        LookupCpu {
            c,
            grid,
            n,
            mine: results + id as u64 * PAGE,
            rng: 0x9e37_79b9_7f4a_7c15u64 ^ (id as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9),
            done: 0,
            last: vec![0; RESULTS as usize],
            stale,
            lost,
        }
    }

    /// Load grid entry `i`, checking it.
    fn load(&self, i: u64) -> anyhow::Result<u64> {
        let v = self
            .c
            .load_u64(self.grid + 8 * i)
            .map_err(|e| anyhow!("lookup: {e}"))?;
        if v != key(i) {
            self.stale.fetch_add(1, Relaxed);
        }
        Ok(v)
    }

    /// Lookups from `pool` until it is empty, a chunk at a time.
    fn lookups(&mut self, pool: &LookupPool) -> anyhow::Result<()> {
        loop {
            match pool.take() {
                0 => return Ok(()),
                chunk => self.lookup_chunk(chunk)?,
            }
        }
    }

    /// `count` lookups: a binary search for a random key, the entries
    /// after it, the result stored; every value checked.
    fn lookup_chunk(&mut self, count: u64) -> anyhow::Result<()> {
        for _ in 0..count {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            let target = self.rng % (2 * self.n);
            // The first entry whose key is at least the target.
            let (mut lo, mut hi) = (0, self.n);
            while lo < hi {
                let mid = (lo + hi) / 2;
                if self.load(mid)? < target {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            let mut acc = lo;
            for j in lo..(lo + NUCLIDE_READS).min(self.n) {
                acc = acc.wrapping_add(self.load(j)?);
            }
            let slot = (self.done % RESULTS) as usize;
            let at = self.mine + 8 * slot as u64;
            let was = self.c.load_u64(at).map_err(|e| anyhow!("result: {e}"))?;
            if was != self.last[slot] {
                self.lost.fetch_add(1, Relaxed);
            }
            self.c
                .store_u64(at, acc)
                .map_err(|e| anyhow!("result: {e}"))?;
            self.last[slot] = acc;
            self.done += 1;
        }
        Ok(())
    }
}

/// The seed's own figures (v6.7 against v6.7 with MIGRC v8; its cover
/// letter, `XSBench -p 100000000` on a 16-CPU guest with 1 GiB of DRAM and
/// 8 GiB of CPU-less memory, counters system-wide), by the table's metric
/// names: printed beside the model's change as the seed's.
const SEED: [(&str, f64, f64); 9] = [
    ("numa_pages_migrated", 12_790_664.0, 14_897_064.0),
    ("pgmigrate_success", 26_835_314.0, 30_825_530.0),
    ("nr_tlb_remote_flush", 3_031_412.0, 198_290.0),
    ("nr_tlb_remote_flush_received", 45_234_862.0, 2_820_156.0),
    ("nr_tlb_local_flush_all", 216_584.0, 92_048.0),
    ("nr_tlb_local_flush_one", 740_940.0, 741_401.0),
    ("dTLB-load-misses", 238_381_632_579.0, 234_502_983_364.0),
    ("dTLB-store-misses", 601_514_255.0, 395_673_680.0),
    ("runtime (s)", 2252.88, 2172.28),
];

/// The seed's (off, migrc) for a metric of the table, those per page
/// migrated derived from its counters.
fn seed_figures(metric: &str) -> Option<(f64, f64)> {
    let get = |name: &str| SEED.iter().find(|s| s.0 == name).map(|s| (s.1, s.2));
    let per_k = |name: &str| {
        let (a, b) = get(name)?;
        let (ma, mb) = get("pgmigrate_success")?;
        Some((1000.0 * a / ma, 1000.0 * b / mb))
    };
    match metric {
        "remote flush per 1000 migrated" => per_k("nr_tlb_remote_flush"),
        "  received per 1000 migrated" => per_k("nr_tlb_remote_flush_received"),
        m => get(m),
    }
}

/// A change as the table prints it.
fn change_text(a: f64, b: f64) -> String {
    if a > 0.0 {
        format!("{:+.1}%", 100.0 * (b - a) / a)
    } else {
        "-".into()
    }
}

fn print_table(rows: &[Row], a: &BenchArgs, grid_mb: u64, machine: &str, scan_ms: u64) {
    let (warmup, lookups, scan_size_mb) = (a.warmup, a.lookups, a.scan_size_mb);
    crate::outln!(
        "bench migrc: {lookups} lookups per CPU measured after {warmup} to warm up, in a {grid_mb} MiB grid, NUMA balancing in tiering mode, demotion on\n"
    );
    for ad in [true, false] {
        let arms: Vec<&Row> = ARMS
            .iter()
            .filter_map(|name| {
                rows.iter()
                    .find(|r| r.arm == *name && r.migration_entry_ad == ad)
            })
            .collect();
        let Some((off, others)) = arms.split_first() else {
            continue;
        };
        crate::outln!(
            "migration_entry_ad {} (medians of {} rounds, arms interleaved)",
            if ad { "on (the host)" } else { "off" },
            off.runs
        );
        let mut head = format!("{:<30} {:>12}", "metric", "off");
        for r in others {
            head += &format!(" {:>12} {:>8}", r.arm, "change");
        }
        head += &format!(" {:>8}", "seed");
        crate::outln!("{head}");
        let line = |name: &str, get: &dyn Fn(&Row) -> f64| {
            let a = get(off);
            let mut l = format!("{name:<30} {a:>12}");
            for r in others {
                let b = get(r);
                l += &format!(" {b:>12} {:>8}", change_text(a, b));
            }
            if let Some((sa, sb)) = seed_figures(name) {
                l += &format!(" {:>8}", change_text(sa, sb));
            }
            crate::outln!("{l}");
        };
        line("numa_pages_migrated", &|r| r.numa_pages_migrated as f64);
        line("pgmigrate_success", &|r| r.pgmigrate_success as f64);
        line("nr_tlb_remote_flush", &|r| r.nr_tlb_remote_flush as f64);
        line("nr_tlb_remote_flush_received", &|r| {
            r.nr_tlb_remote_flush_received as f64
        });
        line("nr_tlb_local_flush_all", &|r| {
            r.nr_tlb_local_flush_all as f64
        });
        line("nr_tlb_local_flush_one", &|r| {
            r.nr_tlb_local_flush_one as f64
        });
        line("dTLB-load-misses", &|r| r.dtlb_load_misses as f64);
        line("dTLB-store-misses", &|r| r.dtlb_store_misses as f64);
        line("remote flush per 1000 migrated", &|r| {
            r.remote_flush_per_k_migrated.round()
        });
        line("  received per 1000 migrated", &|r| {
            r.remote_flush_received_per_k_migrated.round()
        });
        line("remote flush by the NUMA scan", &|r| {
            r.usermm_numa_scan_remote_flush as f64
        });
        line("  others per 1000 migrated", &|r| {
            r.remote_flush_outside_scan_per_k_migrated.round()
        });
        for (e, label) in ATTRIBUTED {
            line(label, &|r| r.attributed[e.name()] as f64);
        }
        for (name, label) in TIERING {
            line(label, &|r| r.tiering[name] as f64);
        }
        line("  by kswapd", &|r| r.kswapd_shootdown_wait_us as f64);
        line("pages kept (peak)", &|r| r.kept_peak as f64);
        line("LUF flushes at takeoff", &|r| r.luf_takeoff_flushes as f64);
        line("LUF forced flushes", &|r| r.luf_forced_flushes as f64);
        line("folios LUF deferred (all runs)", &|r| {
            r.luf_deferred_whole_run as f64
        });
        line("stale reads (all runs)", &|r| r.stale_reads as f64);
        line("lost writes (all runs)", &|r| r.lost_writes as f64);
        line("runtime (s)", &|r| (r.runtime_s * 1000.0).round() / 1000.0);
        let ratios = |name: &str, get: &dyn Fn(&Row) -> Option<Estimate>| {
            let mut l = format!("{name:<30} {:>12}", "");
            for r in others {
                l += &format!(" {:>21}", get(r).map_or("-".into(), |e| e.ratio_text()));
            }
            crate::outln!("{l}");
        };
        if !others.is_empty() {
            ratios("  runtime / off's [95% CI]", &|r| r.estimate());
            ratios("  remote per 1000 / off's", &|r| r.remote_flush_estimate());
            ratios("  others per 1000 / off's", &|r| r.outside_scan_estimate());
        }
        crate::outln!();
    }
    // Pages migrated per scan by `off` (with migration_entry_ad off, the
    // aims' arm, where it ran), from its medians.
    let per_scan = rows
        .iter()
        .filter(|r| r.arm == "off")
        .min_by_key(|r| r.migration_entry_ad)
        .filter(|r| scan_ms > 0 && r.runtime_s > 0.0)
        .map_or("?".to_string(), |r| {
            let scans = r.runtime_s * 1000.0 / scan_ms as f64;
            format!("{:.0}", r.pgmigrate_success as f64 / scans)
        });
    crate::outln!(
        "seed: the change MIGRC made in the seed's own run (v6.7 and v6.7 with MIGRC v8, XSBench -p 100000000 on a 16-CPU guest)"
    );
    crate::outln!(
        "NUMA scan: {scan_size_mb} MB every {scan_ms} ms here (the kernel's first period for this process, kept), {per_scan} pages migrated a scan with migrc off; 256 MB every 2.7 s for most of the seed's run, some 30,000 (26.8 million in under a thousand scans), whose shootdowns its counters do not tell apart (\"others\" leaves the scan's out here)"
    );
    crate::outln!(
        "{}",
        stats::footnote(&format!("{} rounds", rows.first().map_or(0, |r| r.runs)))
    );
    crate::outln!("machine: {machine}\n");
}

/// migrc's and luf's counters as a share of off's, per migration_entry_ad
/// setting.
fn plot_rows(a: &BenchArgs, rows: &[Row]) -> anyhow::Result<()> {
    type Get = fn(&Row) -> u64;
    let metrics: [(&str, Get); 7] = [
        ("remote flush", |r| r.nr_tlb_remote_flush),
        ("received", |r| r.nr_tlb_remote_flush_received),
        ("local all", |r| r.nr_tlb_local_flush_all),
        ("local one", |r| r.nr_tlb_local_flush_one),
        ("migrated", |r| r.pgmigrate_success),
        ("dTLB load miss", |r| r.dtlb_load_misses),
        ("dTLB store miss", |r| r.dtlb_store_misses),
    ];
    let groups: Vec<String> = metrics.iter().map(|(n, _)| n.to_string()).collect();
    let bars: Vec<plot::Bars> = [true, false]
        .into_iter()
        .filter_map(|ad| {
            let arm = move |name: &str| {
                rows.iter()
                    .find(|r| r.arm == name && r.migration_entry_ad == ad)
            };
            let off = arm("off")?;
            Some(ARMS[1..].iter().filter_map(move |&name| {
                let on = arm(name)?;
                Some(plot::Bars {
                    label: format!(
                        "{name} / off, migration_entry_ad {}",
                        if ad { "on" } else { "off" }
                    ),
                    values: metrics
                        .iter()
                        .map(|(_, g)| (g(off) > 0).then(|| 100.0 * g(on) as f64 / g(off) as f64))
                        .collect(),
                })
            }))
        })
        .flatten()
        .collect();
    let path = a.out.join("migrc.svg");
    if bars.is_empty() {
        // `--arms off`: nothing to compare, and no stale plot left beside
        // this run's JSON.
        return match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(anyhow!("removing {}: {e}", path.display()))
            }
            _ => Ok(()),
        };
    }
    plot::bar_plot(
        &path,
        "migrc and luf: each counter as a share of off's (%)",
        &groups,
        "% of off",
        &bars,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arms_are_parsed_in_their_order_with_off_required() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(parse_arms(&[]).unwrap(), [0, 1, 2]);
        assert_eq!(parse_arms(&names(&["luf", "off"])).unwrap(), [0, 2]);
        assert!(parse_arms(&names(&["migrc"])).is_err());
        assert!(parse_arms(&names(&["off", "lru"])).is_err());
        assert_eq!(parse_migration_entry_ad("both").unwrap(), [false, true]);
        assert_eq!(parse_migration_entry_ad("on").unwrap(), [true]);
        assert!(parse_migration_entry_ad("yes").is_err());
    }

    /// The shared count hands out whole chunks, then what is left, then
    /// nothing, and never more than it held, however many CPUs take.
    #[test]
    fn lookup_pool_hands_out_chunks_and_the_rest() {
        let pool = LookupPool::new(2 * LOOKUP_CHUNK + 7);
        assert_eq!(pool.take(), LOOKUP_CHUNK);
        assert_eq!(pool.take(), LOOKUP_CHUNK);
        assert_eq!(pool.take(), 7);
        assert_eq!(pool.take(), 0);
        assert_eq!(pool.take(), 0);

        let pool = LookupPool::new(10_007);
        let taken = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| loop {
                    match pool.take() {
                        0 => break,
                        n => {
                            assert!(n <= LOOKUP_CHUNK);
                            taken.fetch_add(n, Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(taken.load(Relaxed), 10_007);
    }
}
