//! The bytes behind a node's frames: one region of host memory per node.
//!
//! The region is reserved with `MAP_NORESERVE`, so frames that are never
//! touched cost nothing; the host is asked for transparent huge pages so that
//! the model's own accesses do not pay for host TLB misses at 4 KiB. Before a
//! timed run the arena is pre-faulted ([`Arena::prefault`]), so that no timing
//! includes the host kernel's first-touch faults.

use std::ptr::NonNull;

use crate::errno::{Errno, KResult};

pub struct Arena {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the arena is a plain region of memory; all concurrent access to its
// bytes goes through atomics (page-table entries, user loads and stores) or
// happens on frames that one thread owns (zeroing and copying new pages).
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

impl Arena {
    pub fn new(len: usize) -> KResult<Arena> {
        // SAFETY: an anonymous private mapping at an address of the host's
        // choosing has no preconditions; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Errno::ENOMEM);
        }
        // SAFETY: p is the mapping just made, len bytes long. The advice is a
        // hint; failure (THP disabled on the host) is harmless.
        unsafe { libc::madvise(p, len, libc::MADV_HUGEPAGE) };
        // The frames are the model's, not the host process's: a native
        // fork() measured in the same process must not copy them.
        // SAFETY: as above.
        unsafe { libc::madvise(p, len, libc::MADV_DONTFORK) };
        Ok(Arena {
            base: NonNull::new(p as *mut u8).expect("mmap returned NULL"),
            len,
        })
    }

    #[inline]
    pub fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Make the host back every byte now.
    pub fn prefault(&self) {
        const MADV_POPULATE_WRITE: i32 = 23;
        // SAFETY: the range is our own mapping.
        let r = unsafe { libc::madvise(self.base() as *mut _, self.len, MADV_POPULATE_WRITE) };
        if r != 0 {
            // Older hosts: touch one byte per 4 KiB page. Writing zero over
            // zero does not change any frame's contents.
            for off in (0..self.len).step_by(4096) {
                // SAFETY: off < len, inside our mapping; a volatile write of
                // the byte's current value keeps the frame's contents.
                unsafe {
                    let p = self.base().add(off);
                    std::ptr::write_volatile(p, std::ptr::read_volatile(p));
                }
            }
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the region mapped in new(); no reference
        // into it outlives the arena (frames are reached through &PhysMem).
        unsafe { libc::munmap(self.base() as *mut _, self.len) };
    }
}
