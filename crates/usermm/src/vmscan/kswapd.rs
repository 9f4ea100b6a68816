//! kswapd (mm/vmscan.c's `kswapd`, `wakeup_kswapd`): one thread a node,
//! started on its first wakeup, that sleeps until the allocator finds the
//! node short of free pages and then balances it. Its state (the wait
//! queue, whether a run is in progress) is the machine's
//! ([`crate::machine::Kswapd`]); the thread and what it runs are here.
//!
//! Each run takes a CPU of its node from the user thread there, a
//! scheduler slice at a time ([`crate::sched`]), or runs beside the CPUs
//! while one of them is idle.

use crate::machine::{KswapdWait, Machine};
use crate::sync::{Arc, AtomicBool, Ordering};
use crate::vmstat::Event;

/// `wakeup_kswapd`: start the node's kswapd if it has not run yet, and
/// wake it, unless it has failed too often (`kswapd_failures`).
pub(crate) fn wakeup_kswapd(m: &Machine, nid: usize, _order: u32) {
    let Some(k) = m.kswapd.get(nid) else {
        return;
    };
    if m.mem.nodes[nid].kswapd_hopeless() {
        // Model-only: the kernel traces nothing here.
        let v = &m.mem.vmstat;
        v.count(v.no_cpu(), Event::KSWAPD_WAKEUP_HOPELESS, 1);
        return;
    }
    if super::pgdat_balanced_on(m, nid) {
        return;
    }
    k.started.call_once(|| {
        if let Some(me) = m.me.get() {
            spawn_kswapd(me.clone(), k.wait.clone(), nid, m.host_cpus);
        }
    });
    if let Ok(mut s) = k.wait.state.lock() {
        s.woken = true;
    }
    k.wait.cond.notify_one();
}

/// Start node `nid`'s kswapd: a thread that sleeps until woken, then runs
/// `balance_pgdat` on the kswapd CPU. It holds the machine only while it
/// runs, and ends when the machine goes.
fn spawn_kswapd(
    m: std::sync::Weak<Machine>,
    wait: Arc<KswapdWait>,
    nid: usize,
    on: crate::sched::HostCpus,
) {
    let spawned = std::thread::Builder::new()
        .name(format!("kswapd{nid}"))
        .spawn(move || {
            on.apply();
            kswapd_main(m, wait, nid)
        });
    debug_assert!(spawned.is_ok(), "kswapd{nid}: {spawned:?}");
}

/// `kswapd`: sleep, wake, balance the node, count the run.
fn kswapd_main(m: std::sync::Weak<Machine>, wait: Arc<KswapdWait>, nid: usize) {
    loop {
        {
            let Ok(mut s) = wait.state.lock() else {
                return;
            };
            while !s.woken && !s.stop {
                s = match wait.cond.wait(s) {
                    Ok(s) => s,
                    Err(_) => return,
                };
            }
            if s.stop {
                return;
            }
        }
        let Some(m) = m.upgrade() else {
            return;
        };
        let k = &m.kswapd[nid];
        // Running before the wakeup is taken, so that a waiter never sees
        // neither (Release: pairs with kswapd_quiesce's Acquire).
        k.running.store(true, Ordering::Release);
        if let Ok(mut s) = wait.state.lock() {
            s.woken = false;
        }
        let oncpu = m.on_kthread_cpu(&k.cpu);
        // A panic in the run must not leave the kswapd marked running.
        struct NotRunning<'a>(&'a AtomicBool);
        impl Drop for NotRunning<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let _not_running = NotRunning(&k.running);
        // On a CPU of its node, or beside them; given back after the run.
        let run = m.sched.kthread_run(&m.cpus, m.kswapd_cpus_allowed(nid));
        if run.cpu().is_some() {
            // Model-only: a run begun in a user thread's place.
            oncpu
                .vmstat()
                .count(oncpu.id(), Event::KSWAPD_RUN_ON_CPU, 1);
        }
        match super::balance_pgdat(&oncpu, nid) {
            Some(0) => {
                m.mem.nodes[nid].kswapd_failed();
                // Model-only (later kernels trace it,
                // `mm_vmscan_kswapd_reclaim_fail`).
                oncpu.vmstat().count(oncpu.id(), Event::KSWAPD_FAILURE, 1);
            }
            Some(_) => m.mem.nodes[nid].kswapd_clear_hopeless(),
            None => {}
        }
    }
}
