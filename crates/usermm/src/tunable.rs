//! The run-time switches: a registry of named tunables with typed values.
//!
//! Each tunable selects between algorithms on the same engine, so that one
//! process can measure before and after side by side. Every value is some
//! kernel's algorithm (or a published series' design), said in its
//! description; the default is what the host kernel (6.18) does.
//!
//! A tunable is set by name from the library ([`Tunables::set`]), from a
//! scenario (`tunable NAME VALUE`) or on the command line
//! (`--tunable NAME=VALUE`); the engine reads it through a typed accessor,
//! one relaxed load, on its hot paths. A change takes effect for operations
//! that start after it: each operation reads a tunable once where it
//! chooses its path.

use std::fmt;

use crate::sync::{AtomicU8, Ordering};

/// One value a tunable may take.
#[derive(Clone, Copy, Debug)]
pub struct TunableValue {
    pub name: &'static str,
    /// Which kernel (or series) this value is.
    pub description: &'static str,
}

/// A tunable's name, meaning and values.
#[derive(Clone, Copy, Debug)]
pub struct TunableInfo {
    pub name: &'static str,
    pub description: &'static str,
    pub values: &'static [TunableValue],
    /// Index into `values` of the default (the host kernel's algorithm).
    pub default: u8,
}

impl TunableInfo {
    /// The default value's name.
    pub fn default_name(&self) -> &'static str {
        self.values[self.default as usize].name
    }
}

/// The tunables, by index into [`TUNABLES`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Tunable {
    /// F1: fork's PTE batching for large folios.
    ForkBatch,
    /// F2: zap's PTE batching for large folios.
    ZapBatch,
    /// F4: freeing empty user PTE tables.
    PtReclaim,
    /// F4, beyond both designs: freeing the PMD tables that PT reclaim
    /// empties.
    PtReclaimPmd,
    /// F5: the lock a page fault takes.
    FaultLock,
    /// F3's baseline: migration's batched unmap flush.
    MigrateBatchFlush,
    /// `migration_entry_ad`: do migration entries carry young and dirty?
    MigrationEntryAd,
    /// `migrc`: which TLB flushes a migration between tiers may defer.
    Migrc,
    /// `wp_reuse_large`: may a write fault reuse a page of a large folio
    /// in place (v6.15)? docs/extending.md's worked example.
    WpReuseLarge,
}

impl Tunable {
    /// Every tunable, in registry order.
    pub const ALL: [Tunable; TUNABLES.len()] = [
        Tunable::ForkBatch,
        Tunable::ZapBatch,
        Tunable::PtReclaim,
        Tunable::PtReclaimPmd,
        Tunable::FaultLock,
        Tunable::MigrateBatchFlush,
        Tunable::MigrationEntryAd,
        Tunable::Migrc,
        Tunable::WpReuseLarge,
    ];

    /// Its registry entry.
    pub fn info(self) -> &'static TunableInfo {
        &TUNABLES[self as usize]
    }
}

const OFF_ON_BATCH: [TunableValue; 2] = [
    TunableValue {
        name: "off",
        description: "one PTE at a time (the kernel before v6.9)",
    },
    TunableValue {
        name: "on",
        description: "runs of PTEs of one large folio as a batch (v6.9 and later)",
    },
];

/// The designs that free emptied user PTE tables, as [`Tunable::PtReclaim`]
/// selects them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum PtReclaim {
    /// Tables go only when their range is unmapped (`free_pgtables`).
    Off = 0,
    /// `CONFIG_PT_RECLAIM` (v6.14): MADV_DONTNEED frees a table that one
    /// zap emptied over its whole range.
    Upstream = 1,
    /// The seed's `pte_ref` (RFC, April 2022): every PTE table counts its
    /// entries and walkers; MADV_DONTNEED and MADV_FREE free the tables
    /// whose count reaches zero.
    PteRef = 2,
}

/// What MIGRC defers, as [`Tunable::Migrc`] selects it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum MigrcMode {
    /// Every migration flushes (the kernel).
    Off = 0,
    /// The seed: order-0 folios only.
    Migrc = 1,
    /// Beyond the seed: large folios mapped by PTEs too.
    MigrcLarge = 2,
    /// LUF v12: the source is freed, its flush owed before reuse.
    Luf = 3,
}

