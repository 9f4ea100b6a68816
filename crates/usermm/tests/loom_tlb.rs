//! Model-checked reads of a CPU's TLB from another thread, on the engine's
//! own `Tlb`.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release -p usermm --test
//! loom_tlb` (`.ci/run` does). The TLB's owner fills and flushes it with
//! plain relaxed stores inside write sections; a reader on another thread
//! (the invariant checker, `inspect`) takes a picture with
//! `Tlb::entries`, which looks at the sequence count before and after.
//!
//! The model: the owner caches two pages in the one way that the model
//! checker's TLB has, so that the second evicts the first, then flushes
//! the slot; the reader takes one
//! picture meanwhile. The property: every translation in the picture is one
//! the owner cached (never the key of one page with the frame of another),
//! and a picture taken after the flush is empty. A reader that skips its
//! second look at the count (`Tlb::break_reader`) must be caught reading a
//! torn entry.
#![cfg(loom)]

use loom::thread;
use std::sync::Arc;

use usermm::cpu::tlb::Tlb;
use usermm::pgtable::walk::Translation;
use usermm::phys::PAGE_SIZE;

/// The owner's fills: (virtual address, frame).
const FILLS: [(u64, u64); 2] = [(0x1000, 11), (0x2000, 22)];

fn translation(pfn: u64) -> Translation {
    Translation {
        pfn,
        size: PAGE_SIZE,
        writable: pfn % 2 == 0,
        dirty: false,
    }
}

fn run(broken: bool) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(2);
    b.check(move || {
        let mut tlb = Tlb::default();
        if broken {
            tlb.break_reader();
        }
        let tlb = Arc::new(tlb);
        let (slot, _) = tlb.assign_slot(7, 1);
        let reader = {
            let tlb = tlb.clone();
            thread::spawn(move || tlb.entries())
        };
        for (vaddr, pfn) in FILLS {
            tlb.insert(slot, vaddr, &translation(pfn));
        }
        tlb.flush_slot(slot);
        assert!(tlb.entries().is_empty(), "a flushed slot keeps nothing");
        for e in reader.join().unwrap() {
            assert!(
                FILLS.iter().any(|&(v, p)| e.vaddr == v
                    && e.pfn == p
                    && e.writable == translation(p).writable
                    && e.mm_id == 7),
                "the reader saw a translation the owner never cached: {e:?}"
            );
        }
    });
}

#[test]
fn readers_see_whole_entries() {
    run(false);
}

#[test]
#[should_panic(expected = "never cached")]
fn a_reader_that_does_not_look_again_reads_torn_entries() {
    run(true);
}
