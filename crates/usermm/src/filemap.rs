//! The page cache at work (mm/filemap.c, with the parts of
//! mm/readahead.c, mm/page-writeback.c and mm/truncate.c it needs):
//! writing a file through the cache, reading folios in on faults and by
//! readahead, mapping cached folios around a fault, dirtying and writing
//! them back, and truncating.
//!
//! # Folio orders
//!
//! On a filesystem with large folio support ([`crate::fs::FsKind::Ext4`]):
//!
//! * `write(2)` makes folios as `generic_perform_write` asks
//!   `__filemap_get_folio` for them: each step writes up to the largest
//!   folio size, to the end of that size's alignment, and a new folio's
//!   order is the log of the step's length, lowered to what the index's
//!   alignment allows (a 4 MiB write makes two PMD-sized folios; 4 KiB
//!   writes make small ones);
//! * a read fault on a missing page reads around it (`read_ahead_kb`
//!   around the index, order-0 folios), or, in a `MADV_HUGEPAGE` range,
//!   reads PMD-sized folios, as `do_sync_mmap_readahead` does.
//!
//! Without large folio support every folio is order 0.
//!
//! # Locking
//!
//! A folio is looked up with a reference (the `i_pages` lock is dropped
//! before any page-table lock is taken); its lock (`PG_locked`) is held
//! while it is checked still cached and mapped (faults, which may wait
//! for it) or tried (fault-around, which skips a locked folio), and by
//! truncation while it takes the folio out, so that no fault maps a folio
//! truncation has passed.

use crate::errno::{Errno, KResult};
use crate::fs::{AddressSpace, CachedFolio, File, FileRaState, FsKind, Inode};
use crate::machine::OnCpu;
use crate::mm::vma::VM_HUGEPAGE;
use crate::mm::Vma;
use crate::phys::{pg, AllocFlags, Folio, Pfn, PhysMem, HPAGE_PMD_ORDER, PAGE_SHIFT, PAGE_SIZE};
use crate::vmstat::{Event, NodeStat};

/// `MMAP_LOTSAMISS`: past this many misses, mmap faults stop reading
/// around.
const MMAP_LOTSAMISS: u32 = 100;

/// `folio_lock`: wait for the folio's lock (the kernel sleeps; the model
/// yields).
pub fn folio_lock(mem: &PhysMem, folio: Folio) {
    while !folio.trylock(mem) {
        std::thread::yield_now();
    }
}

/// Whether `folio`, locked, is still the page-cache folio of `mapping`
/// at `index` (truncation may have taken it out before its lock was had).
fn folio_still_cached(mem: &PhysMem, folio: Folio, mapping: &AddressSpace, index: u64) -> bool {
    let head = folio.head(mem);
    head.mapping.load(crate::sync::Ordering::Relaxed) == mapping.as_mapping_word()
        && head.index.load(crate::sync::Ordering::Relaxed) == index
}

/// `filemap_alloc_folio`: a folio for the page cache, on this CPU's node.
/// A large one does not reclaim to be had (`__GFP_NORETRY`): the caller
/// falls back to a smaller order.
fn filemap_alloc_folio(oncpu: &OnCpu, order: u32) -> Option<Folio> {
    let gfp = if order > 0 {
        AllocFlags::NONE.transhuge_light()
    } else {
        AllocFlags::NONE
    };
    oncpu
        .mem()
        .folio_alloc(oncpu.cpu.node, order, oncpu.id(), gfp)
}

/// `filemap_add_folio` of a new folio, read from below the cache first
/// (`read_folio`, done at once), and put on the LRU. Returns the cached
/// folio with the caller's reference, or None if another CPU cached a
/// page of its range first (the folio is freed).
fn add_new_folio(oncpu: &OnCpu, inode: &Inode, folio: Folio, index: u64) -> Option<CachedFolio> {
    let mem = oncpu.mem();
    for i in 0..folio.nr_pages(mem) {
        inode.read_page(mem, index + i, folio.pfn() + i);
    }
    if !inode.i_mapping.add_folio(mem, folio, index) {
        folio.put(mem, oncpu.id());
        return None;
    }
    crate::swap::folio_add_lru(mem, folio, oncpu.id());
    Some(CachedFolio { folio, index })
}

