//! Kernel threads on the machine's CPUs: the part of the scheduler
//! (kernel/sched/core.c) the model needs so that kswapd runs on a CPU of
//! its node, in place of the user thread there, as the kernel's does.
//!
//! Why the model needs it: each of the machine's CPUs is played by a host
//! thread, and a kswapd that runs on a host thread of its own beside them
//! makes one runnable thread more than the machine has CPUs. Where the
//! host has no core to spare for it, kswapd and the CPUs' threads take
//! turns on the host's cores, and every shootdown kswapd sends waits until
//! each target's thread has a core again: a scheduler slice, where an IPI
//! costs microseconds. The kernel binds kswapd to its node's CPUs (to all
//! housekeeping CPUs if its node has none: since 6.14 the kthread core
//! does, as `kswapd_run` creates it on its node; `kswapd` itself did
//! before); woken, it runs on one that is idle if there is one, and
//! otherwise shares one with the task there, a slice each (EEVDF). While
//! it runs the CPU is in
//! lazy TLB mode (a kernel thread borrows the mm the CPU had loaded), so
//! flushes skip it.
//!
//! So a kernel thread's run ([`Runqueues::kthread_run`]) runs beside the
//! CPUs' threads while one of its CPUs is idle (no thread plays it, or its
//! thread is lazy), as on that CPU: where the CPUs' threads are pinned one
//! to a host core, as the experiments pin them, that core is free.
//! Otherwise it takes a CPU that runs user code, whose thread stops until
//! the CPU is given back, and runs on that thread's host CPUs. At its
//! [`cond_resched`] points (the kernel's), a run that has had a CPU for a
//! slice ([`sched_base_slice`]) gives it back and asks for none for a
//! slice, the user thread's turn, which it waits out unless another of its
//! CPUs is idle; a run beside the CPUs takes one once none of its CPUs is
//! idle. A run whose CPUs did not answer in time asks again a slice
//! later.
//!
//! # The protocol
//!
//! Each CPU has a word, `NONE`, `REQUESTED` or `TAKEN`:
//! 1. The kernel thread ([`Runqueues::take_cpu`]) picks the CPUs allowed
//!    it that run user code, and for each that no other kernel thread
//!    asked, moves the word from `NONE` to `REQUESTED` and sends the CPU a
//!    reschedule IPI ([`Cpu::send_reschedule`]: its next access takes the
//!    slow path, where it looks at the word).
//! 2. The CPU, at that access ([`Runqueues::kthread_waiting`]), stops
//!    running user code (lazy TLB mode), stores the host CPUs its thread
//!    runs on, and moves the word from `REQUESTED` to `TAKEN`
//!    ([`Runqueues::run_kthread`]); it then blocks until the word is
//!    `NONE` again, and returns to user mode, comparing its TLB's
//!    generation with its mm's as any lazy CPU does.
//! 3. The kernel thread waits up to [`TAKE_TIMEOUT`] for one CPU to be
//!    `TAKEN`, and withdraws its other requests (`REQUESTED` to `NONE`); a
//!    request taken between its look and its withdrawal is given back at
//!    once. The compare-and-swap on `REQUESTED` decides every race between
//!    a take and a withdrawal: exactly one of them moves the word. It then
//!    runs on the host CPUs the CPU's thread stored.
//! 4. To give the CPU back ([`Runqueues::give_back`]) it returns to its
//!    own host CPUs, stores `NONE` under the CPU's lock and wakes the
//!    CPU's thread.
//!
//! With no CPU taken in time (none runs user code: each is in a system
//! call or a fault, or none answered), the kernel thread runs beside them
//! until its next [`cond_resched`]. The CPU's thread blocks on a host mutex
//! and condition variable: it gives its host core to the kernel thread,
//! which is the point.
//!
//! Orderings: the CAS that takes the CPU (AcqRel) follows the CPU's switch
//! to lazy mode in its thread, and the kernel thread reads `TAKEN` with
//! Acquire: so every flush the kernel thread sends after that sees the CPU
//! lazy (the mode word's own SeqCst handshake would find it so in any case,
//! and a CPU found in user mode is only waited for, never wronged). The
//! give-back's store of `NONE` is made under the CPU's mutex, which its
//! thread holds from its look at the word to its wait, so the wakeup is
//! not lost.
//!
//! What the model does differently: the kernel's kswapd runs as the CPU
//! it is on (its frees go to that CPU's per-CPU lists, its events count
//! there); the model's keeps a CPU structure of its own, which no user mm
//! is loaded on, and the CPU it took only stands still. For shootdowns the
//! two agree: the taken CPU is lazy and is skipped in both. The kernel's
//! scheduler also moves a woken kswapd to a CPU that goes idle meanwhile;
//! the model's looks again only at its next `cond_resched`.

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use crate::sync::checked::{AtomicU8, Condvar, Mutex};
use crate::sync::Ordering;

