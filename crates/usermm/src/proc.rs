//! Per-process memory figures as `/proc/<pid>/status` and
//! `/proc/<pid>/smaps` give them (fs/proc/task_mmu.c: `task_mem`,
//! `smaps_account`).
//!
//! [`status`] reads the mm's counters; [`smaps`] walks each VMA's page tables
//! with mmap_lock held for reading and each table's lock held while it is
//! read, and accounts every page as `smaps_account` does: the zero page
//! (small or huge) counts nowhere, a page mapped more than once is shared and
//! contributes to PSS in proportion.

use std::ops::ControlFlow;

use serde::Serialize;

use crate::mm::vma::{VM_EXEC, VM_MAYSHARE, VM_READ, VM_WRITE};
use crate::mm::{Mm, MmCounter, Vma};
use crate::pgtable::pagewalk::{walk_page_range, MmWalkOps, WalkAction, WalkLock};
use crate::pgtable::swapops::SwpKind;
use crate::pgtable::{Pmd, PmdSlot, Pte};
use crate::phys::memmap::pg;
use crate::phys::{folio, Folio, PhysMem, PAGE_SIZE};
use crate::sync::Ordering;

/// The memory lines of `/proc/<pid>/status`, in kB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Status {
    pub vm_size: u64,
    pub vm_hwm: u64,
    pub vm_rss: u64,
    pub rss_anon: u64,
    pub rss_file: u64,
    pub rss_shmem: u64,
    pub vm_pte: u64,
    /// `VmLck`: the size of the locked VMAs (`locked_vm`).
    pub vm_lck: u64,
}

/// `task_mem`.
pub fn status(mm: &Mm) -> Status {
    let kb = |pages: i64| (pages.max(0) as u64) << 2;
    let rss = mm.rss_pages();
    Status {
        vm_size: kb(mm.total_vm.load(Ordering::Relaxed) as i64),
        vm_hwm: kb(mm.hiwater_rss.load(Ordering::Relaxed).max(rss)),
        vm_rss: kb(rss),
        rss_anon: kb(mm.get_rss(MmCounter::AnonPages)),
        rss_file: kb(mm.get_rss(MmCounter::FilePages)),
        rss_shmem: kb(mm.get_rss(MmCounter::ShmemPages)),
        vm_pte: (mm.pgtables_bytes.load(Ordering::Relaxed).max(0) as u64) >> 10,
        vm_lck: kb(mm.locked_vm.load(Ordering::Relaxed) as i64),
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (name, v) in [
            ("VmSize", self.vm_size),
            ("VmLck", self.vm_lck),
            ("VmHWM", self.vm_hwm),
            ("VmRSS", self.vm_rss),
            ("RssAnon", self.rss_anon),
            ("RssFile", self.rss_file),
            ("RssShmem", self.rss_shmem),
            ("VmPTE", self.vm_pte),
        ] {
            writeln!(f, "{:<12}{:>8} kB", format!("{name}:"), v)?;
        }
        Ok(())
    }
}

/// One VMA's `/proc/<pid>/smaps` entry (sizes in kB).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Smaps {
    pub start: u64,
    pub end: u64,
    /// `rw-p` and so on.
    pub perms: String,
    pub size: u64,
    pub rss: u64,
    pub pss: u64,
    pub shared_clean: u64,
    pub shared_dirty: u64,
    pub private_clean: u64,
    pub private_dirty: u64,
    pub referenced: u64,
    pub anonymous: u64,
    pub lazy_free: u64,
    pub anon_huge_pages: u64,
    /// `Locked`: the PSS of a locked VMA.
    pub locked: u64,
    /// The PSS and locked PSS in bytes with [`PSS_SHIFT`] more bits, which
    /// smaps_rollup sums before it rounds down to kB.
    #[serde(skip)]
    pss_raw: (u64, u64),
}

/// `struct mem_size_stats`, in bytes; PSS carries [`PSS_SHIFT`] more bits.
#[derive(Default)]
struct MemSizeStats {
    resident: u64,
    pss: u64,
    shared_clean: u64,
    shared_dirty: u64,
    private_clean: u64,
    private_dirty: u64,
    referenced: u64,
    anonymous: u64,
    lazyfree: u64,
    anonymous_thp: u64,
}

const PSS_SHIFT: u32 = 12;

impl MemSizeStats {
    /// `smaps_page_accumulate`.
    fn page_accumulate(&mut self, size: u64, pss: u64, dirty: bool, private: bool) {
        self.pss += pss;
        match (private, dirty) {
            (true, true) => self.private_dirty += size,
            (true, false) => self.private_clean += size,
            (false, true) => self.shared_dirty += size,
            (false, false) => self.shared_clean += size,
        }
    }