/// `__filemap_get_folio(FGP_CREAT)` with a wanted order: the cached folio
/// holding `index`, or a new one of at most `order` (lowered to the
/// index's alignment and the mapping's largest, then order by order when
/// memory is short), read in. With the caller's reference.
pub fn filemap_get_or_create(
    oncpu: &OnCpu,
    inode: &Inode,
    index: u64,
    order: u32,
) -> KResult<CachedFolio> {
    let mem = oncpu.mem();
    let mapping = &inode.i_mapping;
    loop {
        if let Some(c) = mapping.get_folio(mem, index) {
            return Ok(c);
        }
        let mut order = order.min(mapping.max_folio_order());
        if index & ((1 << order) - 1) != 0 {
            order = index.trailing_zeros();
        }
        // From that order down: a folio that cannot be had, or whose range
        // holds a cached page already (EEXIST), is tried one order lower.
        let mut allocated = false;
        loop {
            if let Some(folio) = filemap_alloc_folio(oncpu, order) {
                allocated = true;
                if let Some(c) = add_new_folio(oncpu, inode, folio, index) {
                    return Ok(c);
                }
            }
            if order == 0 {
                break;
            }
            order -= 1;
        }
        if !allocated {
            return Err(Errno::ENOMEM);
        }
        // Another CPU cached the page itself meanwhile: look again.
    }
}

/// `fgf_set_order`: the folio order for a write of `len` bytes.
fn fgf_order(len: u64) -> u32 {
    let shift = 63 - len.max(1).leading_zeros();
    shift.saturating_sub(PAGE_SHIFT)
}

/// `generic_perform_write` of `buf` at byte `pos` of `file` (`write(2)`
/// and `pwrite(2)`, through the page cache): each step fills part of one
/// folio and marks it dirty; the file grows to cover what was written.
pub fn generic_perform_write(oncpu: &OnCpu, file: &File, pos: u64, buf: &[u8]) -> KResult<usize> {
    if !file.f_mode.write {
        return Err(Errno::EBADF);
    }
    let inode = &*file.inode;
    let mem = oncpu.mem();
    let shmem = inode.i_mapping.is_shmem();
    // mapping_max_folio_size: shmem's mappings take every page-cache size
    // (its knobs choose among them).
    let max_order = if shmem {
        crate::phys::HPAGE_PMD_ORDER
    } else {
        inode.i_mapping.max_folio_order()
    };
    let max_folio = PAGE_SIZE << max_order;
    let mut done = 0usize;
    while done < buf.len() {
        let at = pos + done as u64;
        let offset = at & (max_folio - 1);
        let bytes = (max_folio - offset).min((buf.len() - done) as u64);
        // write_begin: the folio covering the start of the step.
        let index = at >> PAGE_SHIFT;
        let c = if shmem {
            let want = crate::shmem::ShmemWant::Write {
                write_end: at + bytes,
            };
            crate::shmem::shmem_get_folio(oncpu, inode, index, want)?
        } else {
            filemap_get_or_create(oncpu, inode, index, fgf_order(bytes))?
        };
        folio_lock(mem, c.folio);
        if !folio_still_cached(mem, c.folio, &inode.i_mapping, c.index) {
            // Truncated (or split) meanwhile: look again.
            c.folio.unlock(mem);
            c.folio.put(mem, oncpu.id());
            continue;
        }
        let folio_end = (c.index + c.folio.nr_pages(mem)) << PAGE_SHIFT;
        let n = bytes.min(folio_end - at) as usize;
        let mut copied = 0;
        while copied < n {
            let a = at + copied as u64;
            let page = c.folio.pfn() + ((a >> PAGE_SHIFT) - c.index);
            let off = (a % PAGE_SIZE) as usize;
            let len = (PAGE_SIZE as usize - off).min(n - copied);
            mem.write_frame(page, off, &buf[done + copied..done + copied + len]);
            copied += len;
        }
        // write_end: dirty the folio, and grow the file.
        folio_mark_dirty(mem, c.folio);
        if at + n as u64 > inode.size() {
            inode.set_size(at + n as u64);
        }
        c.folio.unlock(mem);
        c.folio.put(mem, oncpu.id());
        done += n;
    }
    Ok(done)
}

/// `folio_mark_dirty` of a page-cache folio: counted in `nr_dirty` the
/// first time. Returns whether it was clean.
pub fn folio_mark_dirty(mem: &PhysMem, folio: Folio) -> bool {
    let head = folio.head(mem);
    if head
        .flags
        .fetch_or(pg::DIRTY, crate::sync::Ordering::AcqRel)
        & pg::DIRTY
        != 0
    {
        return false;
    }
    // Anon folios and shmem's (swap-backed; `noop_dirty_folio`) are not
    // counted.
    let cached = head.mapping.load(crate::sync::Ordering::Relaxed) != 0;
    if cached && !folio.test_anon(mem) && !head.test(pg::SWAPBACKED) {
        mem.mod_node_state(NodeStat::NR_FILE_DIRTY, folio.nr_pages(mem) as i64);
    }
    true
}

