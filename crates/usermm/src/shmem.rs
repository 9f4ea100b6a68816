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
//! Folio orders: tmpfs as mounted by default (`huge=never`) and the
//! internal mount of shared anonymous memory and memfds with the THP
//! knobs' defaults (`shmem_enabled` never, every size's `shmem_enabled`
//! never or inherit) make small folios only, which is what the model
//! makes; the knobs that would give shmem large folios are not modelled
//! yet.

use crate::errno::KResult;
use crate::filemap::{filemap_get_or_create, folio_lock, FileFault};
use crate::fs::{FMode, File, FsKind};
use crate::machine::OnCpu;
use crate::memory::VmFaultResult;
use crate::mm::Vma;
use crate::sync::{Arc, Ordering};

/// `shmem_fault`: the folio holding page `pgoff` of the VMA's shmem file,
/// made (zeroed) if missing; SIGBUS at or past the end of the file. The
/// folio comes back locked, with a reference.
pub fn shmem_fault(oncpu: &OnCpu, vma: &Vma, pgoff: u64) -> Result<FileFault, VmFaultResult> {
    let file = vma.file().expect("shmem_fault of a file VMA");
    let inode = &*file.inode;
    let mem = oncpu.mem();
    loop {
        if pgoff >= inode.size_pages() {
            return Err(VmFaultResult::Sigbus);
        }
        let c = filemap_get_or_create(oncpu, inode, pgoff, 0).map_err(VmFaultResult::from)?;
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
    let inode = oncpu.m.create_file(FsKind::Tmpfs, len);
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
    let inode = oncpu.m.create_file(FsKind::Tmpfs, 0);
    File::open(
        &inode,
        FMode {
            read: true,
            write: true,
        },
    )
}
