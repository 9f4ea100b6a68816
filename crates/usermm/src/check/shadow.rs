//! The shadow-memory checker: every store recorded, every load checked.
//!
//! Stress tests make their user accesses through a [`Shadow`], which performs
//! them on the CPU and keeps, per address space and 8-byte word, the history
//! of what was stored there. Operations that change contents without a store
//! (munmap, MADV_DONTNEED, MAP_FIXED replacement: the word reads as zero
//! afterwards) are recorded as *zaps* over a range, and fork as a copy of the
//! parent's histories into the child's space.
//!
//! # What a load may return
//!
//! Every event (store, zap) has an interval `[t0, t1]` on a global clock:
//! `t0` is taken before it can have any effect, `t1` after it has taken all
//! of it. A load over `[ls, le]` may return the value of any event `E` that
//! had started by `le` (`E.t0 < le`) and was not already overwritten before
//! the load began: no event `F` completed before `ls` started after `E`
//! ended (`E.t1 < F.t0 && F.t1 < ls`). This is linearisability of a register
//! under concurrent writers, with one exception the kernel makes: a store
//! that overlaps a zap of its word may be lost, so it overwrites nothing. A
//! CPU whose TLB still holds the old translation (the zap clears the entry
//! and flushes only when its gather ends) may store into the page the zap
//! is about to free, after another CPU has faulted a new page in and
//! stored there; the later store is gone, the earlier one stays. MADV_DONTNEED
//! under a racing writer allows exactly this. A value outside that set is
//! either a *stale
//! read* (the value of an overwritten event: a TLB that was not flushed, a
//! write lost into a page that was freed or copied too early) or a value that
//! was never stored at all (corruption). Either is reported with the
//! address, the CPU, the interval and the word's history.
//!
//! The clock and the histories are behind one mutex: the checker serialises
//! its bookkeeping, never the accesses themselves, which run unlocked
//! between the two timestamps.
//!
//! Histories are pruned: an event overwritten (in the sense above) by an
//! event that completed before the start of every load still in flight can
//! never again be a legal answer, and is dropped.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use crate::cpu::MAX_CPUS;
use crate::errno::KResult;
use crate::machine::OnCpu;
use crate::sync::{AtomicU64, Mutex, Ordering};

/// Who made an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The word's contents before anything was recorded (zero-filled).
    Initial,
    Store {
        cpu: usize,
    },
    Zap {
        cpu: usize,
    },
    /// Inherited from the parent's space by fork.
    Fork {
        parent_mm: u64,
    },
    /// Moved from another range of the space by mremap.
    Remap {
        cpu: usize,
    },
}

#[derive(Clone, Copy, Debug)]
pub struct ShadowEvent {
    pub t0: u64,
    /// `u64::MAX` while the event is in flight.
    pub t1: u64,
    pub value: u64,
    pub origin: Origin,
}

const IN_FLIGHT: u64 = u64::MAX;

/// A load that returned a value it could not have returned.
#[derive(Clone, Debug)]
pub struct Violation {
    pub mm: u64,
    pub addr: u64,
    pub cpu: usize,
    pub got: u64,
    pub ls: u64,
    pub le: u64,
    /// Whether `got` is the value of an overwritten event still in the
    /// history (a stale read or a lost write); otherwise it was overwritten
    /// long ago (pruned) or never stored.
    pub stale: bool,
    pub history: Vec<ShadowEvent>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.stale {
            "stale read (a newer write was lost or not yet visible)"
        } else {
            "value not in the word's retained history (long overwritten, or never stored)"
        };
        writeln!(
            f,
            "mm {} addr {:#x}: CPU {} loaded {:#x} during [{}, {}]: {kind}",
            self.mm, self.addr, self.cpu, self.got, self.ls, self.le
        )?;
        for e in &self.history {
            let t1 = if e.t1 == IN_FLIGHT {
                "…".to_string()
            } else {
                e.t1.to_string()
            };
            writeln!(f, "    [{}, {t1}] {:#x} {:?}", e.t0, e.value, e.origin)?;
        }
        Ok(())
    }
}

#[derive(Default)]
struct Inner {
    clock: u64,
    /// (mm id) -> word address -> history.
    spaces: HashMap<u64, BTreeMap<u64, Vec<ShadowEvent>>>,
    /// Zaps in progress: (mm, start, end, t0, cpu).
    zaps: Vec<(u64, u64, u64, u64, usize)>,
    /// Moves in progress: (mm, old, new, len).
    remaps: Vec<(u64, u64, u64, u64)>,
    violations: Vec<Violation>,
    loads_checked: u64,
}