use crate::cpu::{Cpu, TlbMm};

/// No kernel thread wants the CPU.
const NONE: u8 = 0;
/// A kernel thread asked for the CPU.
const REQUESTED: u8 = 1;
/// A kernel thread runs on the CPU; its user thread waits.
const TAKEN: u8 = 2;

/// How long a kernel thread waits for a CPU that runs user code to stop
/// for it, before it runs beside them. A CPU's thread answers within a few
/// accesses while it has a host core, and it may not have one (the kernel
/// thread's own wakeup may have taken it).
pub const TAKE_TIMEOUT: Duration = Duration::from_millis(5);

/// One CPU's word, and what its thread waits on while it is taken.
struct Rq {
    state: AtomicU8,
    /// The host CPUs the CPU's thread runs on, stored by the thread as it
    /// stops, which the kernel thread runs on while it has the CPU.
    lock: Mutex<HostCpus>,
    given_back: Condvar,
}

impl Rq {
    fn new() -> Rq {
        Rq {
            state: AtomicU8::new(NONE),
            lock: Mutex::new(HostCpus::default()),
            given_back: Condvar::default(),
        }
    }
}

/// The CPUs' words, and whether kernel threads run on the CPUs at all.
pub struct Runqueues {
    rqs: Box<[Rq]>,
    /// Kernel threads take a CPU of theirs to run on (the kernel's way,
    /// and the default); off, they run on host threads beside the CPUs.
    on_cpus: AtomicBool,
    /// Model checking only: give CPUs back without their lock, for the
    /// loom test that must find the lost wakeup.
    #[cfg(loom)]
    broken_give_back: bool,
}

impl Runqueues {
    pub fn new(nr_cpus: usize) -> Runqueues {
        Runqueues {
            rqs: (0..nr_cpus).map(|_| Rq::new()).collect(),
            on_cpus: AtomicBool::new(true),
            #[cfg(loom)]
            broken_give_back: false,
        }
    }

    /// Model checking only: store `NONE` and wake the CPU's thread without
    /// its lock (see [`Runqueues::give_back`]).
    #[cfg(loom)]
    pub fn break_give_back(&mut self) {
        self.broken_give_back = true;
    }

    /// Whether kernel threads take a CPU to run on.
    pub fn set_on_cpus(&self, on: bool) {
        self.on_cpus.store(on, Ordering::Relaxed);
    }

    pub fn on_cpus(&self) -> bool {
        self.on_cpus.load(Ordering::Relaxed)
    }

    /// The CPU's side, at an access's slow path: whether a kernel thread
    /// waits for it (one relaxed load; [`Runqueues::run_kthread`] decides).
    #[inline]
    pub fn kthread_waiting(&self, cpu: usize) -> bool {
        self.rqs
            .get(cpu)
            .is_some_and(|rq| rq.state.load(Ordering::Relaxed) == REQUESTED)
    }

