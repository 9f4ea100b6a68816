//! Model-checked TLB shootdown handshake (`usermm::cpu::shootdown`).
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release -p usermm --test
//! loom_shootdown` (`.ci/run` does). Loom runs each model under every
//! interleaving of the two threads and every value the memory model lets a
//! load return.
//!
//! The model: a CPU runs user accesses through a TLB entry that maps a page;
//! another CPU clears the PTE, makes a flush request with the protocol's
//! steps, waits as `flush_tlb_mm_range` does, and then frees the page. The
//! property: no access may go through the stale entry once the page is free.
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, AtomicU64};
use loom::sync::{Arc, Mutex};
use loom::thread;
use std::sync::atomic::Ordering;

use usermm::cpu::shootdown::{next_tlb_gen, target_done, Acks, CpuMode, MailFlag};

const TARGET: usize = 1;

struct Shared {
    mm_tlb_gen: AtomicU64,
    mode: CpuMode,
    mail: MailFlag,
    mailbox: Mutex<Option<u64>>,
    acks: Acks,
    pte: AtomicU64,
    freed: AtomicBool,
}

/// The target CPU's private state: its TLB entry and its slot's generation.
struct Tlb {
    valid: bool,
    gen: u64,
}

impl Tlb {
    fn catch_up(&mut self, gen: u64) {
        if self.gen < gen {
            self.valid = false;
            self.gen = gen;
        }
    }
}

/// The target: `rounds` user accesses, each preceded by a return to user
/// mode if needed and a poll of the mailbox, as `OnCpu::translate` does;
/// then it leaves user mode as `enter_kernel` does. `broken_return` swaps
/// the two steps of the return to user mode (reads the generation first).
fn target(s: &Shared, rounds: usize, leave_between: bool, broken_return: bool) {
    let mut tlb = Tlb {
        valid: true,
        gen: 1,
    };
    let handle = |s: &Shared, tlb: &mut Tlb| {
        if s.mail.is_raised() {
            let req = {
                let mut q = s.mailbox.lock().unwrap();
                s.mail.lower();
                q.take()
            };
            if let Some(gen) = req {
                tlb.catch_up(gen);
                s.acks.ack(TARGET);
            }
        }
    };
    for round in 0..rounds {
        if !s.mode.in_user() {
            let gen = if broken_return {
                let g = s.mm_tlb_gen.load(Ordering::SeqCst);
                s.mode.return_to_user(None);
                g
            } else {
                s.mode.return_to_user(Some(&s.mm_tlb_gen)).unwrap()
            };
            tlb.catch_up(gen);
        }
        handle(s, &mut tlb);
        if tlb.valid {
            assert!(
                !s.freed.load(Ordering::SeqCst),
                "round {round}: an access went through a stale TLB entry to a freed page"
            );
        } else if s.pte.load(Ordering::Acquire) != 0 {
            tlb.valid = true; // the walk refills from a live PTE
        }
        if leave_between {
            handle(s, &mut tlb);
            s.mode.leave_user();
        }
    }
    handle(s, &mut tlb);
    s.mode.leave_user();
}

/// The flusher: clear the PTE, then `flush_tlb_mm_range`'s steps, then free.
fn flusher(s: &Shared) {
    s.pte.store(0, Ordering::Release);
    let gen = next_tlb_gen(&s.mm_tlb_gen);
    if let Some(seen) = s.mode.needs_request() {
        *s.mailbox.lock().unwrap() = Some(gen);
        s.mail.raise();
        while !target_done(&s.mode, seen, &s.acks, TARGET) {
            thread::yield_now();
        }
    }
    s.freed.store(true, Ordering::SeqCst);
}

fn run(target_in_user: bool, rounds: usize, leave_between: bool, broken_return: bool) {
    loom::model(move || {
        let s = Arc::new(Shared {
            mm_tlb_gen: AtomicU64::new(1),
            mode: CpuMode::new(),
            mail: MailFlag::default(),
            mailbox: Mutex::new(None),
            acks: Acks::default(),
            pte: AtomicU64::new(1),
            freed: AtomicBool::new(false),
        });
        if target_in_user {
            s.mode.return_to_user(Some(&s.mm_tlb_gen));
        }
        let t = {
            let s = s.clone();
            thread::spawn(move || target(&s, rounds, leave_between, broken_return))
        };
        flusher(&s);
        t.join().unwrap();
    });
}

#[test]
fn target_running_user_accesses() {
    run(true, 2, false, false);
}

#[test]
fn target_entering_and_leaving_user_mode() {
    run(false, 2, true, false);
}

/// The checker finds the bug when the target reads the generation before
/// it announces user mode (the Dekker pair broken).
#[test]
fn broken_return_to_user_is_caught() {
    let r = std::panic::catch_unwind(|| run(false, 2, true, true));
    assert!(r.is_err(), "loom should find a stale access");
}
