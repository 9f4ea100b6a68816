//! Kernel threads on the machine's CPUs: kswapd takes a CPU of its node
//! that runs user code, which stands still (lazy) until kswapd gives it
//! back, and then catches up on the flushes that skipped it meanwhile.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use usermm::check::check_invariants;
use usermm::mempolicy::MPOL_BIND;
use usermm::mmap::*;
use usermm::vmstat::Event;
use usermm::{Errno, Machine, MachineConfig, OnCpu};

mod common;
use common::StopOnDrop;

const RW: u32 = PROT_READ | PROT_WRITE;
const ANON: u32 = MAP_PRIVATE | MAP_ANONYMOUS;
const PAGE: u64 = 4096;

fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

/// Load one word of a page of its own until told to stop, counting the
/// loads: a CPU that runs user code.
fn spin_loads(c: &OnCpu, stop: &AtomicBool, loads: &AtomicU64) {
    c.new_mm().unwrap();
    let a = c.mmap(0, PAGE, RW, ANON).unwrap();
    c.store_u64(a, 7).unwrap();
    while !stop.load(Ordering::Relaxed) {
        assert_eq!(c.load_u64(a).unwrap(), 7);
        loads.fetch_add(1, Ordering::Relaxed);
    }
    c.idle();
}

/// Run `f` while CPU 1 of `m` loads a page of its own throughout (from
/// its first load on), counting into the counter `f` is lent; then stop
/// it.
fn while_cpu1_loads(m: &Machine, f: impl FnOnce(&AtomicU64)) {
    let (stop, loads) = (AtomicBool::new(false), AtomicU64::new(0));
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        s.spawn(|| spin_loads(&m.bind(1).unwrap(), &stop, &loads));
        wait_until("CPU 1 to run", || loads.load(Ordering::Relaxed) > 0);
        f(&loads);
    });
}

/// A kernel thread takes only a CPU that runs user code, among those
/// allowed it; the CPU goes lazy and makes no progress until it is given
/// back; and with kernel threads off the CPUs, none is taken.
#[test]
fn a_taken_cpu_stands_still_until_it_is_given_back() {
    let m = Machine::new(MachineConfig::single_node(64 << 20, 2)).unwrap();
    while_cpu1_loads(&m, |loads| {
        // CPU 0 has no thread: it is not asked, and none is waited for.
        let t = Instant::now();
        assert!(m.sched.take_cpu(&m.cpus, 0b01).is_none());
        assert!(t.elapsed() < Duration::from_secs(1));
        let taken = m
            .sched
            .take_cpu(&m.cpus, 0b11)
            .expect("CPU 1 runs user code");
        assert_eq!(taken, 1);
        assert!(m.sched.is_taken(1));
        assert!(m.cpus[1].is_lazy(), "a taken CPU is lazy");
        // The CPU's loads before it stopped happen before the take.
        let before = loads.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            loads.load(Ordering::Relaxed),
            before,
            "a taken CPU ran user code"
        );
        m.sched.give_back(taken);
        assert!(!m.sched.is_taken(1));
        wait_until("CPU 1 to run again", || {
            loads.load(Ordering::Relaxed) > before
        });
        m.set_kswapd_on_cpus(false);
        assert!(
            m.sched.take_cpu(&m.cpus, 0b11).is_none(),
            "with kernel threads off the CPUs, none is taken"
        );
    });
    check_invariants(&m).unwrap();
}

/// A kernel thread's run takes no CPU while one of its CPUs is idle (it
/// runs there); else it takes one, and at its `cond_resched` points shares
/// it, a slice each, so that the user thread there still runs.
#[test]
fn a_kernel_thread_shares_the_cpu_it_took_slice_by_slice() {
    use usermm::sched::{cond_resched, sched_base_slice};
    let m = Machine::new(MachineConfig::single_node(64 << 20, 2)).unwrap();
    while_cpu1_loads(&m, |loads| {
        // CPU 0 has no thread: idle, so the run takes nothing.
        let run = m.sched.kthread_run(&m.cpus, 0b11);
        assert_eq!(run.cpu(), None, "a CPU is idle");
        drop(run);
        let run = m.sched.kthread_run(&m.cpus, 0b10);
        assert_eq!(run.cpu(), Some(1));
        let before = loads.load(Ordering::Relaxed);
        // Past a slice, the next point gives the CPU back and waits out
        // the user thread's turn (CPU 0, having no thread, is idle but is
        // not one of the run's CPUs), during which CPU 1's thread runs.
        std::thread::sleep(sched_base_slice(2) * 2);
        assert_eq!(loads.load(Ordering::Relaxed), before);
        let (mut turns, mut taken_again) = (0, 0);
        let end = Instant::now() + Duration::from_millis(50);
        while Instant::now() < end {
            let had = run.cpu() == Some(1);
            let at = loads.load(Ordering::Relaxed);
            cond_resched(&m.sched, &m.cpus);
            if had && loads.load(Ordering::Relaxed) > at {
                turns += 1;
            }
            taken_again += usize::from(run.cpu() == Some(1));
            std::thread::sleep(Duration::from_micros(100));
        }
        assert!(turns > 0, "the user thread never had its turn");
        assert!(taken_again > 0, "the run never took the CPU again");
        drop(run);
        assert!(!m.sched.is_taken(1));
    });
    check_invariants(&m).unwrap();
}

