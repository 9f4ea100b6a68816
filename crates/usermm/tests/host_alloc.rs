//! The engine's own host memory does not grow with the number of
//! operations: a million munmap, madvise and mprotect calls (each with its
//! mmu_gather, VMA split and merge) leave the host heap where it was.
//!
//! The counting allocator is this test binary's global allocator, so the
//! count covers every heap allocation the engine makes here.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};

use usermm::madvise::MADV_DONTNEED;
use usermm::mmap::*;
use usermm::{Machine, MachineConfig};

struct Counting;

/// Bytes currently allocated from the host heap.
static LIVE: AtomicI64 = AtomicI64::new(0);

// SAFETY: every method forwards to the system allocator with the caller's
// arguments unchanged; the counter is only bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: forwarded as received (see the impl's SAFETY).
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: forwarded as received.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: forwarded as received.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        // SAFETY: forwarded as received.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const RW: u32 = PROT_READ | PROT_WRITE;
const ANON: u32 = MAP_PRIVATE | MAP_ANONYMOUS;

#[test]
fn a_million_unmaps_advices_and_protections_do_not_grow_the_host_heap() {
    let m = Machine::new(MachineConfig::single_node(64 << 20, 2)).unwrap();
    let c = m.bind(0).unwrap();
    c.new_mm().unwrap();
    let a = c.mmap(0, 64 << 10, RW, ANON).unwrap();
    // Four calls a round, each of which builds and finishes an mmu_gather:
    // mprotect splits and merges back, DONTNEED zaps, munmap + MAP_FIXED
    // punches a hole and fills it again.
    let round = |i: u64| {
        let page = a + (i % 8) * 4096;
        c.store_u64(page, i).unwrap();
        c.mprotect(page, 4096, PROT_READ).unwrap();
        c.mprotect(page, 4096, RW).unwrap();
        c.madvise(page, 4096, MADV_DONTNEED).unwrap();
        c.munmap(a + 40960, 4096).unwrap();
        c.mmap(a + 40960, 4096, RW, ANON | MAP_FIXED).unwrap();
    };
    // Warm up: the allocator's per-CPU lists, the epoch's bags and the
    // vmstat tables reach their steady size.
    for i in 0..20_000 {
        round(i);
    }
    m.rcu_barrier();
    let before = LIVE.load(Ordering::Relaxed);
    const CALLS: u64 = 1_000_000;
    for i in 0..CALLS / 5 {
        round(i);
    }
    m.rcu_barrier();
    let after = LIVE.load(Ordering::Relaxed);
    let growth = after - before;
    println!("host heap: {before} bytes before, {after} after {CALLS} calls ({growth:+})");
    // A leak of even one byte per call would show as a megabyte; allow the
    // noise of lazily grown tables (a few pages).
    assert!(
        growth < 64 << 10,
        "host heap grew by {growth} bytes over {CALLS} calls"
    );
}
