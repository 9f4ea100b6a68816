//! `struct address_space`: a file's page cache (`i_pages`) and its
//! mappings (`i_mmap`).
//!
//! # The page cache's index
//!
//! The kernel keeps folios in an xarray by page index, a large folio in
//! every slot it covers (a multi-index entry), read locklessly under RCU
//! with `folio_try_get`, and changed under `xa_lock`. The model keeps each
//! folio once, by the index of its first page, in an ordered map under one
//! lock that readers take too: a lookup is the folio at or below the index
//! that reaches it. Every folio in the index holds one reference per page
//! (`folio_ref_add(folio, nr)` in `__filemap_add_folio`), and its
//! `mapping` and `index` name this address space and its first page.
//!
//! # Mappings
//!
//! `i_mmap` holds every VMA that maps the file, found by the page offsets
//! it covers; the kernel's is an interval tree under `i_mmap_rwsem`, the
//! model's an ordered map by first offset, filtered by interval (files
//! are mapped a few times, not thousands). A VMA is linked when it is
//! made and unlinked when it leaves for good, as `vma_link_file` and
//! `unlink_file_vma` do; entries hold the VMA weakly.
//!
//! # Locking
//!
//! `i_pages` then nothing: no other lock is taken under it. `i_mmap` is
//! taken for reading by rmap walks and for writing by linking; page-table
//! locks are taken under it (as under the kernel's `i_mmap_rwsem`), never
//! the other way.

use std::collections::BTreeMap;

use super::CachedFolio;
use crate::mm::Vma;
use crate::phys::{Folio, PhysMem};
use crate::sync::{Arc, AtomicU64, Mutex, Ordering, RwLock, Weak};
use crate::vmstat::NodeStat;

/// The `i_mmap` rwsem of an address space, held for writing.
pub type IMmapWriteGuard<'a> = crate::sync::RwLockWriteGuard<'a, BTreeMap<(u64, usize), Weak<Vma>>>;

/// `struct address_space`.
pub struct AddressSpace {
    /// `i_pages`: folios by the index of their first page.
    i_pages: Mutex<BTreeMap<u64, Folio>>,
    /// `nrpages`: pages in the cache.
    nrpages: AtomicU64,
    /// `i_mmap`: the VMAs mapping the file, by (first page offset, VMA).
    i_mmap: RwLock<BTreeMap<(u64, usize), Weak<Vma>>>,
    /// `mapping_large_folio_support`: the largest folio order the cache
    /// may hold (0: small folios only).
    max_order: u32,
    /// `shmem_mapping`: a tmpfs file's (its folios swap-backed, counted
    /// in `nr_shmem`, never written back).
    shmem: bool,
    /// `host`: the inode whose page cache this is.
    host: Weak<super::Inode>,
}

impl AddressSpace {
    pub(super) fn new(large_folios: bool, shmem: bool, host: Weak<super::Inode>) -> AddressSpace {
        AddressSpace {
            i_pages: Mutex::new(BTreeMap::new()),
            nrpages: AtomicU64::new(0),
            i_mmap: RwLock::new(BTreeMap::new()),
            // MAX_PAGECACHE_ORDER on x86-64: the PMD order.
            max_order: if large_folios {
                crate::phys::HPAGE_PMD_ORDER
            } else {
                0
            },
            shmem,
            host,
        }
    }

    /// `mapping->host`: the inode, while it lives.
    pub fn host(&self) -> Option<Arc<super::Inode>> {
        self.host.upgrade()
    }

    /// `shmem_mapping`.
    #[inline]
    pub fn is_shmem(&self) -> bool {
        self.shmem
    }

    /// What a folio's `mapping` holds for this address space.
    #[inline]
    pub fn as_mapping_word(&self) -> u64 {
        self as *const AddressSpace as u64
    }

    /// `mapping_max_folio_order`.
    #[inline]
    pub fn max_folio_order(&self) -> u32 {
        self.max_order
    }