    /// `smaps_account`: `nr` pages from `page` (all of the folio when it is
    /// mapped by a PMD), mapped with the given accessed and dirty bits, by
    /// a present entry or (`present` false) a migration entry.
    fn account(&mut self, mem: &PhysMem, page: u64, nr: u64, bits: (bool, bool), present: bool) {
        let (young, dirty) = bits;
        let f = mem.page_folio(page);
        let size = nr * PAGE_SIZE;
        let head = f.head(mem);
        let dirty = dirty || head.test(pg::DIRTY);
        if f.test_anon(mem) {
            self.anonymous += size;
            if !head.test(pg::SWAPBACKED) && !dirty {
                self.lazyfree += size;
            }
        }
        self.resident += size;
        if young || head.test(pg::REFERENCED) {
            self.referenced += size;
        }
        // A refcount of one means a single mapping, whatever the pages. A
        // non-present entry counts as maybe shared, wholly: its folio's
        // counts are the migration's, not the mappings'.
        if f.ref_count(mem) == 1 || !present {
            self.page_accumulate(size, size << PSS_SHIFT, dirty, present);
            return;
        }
        for p in page..page + nr {
            let mapcount = folio::page_mapcount(mem, p).max(1) as u64;
            let pss = (PAGE_SIZE << PSS_SHIFT) / mapcount;
            self.page_accumulate(PAGE_SIZE, pss, dirty, mapcount < 2);
        }
    }
}

fn perms(vma: &Vma) -> String {
    let f = vma.flags();
    let c = |bit, ch| if f & bit != 0 { ch } else { '-' };
    [
        c(VM_READ, 'r'),
        c(VM_WRITE, 'w'),
        c(VM_EXEC, 'x'),
        if f & VM_MAYSHARE != 0 { 's' } else { 'p' },
    ]
    .iter()
    .collect()
}

/// `/proc/<pid>/maps` (`show_map_vma` for each VMA, then the vsyscall
/// page that x86-64 shows in every process): one line a mapping, its
/// fields separated by single spaces (the kernel pads the name to a
/// column). A host file's mapping shows the host's device, inode and
/// path, as the host's /proc would; a file of the model's own shows
/// device 00:00 and its model inode, with no path.
pub fn maps(mm: &Mm) -> Vec<String> {
    let _g = mm.mmap_lock.read();
    let guard = crate::sync::epoch::pin();
    let layout = mm.layout();
    let mut lines: Vec<String> = mm
        .vma_tree(&guard)
        .iter()
        .map(|vma| show_map_vma(vma, &layout))
        .collect();
    lines.push("ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0 [vsyscall]".into());
    lines
}

/// One line of [`maps`].
fn show_map_vma(vma: &Vma, layout: &crate::mm::MmLayout) -> String {
    let (mut dev, mut ino, mut pgoff, mut name) = ((0, 0), 0, 0, String::new());
    if let Some(file) = vma.file() {
        let inode = &file.inode;
        pgoff = vma.pgoff() * PAGE_SIZE;
        ino = inode.ino;
        if file.shared_anon {
            // shmem_zero_setup's file on shm_mnt, the first anonymous
            // device a booting kernel makes.
            dev = (0, 1);
            name = "/dev/zero (deleted)".into();
        } else if let Some(p) = &inode.host_path {
            use std::os::unix::fs::MetadataExt;
            if let Ok(meta) = std::fs::metadata(p) {
                let d = meta.dev();
                dev = (
                    ((d >> 8) & 0xfff) | ((d >> 32) & !0xfff),
                    (d & 0xff) | ((d >> 12) & !0xff),
                );
                ino = meta.ino();
            }
            name = std::fs::canonicalize(p)
                .unwrap_or_else(|_| p.clone())
                .display()
                .to_string();
        }
    } else if let Some(sm) = vma.special() {
        name = sm.name.into();
    } else if vma.start() < layout.brk && vma.end() > layout.start_brk {
        name = "[heap]".into();
    } else if vma.start() <= layout.start_stack && vma.end() >= layout.start_stack {
        name = "[stack]".into();
    }
    let mut line = format!(
        "{:08x}-{:08x} {} {:08x} {:02x}:{:02x} {}",
        vma.start(),
        vma.end(),
        perms(vma),
        pgoff,
        dev.0,
        dev.1,
        ino
    );
    if !name.is_empty() {
        line.push(' ');
        line.push_str(&name);
    }
    line
}

/// `show_smap` for every VMA of `mm`.
pub fn smaps(mm: &Mm) -> Vec<Smaps> {
    let _g = mm.mmap_lock.read();
    let guard = crate::sync::epoch::pin();
    mm.vma_tree(&guard)
        .iter()
        .map(|vma| smap_vma(mm, vma))
        .collect()
}

/// `/proc/<pid>/smaps_rollup`: the sum over all VMAs.
pub fn smaps_rollup(mm: &Mm) -> Smaps {
    let mut r = Smaps {
        perms: "---p".into(),
        ..Smaps::default()
    };
    for s in smaps(mm) {
        r.start = if r.size == 0 {
            s.start
        } else {
            r.start.min(s.start)
        };
        r.end = r.end.max(s.end);
        r.size += s.size;
        r.rss += s.rss;
        r.pss_raw.0 += s.pss_raw.0;
        r.pss_raw.1 += s.pss_raw.1;
        r.shared_clean += s.shared_clean;
        r.shared_dirty += s.shared_dirty;
        r.private_clean += s.private_clean;
        r.private_dirty += s.private_dirty;
        r.referenced += s.referenced;
        r.anonymous += s.anonymous;
        r.lazy_free += s.lazy_free;
        r.anon_huge_pages += s.anon_huge_pages;
    }
    r.pss = (r.pss_raw.0 >> PSS_SHIFT) >> 10;
    r.locked = (r.pss_raw.1 >> PSS_SHIFT) >> 10;
    r
}

