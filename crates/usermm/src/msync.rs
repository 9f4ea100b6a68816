//! `msync(2)` (mm/msync.c): write a shared file mapping's dirty pages
//! back. `MS_ASYNC` does nothing since v2.6.19 (dirty pages are written
//! back anyway); `MS_SYNC` writes back and waits, for each shared file
//! VMA of the range; `MS_INVALIDATE` only refuses a locked range.

use crate::errno::{Errno, KResult};
use crate::machine::OnCpu;
use crate::mm::vma::{VM_LOCKED, VM_SHARED};
use crate::mm::Mm;
use crate::phys::{PAGE_MASK, PAGE_SIZE};
use crate::sync::Arc;

pub const MS_ASYNC: u32 = 1;
pub const MS_INVALIDATE: u32 = 2;
pub const MS_SYNC: u32 = 4;

/// `msync(2)`. A hole in the range is ENOMEM, after the rest is synced
/// (at once for `MS_ASYNC` alone, which has nothing to do).
pub fn do_msync(oncpu: &OnCpu, mm: &Arc<Mm>, start: u64, len: u64, flags: u32) -> KResult<()> {
    if flags & !(MS_ASYNC | MS_INVALIDATE | MS_SYNC) != 0
        || start & !PAGE_MASK != 0
        || (flags & MS_ASYNC != 0 && flags & MS_SYNC != 0)
    {
        return Err(Errno::EINVAL);
    }
    let len = len.checked_add(PAGE_SIZE - 1).ok_or(Errno::ENOMEM)? & PAGE_MASK;
    let end = start.checked_add(len).ok_or(Errno::ENOMEM)?;
    if end == start {
        return Ok(());
    }
    let mut start = start;
    let mut unmapped = Ok(());
    loop {
        // Under mmap_lock for reading, dropped around the writeback.
        let (file, fstart, fend) = {
            let _g = mm.mmap_lock.read();
            let guard = crate::sync::epoch::pin();
            let tree = mm.vma_tree(&guard);
            let Some(vma) = tree.find_vma(start) else {
                return Err(Errno::ENOMEM);
            };
            if start < vma.start() {
                if flags == MS_ASYNC {
                    return Err(Errno::ENOMEM);
                }
                start = vma.start();
                if start >= end {
                    return Err(Errno::ENOMEM);
                }
                unmapped = Err(Errno::ENOMEM);
            }
            if flags & MS_INVALIDATE != 0 && vma.flags() & VM_LOCKED != 0 {
                return Err(Errno::EBUSY);
            }
            let fstart = vma.linear_page_index(start);
            let fend = vma.linear_page_index(end.min(vma.end()) - 1);
            let file = vma.file().cloned();
            let shared = vma.flags() & VM_SHARED != 0;
            start = vma.end();
            (
                file.filter(|_| flags & MS_SYNC != 0 && shared),
                fstart,
                fend,
            )
        };
        if let Some(file) = file {
            crate::filemap::filemap_write_and_wait_range(oncpu, &file.inode, fstart, fend);
        }
        if start >= end {
            return unmapped;
        }
    }
}