    /// The CPU's side: its thread has stopped running user code (the CPU
    /// is lazy); let the kernel thread that asked for it run, and block
    /// until it is given back. False if the request was withdrawn first.
    pub fn run_kthread(&self, cpu: usize) -> bool {
        let Some(rq) = self.rqs.get(cpu) else {
            return false;
        };
        let mut held = rq.lock.lock();
        *held = HostCpus::of_this_thread();
        // AcqRel: the CPU's switch to lazy mode, before this, is seen by
        // the kernel thread that reads TAKEN.
        if rq
            .state
            .compare_exchange(REQUESTED, TAKEN, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        while rq.state.load(Ordering::Acquire) == TAKEN {
            held = rq.given_back.wait(held);
        }
        true
    }

    /// The kernel thread's side (`try_to_wake_up` and the switch to it):
    /// take one CPU of `allowed` (a mask of CPU ids) that runs user code,
    /// waiting up to [`TAKE_TIMEOUT`] for it to stop; None if none did, or
    /// kernel threads do not take CPUs. The caller gives it back
    /// ([`Runqueues::give_back`]).
    pub fn take_cpu<M: TlbMm>(&self, cpus: &[Cpu<M>], allowed: u64) -> Option<usize> {
        if !self.on_cpus() {
            return None;
        }
        let mut asked = 0u64;
        for (id, cpu) in cpus.iter().enumerate().take(self.rqs.len()) {
            if allowed & (1 << id) != 0 && cpu.in_user() && self.request(id) {
                asked |= 1 << id;
                cpu.send_reschedule();
            }
        }
        if asked == 0 {
            return None;
        }
        let deadline = Instant::now() + TAKE_TIMEOUT;
        let mut taken = None;
        crate::sync::spin_until(|| {
            taken = self.find_taken(asked);
            taken.is_some() || Instant::now() >= deadline
        });
        // Withdraw the other requests; one taken meanwhile goes back.
        for id in self.ids_in(asked) {
            if Some(id) == taken || self.withdraw(id) {
                continue;
            }
            if taken.is_none() {
                taken = Some(id);
            } else {
                self.give_back(id);
            }
        }
        taken
    }

    /// Step 1: ask for CPU `id` (`NONE` to `REQUESTED`); false if another
    /// kernel thread has asked for it or has it.
    pub fn request(&self, id: usize) -> bool {
        self.rqs.get(id).is_some_and(|rq| {
            rq.state
                .compare_exchange(NONE, REQUESTED, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })
    }

    /// Step 3: withdraw a request for CPU `id` (`REQUESTED` to `NONE`);
    /// false if the CPU has stopped for it first (it is `TAKEN`, and the
    /// caller has it, to give back).
    pub fn withdraw(&self, id: usize) -> bool {
        self.rqs.get(id).is_none_or(|rq| {
            rq.state
                .compare_exchange(REQUESTED, NONE, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        })
    }

    /// Give CPU `id` back to its user thread: store `NONE` under the CPU's
    /// lock (its thread holds it from its look at the word to its wait)
    /// and wake the thread.
    pub fn give_back(&self, id: usize) {
        let Some(rq) = self.rqs.get(id) else {
            return;
        };
        #[cfg(loom)]
        if self.broken_give_back {
            rq.state.store(NONE, Ordering::Release);
            rq.given_back.notify_all();
            return;
        }
        let held = rq.lock.lock();
        rq.state.store(NONE, Ordering::Release);
        drop(held);
        rq.given_back.notify_all();
    }

    /// The host CPUs CPU `id`'s thread runs on, as it stored them when it
    /// stopped for a kernel thread.
    fn host_cpus_of(&self, id: usize) -> HostCpus {
        self.rqs
            .get(id)
            .map(|rq| *rq.lock.lock())
            .unwrap_or_default()
    }

    /// The first CPU of `asked` that has stopped for the kernel thread.
    fn find_taken(&self, asked: u64) -> Option<usize> {
        self.ids_in(asked)
            .find(|&id| self.rqs[id].state.load(Ordering::Acquire) == TAKEN)
    }

    /// The ids of the CPUs of `mask`.
    fn ids_in(&self, mask: u64) -> impl Iterator<Item = usize> {
        (0..self.rqs.len()).filter(move |&id| mask & (1 << id) != 0)
    }

    /// Whether a kernel thread runs on `cpu` now (for tests).
    pub fn is_taken(&self, cpu: usize) -> bool {
        self.rqs
            .get(cpu)
            .is_some_and(|rq| rq.state.load(Ordering::Acquire) == TAKEN)
    }

    /// Whether some CPU of `allowed` is idle: no thread plays it, or its
    /// thread stopped running user code (lazy) and no kernel thread has
    /// it. A kernel thread woken then runs there, taking no one's place.
    fn idle_cpu<M: TlbMm>(&self, cpus: &[Cpu<M>], allowed: u64) -> bool {
        cpus.iter()
            .zip(self.rqs.iter())
            .enumerate()
            .any(|(id, (cpu, rq))| {
                allowed & (1 << id) != 0
                    && (!cpu.is_bound() || cpu.is_lazy())
                    && rq.state.load(Ordering::Relaxed) == NONE
            })
    }

    /// Start a kernel thread's run on the calling thread: beside the
    /// CPUs' threads if a CPU of `allowed` is idle (it runs there, taking
    /// no one's place), else in place of the user thread of one that runs
    /// user code, if one stops for it in time. The run shares the CPU at
    /// its [`cond_resched`] points, and gives it back when the value
    /// drops. Kernel threads do not nest.
    pub fn kthread_run<'a, M: TlbMm>(&'a self, cpus: &[Cpu<M>], allowed: u64) -> KthreadRun<'a> {
        CURRENT.with(|c| {
            // A nested run would overwrite the lease of the CPU the outer
            // one has, which would then never be given back.
            assert!(c.get().is_none(), "kernel thread runs nest");
            c.set(Some(Kthread {
                rqs: std::ptr::from_ref(self) as usize,
                allowed,
                lease: None,
                not_before: None,
                slice: sched_base_slice(cpus.len()),
            }));
        });
        let run = KthreadRun {
            rqs: self,
            _not_send: std::marker::PhantomData,
        };
        try_take(self, cpus);
        run
    }
}

/// `sysctl_sched_base_slice`: 0.70 ms since 6.15 (0.75 ms before),
/// scaled by `1 + ilog2(CPUs)` with the CPUs counted up to 8
/// (`SCHED_TUNABLESCALING_LOG`, `get_update_sysctl_factor`): how long
/// EEVDF lets a kernel thread run on a CPU before the user thread there
/// has its turn.
pub fn sched_base_slice(nr_cpus: usize) -> Duration {
    let factor = 1 + nr_cpus.clamp(1, 8).ilog2();
    Duration::from_micros(700 * u64::from(factor))
}

/// The calling thread's kernel-thread run, between [`Runqueues::kthread_run`]
/// and the drop of its value: the CPUs it may have, and the one it has.
#[derive(Clone, Copy)]
struct Kthread {
    /// The address of the [`Runqueues`] the run is on, checked by
    /// [`cond_resched`], which another machine's thread could call.
    rqs: usize,
    allowed: u64,
    lease: Option<Lease>,
    /// No CPU is asked for before then: the user thread's turn after a
    /// give-back, or a wait after CPUs that did not answer.
    not_before: Option<Instant>,
    slice: Duration,
}

/// The CPU a kernel thread has, since when, and its own host CPUs, which
/// it runs on again when it gives the CPU back.
#[derive(Clone, Copy)]
struct Lease {
    id: usize,
    since: Instant,
    own: HostCpus,
}

std::thread_local! {
    /// Set while the thread is in a kernel thread's run, so that
    /// [`cond_resched`] deep in its work finds it.
    static CURRENT: std::cell::Cell<Option<Kthread>> = const { std::cell::Cell::new(None) };
}

/// A kernel thread's run ([`Runqueues::kthread_run`]).
pub struct KthreadRun<'a> {
    rqs: &'a Runqueues,
    /// The run belongs to its thread (its state is thread-local).
    _not_send: std::marker::PhantomData<*const ()>,
}

