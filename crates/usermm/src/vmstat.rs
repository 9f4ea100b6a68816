//! Counters with the kernel's names: /proc/vmstat events (`enum vm_event_item`),
//! node statistics (`enum node_stat_item`), and the per-size mTHP statistics of
//! `/sys/kernel/mm/transparent_hugepage/hugepages-<size>kB/stats`.
//!
//! Events are per-CPU, as in the kernel: each CPU adds to its own slots with
//! relaxed atomics (no cache line is shared between writers) and a reader sums
//! them, so a sum taken while CPUs run is a snapshot, not an instant.
//! Node statistics are per-CPU too (the kernel's per-CPU `vm_node_stat_diff`),
//! summed on read; the kernel folds each CPU's diff into the node's count
//! past a threshold and reads the count alone, so its reads are approximate
//! where the model's are exact, and its writers touch the shared count every
//! threshold-many changes where the model's never do.

use serde::Serialize;

use crate::sync::{AtomicI64, AtomicU64, Ordering};

macro_rules! counters {
    ($(#[$m:meta])* $name:ident { $($item:ident => $text:literal,)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        #[repr(usize)]
        pub enum $name { $($item,)* }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$item,)*];
            pub const COUNT: usize = Self::ALL.len();
            pub fn name(self) -> &'static str {
                match self { $($name::$item => $text,)* }
            }
        }
    };
}