/// The lock a page fault takes, as [`Tunable::FaultLock`] selects it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FaultLock {
    /// mmap_lock for reading, every fault (the kernel before v6.4).
    MmapLock = 0,
    /// The seed's speculative faults (2021-2022, not merged): no lock, a
    /// check of `mm_lock_seq` before the commit, mmap_lock on abort.
    Spf = 1,
    /// Per-VMA locks (v6.4; the reference-count form of v6.15): the
    /// faulting VMA read-locked, mmap_lock where the kernel falls back.
    VmaLock = 2,
}

/// Every tunable, in [`Tunable`] order.
pub const TUNABLES: [TunableInfo; 9] = [
    TunableInfo {
        name: "fork_batch",
        description: "fork copies a run of PTEs mapping one large folio with one \
            reference and one rmap duplication (`folio_pte_batch` in \
            `copy_present_ptes`, v6.9 \"optimize fork() with PTE-mapped THP\")",
        values: &OFF_ON_BATCH,
        default: 1,
    },
    TunableInfo {
        name: "zap_batch",
        description: "munmap, MADV_DONTNEED and exit zap a run of PTEs mapping one \
            large folio as a unit and gather it as one fragment \
            (`zap_present_ptes`, v6.9 \"optimize unmap/zap with PTE-mapped THP\")",
        values: &OFF_ON_BATCH,
        default: 1,
    },
    TunableInfo {
        name: "pt_reclaim",
        description: "freeing the user PTE tables that MADV_DONTNEED empties \
            (`CONFIG_PT_RECLAIM`, v6.14 \"synchronously scan and reclaim empty \
            user PTE pages\")",
        values: &[
            TunableValue {
                name: "off",
                description: "tables are freed only when their range is unmapped \
                    (`free_pgtables`; the kernel before v6.14)",
            },
            TunableValue {
                name: "upstream",
                description: "a MADV_DONTNEED zap that covers a PTE table's whole \
                    2 MiB range and leaves nothing behind frees the table \
                    (v6.14 and later, with the Feb 2025 fix)",
            },
            TunableValue {
                name: "pte_ref",
                description: "each PTE table made while selected keeps a count of \
                    its entries and walkers (a percpu_ref); after MADV_DONTNEED and \
                    MADV_FREE a table whose count is zero is freed, however it was \
                    emptied (the F4 seed, \"Try to free user PTE page table pages\", \
                    RFC 2022, not merged)",
            },
        ],
        default: 1,
    },
    TunableInfo {
        name: "pt_reclaim_pmd",
        description: "also free a PMD table that PT reclaim empties (all 512 \
            entries none once its PTE tables went), with either design; no \
            kernel does",
        values: &[
            TunableValue {
                name: "off",
                description: "PMD tables are freed only when their range is \
                    unmapped (`free_pgtables`; every kernel)",
            },
            TunableValue {
                name: "on",
                description: "after `upstream` or `pte_ref` frees a PTE table, its \
                    PMD table goes too if it maps nothing more (usermm's own \
                    extension)",
            },
        ],
        default: 0,
    },
    TunableInfo {
        name: "fault_lock",
        description: "the lock a user page fault takes to keep its VMA stable \
            (F5: \"Speculative page faults\", 2021, and the per-VMA locks \
            merged instead in v6.4)",
        values: &[
            TunableValue {
                name: "mmap_lock",
                description: "mmap_lock for reading, every fault \
                    (`lock_mm_and_find_vma`; the kernel before v6.4)",
            },
            TunableValue {
                name: "spf",
                description: "no lock: the VMA is looked up under an epoch pin, \
                    the page tables walked without allocating, and the PTE \
                    committed under its lock only if `mm_lock_seq` shows no \
                    mmap writer ran; else the fault is redone under mmap_lock \
                    (the seed, RFC 2021 / v2 2022, not merged)",
            },
            TunableValue {
                name: "vma_lock",
                description: "the faulting VMA read-locked (`lock_vma_under_rcu`, \
                    the `vm_refcnt` form of v6.15), mmap_lock where the kernel \
                    falls back: a VMA being changed, an anon_vma to make while \
                    mmap_lock is held by another (v6.4 and later)",
            },
        ],
        default: 2,
    },
    TunableInfo {
        name: "migrate_batch_flush",
        description: "migration unmaps a batch of folios and flushes the TLBs once \
            for all of them (`try_to_migrate` with `TTU_BATCH_FLUSH`, then \
            `try_to_unmap_flush`; v6.3 \"migrate_pages: batch flushing TLB\")",
        values: &[
            TunableValue {
                name: "off",
                description: "each PTE cleared is flushed at once \
                    (`ptep_clear_flush`; the kernel before v6.3)",
            },
            TunableValue {
                name: "on",
                description: "one flush per batch of up to 512 pages (v6.3+)",
            },
        ],
        default: 1,
    },
    TunableInfo {
        name: "migration_entry_ad",
        description: "whether a migration entry keeps its PTE's accessed and \
            dirty bits (`migration_entry_supports_ad`, v6.1): a kernel \
            configuration, not an algorithm: x86 keeps them when its swap \
            entries have room for the two bits",
        values: &[
            TunableValue {
                name: "off",
                description: "the page is mapped old and clean after \
                    migration (a kernel without CONFIG_SWAP, or an x86 whose \
                    L1TF limit on swap offsets leaves no room; the behaviour \
                    before v6.1)",
            },
            TunableValue {
                name: "on",
                description: "young and dirty carried across (x86 with swap, \
                    v6.1+)",
            },
        ],
        default: 1,
    },
    TunableInfo {
        name: "migrc",
        description: "whether a demotion or promotion whose folio only clean \
            read-only PTEs mapped may skip its TLB flush, keeping the source \
            until a later flush covers the CPUs that may cache it (migrc), or \
            freeing it and flushing before it is handed out again (luf)",
        values: &[
            TunableValue {
                name: "off",
                description: "every migration flushes (the kernel)",
            },
            TunableValue {
                name: "migrc",
                description: "the seed, MIGRC v8 (Byungchul Park, 2024, not \
                    merged): order-0 folios of MR_DEMOTION and \
                    MR_NUMA_MISPLACED keep their source, pinned; a write \
                    fault, an allocation short of its watermark or memory \
                    pressure forces the flush",
            },
            TunableValue {
                name: "migrc_large",
                description: "as migrc, and large folios mapped by PTEs too \
                    (beyond the seed, which keeps order-0 folios only; a \
                    PMD-mapped THP's flush is never batched)",
            },
            TunableValue {
                name: "luf",
                description: "LUF v12 (Byungchul Park, 2025, not merged), for \
                    migrations: order-0 sources are freed at once, stamped \
                    with an unmap generation; the stamped CPUs are flushed \
                    before a page leaves the free lists, after a fault in a \
                    writable VMA and at the end of a VMA's unmap",
            },
        ],
        default: 0,
    },
    TunableInfo {
        name: "wp_reuse_large",
        description: "whether a write fault on a page of a PTE-mapped large \
            anon folio that this address space alone maps may reuse it in \
            place (`__wp_can_reuse_large_anon_folio`, v6.15, David \
            Hildenbrand's series that tracks a large folio's MM owners)",
        values: &[
            TunableValue {
                name: "off",
                description: "never: the page is copied and the folio left \
                    partially mapped, queued for a deferred split \
                    (`wp_can_reuse_anon_folio` from v6.9 to v6.14)",
            },
            TunableValue {
                name: "on",
                description: "when every reference to the folio is a mapping \
                    of this address space, the page is written in place \
                    (v6.15 and later)",
            },
        ],
        default: 1,
    },
];

