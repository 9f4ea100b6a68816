//! Model-checked TLB shootdowns, running the engine's own CPU code.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release -p usermm --test
//! loom_shootdown` (`.ci/run` does). Built so, every atomic and lock of the
//! CPU layer is loom's, and loom runs each model under the interleavings of
//! its threads (up to a preemption bound) and every value the memory model
//! lets a load return.
//!
//! The model: CPUs 1 and 2 switch to an address space (`Cpu::switch_mm`),
//! return to user mode (`Cpu::enter_user`) and make user accesses to one
//! page as `OnCpu::translate` does: poll the mailbox (`Cpu::poll`, which
//! runs `flush_tlb_func` on each request), then look the page up in the TLB
//! and, on a miss, walk (fill the TLB if the PTE is still there). Between
//! two accesses a CPU may make a system call (`Cpu::enter_kernel`, kernel
//! mode: sent the request, not waited for) or go idle (`Cpu::enter_lazy`,
//! lazy mode: skipped unless tables were freed). CPU 0 clears the PTE,
//! calls `flush_tlb_mm_range`, and then frees the page. The property: no
//! access goes through a TLB entry to a page already freed.
//! The address space is a stand-in that has only what the CPU layer needs
//! of one ([`TlbMm`]); everything else is the engine's.
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, AtomicU64};
use loom::thread;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use usermm::cpu::{flush_tlb_mm_range, Cpu, FlushRange, TlbMm};
use usermm::pgtable::walk::Translation;
use usermm::phys::{Pfn, PAGE_SHIFT, PAGE_SIZE};
use usermm::vmstat::VmStat;

const ADDR: u64 = 0x7f00_0000_0000;
const PFN: Pfn = 42;

/// An address space as the CPU layer sees it.
struct ModelMm {
    tlb_gen: AtomicU64,
    cpumask: AtomicU64,
}

impl TlbMm for ModelMm {
    fn tlb_id(&self) -> u64 {
        1
    }
    fn tlb_gen(&self) -> &AtomicU64 {
        &self.tlb_gen
    }
    fn cpumask(&self) -> &AtomicU64 {
        &self.cpumask
    }
    fn cr3(&self) -> Pfn {
        7
    }
}

struct World {
    cpus: Vec<Cpu<ModelMm>>,
    mm: Arc<ModelMm>,
    vmstat: VmStat,
    /// The PTE of `ADDR`: nonzero while it maps the page.
    pte: AtomicU64,
    /// The page went back to the allocator.
    freed: AtomicBool,
}

/// One user access to `ADDR` on `cpu`, as `OnCpu::translate` makes it.
fn access(w: &World, cpu: &Cpu<ModelMm>) {
    cpu.poll(&w.vmstat);
    let (_, slot) = cpu.loaded_pgd().expect("an mm is loaded");
    let tlb = &cpu.tlb;
    if let Some(e) = tlb.lookup(slot, ADDR) {
        assert!(
            !w.freed.load(Ordering::SeqCst),
            "CPU {}: an access went through a stale TLB entry to a freed page (pfn {})",
            cpu.id,
            e.pfn
        );
    } else if w.pte.load(Ordering::Acquire) != 0 {
        // The walk sees the PTE and fills the TLB, in one step.
        let t = Translation {
            pfn: PFN,
            size: PAGE_SIZE,
            writable: true,
            dirty: true,
        };
        tlb.insert(slot, ADDR, &t);
    }
}

/// What a target does between two accesses.
#[derive(Clone, Copy, PartialEq)]
enum Between {
    Nothing,
    /// Leaves user mode and comes back (a system call).
    Syscall,
    /// Goes idle (lazy mode) and comes back.
    Idle,
}

/// A target CPU: switch to the mm, then `rounds` accesses, doing
/// `between` after each. It ends in the kernel.
fn target(w: &World, id: usize, rounds: usize, between: Between) {
    let cpu = &w.cpus[id];
    cpu.switch_mm(Some(&w.mm));
    cpu.enter_user(&w.vmstat);
    for _ in 0..rounds {
        access(w, cpu);
        match between {
            Between::Nothing => {}
            Between::Syscall => cpu.enter_kernel(&w.vmstat),
            Between::Idle => cpu.enter_lazy(&w.vmstat),
        }
        cpu.enter_user(&w.vmstat);
    }
    cpu.enter_kernel(&w.vmstat);
}

/// The model with `targets` target CPUs; `freed_tables` is the flush's;
/// `broken` makes CPU 1 return to user mode with the handshake's steps
/// swapped.
fn run(
    targets: usize,
    rounds: usize,
    between: Between,
    freed_tables: bool,
    broken: bool,
    bound: usize,
) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(bound);
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = runs.clone();
    b.check(move || {
        counted.fetch_add(1, Ordering::Relaxed);
        let mut cpus: Vec<Cpu<ModelMm>> = (0..=targets).map(|id| Cpu::new(id, 0)).collect();
        if broken {
            cpus[1].break_return_to_user();
        }
        let w = Arc::new(World {
            cpus,
            mm: Arc::new(ModelMm {
                tlb_gen: AtomicU64::new(1),
                cpumask: AtomicU64::new(0),
            }),
            vmstat: VmStat::new(targets + 1),
            pte: AtomicU64::new(1),
            freed: AtomicBool::new(false),
        });
        // CPU 0 runs the mm too: the flush is local there and remote on
        // the others.
        w.cpus[0].switch_mm(Some(&w.mm));
        let threads: Vec<_> = (1..=targets)
            .map(|id| {
                let w = w.clone();
                thread::spawn(move || target(&w, id, rounds, between))
            })
            .collect();
        w.pte.store(0, Ordering::Release);
        let me = &w.cpus[0];
        let range = FlushRange {
            start: ADDR,
            end: ADDR + PAGE_SIZE,
            stride_shift: PAGE_SHIFT,
            freed_tables,
        };
        flush_tlb_mm_range(&w.cpus, me, &w.mm, range, &w.vmstat);
        w.freed.store(true, Ordering::SeqCst);
        for t in threads {
            t.join().unwrap();
        }
    });
    eprintln!("{} executions", runs.load(Ordering::Relaxed));
}

#[test]
fn one_target_in_user_mode() {
    run(1, 2, Between::Nothing, false, false, 5);
}

#[test]
fn one_target_entering_and_leaving_user_mode() {
    run(1, 2, Between::Syscall, false, false, 5);
}

#[test]
fn one_target_going_idle() {
    run(1, 2, Between::Idle, false, false, 5);
}

#[test]
fn one_target_going_idle_while_tables_are_freed() {
    run(1, 2, Between::Idle, true, false, 5);
}

#[test]
fn two_targets() {
    run(2, 1, Between::Nothing, false, false, 4);
}

#[test]
fn two_targets_entering_and_leaving_user_mode() {
    run(2, 1, Between::Syscall, false, false, 4);
}

/// The checker finds the bug when a CPU reads the generation before it
/// announces user mode (the Dekker pair broken): the flusher sees it out
/// of user mode and does not wait, while it keeps the stale entry.
#[test]
fn broken_return_to_user_is_caught() {
    let r = std::panic::catch_unwind(|| run(1, 2, Between::Syscall, false, true, 3));
    assert!(r.is_err(), "loom should find a stale access");
}