/// A CPU given back returns to user mode as a lazy CPU does, comparing
/// generations: a munmap made while it was taken, whose shootdown skipped
/// it, leaves it no stale translation of the page.
#[test]
fn a_cpu_given_back_catches_up_on_the_flushes_that_skipped_it() {
    let m = Machine::new(MachineConfig::single_node(64 << 20, 2)).unwrap();
    let c0 = m.bind(0).unwrap();
    let mm = c0.new_mm().unwrap();
    // Two pages, so that the munmap of one frees no page table (a flush
    // that frees tables reaches lazy CPUs too).
    let a = c0.mmap(0, 2 * PAGE, RW, ANON).unwrap();
    c0.store_u64(a, 7).unwrap();
    c0.store_u64(a + PAGE, 8).unwrap();
    let (stop, unmapped, faulted) = (
        AtomicBool::new(false),
        AtomicBool::new(false),
        AtomicBool::new(false),
    );
    let (loads, stale) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        s.spawn(|| {
            let c1 = m.bind(1).unwrap();
            c1.switch_mm(&mm);
            while !stop.load(Ordering::Relaxed) {
                match c1.load_u64(a) {
                    // The CPU is taken from before the munmap until after
                    // the flag is raised, so a load that sees the flag
                    // after it returned was made after the munmap.
                    Ok(_) if unmapped.load(Ordering::Acquire) => {
                        stale.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(v) => {
                        assert_eq!(v, 7);
                        loads.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(Errno::EFAULT) => {
                        faulted.store(true, Ordering::Release);
                        break;
                    }
                    Err(e) => panic!("load: {e:?}"),
                }
            }
            c1.idle();
        });
        wait_until("CPU 1 to cache the page", || {
            loads.load(Ordering::Relaxed) > 0
        });
        let taken = m
            .sched
            .take_cpu(&m.cpus, 0b10)
            .expect("CPU 1 runs user code");
        let sent = m.vmstat().event(Event::TLB_IPI_SENT);
        c0.munmap(a, PAGE).unwrap();
        assert_eq!(
            m.vmstat().event(Event::TLB_IPI_SENT),
            sent,
            "the munmap's shootdown skipped the lazy CPU"
        );
        unmapped.store(true, Ordering::Release);
        m.sched.give_back(taken);
        wait_until("CPU 1 to fault on the unmapped page", || {
            faulted.load(Ordering::Acquire)
        });
    });
    assert_eq!(stale.load(Ordering::Relaxed), 0, "stale loads");
    c0.idle();
    check_invariants(&m).unwrap();
}

/// kswapd, woken by a CPU that writes more than its node holds, runs on
/// a CPU of that node that runs user code (here the other CPU, which
/// loads a page of its own throughout), and every write survives its
/// demotions; with kernel threads off the CPUs it runs beside them.
#[test]
fn kswapd_runs_in_place_of_a_user_thread_of_its_node() {
    for on_cpus in [true, false] {
        let m = Machine::new(MachineConfig::two_tiers(32 << 20, 256 << 20, 2)).unwrap();
        m.set_demotion_enabled(true);
        m.set_kswapd_on_cpus(on_cpus);
        while_cpu1_loads(&m, |_| {
            let c0 = m.bind(0).unwrap();
            c0.new_mm().unwrap();
            let len = 48 << 20;
            let a = c0.mmap(0, len, RW, ANON).unwrap();
            c0.mbind(a, len, MPOL_BIND, &[1], 64, 0).unwrap();
            for p in (a..a + len).step_by(PAGE as usize) {
                c0.store_u64(p, p).unwrap();
            }
            for p in (a..a + len).step_by(PAGE as usize) {
                assert_eq!(c0.load_u64(p).unwrap(), p, "page {p:#x}");
            }
            // Idle first: kswapd's shootdowns wait for CPUs in user mode.
            c0.idle();
        });
        m.kswapd_quiesce();
        let v = m.vmstat();
        let (runs, on_cpu) = (
            v.event(Event::PAGEOUTRUN),
            v.event(Event::KSWAPD_RUN_ON_CPU),
        );
        assert!(
            v.event(Event::PGDEMOTE_KSWAPD) > 0,
            "kswapd demoted nothing"
        );
        assert!(on_cpu <= runs);
        if on_cpus {
            assert!(on_cpu > 0, "no run of {runs} took a CPU");
        } else {
            assert_eq!(on_cpu, 0, "a run took a CPU with kernel threads off them");
        }
        check_invariants(&m).unwrap();
    }
}