/// `filemap_write_and_wait_range` (`fsync`, `msync(MS_SYNC)`): every
/// dirty folio holding a page of `[first, last]` is cleaned in the page
/// tables that map it (`folio_mkclean`), so that the next store faults
/// and dirties it again, then written below the cache. Returns the pages
/// written.
pub fn filemap_write_and_wait_range(oncpu: &OnCpu, inode: &Inode, first: u64, last: u64) -> u64 {
    let mem = oncpu.mem();
    // shmem has nothing below its cache to write to (`shmem_writeout`
    // goes to swap, which there is none of).
    if inode.i_mapping.is_shmem() {
        return 0;
    }
    let mut written = 0;
    for c in inode.i_mapping.get_folios(mem, first, last) {
        folio_lock(mem, c.folio);
        if folio_still_cached(mem, c.folio, &inode.i_mapping, c.index)
            && c.folio.head(mem).test(pg::DIRTY)
        {
            written += folio_writeback(oncpu, inode, c);
        }
        c.folio.unlock(mem);
        c.folio.put(mem, oncpu.id());
    }
    written
}

/// One folio's writeback, the folio locked and dirty:
/// `folio_clear_dirty_for_io` (with `folio_mkclean`), `writepage`, and
/// the end of the I/O at once (`nr_writeback` goes up and down, and
/// `nr_written` counts it).
pub(crate) fn folio_writeback(oncpu: &OnCpu, inode: &Inode, c: CachedFolio) -> u64 {
    let mem = oncpu.mem();
    let nr = c.folio.nr_pages(mem);
    crate::rmap_walk::folio_mkclean(oncpu, &inode.i_mapping, c.folio, c.index);
    if c.folio.head(mem).test_and_clear(pg::DIRTY) {
        mem.mod_node_state(NodeStat::NR_FILE_DIRTY, -(nr as i64));
    }
    mem.mod_node_state(NodeStat::NR_WRITEBACK, nr as i64);
    for i in 0..nr {
        inode.write_page(mem, c.index + i, c.folio.pfn() + i);
    }
    mem.mod_node_state(NodeStat::NR_WRITEBACK, -(nr as i64));
    mem.mod_node_state(NodeStat::NR_WRITTEN, nr as i64);
    nr
}

/// What a file fault found: the folio holding the faulting page (locked,
/// with the fault's reference), that page, and whether it had to be read
/// in (`VM_FAULT_MAJOR`).
pub struct FileFault {
    pub folio: Folio,
    pub page: Pfn,
    pub index: u64,
    pub major: bool,
}

/// `filemap_fault`: the page-cache page of a fault at `pgoff` of `vma`'s
/// file, read in (with readahead) if it is not cached. SIGBUS at or past
/// the end of the file. The folio comes back locked, with a reference.
///
/// A fault that had to read (a major fault) gives up once it has
/// (`VM_FAULT_RETRY`): the kernel drops the fault's lock around the I/O
/// (`maybe_unlock_mmap_for_io`) and takes the fault again, whose
/// fault-around then maps what the read brought in. `tried` is that
/// second take (`FAULT_FLAG_TRIED`), which does not give up.
pub fn filemap_fault(
    oncpu: &OnCpu,
    vma: &Vma,
    pgoff: u64,
    tried: bool,
) -> Result<FileFault, crate::memory::VmFaultResult> {
    use crate::memory::VmFaultResult;
    let file = vma.file().expect("filemap_fault of a file VMA");
    let inode = &*file.inode;
    let mapping = &inode.i_mapping;
    let mem = oncpu.mem();
    if pgoff >= inode.size_pages() {
        return Err(VmFaultResult::Sigbus);
    }
    let mut major = false;
    loop {
        let c = match mapping.get_folio(mem, pgoff) {
            Some(c) => {
                do_async_mmap_readahead(oncpu, file, c);
                c
            }
            None => {
                // No page: read it in now, and around it.
                if !major {
                    major = true;
                    oncpu.vmstat().count(oncpu.id(), Event::PGMAJFAULT, 1);
                }
                let read = do_sync_mmap_readahead(oncpu, file, vma, pgoff);
                if read && !tried && mapping.lookup(mem, pgoff).is_some() {
                    return Err(VmFaultResult::Retry);
                }
                match mapping.get_folio(mem, pgoff) {
                    Some(c) => c,
                    None => filemap_get_or_create(oncpu, inode, pgoff, 0)
                        .map_err(|_| VmFaultResult::Oom)?,
                }
            }
        };
        folio_lock(mem, c.folio);
        if !folio_still_cached(mem, c.folio, mapping, c.index) {
            // Truncated meanwhile: look again.
            c.folio.unlock(mem);
            c.folio.put(mem, oncpu.id());
            continue;
        }
        // The size again, under the folio lock: a truncate that shrank the
        // file takes the folio out under this lock.
        if pgoff >= inode.size_pages() {
            c.folio.unlock(mem);
            c.folio.put(mem, oncpu.id());
            return Err(VmFaultResult::Sigbus);
        }
        return Ok(FileFault {
            folio: c.folio,
            page: c.folio.pfn() + (pgoff - c.index),
            index: c.index,
            major,
        });
    }
}