    /// `mapping_large_folio_support`.
    #[inline]
    pub fn large_folio_support(&self) -> bool {
        self.max_order > 0
    }

    /// `mapping->nrpages`.
    #[inline]
    pub fn nrpages(&self) -> u64 {
        self.nrpages.load(Ordering::Relaxed)
    }

    /// `filemap_get_entry`: the folio holding page `index`, if cached.
    /// The caller takes a reference before it lets go of what keeps the
    /// folio in the cache (see [`AddressSpace::get_folio`]).
    pub fn lookup(&self, mem: &PhysMem, index: u64) -> Option<CachedFolio> {
        let pages = self.i_pages.lock();
        Self::covering(mem, &pages, index)
    }

    fn covering(mem: &PhysMem, pages: &BTreeMap<u64, Folio>, index: u64) -> Option<CachedFolio> {
        let (&first, &folio) = pages.range(..=index).next_back()?;
        (index < first + folio.nr_pages(mem)).then_some(CachedFolio {
            folio,
            index: first,
        })
    }

    /// `filemap_get_folio`: the folio holding page `index`, with a
    /// reference for the caller.
    pub fn get_folio(&self, mem: &PhysMem, index: u64) -> Option<CachedFolio> {
        let pages = self.i_pages.lock();
        let c = Self::covering(mem, &pages, index)?;
        c.folio.get(mem);
        Some(c)
    }

    /// The cached folios that hold a page of `[first, last]`, in order,
    /// each with a reference for the caller (`filemap_get_folios`, and the
    /// walk of `next_uptodate_folio`).
    pub fn get_folios(&self, mem: &PhysMem, first: u64, last: u64) -> Vec<CachedFolio> {
        let pages = self.i_pages.lock();
        let mut out = Vec::new();
        if let Some(c) = Self::covering(mem, &pages, first) {
            if c.index < first {
                c.folio.get(mem);
                out.push(c);
            }
        }
        for (&index, &folio) in pages.range(first..=last) {
            folio.get(mem);
            out.push(CachedFolio { folio, index });
        }
        out
    }

    /// Whether any page of `[first, first + nr)` is cached.
    pub fn range_has_folio(&self, mem: &PhysMem, first: u64, nr: u64) -> bool {
        let pages = self.i_pages.lock();
        Self::covering(mem, &pages, first).is_some()
            || pages.range(first..first + nr).next().is_some()
    }

    /// `__filemap_add_folio`: put a new, locked folio (the caller's one
    /// reference) in the cache at `index`, a multiple of its size; false
    /// (EEXIST), changing nothing, if some page of its range is cached.
    pub fn add_folio(&self, mem: &PhysMem, folio: Folio, index: u64) -> bool {
        let nr = folio.nr_pages(mem);
        debug_assert_eq!(index % nr, 0, "folio misaligned in the page cache");
        let mut pages = self.i_pages.lock();
        if Self::covering(mem, &pages, index).is_some()
            || pages.range(index..index + nr).next().is_some()
        {
            return false;
        }
        let head = folio.head(mem);
        head.mapping
            .store(self.as_mapping_word(), Ordering::Relaxed);
        head.index.store(index, Ordering::Relaxed);
        if self.shmem {
            // shmem_add_to_page_cache: swap-backed. Clean until written
            // (a page of a hole is only zeroes, which reclaim may drop);
            // dirtied without dirty accounting (`noop_dirty_folio`).
            head.set(crate::phys::pg::SWAPBACKED);
            mem.mod_node_state(NodeStat::NR_SHMEM, nr as i64);
        }
        folio.ref_add(mem, nr as i32);
        pages.insert(index, folio);
        self.nrpages.fetch_add(nr, Ordering::Relaxed);
        mem.mod_node_state(NodeStat::NR_FILE_PAGES, nr as i64);
        if folio.order(mem) == crate::phys::HPAGE_PMD_ORDER {
            mem.mod_node_state(self.thps_stat(), nr as i64);
        }
        true
    }

