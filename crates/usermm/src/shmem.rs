//! shmem (mm/shmem.c, mm/memfd.c): tmpfs files, shared anonymous memory
//! and memfds.
//!
//! A shmem file's page cache is all there is of it. A missing page is a
//! new folio of zeroes, made by any fault (there is no shared zero page
//! for shared memory: a read fault allocates as a write does),
//! swap-backed, clean until written; nothing writes it back, and without
//! swap reclaim drops only the clean ones (zeroes, which a fault makes
//! again). Its faults never read, so they are never major.
//!
//! Folio orders (6.18's "huge shmem"): a tmpfs mount has its `huge=`
//! (the model's tmpfs files are on a mount as mounted by default,
//! `huge=never`); the internal mount of shared anonymous memory and
//! memfds has the top-level `shmem_enabled`. A fault in shared anonymous
//! memory may also take any size whose own `shmem_enabled` allows it
//! (`shmem_allowable_huge_orders`); a fault in a tmpfs file or a memfd
//! takes the PMD size where its mount's `huge` allows, a write(2) any
//! page-cache size. A folio is tried from the largest allowed size that
//! fits the VMA and the file's index without meeting a cached page,
//! down (`shmem_fallback`), then a page.

use crate::errno::{Errno, KResult};
use crate::filemap::{folio_lock, FileFault};
use crate::fs::{CachedFolio, FMode, File, FsKind, Inode};
use crate::machine::{OnCpu, ShmemHuge, ShmemOrderMode};
use crate::memory::VmFaultResult;
use crate::mm::vma::{VM_HUGEPAGE, VM_NOHUGEPAGE};
use crate::mm::Vma;
use crate::phys::{AllocFlags, HPAGE_PMD_ORDER};
use crate::sync::{Arc, Ordering};
use crate::vmstat::{Event, MthpStat};

/// `THP_ORDERS_ALL_FILE_DEFAULT`: the page cache's large orders, 1 to
/// `MAX_PAGECACHE_ORDER` (the PMD order on x86-64).
const ORDERS_ALL_FILE: u32 = ((1 << (HPAGE_PMD_ORDER + 1)) - 1) & !1;

/// The PMD order alone, as a mask.
const PMD_ORDER_MASK: u32 = 1 << HPAGE_PMD_ORDER;

/// `highest_order`: the largest order in a non-empty mask.
fn highest_order(orders: u32) -> u32 {
    31 - orders.leading_zeros()
}

/// `next_order`: `order` leaves the mask; the next largest left (or 0).
fn next_order(orders: &mut u32, order: u32) -> u32 {
    *orders &= !(1 << order);
    if *orders == 0 {
        0
    } else {
        highest_order(*orders)
    }
}

/// Where a shmem folio is wanted: a fault at `addr` of `vma`, or a
/// write(2) ending at byte `write_end` (`vmf == NULL`).
#[derive(Clone, Copy)]
pub enum ShmemWant<'a> {
    Fault { vma: &'a Vma, addr: u64 },
    Write { write_end: u64 },
}

impl ShmemWant<'_> {
    fn vma(&self) -> Option<&Vma> {
        match *self {
            ShmemWant::Fault { vma, .. } => Some(vma),
            ShmemWant::Write { .. } => None,
        }
    }
    fn write_end(&self) -> u64 {
        match *self {
            ShmemWant::Fault { .. } => 0,
            ShmemWant::Write { write_end } => write_end,
        }
    }
}

/// `shmem_get_orders_within_size`: of `orders`, from the largest down,
/// the first whose aligned block around `index` ends inside the file
/// (its size, or `write_end` if larger) keeps itself and the smaller
/// ones; none does: 0.
fn shmem_get_orders_within_size(inode: &Inode, mut orders: u32, index: u64, write_end: u64) -> u32 {
    if orders == 0 {
        return 0;
    }
    let size_pages = inode.size().max(write_end).div_ceil(crate::phys::PAGE_SIZE);
    let mut order = highest_order(orders);
    while orders != 0 {
        let aligned_end = (index + 1).next_multiple_of(1 << order);
        if size_pages >= aligned_end {
            return orders;
        }
        order = next_order(&mut orders, order);
    }
    0
}