/// `do_sync_mmap_readahead`: a fault missed the cache at `index`. In a
/// `MADV_HUGEPAGE` range, read the PMD-sized block around it and the next
/// one as PMD-sized folios (the second marked for readahead), whatever
/// `read_ahead_kb` says; otherwise, unless faults keep missing, read
/// `ra_pages` around it in small folios (mmap read-around).
fn do_sync_mmap_readahead(oncpu: &OnCpu, file: &File, vma: &Vma, index: u64) -> bool {
    let inode = &*file.inode;
    let mut ra = file.f_ra.lock();
    if vma.flags() & VM_HUGEPAGE != 0 && inode.i_mapping.max_folio_order() >= HPAGE_PMD_ORDER {
        let nr = 1u64 << HPAGE_PMD_ORDER;
        ra.start = index & !(nr - 1);
        ra.size = 2 * nr;
        ra.async_size = nr;
        ra.order = HPAGE_PMD_ORDER;
        let ra_now = *ra;
        drop(ra);
        page_cache_ra_order(oncpu, inode, &ra_now);
        return true;
    }
    if ra.ra_pages == 0 {
        return false;
    }
    if ra.mmap_miss < MMAP_LOTSAMISS * 10 {
        ra.mmap_miss += 1;
    }
    if ra.mmap_miss > MMAP_LOTSAMISS {
        return false;
    }
    ra.start = index.saturating_sub(ra.ra_pages / 2);
    ra.size = ra.ra_pages;
    ra.async_size = ra.ra_pages / 4;
    ra.order = 0;
    let ra_now = *ra;
    drop(ra);
    page_cache_ra_order(oncpu, inode, &ra_now);
    true
}

/// `do_async_mmap_readahead`: a fault found its page cached, unlocked. A
/// hit takes one off the miss count; a folio marked `PG_readahead` starts
/// the next window, twice or four times as large up to `ra_pages`, in
/// folios two orders larger (`page_cache_async_ra`).
fn do_async_mmap_readahead(oncpu: &OnCpu, file: &File, c: CachedFolio) {
    let mem = oncpu.mem();
    let mut ra = file.f_ra.lock();
    if ra.ra_pages == 0 {
        return;
    }
    if !c.folio.head(mem).test(pg::LOCKED) {
        ra.mmap_miss = ra.mmap_miss.saturating_sub(1);
    }
    if !c.folio.head(mem).test_and_clear(pg::READAHEAD) {
        return;
    }
    let max_pages = ra.ra_pages;
    let nr = c.folio.nr_pages(mem);
    let expected = (ra.start + ra.size - ra.async_size) / nr * nr;
    if c.index == expected {
        ra.start += ra.size;
        ra.size = ra.size.max(get_next_ra_size(ra.size, max_pages));
    } else {
        // Not the window's marker: start after what is cached from here.
        let mut start = c.index + nr;
        while start < file.inode.size_pages() && file.mapping().lookup(mem, start).is_some() {
            start += 1;
        }
        ra.start = start;
        ra.size = get_next_ra_size(start - c.index + 1, max_pages);
    }
    ra.order += 2;
    let align = 1u64 << ra.order.min(max_pages.trailing_zeros());
    let end = ra.start + ra.size;
    let aligned_end = end / align * align;
    if aligned_end > ra.start {
        ra.size -= end - aligned_end;
    }
    ra.async_size = ra.size;
    let ra_now = *ra;
    drop(ra);
    page_cache_ra_order(oncpu, &file.inode, &ra_now);
}