counters! {
    /// `enum vm_event_item`, plus model-only events prefixed `usermm_`.
    Event {
        PGALLOC => "pgalloc_normal",
        PGFREE => "pgfree",
        PGFAULT => "pgfault",
        PGMAJFAULT => "pgmajfault",
        THP_FILE_ALLOC => "thp_file_alloc",
        THP_FILE_FALLBACK => "thp_file_fallback",
        THP_FILE_MAPPED => "thp_file_mapped",
        THP_FAULT_ALLOC => "thp_fault_alloc",
        THP_FAULT_FALLBACK => "thp_fault_fallback",
        THP_COLLAPSE_ALLOC => "thp_collapse_alloc",
        THP_COLLAPSE_ALLOC_FAILED => "thp_collapse_alloc_failed",
        THP_SPLIT_PMD => "thp_split_pmd",
        THP_SPLIT_PAGE => "thp_split_page",
        THP_SPLIT_PAGE_FAILED => "thp_split_page_failed",
        THP_ZERO_PAGE_ALLOC => "thp_zero_page_alloc",
        THP_ZERO_PAGE_ALLOC_FAILED => "thp_zero_page_alloc_failed",
        THP_DEFERRED_SPLIT_PAGE => "thp_deferred_split_page",
        PGLAZYFREE => "pglazyfree",
        PGLAZYFREED => "pglazyfreed",
        PGACTIVATE => "pgactivate",
        UNEVICTABLE_PGCULLED => "unevictable_pgs_culled",
        UNEVICTABLE_PGRESCUED => "unevictable_pgs_rescued",
        UNEVICTABLE_PGMLOCKED => "unevictable_pgs_mlocked",
        UNEVICTABLE_PGMUNLOCKED => "unevictable_pgs_munlocked",
        UNEVICTABLE_PGCLEARED => "unevictable_pgs_cleared",
        UNEVICTABLE_PGSTRANDED => "unevictable_pgs_stranded",
        PGDEACTIVATE => "pgdeactivate",
        PGREFILL => "pgrefill",
        PGSCAN_KSWAPD => "pgscan_kswapd",
        PGSCAN_DIRECT => "pgscan_direct",
        PGSCAN_ANON => "pgscan_anon",
        PGSCAN_FILE => "pgscan_file",
        PGSTEAL_KSWAPD => "pgsteal_kswapd",
        PGSTEAL_DIRECT => "pgsteal_direct",
        PGSTEAL_ANON => "pgsteal_anon",
        PGSTEAL_FILE => "pgsteal_file",
        PGDEMOTE_KSWAPD => "pgdemote_kswapd",
        PGDEMOTE_DIRECT => "pgdemote_direct",
        PAGEOUTRUN => "pageoutrun",
        ALLOCSTALL => "allocstall_normal",
        NUMA_PTE_UPDATES => "numa_pte_updates",
        NUMA_HINT_FAULTS => "numa_hint_faults",
        NUMA_HINT_FAULTS_LOCAL => "numa_hint_faults_local",
        NUMA_PAGE_MIGRATE => "numa_pages_migrated",
        PGMIGRATE_SUCCESS => "pgmigrate_success",
        PGMIGRATE_FAIL => "pgmigrate_fail",
        THP_MIGRATION_SUCCESS => "thp_migration_success",
        THP_MIGRATION_FAIL => "thp_migration_fail",
        THP_MIGRATION_SPLIT => "thp_migration_split",
        NR_TLB_REMOTE_FLUSH => "nr_tlb_remote_flush",
        NR_TLB_REMOTE_FLUSH_RECEIVED => "nr_tlb_remote_flush_received",
        NR_TLB_LOCAL_FLUSH_ALL => "nr_tlb_local_flush_all",
        NR_TLB_LOCAL_FLUSH_ONE => "nr_tlb_local_flush_one",
        TLB_MISS => "usermm_tlb_miss",
        DTLB_STORE_MISS => "usermm_dtlb_store_misses",
        TLB_LAZY_FLUSH => "usermm_tlb_lazy_flush",
        TLB_IPI_SENT => "usermm_tlb_ipi_sent",
        TLB_SHOOTDOWN_WAIT_US => "usermm_tlb_shootdown_wait_us",
        COW_FAULT => "usermm_cow_fault",
        WP_REUSE => "usermm_wp_reuse",
        GATHER_FORCE_FLUSH => "usermm_gather_force_flush",
        PT_FREED => "usermm_pt_freed",
        PT_RECLAIM_UPSTREAM => "usermm_pt_reclaim_upstream",
        PT_RECLAIM_UPSTREAM_SLOW => "usermm_pt_reclaim_upstream_slow",
        PT_RECLAIM_PTE_REF => "usermm_pt_reclaim_pte_ref",
        PT_RECLAIM_PMD => "usermm_pt_reclaim_pmd",
        VMA_LOCK_SUCCESS => "vma_lock_success",
        VMA_LOCK_ABORT => "vma_lock_abort",
        VMA_LOCK_RETRY => "vma_lock_retry",
        VMA_LOCK_MISS => "vma_lock_miss",
        SPF_ATTEMPT => "spf_attempt",
        SPF_ABORT => "spf_abort",
        SPF_ABORT_ODD => "SPF_ABORT_ODD",
        SPF_ABORT_UNMAPPED => "SPF_ABORT_UNMAPPED",
        SPF_ABORT_VMA_COPY => "SPF_ABORT_VMA_COPY",
        SPF_ABORT_ACCESS_ERROR => "SPF_ABORT_ACCESS_ERROR",
        SPF_ABORT_PUD => "SPF_ABORT_PUD",
        SPF_ABORT_PMD => "SPF_ABORT_PMD",
        SPF_ABORT_ANON_VMA => "SPF_ABORT_ANON_VMA",
        SPF_ABORT_PTE_MAP_LOCK_SEQ1 => "SPF_ABORT_PTE_MAP_LOCK_SEQ1",
        SPF_ABORT_PTE_MAP_LOCK_PMD => "SPF_ABORT_PTE_MAP_LOCK_PMD",
        SPF_ABORT_PTE_MAP_LOCK_PTL => "SPF_ABORT_PTE_MAP_LOCK_PTL",
        SPF_ABORT_PTE_MAP_LOCK_SEQ2 => "SPF_ABORT_PTE_MAP_LOCK_SEQ2",
        SPF_ABORT_NON_SWAP_ENTRY => "SPF_ABORT_NON_SWAP_ENTRY",
        SPF_ABORT_NO_SPECULATE => "SPF_ABORT_NO_SPECULATE",
        SPF_ATTEMPT_ANON => "SPF_ATTEMPT_ANON",
        SPF_ATTEMPT_PTE => "SPF_ATTEMPT_PTE",
        SPF_ATTEMPT_WP => "SPF_ATTEMPT_WP",
        SHARED_LINE_WRITES => "usermm_shared_line_writes",
        LUF_TAKEOFF_FLUSH => "usermm_luf_takeoff_flush",
        LUF_FORCED_FLUSH => "usermm_luf_forced_flush",
        LUF_DEFERRED => "usermm_luf_deferred",
        NUMA_SCAN_REMOTE_FLUSH => "usermm_numa_scan_remote_flush",
        NUMA_PROMOTE_REFUSED => "usermm_numa_promote_refused",
        KSWAPD_FAILURE => "usermm_kswapd_failure",
        KSWAPD_WAKEUP_HOPELESS => "usermm_kswapd_wakeup_hopeless",
        KSWAPD_RUN_ON_CPU => "usermm_kswapd_run_on_cpu",
        MIGRC_FLUSH_WP_FAULT => "usermm_migrc_flush_wp_fault",
        MIGRC_FLUSH_WATERMARK => "usermm_migrc_flush_watermark",
        MIGRC_FLUSH_PRESSURE => "usermm_migrc_flush_pressure",
        MIGRC_FLUSH_REFUSED => "usermm_migrc_flush_refused",
        MIGRC_CAN_MIGRC_FAIL => "usermm_migrc_can_migrc_fail",
        MR_DEMOTION_REMOTE_FLUSH => "usermm_mr_demotion_remote_flush",
        MR_NUMA_MISPLACED_REMOTE_FLUSH => "usermm_mr_numa_misplaced_remote_flush",
    }
}