    /// `__filemap_remove_folio` + `filemap_free_folio`: take a locked,
    /// unmapped folio out of the cache and drop the cache's references
    /// (the caller keeps its own). A dirty folio's count goes with it.
    pub fn remove_folio(&self, mem: &PhysMem, c: CachedFolio, cpu: usize) {
        let nr = c.folio.nr_pages(mem);
        {
            let mut pages = self.i_pages.lock();
            let gone = pages.remove(&c.index);
            debug_assert_eq!(gone, Some(c.folio), "removing a folio not cached there");
            self.nrpages.fetch_sub(nr, Ordering::Relaxed);
        }
        Self::forget_folio(mem, c.folio, nr, cpu, self.shmem);
    }

    fn forget_folio(mem: &PhysMem, folio: Folio, nr: u64, cpu: usize, shmem: bool) {
        debug_assert!(
            !folio.mapped(mem),
            "folio {:#x} left the page cache mapped",
            folio.pfn()
        );
        let head = folio.head(mem);
        if head.test_and_clear(crate::phys::pg::DIRTY) && !shmem {
            // `folio_account_cleaned`: a truncated dirty folio is never
            // written.
            mem.mod_node_state(NodeStat::NR_FILE_DIRTY, -(nr as i64));
        }
        if shmem {
            mem.mod_node_state(NodeStat::NR_SHMEM, -(nr as i64));
        }
        head.mapping.store(0, Ordering::Relaxed);
        mem.mod_node_state(NodeStat::NR_FILE_PAGES, -(nr as i64));
        if folio.order(mem) == crate::phys::HPAGE_PMD_ORDER {
            mem.mod_node_state(thps_stat(shmem), -(nr as i64));
        }
        folio.put_refs(mem, nr as i32, cpu);
    }

    /// The statistic of this cache's PMD-sized folios: `NR_SHMEM_THPS`
    /// (`shmem_add_to_page_cache`) or `NR_FILE_THPS`.
    pub fn thps_stat(&self) -> NodeStat {
        thps_stat(self.shmem)
    }

    /// The index's side of splitting `folio`, cached at `index`, into
    /// one-page folios: under the index's lock, its references are frozen
    /// if they are `expected` (none but the cache's and the splitter's:
    /// a lookup takes its reference under this lock), `split` makes the
    /// pieces (giving each its references), and each piece takes its
    /// page's slot. False, nothing done: someone else holds a reference.
    /// The caller holds the folio's lock.
    pub fn split_entry_frozen(
        &self,
        mem: &PhysMem,
        folio: Folio,
        index: u64,
        expected: i32,
        split: impl FnOnce(),
    ) -> bool {
        let mut pages = self.i_pages.lock();
        debug_assert_eq!(
            pages.get(&index),
            Some(&folio),
            "splitting an uncached folio"
        );
        let nr = folio.nr_pages(mem);
        // folio_ref_freeze. AcqRel: whoever dropped a reference before is
        // done with the folio; the pieces' references are stored after.
        let frozen = folio
            .head(mem)
            .refcount
            .compare_exchange(expected, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        if !frozen {
            return false;
        }
        split();
        pages.remove(&index);
        for i in 0..nr {
            pages.insert(index + i, Folio(folio.pfn() + i));
        }
        true
    }

    /// Take every folio out (the inode is going), calling `each` on each
    /// first; they must all be unmapped.
    pub(super) fn remove_all(&self, mem: &PhysMem, cpu: usize, mut each: impl FnMut(Folio)) {
        let pages = std::mem::take(&mut *self.i_pages.lock());
        for (_, folio) in pages {
            let nr = folio.nr_pages(mem);
            // Taken out under its lock, which reclaim holds while it
            // reads the folio's mapping (`truncate_inode_pages_final`):
            // held here, for the duration, by one more reference.
            folio.get(mem);
            while !folio.trylock(mem) {
                std::thread::yield_now();
            }
            self.nrpages.fetch_sub(nr, Ordering::Relaxed);
            each(folio);
            Self::forget_folio(mem, folio, nr, cpu, self.shmem);
            folio.unlock(mem);
            folio.put(mem, cpu);
        }
    }

    /// Every cached folio, in order (for the checker and statistics).
    pub fn folios(&self) -> Vec<(u64, Folio)> {
        self.i_pages.lock().iter().map(|(&i, &f)| (i, f)).collect()
    }

    /// `i_mmap_lock_write`: rmap walks of the file wait until the guard
    /// goes (mremap moves entries under it).
    pub fn i_mmap_lock_write(&self) -> IMmapWriteGuard<'_> {
        self.i_mmap.write()
    }