/// `force_page_cache_ra` (`POSIX_FADV_WILLNEED`): read `nr` pages of the
/// file from page `index`, at most the readahead window's worth
/// (`max(io_pages, ra_pages)`; the model's device has `io_pages` equal
/// to `ra_pages`), in 2 MiB chunks of small folios that skip what is
/// cached, never past the end of the file.
pub fn force_page_cache_readahead(oncpu: &OnCpu, file: &File, index: u64, nr: u64) {
    let max_pages = file.f_ra.lock().ra_pages;
    let nr = nr.min(max_pages);
    let chunk = (2 << 20) >> PAGE_SHIFT;
    let mut at = index;
    while at < index + nr {
        let n = chunk.min(index + nr - at);
        let ra = crate::fs::FileRaState {
            start: at,
            size: n,
            async_size: 0,
            order: 0,
            ..FileRaState::new()
        };
        page_cache_ra_unbounded(oncpu, &file.inode, &ra);
        at += n;
    }
}

/// `page_cache_ra_unbounded`: the window's missing pages read in small
/// folios, to the end of the file.
fn page_cache_ra_unbounded(oncpu: &OnCpu, inode: &Inode, ra: &FileRaState) {
    let mem = oncpu.mem();
    let end = (ra.start + ra.size).min(inode.size_pages());
    for index in ra.start..end {
        if inode.i_mapping.lookup(mem, index).is_none()
            && !ra_alloc_folio(oncpu, inode, index, u64::MAX, 0)
        {
            return;
        }
    }
}

/// `get_next_ra_size`: the window after one of `cur` pages.
fn get_next_ra_size(cur: u64, max: u64) -> u64 {
    if cur < max / 16 {
        4 * cur
    } else if cur <= max / 2 {
        2 * cur
    } else {
        max
    }
}

/// `page_cache_ra_order`: read the pages of the window `ra` (from
/// `ra.start`, `ra.size` pages, never past the end of the file) in folios
/// of up to `ra.order` (lowered to the window's size, each index's
/// alignment, and what fits before the window's end); the folio at
/// `start + size - async_size` gets `PG_readahead`. A page already cached
/// ends the large-folio loop, and the rest is read in small folios
/// around what is cached (`page_cache_ra_unbounded`).
fn page_cache_ra_order(oncpu: &OnCpu, inode: &Inode, ra: &crate::fs::FileRaState) {
    let mem = oncpu.mem();
    let mapping = &inode.i_mapping;
    if inode.size() == 0 || ra.size == 0 {
        return;
    }
    let file_last = (inode.size() - 1) >> PAGE_SHIFT;
    let mark = ra.start + ra.size - ra.async_size;
    let limit = file_last.min(ra.start + ra.size - 1);
    let mut index = ra.start;
    if mapping.large_folio_support() {
        let size_order = 63 - ra.size.leading_zeros();
        let new_order = mapping.max_folio_order().min(ra.order).min(size_order);
        while index <= limit {
            let mut order = new_order;
            if index & ((1 << order) - 1) != 0 {
                order = index.trailing_zeros();
            }
            while order > 0 && index + (1 << order) - 1 > limit {
                order -= 1;
            }
            if !ra_alloc_folio(oncpu, inode, index, mark, order) {
                break;
            }
            index += 1 << order;
        }
        if index > limit {
            return;
        }
    }
    // page_cache_ra_unbounded at order 0 over the rest, skipping what is
    // cached.
    while index <= limit {
        if mapping.lookup(mem, index).is_none() && !ra_alloc_folio(oncpu, inode, index, mark, 0) {
            return;
        }
        index += 1;
    }
}

/// `ra_alloc_folio`: one readahead folio of `order` at `index`, marked if
/// it holds `mark`, read in at once. False if memory is short or a page of
/// its range is cached already.
fn ra_alloc_folio(oncpu: &OnCpu, inode: &Inode, index: u64, mark: u64, order: u32) -> bool {
    let mem = oncpu.mem();
    let Some(folio) = filemap_alloc_folio(oncpu, order) else {
        return false;
    };
    if mark & !((1 << order) - 1) == index {
        folio.head(mem).set(pg::READAHEAD);
    }
    match add_new_folio(oncpu, inode, folio, index) {
        Some(c) => {
            c.folio.put(mem, oncpu.id());
            true
        }
        None => false,
    }
}

/// `next_uptodate_folio`'s filter, for a folio fault-around found with a
/// reference: locked here, still cached, not a readahead marker (the
/// fault must reach `filemap_fault` for the next window), and holding a
/// page below the end of the file. False: skip it (unlocked).
fn fault_around_takes(
    mem: &PhysMem,
    c: CachedFolio,
    mapping: &AddressSpace,
    size_pages: u64,
) -> bool {
    let head = c.folio.head(mem);
    if head.test(pg::LOCKED) || head.test(pg::READAHEAD) || !c.folio.trylock(mem) {
        return false;
    }
    if !folio_still_cached(mem, c.folio, mapping, c.index) || c.index >= size_pages {
        c.folio.unlock(mem);
        return false;
    }
    true
}

