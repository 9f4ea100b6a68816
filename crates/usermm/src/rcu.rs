//! RCU callbacks (kernel/rcu/tree.c: `call_rcu`, `rcu_core`,
//! `rcu_barrier`): what is freed after a grace period is freed by the CPU
//! that queued it.
//!
//! The model's grace periods are crossbeam-epoch's ([`crate::sync::epoch`]).
//! A function deferred straight to crossbeam runs on whichever thread next
//! collects the global garbage, and that is most often a CPU that faults,
//! since it pins for every page walk: a fault thread would pay for another
//! CPU's munmap (the VMAs, tree nodes and page tables it unlinked, freed
//! into that CPU's allocator arena, under that arena's lock), a cost no
//! kernel fault has. The kernel invokes callbacks on the CPU that queued
//! them, from `RCU_SOFTIRQ` on its way out of an interrupt. So here a CPU
//! queues its callbacks on its own list ([`RcuData`], `rcu_data`'s
//! `cblist`; [`call_rcu`] finds it through the thread, which
//! [`Rcu::bind`] tells which CPU it plays); at a kernel entry
//! ([`Rcu::rcu_core`]) it hands what it queued to crossbeam as one batch,
//! whose grace period ends with the batch moved to the CPU's done list,
//! and it invokes what is done. A thread that plays no CPU of the machine
//! defers straight to crossbeam.
//!
//! A CPU hands its callbacks on in batches of [`RCU_BATCH`], and all of
//! them when its thread leaves it ([`Rcu::rcu_cpu_leave`]) or at a barrier.
//!
//! Locking: a CPU's lists are under its mutex, which the CPU takes, and so
//! does the thread that ends a batch's grace period (to move it to done)
//! and [`Rcu::barrier_step`]. `nr_next` and `nr_done` count the callbacks
//! on the lists so that a kernel entry with nothing to do reads two words
//! of its own CPU's.
//!
//! What the kernel does differently: its callbacks wait in segments of
//! one list (`RCU_WAIT_TAIL`, `RCU_NEXT_TAIL`) for grace periods that the
//! CPUs' quiescent states end; a batch here waits until crossbeam's epoch
//! has moved on past every pin. An idle CPU's done callbacks wait here
//! until it enters the kernel again, or [`Rcu::barrier_step`] invokes them
//! from the barrier's thread (the kernel's idle CPU keeps its tick while
//! it has callbacks, or has them offloaded to a kthread).

use crate::sync::{epoch, Arc, AtomicBool, AtomicUsize, CachePadded, Mutex, Ordering};

type Callback = Box<dyn FnOnce() + Send>;

std::thread_local! {
    /// The callbacks of the CPU the calling thread plays, if it plays one.
    static THIS_CPU: std::cell::RefCell<Option<Arc<CachePadded<RcuData>>>> =
        const { std::cell::RefCell::new(None) };
}

/// `call_rcu`: run `f` once every reader that may hold what it frees has
/// left (every epoch pin taken before this call is dropped), on the CPU
/// the calling thread plays ([`Rcu::bind`]), or wherever crossbeam runs it
/// if the thread plays none.
pub fn call_rcu(f: impl FnOnce() + Send + 'static) {
    queue(Box::new(f));
}

/// [`call_rcu`] for a function that is not `Send` (it frees what holds
/// raw pointers).
///
/// # Safety
///
/// `f` must be safe to run on another thread than the caller's, as
/// crossbeam's `defer_unchecked` requires.
pub unsafe fn call_rcu_unchecked(f: impl FnOnce() + 'static) {
    struct AssertSend<F>(F);
    // SAFETY: the caller promises that `f` may run on any thread.
    unsafe impl<F> Send for AssertSend<F> {}
    impl<F: FnOnce()> AssertSend<F> {
        // A method, so that the closure below captures the whole wrapper
        // (a closure naming `f.0` would capture the field alone).
        fn call(self) {
            (self.0)()
        }
    }
    let f = AssertSend(f);
    queue(Box::new(move || f.call()));
}

fn queue(f: Callback) {
    THIS_CPU.with(|d| match &*d.borrow() {
        Some(data) => data.queue(f),
        None => epoch::pin().defer(f),
    });
}

/// Callbacks a CPU queues before its kernel entry hands them to a grace
/// period as one batch: the kernel's grace periods last milliseconds, over
/// which a CPU queues many callbacks; a batch per system call would cost
/// each call a deferral of its own.
pub const RCU_BATCH: usize = 16;

#[derive(Default)]
struct CbList {
    /// Queued, waiting to be handed to a grace period.
    next: Vec<Callback>,
    /// Their grace period is over: to invoke.
    done: Vec<Callback>,
    /// An emptied list kept for `next`, so that a batch handed on does not
    /// cost an allocation for the one after.
    spare: Vec<Callback>,
}

