//! Model-checked MIGRC: the publication of owed flushes and kept sources
//! against a concurrent batched flush (`migrc_flushing`), running the
//! engine's own [`Migrc`].
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release -p usermm --test
//! loom_migrc` (`.ci/run` does). Built so, MIGRC's lock and atomics are
//! loom's, and loom runs the model under every interleaving of its three
//! threads (up to a preemption bound).
//!
//! The model: one virtual address, mapped read-only by one PTE, and one
//! CPU whose TLB may cache it.
//! - The CPU's thread walks the PTE and fills its TLB, as one step under
//!   its TLB lock (a flush request is handled before the walk or after the
//!   fill).
//! - The migrating thread does `migrate_pages_batch`'s steps in its
//!   shape: clear the PTE, owe its flush (`migrc_add_pending_ubc`, or
//!   flush now if refused), point the PTE at the destination, and keep
//!   the source (`migrc_add_pending_folios`, or flush everything owed and
//!   free it if refused).
//! - A third thread runs an unrelated batched flush that covers the CPU
//!   (`migrc_flush_start`, the IPI, `migrc_flush_end`), which releases
//!   whatever is kept once no CPU owes a flush; or a forced flush
//!   (`migrc_flush_free_folios`, as a write fault elsewhere runs it).
//!
//! The property (I1 of the seed): a source is never released while the
//! CPU's TLB still holds a translation to it. Three scenes: a first
//! migration, a destination migrated again while its own source is still
//! kept, and a first migration against a forced flush. Broken variants
//! that must be caught:
//! - the publication's look at `migrc_flushing` removed
//!   ([`Weakened::NoFlushingCheck`]): the flush's IPI runs before the PTE
//!   is cleared, the CPU caches the source again, and the flush's end,
//!   which now sees the owed mask, releases the source;
//! - a forced flush that clears the owed mask before its flush is done,
//!   as the seed's does ([`Weakened::ForcedFlushForgets`]): the
//!   publication it makes refuse finds nothing owed, flushes nothing, and
//!   frees its source while the CPU still caches it.
#![cfg(loom)]

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;
use usermm::migrc::{Migrc, Weakened};
use usermm::phys::Folio;

/// The CPU's bit in the masks.
const CPU: u64 = 1;

struct World {
    migrc: Migrc,
    /// The PTE: the frame it maps, or 0 while cleared.
    pte: AtomicU64,
    /// The CPU's TLB entry for the address, under its TLB lock.
    tlb: Mutex<Option<u64>>,
}

impl World {
    /// The CPU handles a full flush.
    fn flush_cpu(&self) {
        *self.tlb.lock().unwrap() = None;
    }

    /// Sources freed: none may still be cached.
    fn release(&self, folios: Vec<Folio>) {
        let tlb = *self.tlb.lock().unwrap();
        for f in folios {
            assert_ne!(tlb, Some(f.0), "source {:#x} freed while cached", f.0);
        }
    }

    /// `migrc_flush_free_folios`: take the kept sources, flush what is
    /// owed (a bracketed batched flush, whose end releases what was kept
    /// since), then release them.
    fn flush_free_folios(&self) {
        let (kept, owed) = self.migrc.take_for_flush();
        if owed != 0 {
            self.migrc.flush_start();
            self.flush_cpu();
            let released = self.migrc.flush_end(owed);
            self.release(released);
        }
        self.release(kept);
    }
}

/// The CPU: walk and fill, twice.
fn cpu(w: &World) {
    for _ in 0..2 {
        let mut tlb = w.tlb.lock().unwrap();
        let pfn = w.pte.load(Ordering::SeqCst);
        if pfn != 0 {
            *tlb = Some(pfn);
        }
    }
}

/// `migrate_pages_batch` of the folio at `src` to `dst` with MIGRC.
fn migrate(w: &World, src: u64, dst: u64) {
    // try_to_migrate_one: the PTE cleared, its flush queued read-only
    // (the source's arch_tlbbatch_add_pending).
    w.pte.store(0, Ordering::SeqCst);
    let owed = w.migrc.add_pending_ubc(CPU);
    if !owed {
        // try_to_unmap_flush with the owed CPUs folded in.
        w.flush_cpu();
    }
    // migrate_folio_move: copied, the PTE restored to the destination.
    w.pte.store(dst, Ordering::SeqCst);
    if !owed {
        w.release(vec![Folio(src)]);
        return;
    }
    if let Err(refused) = w.migrc.add_pending_folios(vec![Folio(src)]) {
        w.flush_free_folios();
        w.release(refused);
    }
}