    /// `vma_interval_tree_insert` (`vma_link_file`).
    pub fn i_mmap_insert(&self, vma: &Arc<Vma>) {
        let key = (vma.pgoff(), Arc::as_ptr(vma) as usize);
        self.i_mmap.write().insert(key, Arc::downgrade(vma));
    }

    /// `vma_interval_tree_remove` (`unlink_file_vma`).
    pub fn i_mmap_remove(&self, vma: &Vma) {
        let key = (vma.pgoff(), vma as *const Vma as usize);
        self.i_mmap.write().remove(&key);
    }

    /// `mapping_mapped`.
    pub fn mapped(&self) -> bool {
        !self.i_mmap.read().is_empty()
    }

    /// `vma_interval_tree_foreach`: the VMAs mapping some page of
    /// `[first, last]`, in order of their first page offset.
    pub fn vmas_in(&self, first: u64, last: u64) -> Vec<Arc<Vma>> {
        self.i_mmap
            .read()
            .range(..=(last, usize::MAX))
            .filter_map(|(_, w)| w.upgrade())
            .filter(|v| v.last_pgoff() >= first)
            .collect()
    }

    /// `vma_interval_tree_foreach` under `i_mmap_lock_read`: `f` for each
    /// VMA mapping some page of `[first, last]`, the lock held throughout
    /// (no VMA it finds can be unlinked, and have its page tables freed,
    /// meanwhile); `f` returns false to stop.
    pub fn for_each_vma_in(&self, first: u64, last: u64, mut f: impl FnMut(&Arc<Vma>) -> bool) {
        let g = self.i_mmap.read();
        for (_, w) in g.range(..=(last, usize::MAX)) {
            let Some(v) = w.upgrade() else { continue };
            if v.last_pgoff() >= first && !f(&v) {
                return;
            }
        }
    }

    /// Whether `vma` is linked here.
    pub fn has_vma(&self, vma: &Vma) -> bool {
        let key = (vma.pgoff(), vma as *const Vma as usize);
        self.i_mmap.read().contains_key(&key)
    }

    /// How many VMAs are linked.
    pub fn i_mmap_len(&self) -> usize {
        self.i_mmap.read().len()
    }
}

/// `folio_mapping` of a page-cache folio: its address space, or None for
/// an anon folio or one no longer cached.
///
/// # Safety
///
/// The caller keeps the folio's address space alive: it holds a mapping
/// of the folio (a VMA that holds the file, under a page-table lock that
/// keeps the mapping in place), or the folio's lock while the folio is
/// still cached (eviction takes each folio out first).
pub unsafe fn folio_mapping<'a>(mem: &PhysMem, folio: Folio) -> Option<&'a AddressSpace> {
    let word = folio.head(mem).mapping.load(Ordering::Relaxed);
    if word == 0 || word & crate::phys::memmap::PAGE_MAPPING_ANON != 0 {
        return None;
    }
    // SAFETY: a non-anon mapping word is an AddressSpace's address
    // (`add_folio`), alive by the caller's promise.
    Some(unsafe { &*(word as *const AddressSpace) })
}

/// `NR_SHMEM_THPS` for a shmem cache, else `NR_FILE_THPS`.
fn thps_stat(shmem: bool) -> NodeStat {
    if shmem {
        NodeStat::NR_SHMEM_THPS
    } else {
        NodeStat::NR_FILE_THPS
    }
}