/// See the module documentation.
pub struct Shadow {
    inner: Mutex<Inner>,
    /// `ls` of the load each CPU has in flight, or `u64::MAX`.
    load_start: [AtomicU64; MAX_CPUS],
}

impl Default for Shadow {
    fn default() -> Self {
        Shadow {
            inner: Mutex::new(Inner::default()),
            load_start: std::array::from_fn(|_| AtomicU64::new(IN_FLIGHT)),
        }
    }
}

fn initial() -> Vec<ShadowEvent> {
    vec![ShadowEvent {
        t0: 0,
        t1: 0,
        value: 0,
        origin: Origin::Initial,
    }]
}

impl Inner {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The history of a word, created on first use with the zero it starts
    /// with and any zap in progress over it.
    fn word(&mut self, mm: u64, addr: u64) -> &mut Vec<ShadowEvent> {
        let zaps = &self.zaps;
        self.spaces
            .entry(mm)
            .or_default()
            .entry(addr)
            .or_insert_with(|| {
                let mut h = initial();
                for &(_, _, _, t0, cpu) in zaps
                    .iter()
                    .filter(|z| z.0 == mm && z.1 <= addr && addr < z.2)
                {
                    h.push(ShadowEvent {
                        t0,
                        t1: IN_FLIGHT,
                        value: 0,
                        origin: Origin::Zap { cpu },
                    });
                }
                h
            })
    }
}

impl Shadow {
    pub fn new() -> Shadow {
        Shadow::default()
    }

    /// Store `v` at the 8-byte aligned `addr` of the CPU's current mm.
    pub fn store_u64(&self, c: &OnCpu, addr: u64, v: u64) -> KResult<()> {
        debug_assert_eq!(addr % 8, 0, "the shadow tracks aligned words");
        let mm = c.mm()?.id;
        let t0 = {
            let mut g = self.inner.lock();
            let t0 = g.tick();
            let h = g.word(mm, addr);
            h.push(ShadowEvent {
                t0,
                t1: IN_FLIGHT,
                value: v,
                origin: Origin::Store { cpu: c.id() },
            });
            // A store into a range being moved may land before its page
            // moves, and show at the new address at once: there it stays in
            // flight for good (it may as well have missed the move).
            let moving: Vec<u64> = g
                .remaps
                .iter()
                .filter(|r| r.0 == mm && r.1 <= addr && addr < r.1 + r.3)
                .map(|r| r.2 + (addr - r.1))
                .collect();
            for to in moving {
                g.word(mm, to).push(ShadowEvent {
                    t0,
                    t1: IN_FLIGHT,
                    value: v,
                    origin: Origin::Remap { cpu: c.id() },
                });
            }
            t0
        };
        let r = c.store_u64(addr, v);
        let mut g = self.inner.lock();
        let t1 = g.tick();
        let min_ls = self.min_load_start(t1);
        let h = g.word(mm, addr);
        // Pruning never drops an event in flight, but may have moved it.
        let i = h
            .iter()
            .rposition(|e| e.t0 == t0)
            .expect("a store in flight is never pruned");
        if r.is_ok() {
            h[i].t1 = t1;
        } else {
            // A failed store (EFAULT) wrote nothing.
            h.remove(i);
        }
        prune(h, min_ls);
        r
    }

    /// Load the 8-byte aligned `addr` and check the value against the history.
    pub fn load_u64(&self, c: &OnCpu, addr: u64) -> KResult<u64> {
        debug_assert_eq!(addr % 8, 0, "the shadow tracks aligned words");
        let mm = c.mm()?.id;
        let ls = {
            let mut g = self.inner.lock();
            let ls = g.tick();
            self.load_start[c.id()].store(ls, Ordering::Relaxed);
            ls
        };
        let r = c.load_u64(addr);
        let mut g = self.inner.lock();
        let le = g.tick();
        self.load_start[c.id()].store(IN_FLIGHT, Ordering::Relaxed);
        let Ok(got) = r else { return r };
        g.loads_checked += 1;
        let h = g.word(mm, addr);
        if let Some(stale) = check_load(h, got, ls, le) {
            let v = Violation {
                mm,
                addr,
                cpu: c.id(),
                got,
                ls,
                le,
                stale,
                history: h.clone(),
            };
            g.violations.push(v);
        }
        r
    }