/// `shmem_huge_global_enabled`: the orders the file's mount allows by
/// its `huge` (the internal mount's follows `shmem_enabled`; `deny` and
/// `force` at the top level override every mount's): a fault takes the
/// PMD order only, a write any size.
fn shmem_huge_global_enabled(oncpu: &OnCpu, inode: &Inode, index: u64, want: ShmemWant<'_>) -> u32 {
    let knobs = &oncpu.m.thp;
    match knobs.shmem_enabled() {
        ShmemHuge::Deny => return 0,
        ShmemHuge::Force => return PMD_ORDER_MASK,
        _ => {}
    }
    let huge = match inode.kind {
        FsKind::ShmMnt => knobs.shm_mnt_huge(),
        // A tmpfs mount as mounted by default.
        _ => ShmemHuge::Never,
    };
    let vma = want.vma();
    let all = if vma.is_some() {
        PMD_ORDER_MASK
    } else {
        ORDERS_ALL_FILE
    };
    let advised = || vma.is_some_and(|v| v.flags() & VM_HUGEPAGE != 0);
    match huge {
        ShmemHuge::Always => all,
        ShmemHuge::WithinSize => {
            match shmem_get_orders_within_size(inode, all, index, want.write_end()) {
                0 if advised() => PMD_ORDER_MASK,
                o => o,
            }
        }
        ShmemHuge::Advise if advised() => PMD_ORDER_MASK,
        _ => 0,
    }
}

/// `shmem_allowable_huge_orders`: the large orders a new folio at
/// `index` may have. Shared anonymous memory adds the sizes whose own
/// `shmem_enabled` allows them (`inherit` through the mount's answer);
/// a tmpfs file or a memfd has only its mount's.
pub fn shmem_allowable_huge_orders(
    oncpu: &OnCpu,
    inode: &Inode,
    index: u64,
    want: ShmemWant<'_>,
) -> u32 {
    let vma = want.vma();
    // vma_thp_disabled (the model has no prctl(PR_SET_THP_DISABLE)).
    if vma.is_some_and(|v| v.flags() & VM_NOHUGEPAGE != 0) {
        return 0;
    }
    let global = shmem_huge_global_enabled(oncpu, inode, index, want);
    let Some(vma) = vma.filter(|v| v.file().is_some_and(|f| f.shared_anon)) else {
        return global;
    };
    let knobs = &oncpu.m.thp;
    match knobs.shmem_enabled() {
        ShmemHuge::Deny => return 0,
        ShmemHuge::Force => return knobs.shmem_orders(ShmemOrderMode::Inherit),
        _ => {}
    }
    let within = knobs.shmem_orders(ShmemOrderMode::WithinSize);
    let mut mask = knobs.shmem_orders(ShmemOrderMode::Always)
        | shmem_get_orders_within_size(inode, within, index, 0);
    if vma.flags() & VM_HUGEPAGE != 0 {
        mask |= knobs.shmem_orders(ShmemOrderMode::Advise);
    }
    if global != 0 {
        mask |= knobs.shmem_orders(ShmemOrderMode::Inherit);
    }
    ORDERS_ALL_FILE & mask
}