/// `filemap_map_pages` (fault-around): map the cached pages of
/// `[start_pgoff, end_pgoff]` whose PTEs are empty, under the fault's
/// PMD, never past the file's last page. The first folio, if it ends
/// before the file's last page (6.18's test, which also refuses a folio
/// ending exactly there), may be mapped by the PMD if it is PMD-sized
/// and the PMD empty (`filemap_map_pmd`), which otherwise gets a PTE
/// table; where the PMD holds no table then, nothing is mapped and the
/// fault goes on to `filemap_fault`. Returns whether the faulting page
/// got mapped.
pub fn filemap_map_pages(
    vmf: &mut crate::memory::VmFault<'_>,
    start_pgoff: u64,
    end_pgoff: u64,
) -> bool {
    let (oncpu, vma) = (vmf.oncpu, vmf.vma);
    let mem = oncpu.mem();
    let file = vma.file().expect("fault-around of a file VMA");
    let inode = &*file.inode;
    let mapping = &inode.i_mapping;
    let size_pages = inode.size_pages();
    if size_pages == 0 {
        return false;
    }
    let file_end = size_pages - 1;
    let end_pgoff = end_pgoff.min(file_end);
    if start_pgoff > end_pgoff {
        return false;
    }
    let mut folios = mapping.get_folios(mem, start_pgoff, end_pgoff).into_iter();
    let mut mapped_fault = false;
    let mut mmap_miss = 0u64;
    let mut taken = None;
    for c in folios.by_ref() {
        if fault_around_takes(mem, c, mapping, size_pages) {
            taken = Some(c);
            break;
        }
        c.folio.put(mem, oncpu.id());
    }
    let Some(first) = taken else {
        return false;
    };
    let next_index = |c: CachedFolio| c.index + c.folio.nr_pages(mem);
    let shmem = mapping.is_shmem();
    if shmem || file_end >= next_index(first) {
        match crate::huge_memory::filemap_map_pmd(vmf, first.folio) {
            crate::huge_memory::MapPmd::Mapped => {
                first.folio.unlock(mem);
                first.folio.put(mem, oncpu.id());
                folios.for_each(|c| c.folio.put(mem, oncpu.id()));
                return true;
            }
            crate::huge_memory::MapPmd::Ptes => {}
        }
    }
    let mut next = Some(first);
    while let Some(c) = next {
        let r = crate::memory::filemap_map_folio_range(vmf, c, start_pgoff, end_pgoff, file_end);
        mapped_fault |= r.mapped_fault;
        mmap_miss += r.looked;
        c.folio.unlock(mem);
        c.folio.put(mem, oncpu.id());
        if r.table_gone {
            break;
        }
        next = None;
        for c in folios.by_ref() {
            if fault_around_takes(mem, c, mapping, size_pages) {
                next = Some(c);
                break;
            }
            c.folio.put(mem, oncpu.id());
        }
    }
    folios.for_each(|c| c.folio.put(mem, oncpu.id()));
    // The pages looked at are hits for the miss count (none is a
    // workingset refault: the model keeps no shadow entries).
    let mut ra = file.f_ra.lock();
    ra.mmap_miss = ra
        .mmap_miss
        .saturating_sub(mmap_miss.min(u32::MAX as u64) as u32);
    mapped_fault
}

/// `truncate_pagecache` after the file's size became `newsize`: unmap
/// every mapping of the pages past it, private COW copies included
/// (`unmap_mapping_range` with `even_cows`), then drop them from the
/// cache (`truncate_inode_pages`) and zero the rest of the partial last
/// page in the cache.
pub fn truncate_pagecache(oncpu: &OnCpu, inode: &Inode, newsize: u64) {
    let mem = oncpu.mem();
    let first = newsize.div_ceil(PAGE_SIZE);
    crate::memory::unmap_mapping_range(
        oncpu,
        &inode.i_mapping,
        first,
        u64::MAX >> PAGE_SHIFT,
        true,
    );
    truncate_inode_pages_range(oncpu, inode, first, u64::MAX >> PAGE_SHIFT);
    crate::memory::unmap_mapping_range(
        oncpu,
        &inode.i_mapping,
        first,
        u64::MAX >> PAGE_SHIFT,
        true,
    );
    if !newsize.is_multiple_of(PAGE_SIZE) {
        if let Some(c) = inode.i_mapping.get_folio(mem, newsize >> PAGE_SHIFT) {
            let page = c.folio.pfn() + ((newsize >> PAGE_SHIFT) - c.index);
            let off = (newsize % PAGE_SIZE) as usize;
            mem.write_frame(page, off, &vec![0u8; PAGE_SIZE as usize - off]);
            c.folio.put(mem, oncpu.id());
        }
    }
}