/// One CPU's callbacks (`struct rcu_data`).
#[derive(Default)]
pub struct RcuData {
    cbs: Mutex<CbList>,
    /// Callbacks on `next`, and on `done`: what a kernel entry reads first.
    nr_next: AtomicUsize,
    nr_done: AtomicUsize,
    /// The machine is gone: a batch whose grace period ends now is invoked
    /// at once by whoever ends it, as no CPU will come for it (and the
    /// callbacks, which may hold the machine's memory, must not wait in a
    /// list that memory owns).
    offline: AtomicBool,
}

impl RcuData {
    fn queue(&self, f: Callback) {
        self.cbs.lock().next.push(f);
        self.nr_next.fetch_add(1, Ordering::Relaxed);
    }

    /// A batch's grace period is over (run from crossbeam's collection, on
    /// any thread).
    fn push_done(&self, batch: Vec<Callback>) {
        // Relaxed: the mutex orders the lists; `offline` is set under it.
        let mut l = self.cbs.lock();
        if self.offline.load(Ordering::Relaxed) {
            drop(l);
            batch.into_iter().for_each(|f| f());
            return;
        }
        self.nr_done.fetch_add(batch.len(), Ordering::Relaxed);
        l.done.extend(batch);
    }

    /// Take what is done, and what is queued if `all` or a batch is full.
    fn take(&self, all: bool) -> (Vec<Callback>, Vec<Callback>) {
        let mut l = self.cbs.lock();
        let next = if all || l.next.len() >= RCU_BATCH {
            let spare = std::mem::take(&mut l.spare);
            std::mem::replace(&mut l.next, spare)
        } else {
            Vec::new()
        };
        let done = std::mem::take(&mut l.done);
        drop(l);
        self.nr_next.fetch_sub(next.len(), Ordering::Relaxed);
        self.nr_done.fetch_sub(done.len(), Ordering::Relaxed);
        (next, done)
    }

    /// Invoke `done`, and keep its list for a later batch.
    fn invoke(&self, mut done: Vec<Callback>) {
        if done.is_empty() {
            return;
        }
        done.drain(..).for_each(|f| f());
        let mut l = self.cbs.lock();
        if l.spare.capacity() == 0 {
            l.spare = done;
        }
    }
}

/// Hand on what `data` queued (all of it, or a full batch) and invoke
/// what is done.
fn advance(data: &Arc<CachePadded<RcuData>>, all: bool) {
    let (next, done) = data.take(all);
    start_grace_period(data, next);
    data.invoke(done);
}

/// Every CPU's callbacks.
pub struct Rcu {
    cpus: Box<[Arc<CachePadded<RcuData>>]>,
}

/// Hand `next` to a grace period, at whose end it moves to `data`'s done
/// list.
fn start_grace_period(data: &Arc<CachePadded<RcuData>>, next: Vec<Callback>) {
    if next.is_empty() {
        return;
    }
    let data = data.clone();
    let guard = epoch::pin();
    guard.defer(move || data.push_done(next));
    // Into the global queue at once, where any thread's collection finds
    // it: left in this thread's bag, the batch would wait for 63 more
    // before its grace period could end, and what it frees would stay
    // allocated meanwhile.
    guard.flush();
}

impl Rcu {
    /// The lists of `nr_cpus` CPUs.
    pub fn new(nr_cpus: usize) -> Rcu {
        Rcu {
            cpus: (0..nr_cpus).map(|_| Default::default()).collect(),
        }
    }

    /// The calling thread plays `cpu` (None: no CPU of any machine):
    /// its [`call_rcu`]s queue there.
    pub fn bind(&self, cpu: Option<usize>) {
        let data = cpu.and_then(|c| self.cpus.get(c)).cloned();
        THIS_CPU.with(|d| *d.borrow_mut() = data);
    }

    /// `rcu_core` on `cpu`, by the thread playing it, as it enters the
    /// kernel: start a grace period for a full batch of what it queued,
    /// and invoke what is done.
    #[inline]
    pub fn rcu_core(&self, cpu: usize) {
        let Some(data) = self.cpus.get(cpu) else {
            return;
        };
        // Relaxed: a count missed now is seen at a later entry.
        if data.nr_done.load(Ordering::Relaxed) == 0
            && data.nr_next.load(Ordering::Relaxed) < RCU_BATCH
        {
            return;
        }
        advance(data, false);
    }

    /// The thread leaves `cpu`: what it queued starts its grace period
    /// now, however few, and what is done is invoked.
    pub fn rcu_cpu_leave(&self, cpu: usize) {
        if let Some(data) = self.cpus.get(cpu) {
            advance(data, true);
        }
    }