/// `shmem_suitable_orders`: of `orders`, those that fit the fault's VMA
/// (`thp_vma_suitable_order`), from the largest whose aligned block of
/// the file holds no cached page yet on down.
fn shmem_suitable_orders(
    oncpu: &OnCpu,
    inode: &Inode,
    index: u64,
    want: ShmemWant<'_>,
    orders: u32,
) -> u32 {
    let mut orders = orders;
    if let ShmemWant::Fault { vma, addr } = want {
        orders &= (1..=HPAGE_PMD_ORDER)
            .filter(|&o| crate::memory::thp_vma_suitable_order(vma, addr, o))
            .fold(0, |m, o| m | 1 << o);
    }
    if orders == 0 {
        return 0;
    }
    let block_is_free = |order: u32| {
        let pages = 1u64 << order;
        !inode
            .i_mapping
            .range_has_folio(oncpu.mem(), index & !(pages - 1), pages)
    };
    let mut order = highest_order(orders);
    while orders != 0 && !block_is_free(order) {
        order = next_order(&mut orders, order);
    }
    orders
}

/// `shmem_alloc_and_add_folio`: a new folio for page `index`, of the
/// largest of `orders` that can be had (each one missed counts
/// `shmem_fallback`, and the PMD size `thp_file_fallback`), or of one
/// page when `orders` is empty; zeroed, swap-backed and cached at its
/// aligned index, on the LRU. EEXIST: a page of its range was cached
/// meanwhile.
fn shmem_alloc_and_add_folio(
    oncpu: &OnCpu,
    inode: &Inode,
    index: u64,
    want: ShmemWant<'_>,
    orders: u32,
) -> KResult<CachedFolio> {
    let mem = oncpu.mem();
    let mut suitable = if orders != 0 {
        shmem_suitable_orders(oncpu, inode, index, want, orders)
    } else {
        0
    };
    let mut found = None;
    let mut order = if suitable != 0 {
        highest_order(suitable)
    } else {
        0
    };
    // vma_thp_gfp_mask (or the mount's gfp, for a write): no reclaim for
    // a large folio unless the range was advised.
    let gfp = match want.vma() {
        Some(vma) => crate::huge_memory::vma_thp_gfp_mask(vma),
        None => AllocFlags::ZERO.transhuge_light(),
    };
    while suitable != 0 {
        let aligned = index & !((1u64 << order) - 1);
        if let Some(f) = mem.folio_alloc(oncpu.cpu.node, order, oncpu.id(), gfp) {
            found = Some((f, aligned));
            break;
        }
        if order == HPAGE_PMD_ORDER {
            oncpu
                .vmstat()
                .count(oncpu.id(), Event::THP_FILE_FALLBACK, 1);
        }
        oncpu.vmstat().mod_mthp(order, MthpStat::SHMEM_FALLBACK, 1);
        order = next_order(&mut suitable, order);
    }
    let (folio, at) = match found {
        Some(f) => f,
        None => (
            mem.folio_alloc(oncpu.cpu.node, 0, oncpu.id(), AllocFlags::ZERO)
                .ok_or(Errno::ENOMEM)?,
            index,
        ),
    };
    if !inode.i_mapping.add_folio(mem, folio, at) {
        folio.put(mem, oncpu.id());
        return Err(Errno::EEXIST);
    }
    crate::swap::folio_add_lru(mem, folio, oncpu.id());
    Ok(CachedFolio { folio, index: at })
}

/// `shmem_get_folio_gfp` (SGP_CACHE for a fault, SGP_WRITE for a write):
/// the folio holding page `index`, cached, or a new one of the largest
/// allowed size (`shmem_alloc`, and the PMD size `thp_file_alloc`), else
/// of one page. With the caller's reference, unlocked.
pub fn shmem_get_folio(
    oncpu: &OnCpu,
    inode: &Inode,
    index: u64,
    want: ShmemWant<'_>,
) -> KResult<CachedFolio> {
    let mem = oncpu.mem();
    loop {
        if let Some(c) = inode.i_mapping.get_folio(mem, index) {
            return Ok(c);
        }
        let orders = shmem_allowable_huge_orders(oncpu, inode, index, want);
        if orders != 0 {
            match shmem_alloc_and_add_folio(oncpu, inode, index, want, orders) {
                Ok(c) => {
                    let order = c.folio.order(mem);
                    if order == HPAGE_PMD_ORDER {
                        oncpu.vmstat().count(oncpu.id(), Event::THP_FILE_ALLOC, 1);
                    }
                    oncpu.vmstat().mod_mthp(order, MthpStat::SHMEM_ALLOC, 1);
                    return Ok(c);
                }
                Err(Errno::EEXIST) => continue,
                Err(_) => {}
            }
        }
        match shmem_alloc_and_add_folio(oncpu, inode, index, want, 0) {
            Err(Errno::EEXIST) => continue,
            r => return r,
        }
    }
}

