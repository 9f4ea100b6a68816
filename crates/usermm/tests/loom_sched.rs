//! Model-checked: a kernel thread taking a CPU from its user thread and
//! giving it back, running the engine's own [`Runqueues`].
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release -p usermm --test
//! loom_sched` (`.ci/run` does). Built so, the CPUs' words, locks and
//! condition variables are loom's, and loom runs the model under every
//! interleaving of its two threads up to a preemption bound. It checks
//! the handshake on one CPU (the steps [`Runqueues::take_cpu`] makes for
//! each CPU it asks); the choice among several CPUs, the host CPUs and
//! the sharing of a CPU at `cond_resched` are tested in `tests/sched.rs`.
//!
//! The model: one CPU. Its user thread runs user code twice, looking at
//! the word before each, as an access's slow path does, and stops for a
//! kernel thread that asked ([`Runqueues::run_kthread`]). The kernel
//! thread asks for the CPU ([`Runqueues::request`]); then either waits
//! until the CPU is taken, or withdraws at once ([`Runqueues::withdraw`]),
//! keeping the CPU if it was taken first; runs on it if it has it; and
//! gives it back ([`Runqueues::give_back`]).
//!
//! The properties: the user thread never runs user code while the kernel
//! thread runs on its CPU; and the user thread, stopped, is always woken
//! (loom reports a thread left blocked for ever as a deadlock). The broken
//! variant that must be caught: the give-back's store and wakeup made
//! without the CPU's lock ([`Runqueues::break_give_back`]): the store and
//! the wakeup can fall between the user thread's look at the word and its
//! wait, and the wakeup is lost.
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::thread;
use usermm::sched::Runqueues;

struct World {
    rqs: Runqueues,
    /// The kernel thread runs on the CPU.
    kthread_on_cpu: AtomicBool,
}

/// The user thread: two stretches of user code, each after a look at the
/// word (an access's slow path).
fn user_thread(w: &World) {
    for _ in 0..2 {
        if w.rqs.kthread_waiting(0) {
            w.rqs.run_kthread(0);
        }
        assert!(
            !w.kthread_on_cpu.load(Ordering::SeqCst),
            "user code ran while the kernel thread had the CPU"
        );
    }
}

/// The kernel thread: ask, then wait for the CPU or withdraw at once; run
/// on the CPU if it has it; give it back.
fn kthread(w: &World, wait: bool) {
    assert!(w.rqs.request(0));
    let have = if wait {
        // Bounded: the user thread may have finished without a look.
        let mut have = false;
        for _ in 0..3 {
            if w.rqs.is_taken(0) {
                have = true;
                break;
            }
            thread::yield_now();
        }
        have || !w.rqs.withdraw(0)
    } else {
        !w.rqs.withdraw(0)
    };
    if have {
        // Its run: two steps, between which the user thread may be
        // scheduled (and must not run user code).
        w.kthread_on_cpu.store(true, Ordering::SeqCst);
        w.kthread_on_cpu.store(false, Ordering::SeqCst);
        w.rqs.give_back(0);
    }
}

fn check(broken: bool, wait: bool) {
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(3);
    model.check(move || {
        let mut rqs = Runqueues::new(1);
        if broken {
            rqs.break_give_back();
        }
        // Leaked, so that a deadlock found leaves nothing of loom's to
        // drop while the model unwinds; the user thread is spawned, so
        // that the thread the model blocks in last is this one, joining.
        let w: &'static World = Box::leak(Box::new(World {
            rqs,
            kthread_on_cpu: AtomicBool::new(false),
        }));
        let user = thread::spawn(move || user_thread(w));
        kthread(w, wait);
        user.join().unwrap();
        assert!(!w.rqs.is_taken(0), "the CPU was never given back");
    });
}

#[test]
fn a_taken_cpu_runs_no_user_code_and_is_woken_when_given_back() {
    check(false, true);
}

#[test]
fn a_request_withdrawn_or_taken_first_is_settled_once() {
    check(false, false);
}

#[test]
fn a_give_back_without_the_lock_loses_the_wakeup() {
    let r = std::panic::catch_unwind(|| check(true, true));
    let found = r.err().and_then(|e| {
        e.downcast_ref::<String>()
            .map(|m| m.contains("deadlock"))
            .or_else(|| e.downcast_ref::<&str>().map(|m| m.contains("deadlock")))
    });
    assert_eq!(found, Some(true), "the lost wakeup was not found");
}