/// Why a tunable could not be set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TunableError {
    UnknownName(String),
    UnknownValue { name: &'static str, value: String },
}

impl fmt::Display for TunableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TunableError::UnknownName(n) => {
                let names: Vec<_> = TUNABLES.iter().map(|t| t.name).collect();
                write!(f, "no tunable {n:?}; there are: {}", names.join(", "))
            }
            TunableError::UnknownValue { name, value } => {
                let info = TUNABLES.iter().find(|t| t.name == *name).expect("named");
                let values: Vec<_> = info.values.iter().map(|v| v.name).collect();
                write!(
                    f,
                    "tunable {name} has no value {value:?}; it takes: {}",
                    values.join(", ")
                )
            }
        }
    }
}

impl std::error::Error for TunableError {}

/// The machine's current value of every tunable.
pub struct Tunables {
    values: [AtomicU8; TUNABLES.len()],
}

impl Default for Tunables {
    /// Every tunable at its default: what the host kernel does.
    fn default() -> Self {
        Tunables {
            values: std::array::from_fn(|i| AtomicU8::new(TUNABLES[i].default)),
        }
    }
}

impl Tunables {
    /// The registry entry named `name`.
    pub fn info(name: &str) -> Option<(Tunable, &'static TunableInfo)> {
        let i = TUNABLES.iter().position(|t| t.name == name)?;
        Some((Tunable::ALL[i], &TUNABLES[i]))
    }

