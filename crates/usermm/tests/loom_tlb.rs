//! Model-checked reads of a CPU's TLB from another thread, on the engine's
//! own `Tlb`.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release -p usermm --test
//! loom_tlb` (`.ci/run` does). The TLB's owner fills and flushes it with
//! plain relaxed stores inside write sections; a reader on another thread
//! (the invariant checker, `inspect`) takes a picture with
//! `Tlb::entries`, which looks at the sequence count before and after.
//!
//! The model: the owner has cached a page in the one way the model
//! checker's TLB has. While the reader takes its picture, the owner caches
//! a second page, which evicts the first, then gives the slot (the only one
//! under the model checker) to another address space, which flushes it.
//! The property: every translation in the picture is one the owner cached,
//! for the address space it cached it for: never the key of one page with
//! the frame of another, nor an entry of the old address space credited to
//! the new one. A reader that skips its second look at the count
//! (`Tlb::break_reader`) must be caught reading a torn entry.
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
    b.preemption_bound = Some(3);
    b.check(move || {
        let mut tlb = Tlb::default();
        if broken {
            tlb.break_reader();
        }
        let tlb = Arc::new(tlb);
        let (slot, _) = tlb.assign_slot(7, 1);
        let (vaddr, pfn) = FILLS[0];
        tlb.insert(slot, vaddr, &translation(pfn));
        let reader = {
            let tlb = tlb.clone();
            thread::spawn(move || tlb.entries())
        };
        let (vaddr, pfn) = FILLS[1];
        tlb.insert(slot, vaddr, &translation(pfn));
        let (again, new) = tlb.assign_slot(8, 1);
        assert!(new && again == slot, "one slot: the new mm evicts the old");
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
