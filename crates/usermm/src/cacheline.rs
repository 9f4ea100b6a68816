//! Writes to shared cache lines: a measure of the model's that no kernel
//! has, for the argument of the speculative-fault seed ("avoiding writing
//! into any shared cache lines"), counted independently of how many cores
//! the host has.
//!
//! A [`LineWriters`] sits beside a word that several CPUs may write (the
//! mmap_lock count, a VMA's `vm_refcnt`, the global part of an mm's RSS
//! counters, the zone lock, the lruvec lock; a page-table frame keeps the
//! set of its split lock in its descriptor) and records which threads have
//! written it. Each write through [`LineWriters::write`] that a fault makes
//! to a line some other thread has written is one shared-line write; the
//! fault entry gathers them per fault ([`fault_begin`], [`fault_end`]) into
//! the `usermm_shared_line_writes` event. A lock taken and released counts
//! two (the line may move between the two); the stores made while a lock is
//! held count with the lock.
//!
//! "Has written" means within the current measurement: [`begin_measurement`]
//! starts an epoch, and a set last written in an earlier epoch counts as
//! empty. Without it a line would stay shared for good once any thread had
//! written it — the thread that set a mapping up, or a fault thread of an
//! earlier run long gone — and one fault thread alone would be charged for
//! lines nobody else writes while it runs.
//!
//! What is not counted: lines no fault writes in a way another CPU does
//! (per-CPU counters and lists, a new page's descriptor), and the entries
//! of the page tables themselves (written under the table's lock, which is
//! counted).
//!
//! Each word holds the epoch in its top 16 bits and a set of 48 thread
//! slots below (a thread's index modulo 48); the experiments run far fewer
//! threads, and more than 48 would share slots and be undercounted. The
//! epoch wraps after 65,536 measurements, when a word untouched that long
//! could look current: an overcount at worst. The words are measurements,
//! ordering nothing, so every access is Relaxed.

use crate::sync::{AtomicU64, AtomicUsize, Ordering};
use std::cell::Cell;

const SLOTS: u64 = 48;
const SLOT_MASK: u64 = (1 << SLOTS) - 1;

static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);
/// The current measurement, as it sits in a word's top bits.
static EPOCH: AtomicU64 = AtomicU64::new(0);

std::thread_local! {
    /// This thread's bit in the writer sets.
    static SLOT_BIT: u64 = 1 << (NEXT_SLOT.fetch_add(1, Ordering::Relaxed) as u64 % SLOTS);
    /// Shared-line writes of the fault in progress on this thread, if one is.
    static IN_FAULT: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Start a measurement: from here on a line counts as shared only if
/// another thread writes it after this call. Process-wide, so one
/// experiment measures at a time.
pub fn begin_measurement() {
    EPOCH.fetch_add(1 << SLOTS, Ordering::Relaxed);
}

/// The threads that have written one cache line.
#[derive(Debug, Default)]
pub struct LineWriters(AtomicU64);

impl LineWriters {
    pub const fn new() -> LineWriters {
        LineWriters(AtomicU64::new(0))
    }

    /// The calling thread writes the line: record it, and count the write
    /// for the fault in progress if another thread wrote the line before.
    #[inline]
    pub fn write(&self) {
        note_write(&self.0);
    }
}

/// [`LineWriters::write`] for a writer set kept in a word of its owner's
/// (a page-table frame's descriptor keeps its lock's).
#[inline]
pub fn note_write(writers: &AtomicU64) {
    let bit = SLOT_BIT.with(|b| *b);
    let epoch = EPOCH.load(Ordering::Relaxed);
    let mut word = writers.load(Ordering::Relaxed);
    let others = loop {
        let current = if word & !SLOT_MASK == epoch {
            word
        } else {
            epoch
        };
        if current | bit == word {
            break current & !bit & SLOT_MASK;
        }
        match writers.compare_exchange_weak(
            word,
            current | bit,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => break current & !bit & SLOT_MASK,
            Err(w) => word = w,
        }
    };
    if others != 0 {
        IN_FAULT.with(|f| {
            if let Some(n) = f.get() {
                f.set(Some(n + 1));
            }
        });
    }
}

/// A fault begins on this thread: count its shared-line writes.
#[inline]
pub fn fault_begin() {
    IN_FAULT.with(|f| f.set(Some(0)));
}

/// The fault ends: its shared-line writes.
#[inline]
pub fn fault_end() -> u64 {
    IN_FAULT.with(|f| f.replace(None)).unwrap_or(0)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn only_lines_another_thread_wrote_count() {
        let line = LineWriters::new();
        fault_begin();
        line.write();
        line.write();
        assert_eq!(fault_end(), 0, "this thread's own line");
        std::thread::scope(|s| {
            s.spawn(|| line.write());
        });
        fault_begin();
        line.write();
        assert_eq!(fault_end(), 1);
        line.write();
        fault_begin();
        assert_eq!(fault_end(), 0, "writes outside a fault are not counted");
        // A new measurement forgets the other thread's write, and counts it
        // again once that thread writes anew.
        begin_measurement();
        fault_begin();
        line.write();
        assert_eq!(
            fault_end(),
            0,
            "written by another thread only before the measurement"
        );
        std::thread::scope(|s| {
            s.spawn(|| line.write());
        });
        fault_begin();
        line.write();
        assert_eq!(
            fault_end(),
            1,
            "written by another thread in this measurement"
        );
    }
}

/// A hint to fetch the cache line of `*p` (x86's `prefetcht0`); nothing
/// on other architectures.
#[inline]
pub fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it reads nothing the program sees
    // and never faults, whatever the address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