/// An unrelated batched flush that covers the CPU.
fn batched_flush(w: &World) {
    w.migrc.flush_start();
    w.flush_cpu();
    let released = w.migrc.flush_end(CPU);
    w.release(released);
}

/// What the third thread does while the migration runs.
#[derive(Clone, Copy)]
enum Other {
    /// An unrelated batched flush that covers the CPU.
    BatchedFlush,
    /// A forced flush (a write fault elsewhere, `do_wp_page`).
    ForcedFlush,
}

/// The migration the model makes.
#[derive(Clone, Copy)]
enum Scene {
    /// S (0x100) to D (0x200), the CPU caching S.
    First,
    /// D (0x200) to D2 (0x300) while its own source S (0x100) is still
    /// kept, its flush owed, and the CPU still caches S.
    Again,
}

/// The preemption bound of every model.
const BOUND: usize = 3;

/// Run the model: `scene`'s migration while `other` runs, MIGRC broken
/// as `weakened` says.
fn run(scene: Scene, other: Other, weakened: Weakened) {
    let (mapped, cached, kept, dst) = match scene {
        Scene::First => (0x100, 0x100, None, 0x200),
        Scene::Again => (0x200, 0x100, Some(0x100), 0x300),
    };
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(BOUND);
    b.check(move || {
        let w = Arc::new(World {
            migrc: Migrc::default(),
            pte: AtomicU64::new(mapped),
            tlb: Mutex::new(Some(cached)),
        });
        w.migrc.set_weakened(weakened);
        if let Some(s) = kept {
            assert!(w.migrc.add_pending_ubc(CPU));
            assert!(w.migrc.add_pending_folios(vec![Folio(s)]).is_ok());
        }
        let threads = [
            {
                let w = w.clone();
                thread::spawn(move || cpu(&w))
            },
            {
                let w = w.clone();
                thread::spawn(move || match other {
                    Other::BatchedFlush => batched_flush(&w),
                    Other::ForcedFlush => w.flush_free_folios(),
                })
            },
        ];
        migrate(&w, mapped, dst);
        for t in threads {
            t.join().unwrap();
        }
    });
}

use Other::{BatchedFlush, ForcedFlush};
use Scene::{Again, First};
use Weakened::{ForcedFlushForgets, NoFlushingCheck};

/// The broken model must fail: loom finds a source freed while cached.
fn caught(scene: Scene, other: Other, weakened: Weakened) {
    let r = std::panic::catch_unwind(|| run(scene, other, weakened));
    assert!(r.is_err(), "loom should find a source freed while cached");
}

/// A first migration against a batched flush.
#[test]
fn a_publication_racing_a_batched_flush() {
    run(First, BatchedFlush, Weakened::None);
}

/// A destination migrated again while its source is still kept.
#[test]
fn a_destination_migrated_again_while_its_source_is_kept() {
    run(Again, BatchedFlush, Weakened::None);
}

/// A forced flush (a write fault elsewhere) runs while the migration
/// publishes: a publication it makes refuse must still see the flush owed
/// until that flush is done, and make its own before freeing the source.
#[test]
fn a_publication_racing_a_forced_flush() {
    run(First, ForcedFlush, Weakened::None);
}

#[test]
fn a_publication_without_the_flushing_check_is_caught() {
    caught(First, BatchedFlush, NoFlushingCheck);
}

#[test]
fn a_second_migration_without_the_flushing_check_is_caught() {
    caught(Again, BatchedFlush, NoFlushingCheck);
}

/// The seed's forced flush, which forgets the owed CPUs before its flush
/// is done: the refused publication then frees its source at once.
#[test]
fn a_forced_flush_that_forgets_what_is_owed_is_caught() {
    caught(First, ForcedFlush, ForcedFlushForgets);
}