    /// Run `op` (munmap, MADV_DONTNEED, a MAP_FIXED replacement) which makes
    /// `[start, end)` of `mm` read as zero once it returns.
    pub fn zap<R>(&self, c: &OnCpu, mm: u64, start: u64, end: u64, op: impl FnOnce() -> R) -> R {
        self.zap_inner(c, mm, start, end, op, |_| true)
    }

    /// As [`Shadow::zap`], for an operation that zaps nothing when it fails
    /// (munmap, a MAP_FIXED mmap: both check everything before they unmap):
    /// on error its zap events are taken back, as a failed store's is.
    pub fn zap_if_ok<T>(
        &self,
        c: &OnCpu,
        mm: u64,
        start: u64,
        end: u64,
        op: impl FnOnce() -> KResult<T>,
    ) -> KResult<T> {
        self.zap_inner(c, mm, start, end, op, |r| r.is_ok())
    }

    /// Record the zap while `op` runs; complete it if `zapped` says the
    /// op's result zeroed the range, else take it back.
    fn zap_inner<R>(
        &self,
        c: &OnCpu,
        mm: u64,
        start: u64,
        end: u64,
        op: impl FnOnce() -> R,
        zapped: impl FnOnce(&R) -> bool,
    ) -> R {
        let is_zap = |e: &ShadowEvent, t0| e.t0 == t0 && matches!(e.origin, Origin::Zap { .. });
        let t0 = {
            let mut g = self.inner.lock();
            let t0 = g.tick();
            g.zaps.push((mm, start, end, t0, c.id()));
            if let Some(space) = g.spaces.get_mut(&mm) {
                for h in space.range_mut(start..end).map(|(_, h)| h) {
                    h.push(ShadowEvent {
                        t0,
                        t1: IN_FLIGHT,
                        value: 0,
                        origin: Origin::Zap { cpu: c.id() },
                    });
                }
            }
            t0
        };
        let r = op();
        let done = zapped(&r);
        let mut g = self.inner.lock();
        let t1 = g.tick();
        g.zaps.retain(|z| z.3 != t0);
        let min_ls = self.min_load_start(t1);
        if let Some(space) = g.spaces.get_mut(&mm) {
            for h in space.range_mut(start..end).map(|(_, h)| h) {
                if !done {
                    h.retain(|e| !is_zap(e, t0));
                    continue;
                }
                if let Some(e) = h.iter_mut().find(|e| is_zap(e, t0)) {
                    e.t1 = t1;
                }
                prune(h, min_ls);
            }
        }
        r
    }

    /// Run `op`, a fork of `parent` that returns the child's mm id. The
    /// child's copy is taken at some point while `op` runs: events that
    /// completed before it started are in the child; events that completed
    /// later, or are still in flight, may or may not be (a store that faulted
    /// and waited for the fork lands in the parent only), so in the child they
    /// stay in flight for good: values it may see that overwrite nothing.
    ///
    /// While the fork runs, the parent's histories are kept back to its
    /// start, as for a load in flight on the forking CPU.
    pub fn fork<T>(
        &self,
        c: &OnCpu,
        parent: u64,
        op: impl FnOnce() -> KResult<(T, u64)>,
    ) -> KResult<T> {
        let t0 = {
            let mut g = self.inner.lock();
            let t0 = g.tick();
            self.load_start[c.id()].store(t0, Ordering::Relaxed);
            t0
        };
        let r = op();
        let mut g = self.inner.lock();
        self.load_start[c.id()].store(IN_FLIGHT, Ordering::Relaxed);
        let (t, child) = r?;
        let copy: BTreeMap<u64, Vec<ShadowEvent>> = g
            .spaces
            .get(&parent)
            .map(|space| {
                space
                    .iter()
                    .map(|(&a, h)| {
                        let h = h
                            .iter()
                            .map(|e| ShadowEvent {
                                t1: if e.t1 < t0 { e.t1 } else { IN_FLIGHT },
                                origin: Origin::Fork { parent_mm: parent },
                                ..*e
                            })
                            .collect();
                        (a, h)
                    })
                    .collect()
            })
            .unwrap_or_default();
        g.spaces.insert(child, copy);
        Ok(t)
    }

