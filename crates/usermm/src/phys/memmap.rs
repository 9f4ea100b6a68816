//! The memmap: one page descriptor (`struct page`) per frame.
//!
//! A descriptor is a set of atomics, 64 bytes like the kernel's `struct
//! page`, so that walking the memmap costs what it costs there. As in the
//! kernel, the folio-wide counters of a large folio live in the descriptor of
//! its first tail page, in fields a tail page does not otherwise use
//! (`struct folio` overlays `page[0]` and `page[1]`); see
//! [`crate::phys::folio::Folio::counters`].

use crate::sync::{AtomicI32, AtomicU32, AtomicU64, Ordering, SpinLock};

/// Page flags (`enum pageflags`), only those the model uses.
pub mod pg {
    pub const LOCKED: u64 = 1 << 0;
    /// Referenced once since reclaim last looked (`PG_referenced`).
    pub const REFERENCED: u64 = 1 << 2;
    pub const DIRTY: u64 = 1 << 4;
    /// On an LRU list (`PG_lru`).
    pub const LRU: u64 = 1 << 5;
    pub const HEAD: u64 = 1 << 6;
    /// On an active LRU list (`PG_active`).
    pub const ACTIVE: u64 = 1 << 8;
    /// `PG_readahead`, which is `PG_reclaim`'s bit in the kernel too:
    /// reading this page-cache folio starts the next readahead window;
    /// reclaim sets it on a dirty folio it leaves for writeback.
    pub const READAHEAD: u64 = 1 << 17;
    /// On the unevictable list (`PG_unevictable`).
    pub const UNEVICTABLE: u64 = 1 << 18;
    pub const SWAPBACKED: u64 = 1 << 19;
    /// `PG_anon_exclusive` (aliases `PG_mappedtodisk` in the kernel).
    pub const ANON_EXCLUSIVE: u64 = 1 << 20;
    /// Mapped by a `VM_LOCKED` VMA (`PG_mlocked`): kept off the evictable
    /// lists, counted in `nr_mlock`.
    pub const MLOCKED: u64 = 1 << 21;
    /// The frame is free in the buddy allocator (`PageBuddy`, a page type).
    pub const BUDDY: u64 = 1 << 40;
    /// The frame holds a page table (`PageTable`, a page type).
    pub const TABLE: u64 = 1 << 41;
    /// The frame is on a per-CPU free list.
    pub const PCP: u64 = 1 << 42;
    /// The shared zero page, or the huge zero folio.
    pub const ZERO: u64 = 1 << 43;
    /// `folio_test_large_rmappable`/`PG_partially_mapped` stand-in: a large anon
    /// folio some of whose pages are no longer mapped (deferred split queue).
    pub const PARTIALLY_MAPPED: u64 = 1 << 44;
    /// The folio is MADV_FREE'd and may be discarded (lazyfree).
    pub const LAZYFREE: u64 = 1 << 45;
    /// LUF: the head of a free block (or of a part a merge made of it) some
    /// page of which still carries a `luf_key`; the block is filed on a
    /// pend list. v12 folds the parts' keys into the head's key instead;
    /// a flag leaves every page's own key as its free made it.
    pub const LUF_PEND: u64 = 1 << 46;
    /// Low byte of the high word: the folio order (head pages only).
    pub const ORDER_SHIFT: u32 = 56;
    pub const ORDER_MASK: u64 = 0xff << ORDER_SHIFT;
}

/// Low bit of `mapping` marks an anonymous folio (`PAGE_MAPPING_ANON`).
pub const PAGE_MAPPING_ANON: u64 = 1;

/// Marks a tail page in `compound_head` (bit 0, as in the kernel).
pub const COMPOUND_TAIL: u64 = 1;

/// An unlinked buddy/pcp list pointer.
pub const LIST_NONE: u32 = u32::MAX;

/// `struct page`.
#[repr(C, align(64))]
pub struct Page {
    pub flags: AtomicU64,
    /// `_refcount`: references, one per PTE/PMD mapping plus transient ones.
    pub refcount: AtomicI32,
    /// `_mapcount`, starting at -1 for an unmapped page. For a page-table
    /// frame: the number of present entries in a PTE table is not tracked here
    /// (the kernel does not either); see `pt_share`.
    pub mapcount: AtomicI32,
    /// For a tail page: the head's PFN with [`COMPOUND_TAIL`] set; else 0.
    pub compound_head: AtomicU64,
    /// anon_vma pointer with [`PAGE_MAPPING_ANON`] set, for anon folios.
    pub mapping: AtomicU64,
    /// Linear page index in the anon_vma (the page's address >> PAGE_SHIFT at
    /// the time it was first mapped).
    pub index: AtomicU64,
    /// Buddy order of a free block; in `page[1]` of a large folio,
    /// `_nr_pages_mapped`; for a PMD table, the head of the list of
    /// deposited PTE tables (`pmd_huge_pte`), as a PFN + 1 (0 = empty).
    pub private: AtomicU64,
    /// Free-list links (offsets within the node), guarded by the zone lock or
    /// the pcp lock; also the deposit list link of a deposited PTE table.
    /// In `page[1]` of a large folio: `_large_mapcount` and `_entire_mapcount`.
    pub lru_next: AtomicU32,
    pub lru_prev: AtomicU32,
    /// `luf_key` (LUF, [`super::luf`]): while the page is free, the batch
    /// of CPUs to flush before it is handed out again; 0 for none.
    pub luf_key: AtomicU32,
    /// The split page-table lock (`ptdesc->ptl`) when this frame is a table.
    pub ptl: SpinLock,
}

impl Default for Page {
    fn default() -> Self {
        Page {
            flags: AtomicU64::new(0),
            refcount: AtomicI32::new(0),
            mapcount: AtomicI32::new(-1),
            compound_head: AtomicU64::new(0),
            mapping: AtomicU64::new(0),
            index: AtomicU64::new(0),
            private: AtomicU64::new(0),
            lru_next: AtomicU32::new(LIST_NONE),
            lru_prev: AtomicU32::new(LIST_NONE),
            luf_key: AtomicU32::new(0),
            ptl: SpinLock::new(),
        }
    }
}

impl Page {
    #[inline]
    pub fn test(&self, flag: u64) -> bool {
        self.flags.load(Ordering::Relaxed) & flag != 0
    }

    #[inline]
    pub fn set(&self, flag: u64) {
        self.flags.fetch_or(flag, Ordering::Relaxed);
    }

    #[inline]
    pub fn clear(&self, flag: u64) {
        self.flags.fetch_and(!flag, Ordering::Relaxed);
    }

    /// `folio_test_clear_*`: clear `flag` and say whether it was set; of
    /// several CPUs clearing it at once, exactly one sees it set.
    #[inline]
    pub fn test_and_clear(&self, flag: u64) -> bool {
        // AcqRel, as the kernel's test_and_clear_bit is fully ordered: the
        // winner sees what was done to the folio before the flag was set.
        self.flags.fetch_and(!flag, Ordering::AcqRel) & flag != 0
    }

    /// Order of the folio this page heads (0 for a small folio).
    #[inline]
    pub fn order(&self) -> u32 {
        ((self.flags.load(Ordering::Relaxed) & pg::ORDER_MASK) >> pg::ORDER_SHIFT) as u32
    }

    #[inline]
    pub fn is_tail(&self) -> bool {
        self.compound_head.load(Ordering::Relaxed) & COMPOUND_TAIL != 0
    }
}

// The descriptor must stay one cache line, as in the kernel (under loom
// the page-table lock is loom's mutex, which is larger).
#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<Page>() == 64);