impl Event {
    /// The tables each design of PT reclaim freed, one counter per design
    /// (the slow-path counters count a subset of these).
    pub const PT_RECLAIMED_BY_DESIGN: &'static [Event] =
        &[Event::PT_RECLAIM_UPSTREAM, Event::PT_RECLAIM_PTE_REF];
}

counters! {
    /// `enum node_stat_item` (and `NR_FREE_PAGES` of the zone), those modelled.
    NodeStat {
        NR_ANON_MAPPED => "nr_anon_pages",
        NR_ANON_THPS => "nr_anon_transparent_hugepages",
        NR_PAGETABLE => "nr_page_table_pages",
        NR_INACTIVE_ANON => "nr_inactive_anon",
        NR_ACTIVE_ANON => "nr_active_anon",
        NR_INACTIVE_FILE => "nr_inactive_file",
        NR_ACTIVE_FILE => "nr_active_file",
        NR_UNEVICTABLE => "nr_unevictable",
        NR_MLOCK => "nr_mlock",
        NR_ISOLATED_ANON => "nr_isolated_anon",
        NR_ISOLATED_FILE => "nr_isolated_file",
        NR_FILE_PAGES => "nr_file_pages",
        NR_FILE_MAPPED => "nr_mapped",
        NR_FILE_DIRTY => "nr_dirty",
        NR_WRITEBACK => "nr_writeback",
        NR_WRITTEN => "nr_written",
        NR_FILE_THPS => "nr_file_hugepages",
        NR_FILE_PMDMAPPED => "nr_file_pmdmapped",
        NR_SHMEM => "nr_shmem",
        NR_SHMEM_THPS => "nr_shmem_hugepages",
        NR_SHMEM_PMDMAPPED => "nr_shmem_pmdmapped",
        PGPROMOTE_SUCCESS => "pgpromote_success",
        PGPROMOTE_CANDIDATE => "pgpromote_candidate",
        PGPROMOTE_CANDIDATE_NRL => "pgpromote_candidate_nrl",
    }
}

impl NodeStat {
    /// Pages per unit of the figure /proc/vmstat prints: the THP counts are
    /// kept in pages and printed in PMD-sized THPs
    /// (`vmstat_item_print_in_thp`).
    pub fn print_unit(self) -> i64 {
        match self {
            NodeStat::NR_ANON_THPS
            | NodeStat::NR_FILE_THPS
            | NodeStat::NR_FILE_PMDMAPPED
            | NodeStat::NR_SHMEM_THPS
            | NodeStat::NR_SHMEM_PMDMAPPED => crate::page_types::HPAGE_PMD_NR as i64,
            _ => 1,
        }
    }
}

counters! {
    /// Per-order mTHP statistics (`enum mthp_stat_item`).
    MthpStat {
        ANON_FAULT_ALLOC => "anon_fault_alloc",
        ANON_FAULT_FALLBACK => "anon_fault_fallback",
        SPLIT => "split",
        SPLIT_FAILED => "split_failed",
        SPLIT_DEFERRED => "split_deferred",
        NR_ANON => "nr_anon",
        NR_ANON_PARTIALLY_MAPPED => "nr_anon_partially_mapped",
        SHMEM_ALLOC => "shmem_alloc",
        SHMEM_FALLBACK => "shmem_fallback",
    }
}

/// Orders that have mTHP statistics: 0..=PMD order (order 0 and 1 unused).
pub const MTHP_ORDERS: usize = 10;

#[repr(align(128))]
struct CpuEvents([AtomicU64; Event::COUNT]);

#[repr(align(128))]
struct CpuNodeStats([AtomicI64; NodeStat::COUNT]);

pub struct VmStat {
    /// One row per CPU, plus a last row for work done on no CPU.
    events: Box<[CpuEvents]>,
    /// Likewise for the node statistics; the last row is written with
    /// atomic adds, by any thread that plays no CPU.
    node: Box<[CpuNodeStats]>,
    mthp: [[AtomicI64; MthpStat::COUNT]; MTHP_ORDERS],
}