/// `truncate_inode_pages_range` of pages `first..=last`: every folio
/// that lies wholly inside leaves the cache. One that straddles an end
/// is split (`truncate_inode_partial_folio`), which unmaps it from every
/// mapping, and its pieces inside leave. Where it cannot be split
/// (someone else holds it, or it is dirty on a disk filesystem), a disk
/// filesystem's folio is unmapped whole (`try_folio_split_or_unmap`, for
/// faults to map it again by PTEs); then its pages inside are zeroed and
/// it stays if it is dirty (shmem's always are), or leaves whole if it
/// is clean (the kernel's `truncate_inode_folio`: its data is below the
/// cache still). The model splits into single pages where 6.18 splits
/// around the page at the end alone (`folio_split`, pieces of every
/// order).
fn truncate_inode_pages_range(oncpu: &OnCpu, inode: &Inode, first: u64, last: u64) {
    let mem = oncpu.mem();
    let mapping = &inode.i_mapping;
    let folios = mapping.get_folios(mem, first, last);
    // folio_batch_release drains this CPU's LRU batches once a batch of
    // folios was found.
    if !folios.is_empty() {
        crate::swap::lru_add_drain(mem, oncpu.id());
    }
    for c in folios {
        folio_lock(mem, c.folio);
        let nr = c.folio.nr_pages(mem);
        let (from, to) = (first.max(c.index), last.min(c.index + nr - 1));
        if !folio_still_cached(mem, c.folio, mapping, c.index) || from > to {
            // Gone meanwhile, or (split meanwhile) no page inside.
        } else if from == c.index && to == c.index + nr - 1 {
            truncate_inode_folio(oncpu, mapping, c);
        } else {
            truncate_inode_partial_folio(oncpu, mapping, c, from, to);
        }
        c.folio.unlock(mem);
        c.folio.put(mem, oncpu.id());
    }
}

/// `truncate_inode_folio`: a locked folio wholly inside the range leaves
/// the cache, unmapped once more if it was mapped again meanwhile (the
/// kernel's `truncate_cleanup_folio`).
fn truncate_inode_folio(oncpu: &OnCpu, mapping: &AddressSpace, c: CachedFolio) {
    let mem = oncpu.mem();
    if c.folio.mapped(mem) {
        let last = c.index + c.folio.nr_pages(mem) - 1;
        crate::memory::unmap_mapping_range(oncpu, mapping, c.index, last, false);
    }
    mapping.remove_folio(mem, c, oncpu.id());
}

/// `truncate_inode_partial_folio` of a locked folio whose pages
/// `from..=to` lie inside the range (see [`truncate_inode_pages_range`]).
fn truncate_inode_partial_folio(
    oncpu: &OnCpu,
    mapping: &AddressSpace,
    c: CachedFolio,
    from: u64,
    to: u64,
) {
    let mem = oncpu.mem();
    let nr = c.folio.nr_pages(mem);
    if split_file_folio(oncpu, mapping, c) {
        // The pieces inside go, each locked for it (the first is the
        // caller's, locked already).
        for index in from..=to {
            let piece = CachedFolio {
                folio: Folio(c.folio.pfn() + (index - c.index)),
                index,
            };
            let ours = index == c.index;
            if !ours {
                piece.folio.get(mem);
                folio_lock(mem, piece.folio);
            }
            if folio_still_cached(mem, piece.folio, mapping, piece.index)
                && !piece.folio.mapped(mem)
            {
                mapping.remove_folio(mem, piece, oncpu.id());
            }
            if !ours {
                piece.folio.unlock(mem);
                piece.folio.put(mem, oncpu.id());
            }
        }
        return;
    }
    if !mapping.is_shmem() {
        crate::memory::unmap_mapping_range(oncpu, mapping, c.index, c.index + nr - 1, false);
    }
    for index in from..=to {
        mem.clear_page(c.folio.pfn() + (index - c.index));
    }
    let dirty = mapping.is_shmem() || c.folio.head(mem).test(pg::DIRTY);
    if !dirty && !c.folio.mapped(mem) {
        mapping.remove_folio(mem, c, oncpu.id());
    }
}

