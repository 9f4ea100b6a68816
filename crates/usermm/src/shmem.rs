//! shmem (mm/shmem.c, mm/memfd.c): tmpfs files, shared anonymous memory
//! and memfds.
//!
//! A shmem file's page cache is all there is of it. A missing page is a
//! new folio of zeroes, made by any fault (there is no shared zero page
//! for shared memory: a read fault allocates as a write does), swap-backed
//! and dirty from the start; nothing writes it back, and without swap
//! nothing reclaims it. Its faults never read, so they are never major.
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
/// `len` bytes (`/dev/zero (deleted)` in /proc/PID/maps).
pub fn shmem_zero_setup(oncpu: &OnCpu, len: u64) -> KResult<Arc<File>> {
    let inode = oncpu.m.create_file(FsKind::Tmpfs, len);
    File::open(
        &inode,
        FMode {
            read: true,
            write: true,
        },
    )
}

/// `memfd_create(2)`: a new, empty shmem file, open for reading and
/// writing.
pub fn memfd_create(oncpu: &OnCpu) -> KResult<Arc<File>> {
    shmem_zero_setup(oncpu, 0)
}