/// `smaps_walk_ops`: each mapped page's share, under the page-table locks.
struct SmapsWalk<'a> {
    mem: &'a PhysMem,
    mss: MemSizeStats,
}

impl MmWalkOps for SmapsWalk<'_> {
    type Break = std::convert::Infallible;

    /// `smaps_pmd_entry`: a huge PMD, read under its lock; the huge zero
    /// page counts nowhere.
    fn pmd_entry(
        &mut self,
        slot: PmdSlot,
        pmd: Pmd,
        _addr: u64,
        _next: u64,
    ) -> ControlFlow<Self::Break, WalkAction> {
        let mem = self.mem;
        // pmd_trans_huge_lock: the lock only for a huge entry (or a PMD
        // migration entry), rechecked.
        let huge = crate::huge_memory::pmd_is_huge;
        if !huge(pmd) {
            return ControlFlow::Continue(WalkAction::Subtree);
        }
        let ptl = slot.lock(mem);
        let pmd = ptl.get();
        if !huge(pmd) {
            return ControlFlow::Continue(WalkAction::Subtree);
        }
        let nr = 1u64 << crate::phys::HPAGE_PMD_ORDER;
        if pmd.is_swap() {
            // A folio under migration counts where its entry is, as at
            // the PTE level.
            if let SwpKind::Migration { pfn, .. } = pmd.swp_entry().kind() {
                self.mss.account(mem, pfn, nr, (false, false), false);
                self.mss.anonymous_thp += nr * PAGE_SIZE;
            }
        } else if !pmd.special() {
            self.mss
                .account(mem, pmd.pfn(), nr, (pmd.young(), pmd.dirty()), true);
            if Folio(pmd.pfn()).test_anon(mem) {
                self.mss.anonymous_thp += nr * PAGE_SIZE;
            }
        }
        ControlFlow::Continue(WalkAction::Continue)
    }

    /// `smaps_pte_entry`: `vm_normal_page` skips the zero page; a page
    /// under migration counts where its migration entry is, as maybe shared
    /// (with its folio's dirty and referenced flags); markers count nowhere.
    fn pte_entry(&mut self, pte: Pte, _addr: u64) -> ControlFlow<Self::Break> {
        if pte.is_swap() {
            if let SwpKind::Migration { pfn, .. } = pte.swp_entry().kind() {
                self.mss.account(self.mem, pfn, 1, (false, false), false);
            }
        } else if !pte.special() {
            self.mss
                .account(self.mem, pte.pfn(), 1, (pte.young(), pte.dirty()), true);
        }
        ControlFlow::Continue(())
    }
}

fn smap_vma(mm: &Mm, vma: &Vma) -> Smaps {
    let (start, end) = (vma.start(), vma.end());
    let mut walk = SmapsWalk {
        mem: &mm.mem,
        mss: MemSizeStats::default(),
    };
    let flow = walk_page_range(&mm.mem, &mm.pgd, start, end, WalkLock::Ptl, &mut walk);
    debug_assert!(flow.is_continue());
    let mss = walk.mss;
    let kb = |b: u64| b >> 10;
    let locked = vma.flags() & crate::mm::vma::VM_LOCKED != 0;
    Smaps {
        start,
        end,
        perms: perms(vma),
        size: kb(end - start),
        rss: kb(mss.resident),
        pss: kb(mss.pss >> PSS_SHIFT),
        shared_clean: kb(mss.shared_clean),
        shared_dirty: kb(mss.shared_dirty),
        private_clean: kb(mss.private_clean),
        private_dirty: kb(mss.private_dirty),
        referenced: kb(mss.referenced),
        anonymous: kb(mss.anonymous),
        lazy_free: kb(mss.lazyfree),
        anon_huge_pages: kb(mss.anonymous_thp),
        locked: if locked { kb(mss.pss >> PSS_SHIFT) } else { 0 },
        pss_raw: (mss.pss, if locked { mss.pss } else { 0 }),
    }
}

impl std::fmt::Display for Smaps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{:08x}-{:08x} {}", self.start, self.end, self.perms)?;
        for (name, v) in [
            ("Size", self.size),
            ("Rss", self.rss),
            ("Pss", self.pss),
            ("Shared_Clean", self.shared_clean),
            ("Shared_Dirty", self.shared_dirty),
            ("Private_Clean", self.private_clean),
            ("Private_Dirty", self.private_dirty),
            ("Referenced", self.referenced),
            ("Anonymous", self.anonymous),
            ("LazyFree", self.lazy_free),
            ("AnonHugePages", self.anon_huge_pages),
            ("Locked", self.locked),
        ] {
            writeln!(f, "{:<16}{:>8} kB", format!("{name}:"), v)?;
        }
        Ok(())
    }
}