impl KthreadRun<'_> {
    /// The CPU the run has now, if any.
    pub fn cpu(&self) -> Option<usize> {
        CURRENT
            .with(|c| c.get())
            .and_then(|k| k.lease)
            .map(|l| l.id)
    }
}

impl Drop for KthreadRun<'_> {
    fn drop(&mut self) {
        give_back_lease(self.rqs);
        CURRENT.with(|c| c.set(None));
    }
}

/// The calling thread's run on `rqs`, if it is in one.
fn current(rqs: &Runqueues) -> Option<Kthread> {
    CURRENT
        .with(|c| c.get())
        .filter(|k| k.rqs == std::ptr::from_ref(rqs) as usize)
}

/// Take a CPU for the calling thread's run, unless it has one, one of its
/// CPUs is idle, or it waits for a turn (`not_before`); then run where
/// that CPU's thread ran, whose host core its wait frees where the CPUs'
/// threads are pinned one to a core (the kernel thread's own set may hold
/// other CPUs' threads' cores, which the host would leave it on). A run
/// whose CPUs did not answer asks again only a slice later.
fn try_take<M: TlbMm>(rqs: &Runqueues, cpus: &[Cpu<M>]) {
    let Some(k) = current(rqs) else {
        return;
    };
    let now = Instant::now();
    if k.lease.is_some() || k.not_before.is_some_and(|t| now < t) || rqs.idle_cpu(cpus, k.allowed) {
        return;
    }
    let Some(id) = rqs.take_cpu(cpus, k.allowed) else {
        let not_before = Some(Instant::now() + k.slice);
        CURRENT.with(|c| c.set(Some(Kthread { not_before, ..k })));
        return;
    };
    let own = HostCpus::of_this_thread();
    rqs.host_cpus_of(id).apply();
    let lease = Some(Lease {
        id,
        since: Instant::now(),
        own,
    });
    CURRENT.with(|c| {
        c.set(Some(Kthread {
            lease,
            not_before: None,
            ..k
        }))
    });
}