/// `shmem_fault`: the folio holding page `pgoff` of the VMA's shmem file,
/// made (zeroed) if missing; SIGBUS at or past the end of the file. The
/// folio comes back locked, with a reference.
pub fn shmem_fault(
    oncpu: &OnCpu,
    vma: &Vma,
    addr: u64,
    pgoff: u64,
) -> Result<FileFault, VmFaultResult> {
    let file = vma.file().expect("shmem_fault of a file VMA");
    let inode = &*file.inode;
    let mem = oncpu.mem();
    loop {
        if pgoff >= inode.size_pages() {
            return Err(VmFaultResult::Sigbus);
        }
        let want = ShmemWant::Fault { vma, addr };
        let c = shmem_get_folio(oncpu, inode, pgoff, want).map_err(VmFaultResult::from)?;
        folio_lock(mem, c.folio);
        let head = c.folio.head(mem);
        let cached = head.mapping.load(Ordering::Relaxed) == inode.i_mapping.as_mapping_word()
            && head.index.load(Ordering::Relaxed) == c.index;
        if !cached || pgoff >= inode.size_pages() {
            // Truncated meanwhile: again, from the size.
            c.folio.unlock(mem);
            c.folio.put(mem, oncpu.id());
            continue;
        }
        return Ok(FileFault {
            folio: c.folio,
            page: c.folio.pfn() + (pgoff - c.index),
            index: c.index,
            major: false,
        });
    }
}

/// `shmem_zero_setup`: the file behind a shared anonymous mapping of
/// `len` bytes of `mm` (`/dev/zero (deleted)` in /proc/PID/maps). Unless
/// the mapping is `VM_NORESERVE`, its whole size is charged to the
/// overcommit commitment (`shmem_acct_size`) until the file goes:
/// ENOMEM where the policy refuses.
pub fn shmem_zero_setup(
    oncpu: &OnCpu,
    mm: &crate::mm::Mm,
    len: u64,
    vm_flags: crate::mm::vma::VmFlags,
) -> KResult<Arc<File>> {
    let inode = oncpu.m.create_file(FsKind::ShmMnt, len);
    if vm_flags & crate::mm::vma::VM_NORESERVE == 0 {
        let pages = len >> crate::phys::PAGE_SHIFT;
        let oc = &oncpu.m.overcommit;
        oc.vm_enough_memory(Some(mm.total_vm.load(Ordering::Relaxed)), pages)?;
        let machine = oncpu.m.me.get().cloned();
        inode.set_accounted(
            pages,
            Box::new(move |pages| {
                if let Some(m) = machine.and_then(|w| w.upgrade()) {
                    m.overcommit.vm_unacct_memory(pages);
                }
            }),
        );
    }
    Ok(File::open_shared_anon(&inode))
}

/// `memfd_create(2)`: a new, empty shmem file, open for reading and
/// writing. (A memfd, as a tmpfs file, is `VM_NORESERVE`: the kernel
/// charges its pages one by one as they are allocated, which the model
/// does not.)
pub fn memfd_create(oncpu: &OnCpu) -> KResult<Arc<File>> {
    let inode = oncpu.m.create_file(FsKind::ShmMnt, 0);
    File::open(
        &inode,
        FMode {
            read: true,
            write: true,
        },
    )
}