impl VmStat {
    pub fn new(nr_cpus: usize) -> VmStat {
        VmStat {
            events: (0..=nr_cpus)
                .map(|_| CpuEvents(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
            node: (0..=nr_cpus)
                .map(|_| CpuNodeStats(std::array::from_fn(|_| AtomicI64::new(0))))
                .collect(),
            mthp: std::array::from_fn(|_| std::array::from_fn(|_| AtomicI64::new(0))),
        }
    }

    /// The row used by code that runs on no CPU.
    pub fn no_cpu(&self) -> usize {
        self.events.len() - 1
    }

    /// `count_vm_events(item, n)` on `cpu`.
    #[inline]
    pub fn count(&self, cpu: usize, item: Event, n: u64) {
        let last = self.events.len() - 1;
        if cpu >= last {
            // The row of threads that play no CPU (kswapd), which several
            // may write at once.
            self.events[last].0[item as usize].fetch_add(n, Ordering::Relaxed);
            return;
        }
        let slot = &self.events[cpu].0[item as usize];
        // Only this CPU writes its row: a load and a store suffice and avoid
        // a locked instruction, as the kernel's this_cpu_add does.
        slot.store(
            slot.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }

    pub fn event(&self, item: Event) -> u64 {
        self.events
            .iter()
            .map(|r| r.0[item as usize].load(Ordering::Relaxed))
            .sum()
    }

    pub fn event_on(&self, cpu: usize, item: Event) -> u64 {
        self.events[cpu].0[item as usize].load(Ordering::Relaxed)
    }

    /// A node statistic changes, from work on no CPU.
    #[inline]
    pub fn mod_node(&self, item: NodeStat, delta: i64) {
        self.mod_node_on(usize::MAX, item, delta);
    }

    /// A node statistic changes on `cpu` (out of range: no CPU).
    #[inline]
    pub fn mod_node_on(&self, cpu: usize, item: NodeStat, delta: i64) {
        let last = self.node.len() - 1;
        if cpu >= last {
            self.node[last].0[item as usize].fetch_add(delta, Ordering::Relaxed);
            return;
        }
        // Only the thread playing `cpu` writes its row.
        let slot = &self.node[cpu].0[item as usize];
        slot.store(slot.load(Ordering::Relaxed) + delta, Ordering::Relaxed);
    }

    pub fn node(&self, item: NodeStat) -> i64 {
        self.node
            .iter()
            .map(|r| r.0[item as usize].load(Ordering::Relaxed))
            .sum()
    }

    #[inline]
    pub fn mod_mthp(&self, order: u32, item: MthpStat, delta: i64) {
        self.mthp[order as usize][item as usize].fetch_add(delta, Ordering::Relaxed);
    }

    pub fn mthp(&self, order: u32, item: MthpStat) -> i64 {
        self.mthp[order as usize][item as usize].load(Ordering::Relaxed)
    }

    /// Every counter by its kernel name, as /proc/vmstat and the mTHP
    /// stats print it.
    pub fn snapshot(&self) -> VmStatSnapshot {
        VmStatSnapshot {
            events: Event::ALL
                .iter()
                .map(|&e| (e.name().to_string(), self.event(e)))
                .collect(),
            node: NodeStat::ALL
                .iter()
                .map(|&s| (s.name().to_string(), self.node(s) / s.print_unit()))
                .collect(),
            mthp: (2..MTHP_ORDERS as u32)
                .map(|o| {
                    let kb = 4u64 << o;
                    (
                        format!("hugepages-{kb}kB"),
                        MthpStat::ALL
                            .iter()
                            .map(|&s| (s.name().to_string(), self.mthp(o, s)))
                            .collect(),
                    )
                })
                .collect(),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct VmStatSnapshot {
    pub events: Vec<(String, u64)>,
    pub node: Vec<(String, i64)>,
    pub mthp: Vec<(String, Vec<(String, i64)>)>,
}

impl VmStatSnapshot {
    /// A counter by its name: a /proc/vmstat event or node statistic, or
    /// `hugepages-<size>kB/<stat>` for a per-size mTHP statistic.
    pub fn get(&self, name: &str) -> Option<i64> {
        if let Some((size, stat)) = name.split_once('/') {
            let (_, stats) = self.mthp.iter().find(|(s, _)| s == size)?;
            return stats.iter().find(|(n, _)| n == stat).map(|(_, v)| *v);
        }
        self.events
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v as i64)
            .or_else(|| self.node.iter().find(|(n, _)| n == name).map(|(_, v)| *v))
    }
}