    /// Run `op`, an mremap of `mm` that moves what `[old, old + len)` holds
    /// to `[new, new + len)` (what was there goes) and leaves the old range
    /// reading as zero or unmapped. The old range must lie in one VMA: a
    /// move of several VMAs leaves the destination's part between them as
    /// it was, which this does not know. While it runs, a word of the new
    /// range may read as what it held, as zero, or as any value its old
    /// word's history holds as the move begins; once it returns, as one of
    /// the latter. A store to the old range while the move runs may land
    /// before its page moves and show at the new address at once, or miss
    /// the move: in the new range it stays in flight for good
    /// ([`Shadow::store_u64`] puts it there). If `op` fails, its events stay
    /// in flight, either outcome allowed.
    pub fn remap(
        &self,
        c: &OnCpu,
        mm: u64,
        old: u64,
        new: u64,
        len: u64,
        op: impl FnOnce() -> KResult<u64>,
    ) -> KResult<u64> {
        let cpu = c.id();
        let ours = |e: &ShadowEvent, t0| {
            e.t0 == t0 && matches!(e.origin, Origin::Zap { .. } | Origin::Remap { .. })
        };
        let t0 = {
            let mut g = self.inner.lock();
            let t0 = g.tick();
            // Words first met while the move runs start with a zero in
            // flight (`Inner::word`).
            g.zaps.push((mm, old, old + len, t0, cpu));
            g.zaps.push((mm, new, new + len, t0, cpu));
            g.remaps.push((mm, old, new, len));
            let space = g.spaces.entry(mm).or_default();
            let mut moved: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
            for (&a, h) in space.range_mut(old..old + len) {
                let mut values: Vec<u64> = h.iter().map(|e| e.value).collect();
                values.sort_unstable();
                values.dedup();
                moved.insert(a - old, values);
                h.push(ShadowEvent {
                    t0,
                    t1: IN_FLIGHT,
                    value: 0,
                    origin: Origin::Zap { cpu },
                });
            }
            let targets: Vec<u64> = space.range(new..new + len).map(|(&a, _)| a - new).collect();
            for off in targets.into_iter().chain(moved.keys().copied()) {
                let values = moved.get(&off).cloned().unwrap_or_else(|| vec![0]);
                let h = space.entry(new + off).or_insert_with(initial);
                if h.iter().any(|e| e.t0 == t0) {
                    continue;
                }
                for value in values {
                    h.push(ShadowEvent {
                        t0,
                        t1: IN_FLIGHT,
                        value,
                        origin: Origin::Remap { cpu },
                    });
                }
            }
            t0
        };
        let r = op();
        let mut g = self.inner.lock();
        let t1 = g.tick();
        g.zaps.retain(|z| z.3 != t0);
        g.remaps.retain(|r| *r != (mm, old, new, len));
        let min_ls = self.min_load_start(t1);
        let space = g.spaces.entry(mm).or_default();
        for start in [old, new] {
            for h in space.range_mut(start..start + len).map(|(_, h)| h) {
                if r.is_ok() {
                    for e in h.iter_mut().filter(|e| ours(e, t0)) {
                        e.t1 = t1;
                    }
                }
                prune(h, min_ls);
            }
        }
        r
    }

    /// Forget a space (its process exited).
    pub fn exit(&self, mm: u64) {
        self.inner.lock().spaces.remove(&mm);
    }

    pub fn violations(&self) -> Vec<Violation> {
        self.inner.lock().violations.clone()
    }

    pub fn loads_checked(&self) -> u64 {
        self.inner.lock().loads_checked
    }

    /// The checker's clock now, to place other events (a driver's log of
    /// operations) on the same time line as the histories.
    pub fn now(&self) -> u64 {
        self.inner.lock().clock
    }

    pub fn nr_violations(&self) -> usize {
        self.inner.lock().violations.len()
    }

    /// Ok, or every violation formatted for a test failure.
    pub fn verdict(&self) -> Result<(), String> {
        let g = self.inner.lock();
        if g.violations.is_empty() {
            return Ok(());
        }
        let mut s = format!("{} shadow-memory violations:\n", g.violations.len());
        for v in g.violations.iter().take(10) {
            s += &v.to_string();
        }
        Err(s)
    }

    fn min_load_start(&self, now: u64) -> u64 {
        self.load_start
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .fold(now, u64::min)
    }
}

/// Is `got` a legal answer for a load over `[ls, le]`? None if so; otherwise
/// Some(stale): whether it is the value of an overwritten event.
fn check_load(h: &[ShadowEvent], got: u64, ls: u64, le: u64) -> Option<bool> {
    // The latest end among events that completed before the load started:
    // anything that ended before the start of such an event is overwritten
    // (unless that event was a store a zap may have lost).
    let overwritten = |e: &ShadowEvent| {
        h.iter()
            .any(|f| f.t1 != IN_FLIGHT && f.t1 < ls && e.t1 < f.t0 && !may_be_lost(h, f))
    };
    let legal = h
        .iter()
        .any(|e| e.value == got && e.t0 < le && !overwritten(e));
    if legal {
        None
    } else {
        Some(h.iter().any(|e| e.value == got))
    }
}