/// Give back the CPU the calling thread's run has, if any.
fn give_back_lease(rqs: &Runqueues) {
    let Some(k) = current(rqs) else {
        return;
    };
    if let Some(l) = k.lease {
        CURRENT.with(|c| c.set(Some(Kthread { lease: None, ..k })));
        l.own.apply();
        rqs.give_back(l.id);
    }
}

/// `cond_resched()`: in a kernel thread's run, a thread that has run a
/// slice on a CPU gives it back, and asks for none for a slice, the user
/// thread's turn (EEVDF shares a CPU so between two runnable tasks): it
/// waits that slice out unless a CPU of its own is idle (the one it gave
/// back does not count: its thread has its turn), where it runs
/// meanwhile. A run without a CPU takes one once none of its CPUs is idle
/// and its turn has come. Nothing for a thread that plays a CPU.
pub fn cond_resched<M: TlbMm>(rqs: &Runqueues, cpus: &[Cpu<M>]) {
    let Some(k) = current(rqs) else {
        return;
    };
    match k.lease {
        Some(l) if l.since.elapsed() >= k.slice => {
            give_back_lease(rqs);
            let turn = Instant::now() + k.slice;
            CURRENT.with(|c| {
                c.set(Some(Kthread {
                    lease: None,
                    not_before: Some(turn),
                    ..k
                }))
            });
            if !rqs.idle_cpu(cpus, k.allowed & !(1 << l.id)) {
                std::thread::sleep(turn.saturating_duration_since(Instant::now()));
                try_take(rqs, cpus);
            }
        }
        Some(_) => {}
        None => try_take(rqs, cpus),
    }
}

/// The host CPUs a thread may run on (its affinity). A kswapd is started
/// by whichever thread first wakes it, and a thread spawned inherits its
/// maker's affinity, so a kswapd started from a CPU's thread pinned to one
/// host CPU would share it with that CPU's work: the kernel binds kswapd
/// to its node's CPUs, never to its waker's, and the model gives it the
/// set of the thread that made the machine. While it has a CPU it runs on
/// that CPU's thread's set instead.
#[derive(Clone, Copy, Default)]
pub(crate) struct HostCpus(Option<libc::cpu_set_t>);

impl HostCpus {
    pub(crate) fn of_this_thread() -> HostCpus {
        // SAFETY: the set is zeroed, then filled by sched_getaffinity for
        // the calling thread (0) within its size.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            let ok = libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set);
            HostCpus((ok == 0).then_some(set))
        }
    }

    /// Put the calling thread on these CPUs (nothing if they were not
    /// known, or cannot be had).
    pub(crate) fn apply(self) {
        if let Some(set) = self.0 {
            // SAFETY: the set was filled by sched_getaffinity; 0 names the
            // calling thread.
            unsafe {
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::sched_base_slice;

    /// The host kernel is the oracle: its scheduler's debug file gives
    /// the base slice it worked out for its online CPUs (in ms), which must
    /// be what [`sched_base_slice`] works out for as many. Skipped where
    /// the file cannot be read (debugfs not mounted, or not root); a host
    /// whose slice was tuned by hand would differ.
    #[test]
    fn sched_base_slice_agrees_with_the_host_kernel() {
        let Ok(text) = std::fs::read_to_string("/sys/kernel/debug/sched/debug") else {
            eprintln!("skipped: the scheduler's debug file cannot be read");
            return;
        };
        let Some(ms) = text
            .lines()
            .find(|l| l.trim_start().starts_with(".sysctl_sched_base_slice"))
            .and_then(|l| l.split(':').nth(1))
            .and_then(|v| v.trim().parse::<f64>().ok())
        else {
            eprintln!("skipped: no base slice in the scheduler's debug file");
            return;
        };
        // SAFETY: sysconf reads a system setting; no pointer is passed.
        let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        assert!(online > 0);
        let host_us = (ms * 1000.0).round() as u128;
        assert_eq!(
            sched_base_slice(online as usize).as_micros(),
            host_us,
            "{online} CPUs"
        );
    }

    /// The scaling's steps: 1, 2, 3 and 4 times 0.70 ms, the last from 8
    /// CPUs on.
    #[test]
    fn the_base_slice_grows_with_the_log_of_the_cpus_up_to_eight() {
        let us = |n| sched_base_slice(n).as_micros();
        assert_eq!([us(1), us(2), us(3), us(4)], [700, 1400, 1400, 2100]);
        assert_eq!([us(8), us(16), us(64)], [2800, 2800, 2800]);
    }
}