    /// One step of `rcu_barrier`, from any thread: every CPU's queued
    /// callbacks start their grace period, and what is done is invoked
    /// here. Repeated until the grace periods have ended, it has invoked
    /// every callback queued before it began.
    pub fn barrier_step(&self) {
        for data in self.cpus.iter() {
            advance(data, true);
        }
    }

    /// The machine goes: no CPU will run again. Every callback queued goes
    /// to crossbeam to be invoked by whoever collects it, what is done is
    /// invoked now, and a grace period that ends later invokes its batch
    /// at once.
    pub fn offline(&self) {
        for data in self.cpus.iter() {
            let l = {
                let mut l = data.cbs.lock();
                data.offline.store(true, Ordering::Relaxed);
                std::mem::take(&mut *l)
            };
            data.nr_next.store(0, Ordering::Relaxed);
            data.nr_done.store(0, Ordering::Relaxed);
            if !l.next.is_empty() {
                let next = l.next;
                epoch::pin().defer(move || next.into_iter().for_each(|f| f()));
            }
            l.done.into_iter().for_each(|f| f());
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize as StdAtomicUsize;

    fn counter() -> (Arc<StdAtomicUsize>, impl Fn() -> usize) {
        let n = Arc::new(StdAtomicUsize::new(0));
        let m = n.clone();
        (n, move || m.load(Ordering::SeqCst))
    }

    /// A CPU's callbacks run on the thread playing it, at a kernel entry
    /// after their grace period, never on a thread that merely collects.
    #[test]
    fn callbacks_run_on_the_cpu_that_queued_them() {
        let rcu = Arc::new(Rcu::new(2));
        let (ran, count) = counter();
        let on = Arc::new(Mutex::new(None));
        rcu.bind(Some(1));
        for _ in 0..RCU_BATCH {
            let (ran, on) = (ran.clone(), on.clone());
            call_rcu(move || {
                ran.fetch_add(1, Ordering::SeqCst);
                *on.lock() = Some(std::thread::current().id());
            });
        }
        rcu.rcu_core(1);
        // The batch leaves this thread's bag for the global queue; another
        // thread collects it, ending its grace period: the callbacks do not
        // run there.
        epoch::pin().flush();
        let other = rcu.clone();
        std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while other.cpus[1].nr_done.load(Ordering::Relaxed) == 0 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the grace period never ended"
                );
                epoch::pin().flush();
            }
        })
        .join()
        .unwrap();
        assert_eq!(count(), 0, "run by the collecting thread");
        rcu.rcu_core(1);
        assert_eq!(count(), RCU_BATCH);
        assert_eq!(*on.lock(), Some(std::thread::current().id()));
        // Less than a batch waits at a kernel entry, and goes when the
        // thread leaves the CPU.
        call_rcu(|| {});
        rcu.rcu_core(1);
        assert_eq!(rcu.cpus[1].nr_next.load(Ordering::Relaxed), 1);
        rcu.rcu_cpu_leave(1);
        assert_eq!(rcu.cpus[1].nr_next.load(Ordering::Relaxed), 0);
        rcu.bind(None);
    }

    /// A thread that plays no CPU defers straight to crossbeam; a barrier
    /// invokes an idle CPU's callbacks; after `offline`, a batch whose
    /// grace period ends is invoked at once.
    #[test]
    fn barrier_and_offline_leave_nothing_queued() {
        let rcu = Rcu::new(2);
        let (ran, count) = counter();
        let r = ran.clone();
        call_rcu(move || {
            r.fetch_add(1, Ordering::SeqCst);
        });
        assert!(rcu
            .cpus
            .iter()
            .all(|d| d.nr_next.load(Ordering::Relaxed) == 0
                && d.nr_done.load(Ordering::Relaxed) == 0));
        rcu.bind(Some(0));
        let r = ran.clone();
        call_rcu(move || {
            r.fetch_add(1, Ordering::SeqCst);
        });
        rcu.bind(None);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while count() < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "the barrier never ended"
            );
            rcu.barrier_step();
            epoch::pin().flush();
        }
        rcu.bind(Some(1));
        let r = ran.clone();
        call_rcu(move || {
            r.fetch_add(1, Ordering::SeqCst);
        });
        rcu.bind(None);
        rcu.rcu_core(1);
        rcu.offline();
        while count() < 3 {
            assert!(
                std::time::Instant::now() < deadline,
                "offline left a callback"
            );
            epoch::pin().flush();
        }
        assert!(rcu
            .cpus
            .iter()
            .all(|d| d.nr_next.load(Ordering::Relaxed) == 0
                && d.nr_done.load(Ordering::Relaxed) == 0));
    }
}