/// A store that overlaps a zap of its word (see the module doc).
fn may_be_lost(h: &[ShadowEvent], f: &ShadowEvent) -> bool {
    matches!(f.origin, Origin::Store { .. })
        && h.iter()
            .any(|z| matches!(z.origin, Origin::Zap { .. }) && z.t0 < f.t1 && f.t0 < z.t1)
}

/// Drop events that no load starting at or after `min_ls` may return.
fn prune(h: &mut Vec<ShadowEvent>, min_ls: u64) {
    if h.len() < 8 {
        return;
    }
    // Among completed events that ended before min_ls, the one that started
    // last overwrites everything that ended before it started.
    let Some(barrier) = h
        .iter()
        .filter(|f| f.t1 != IN_FLIGHT && f.t1 < min_ls && !may_be_lost(h, f))
        .map(|f| f.t0)
        .max()
    else {
        return;
    };
    h.retain(|e| e.t1 >= barrier);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(t0: u64, t1: u64, value: u64) -> ShadowEvent {
        ShadowEvent {
            t0,
            t1,
            value,
            origin: Origin::Store { cpu: 0 },
        }
    }

    #[test]
    fn a_store_beside_a_zap_may_be_lost() {
        let zap = ShadowEvent {
            origin: Origin::Zap { cpu: 0 },
            ..ev(10, 50, 0)
        };
        let h = vec![ev(0, 0, 0), ev(5, 6, 4), zap, ev(20, 21, 7), ev(30, 31, 8)];
        // 8 came after 7, but 8 may have gone into the page the zap freed.
        assert_eq!(check_load(&h, 7, 60, 61), None);
        assert_eq!(check_load(&h, 8, 60, 61), None);
        assert_eq!(check_load(&h, 0, 60, 61), None);
        // A store before the zap began is overwritten as before.
        assert_eq!(check_load(&h, 4, 60, 61), Some(true));
        let mut pruned = h.clone();
        pruned.extend((0..8).map(|i| ev(100 + i, 100 + i, 9)));
        prune(&mut pruned, 200);
        assert!(
            pruned.iter().all(|e| e.value == 9),
            "later stores overwrite all"
        );
    }

    #[test]
    fn sequential_history() {
        let h = vec![ev(0, 0, 0), ev(1, 2, 5), ev(3, 4, 6)];
        assert_eq!(check_load(&h, 6, 5, 6), None);
        assert_eq!(check_load(&h, 5, 5, 6), Some(true), "stale");
        assert_eq!(check_load(&h, 0, 5, 6), Some(true), "stale initial");
        assert_eq!(check_load(&h, 9, 5, 6), Some(false), "never stored");
        // A load overlapping the second store may see either.
        assert_eq!(check_load(&h, 5, 3, 6), None);
        assert_eq!(check_load(&h, 6, 3, 6), None);
    }

    #[test]
    fn concurrent_and_in_flight_events() {
        // Two overlapping stores: either may be last.
        let h = vec![ev(0, 0, 0), ev(1, 10, 5), ev(3, 5, 6)];
        assert_eq!(check_load(&h, 5, 11, 12), None);
        assert_eq!(check_load(&h, 6, 11, 12), None);
        // A store in flight may already be visible, but not one that starts
        // after the load ended.
        let h = vec![ev(0, 0, 0), ev(4, IN_FLIGHT, 7)];
        assert_eq!(check_load(&h, 7, 2, 6), None);
        assert_eq!(check_load(&h, 7, 1, 3), Some(true));
    }

    #[test]
    fn pruning_keeps_what_loads_may_still_return() {
        let mut h = vec![ev(0, 0, 0)];
        for i in 1..20 {
            h.push(ev(2 * i, 2 * i + 1, i));
        }
        prune(&mut h, 30);
        // Events 1..14 end before event 14's start (28) or are event 14.
        assert!(h.iter().all(|e| e.value >= 14), "{h:?}");
        assert_eq!(check_load(&h, 14, 30, 31), None);
        assert_eq!(check_load(&h, 14, 34, 35), Some(true));
        assert_eq!(check_load(&h, 15, 34, 35), Some(true));
        assert_eq!(check_load(&h, 16, 34, 35), None);
        assert_eq!(check_load(&h, 17, 34, 35), None);
    }
}