/// `truncate_pagecache_range` of bytes `lstart..=lend` (a hole punched):
/// the pages wholly inside are unmapped from every mapping but private
/// COW copies (`unmap_mapping_range` without `even_cows`), then leave
/// the cache (shmem's `shmem_truncate_range` does the same); a page the
/// range covers in part is zeroed there.
pub fn truncate_pagecache_range(oncpu: &OnCpu, inode: &Inode, lstart: u64, lend: u64) {
    let mem = oncpu.mem();
    let first = lstart.div_ceil(PAGE_SIZE);
    let end = (lend + 1) >> PAGE_SHIFT;
    if end > first {
        crate::memory::unmap_mapping_range(oncpu, &inode.i_mapping, first, end - 1, false);
        truncate_inode_pages_range(oncpu, inode, first, end - 1);
    }
    // The partial pages at either end.
    for (at, from, to) in [
        (lstart >> PAGE_SHIFT, lstart % PAGE_SIZE, PAGE_SIZE),
        (lend >> PAGE_SHIFT, 0, (lend % PAGE_SIZE) + 1),
    ] {
        let page_from = at << PAGE_SHIFT;
        let (lo, hi) = (
            (page_from + from).max(lstart),
            (page_from + to).min(lend + 1),
        );
        if lo >= hi || (lo == page_from && hi == page_from + PAGE_SIZE) {
            continue;
        }
        if let Some(c) = inode.i_mapping.get_folio(mem, at) {
            let page = c.folio.pfn() + (at - c.index);
            let off = (lo - page_from) as usize;
            mem.write_frame(page, off, &vec![0u8; (hi - lo) as usize]);
            c.folio.put(mem, oncpu.id());
        }
    }
}

/// `vfs_fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)` of `len`
/// bytes at `offset` (MADV_REMOVE's): EBADF for a file not open for
/// writing; shmem's `shmem_fallocate` punches the range (past the end of
/// the file too); ext4's `ext4_punch_hole` clips it at the end of the
/// file, drops the cache's pages and frees the blocks; ext2 has no
/// fallocate (EOPNOTSUPP).
pub fn punch_hole(oncpu: &OnCpu, file: &File, offset: u64, len: u64) -> KResult<()> {
    if !file.f_mode.write {
        return Err(Errno::EBADF);
    }
    let inode = &*file.inode;
    let end = match inode.kind {
        FsKind::Tmpfs | FsKind::ShmMnt => offset + len,
        FsKind::Ext4 => {
            let size = inode.size();
            if offset >= size {
                return Ok(());
            }
            (offset + len).min(size.next_multiple_of(PAGE_SIZE))
        }
        FsKind::Ext2 => return Err(Errno::EOPNOTSUPP),
    };
    truncate_pagecache_range(oncpu, inode, offset, end - 1);
    inode.punch_blocks(offset, end);
    Ok(())
}

/// `split_folio` of a locked page-cache folio `c` that the caller holds a
/// reference to: a dirty one of a disk filesystem is not split (its
/// buffers cannot be released, `filemap_release_folio`), and stays
/// mapped; any other is unmapped from every mapping first (the kernel's
/// `unmap_folio`: `try_to_unmap` through the rmap, locked VMAs too, a PMD
/// split; a split file folio is not mapped again, its pieces are left to
/// faults), then split into small folios if nothing else holds
/// it (a CPU's LRU batch, another lookup); the caller keeps the first
/// piece's lock. False: not split (unmapped, unless it was dirty).
pub fn split_file_folio(oncpu: &OnCpu, mapping: &AddressSpace, c: CachedFolio) -> bool {
    let mem = oncpu.mem();
    let nr = c.folio.nr_pages(mem);
    if nr == 1 {
        return true;
    }
    if !mapping.is_shmem() && c.folio.head(mem).test(pg::DIRTY) {
        return false;
    }
    let mut ubc = crate::tlbbatch::TlbflushUnmapBatch::new();
    crate::vmscan::try_to_unmap_file(oncpu, c.folio, mapping, c.index, true, &mut ubc);
    ubc.flush(oncpu);
    crate::swap::lru_add_drain(mem, oncpu.id());
    if c.folio.mapped(mem) || !folio_still_cached(mem, c.folio, mapping, c.index) {
        return false;
    }
    crate::huge_memory::split_page_cache_folio(oncpu, mapping, c.folio, c.index, 1)
}

/// `ftruncate(2)` of an open file to `size` bytes: the page cache and
/// the mappings past the new end go, the blocks with them; a grown file
/// reads zeroes in its new part.
pub fn do_truncate(oncpu: &OnCpu, file: &File, size: u64) -> KResult<()> {
    if !file.f_mode.write {
        return Err(Errno::EINVAL);
    }
    let inode = &*file.inode;
    let old = inode.size();
    inode.set_size(size);
    if size < old {
        truncate_pagecache(oncpu, inode, size);
        inode.truncate_blocks(size);
    }
    Ok(())
}