    /// Check `name=value` without setting anything.
    pub fn parse(name: &str, value: &str) -> Result<(Tunable, u8), TunableError> {
        let (t, info) =
            Self::info(name).ok_or_else(|| TunableError::UnknownName(name.to_string()))?;
        let v = info
            .values
            .iter()
            .position(|v| v.name == value)
            .ok_or_else(|| TunableError::UnknownValue {
                name: info.name,
                value: value.to_string(),
            })?;
        Ok((t, v as u8))
    }

    /// Set a tunable by name to a value by name.
    pub fn set(&self, name: &str, value: &str) -> Result<(), TunableError> {
        let (t, v) = Self::parse(name, value)?;
        self.values[t as usize].store(v, Ordering::Relaxed);
        Ok(())
    }

    /// The current value's name.
    pub fn get(&self, t: Tunable) -> &'static str {
        TUNABLES[t as usize].values[self.index(t) as usize].name
    }

    /// Every tunable with its current value, in registry order.
    pub fn list(&self) -> Vec<(&'static str, &'static str)> {
        TUNABLES
            .iter()
            .enumerate()
            .map(|(i, info)| {
                (
                    info.name,
                    info.values[self.values[i].load(Ordering::Relaxed) as usize].name,
                )
            })
            .collect()
    }

    /// The tunables that are not at their default, with their values.
    pub fn changed(&self) -> Vec<(&'static str, &'static str)> {
        Tunable::ALL
            .iter()
            .filter(|t| self.index(**t) != t.info().default)
            .map(|&t| (t.info().name, self.get(t)))
            .collect()
    }

    #[inline]
    fn index(&self, t: Tunable) -> u8 {
        // Relaxed: a tunable orders nothing; an operation reads it once
        // where it picks its path.
        self.values[t as usize].load(Ordering::Relaxed)
    }

    /// Set a two-valued tunable: `off` or `on`.
    pub fn set_on(&self, t: Tunable, on: bool) {
        debug_assert_eq!(TUNABLES[t as usize].values.len(), 2);
        self.values[t as usize].store(on as u8, Ordering::Relaxed);
    }

    /// `fork_batch`: is fork's PTE batching on?
    #[inline]
    pub fn fork_batch(&self) -> bool {
        self.index(Tunable::ForkBatch) != 0
    }

    /// `zap_batch`: is zap's PTE batching on?
    #[inline]
    pub fn zap_batch(&self) -> bool {
        self.index(Tunable::ZapBatch) != 0
    }

    /// `pt_reclaim`: which design frees emptied PTE tables.
    #[inline]
    pub fn pt_reclaim(&self) -> PtReclaim {
        match self.index(Tunable::PtReclaim) {
            0 => PtReclaim::Off,
            1 => PtReclaim::Upstream,
            _ => PtReclaim::PteRef,
        }
    }

    /// `pt_reclaim_pmd`: PT reclaim frees the PMD tables it empties.
    #[inline]
    pub fn pt_reclaim_pmd(&self) -> bool {
        self.index(Tunable::PtReclaimPmd) != 0
    }

    /// `fault_lock`: the lock a page fault takes.
    #[inline]
    pub fn fault_lock(&self) -> FaultLock {
        match self.index(Tunable::FaultLock) {
            0 => FaultLock::MmapLock,
            1 => FaultLock::Spf,
            _ => FaultLock::VmaLock,
        }
    }

    pub fn set_fault_lock(&self, lock: FaultLock) {
        self.values[Tunable::FaultLock as usize].store(lock as u8, Ordering::Relaxed);
    }

    pub fn set_pt_reclaim_pmd(&self, on: bool) {
        self.set_on(Tunable::PtReclaimPmd, on)
    }

    pub fn set_pt_reclaim(&self, design: PtReclaim) {
        self.values[Tunable::PtReclaim as usize].store(design as u8, Ordering::Relaxed);
    }

    pub fn set_fork_batch(&self, on: bool) {
        self.set_on(Tunable::ForkBatch, on)
    }

    pub fn set_zap_batch(&self, on: bool) {
        self.set_on(Tunable::ZapBatch, on)
    }

    /// `migrate_batch_flush`: does migration batch its TLB flushes?
    #[inline]
    pub fn migrate_batch_flush(&self) -> bool {
        self.index(Tunable::MigrateBatchFlush) != 0
    }

    pub fn set_migrate_batch_flush(&self, on: bool) {
        self.set_on(Tunable::MigrateBatchFlush, on)
    }

    /// `wp_reuse_large`: may a write fault reuse a page of a large folio?
    #[inline]
    pub fn wp_reuse_large(&self) -> bool {
        self.index(Tunable::WpReuseLarge) != 0
    }

    /// `migration_entry_supports_ad`.
    #[inline]
    pub fn migration_entry_ad(&self) -> bool {
        self.index(Tunable::MigrationEntryAd) != 0
    }

    pub fn set_migration_entry_ad(&self, on: bool) {
        self.set_on(Tunable::MigrationEntryAd, on)
    }

    /// `migrc` or `migrc_large`: do migrations keep the sources whose
    /// read-only flushes they defer?
    #[inline]
    pub fn migrc(&self) -> bool {
        matches!(self.index(Tunable::Migrc), 1 | 2)
    }

    /// `luf`: do migrations free the sources whose read-only flushes they
    /// defer, owing the flush before reuse?
    #[inline]
    pub fn luf(&self) -> bool {
        self.index(Tunable::Migrc) == 3
    }

    /// `migrc`: which folios may defer their flush.
    #[inline]
    pub fn migrc_mode(&self) -> MigrcMode {
        match self.index(Tunable::Migrc) {
            0 => MigrcMode::Off,
            1 => MigrcMode::Migrc,
            2 => MigrcMode::MigrcLarge,
            _ => MigrcMode::Luf,
        }
    }

    /// `migrc` on (the seed's) or off.
    pub fn set_migrc(&self, on: bool) {
        self.set_migrc_mode(if on { MigrcMode::Migrc } else { MigrcMode::Off })
    }

    pub fn set_migrc_mode(&self, mode: MigrcMode) {
        self.values[Tunable::Migrc as usize].store(mode as u8, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_order_matches_the_enum() {
        for (i, info) in TUNABLES.iter().enumerate() {
            let (t, got) = Tunables::info(info.name).unwrap();
            assert_eq!(t as usize, i);
            assert_eq!(got.name, info.name);
            assert!((info.default as usize) < info.values.len());
        }
    }

    #[test]
    fn set_by_name_and_read_typed() {
        let t = Tunables::default();
        assert!(t.fork_batch() && t.zap_batch(), "the host kernel's default");
        t.set("zap_batch", "off").unwrap();
        assert!(!t.zap_batch() && t.fork_batch());
        assert_eq!(t.get(Tunable::ZapBatch), "off");
        assert_eq!(
            t.list(),
            [
                ("fork_batch", "on"),
                ("zap_batch", "off"),
                ("pt_reclaim", "upstream"),
                ("pt_reclaim_pmd", "off"),
                ("fault_lock", "vma_lock"),
                ("migrate_batch_flush", "on"),
                ("migration_entry_ad", "on"),
                ("migrc", "off"),
                ("wp_reuse_large", "on")
            ]
        );
        let e = t.set("zap_batch", "maybe").unwrap_err();
        assert_eq!(
            e.to_string(),
            "tunable zap_batch has no value \"maybe\"; it takes: off, on"
        );
        let e = t.set("zap", "on").unwrap_err();
        assert_eq!(
            e.to_string(),
            "no tunable \"zap\"; there are: fork_batch, zap_batch, pt_reclaim, pt_reclaim_pmd, fault_lock, migrate_batch_flush, migration_entry_ad, migrc, wp_reuse_large"
        );
        assert!(!t.zap_batch(), "a refused set changes nothing");
    }
}
