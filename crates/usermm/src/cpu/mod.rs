//! Layer 5: CPUs, their TLBs, and TLB shootdowns across threads.
//!
//! A [`Cpu`] is played by one real thread at a time. It runs one address
//! space (its loaded mm), caches translations in a software [`tlb::Tlb`], and
//! has a mailbox for flush requests from other CPUs: the model's IPIs.
//!
//! # The shootdown protocol
//!
//! A CPU is in *user mode* (executing loads and stores through its TLB), in
//! *kernel mode* (running kernel code for a thread of its mm: a fault, a
//! system call), or *lazy* (its thread stopped running: the CPU is idle with
//! the mm still loaded, x86's lazy TLB mode). Its mode word holds the mode
//! and counts changes.
//!
//! A flusher (`flush_tlb_mm_range`, after changing PTEs):
//! 1. bumps `mm.tlb_gen` (SeqCst);
//! 2. for each other CPU in `mm_cpumask`, raises its `missed` flag and then
//!    reads its mode (SeqCst both): a CPU in user or kernel mode is posted
//!    the request; a lazy one only if page tables were freed
//!    (`freed_tables`, x86's `should_flush_tlb`), and then as a count, since
//!    x86's handler, finding the CPU lazy, only switches it to `init_mm`;
//! 3. waits until each CPU it found in user mode has acknowledged the
//!    request *or* changed mode. A CPU in kernel mode takes what was posted
//!    at its next kernel entry or before its next user access, which is all
//!    that waiting for it would guarantee (x86 waits for every CPU it
//!    interrupts; here a thread blocked in the kernel could not answer).
//!
//! A CPU in user mode polls its mailbox before every access, handles the
//! requests (`flush_tlb_func`) and acknowledges with Release, so that its
//! earlier stores happen before the flusher frees the pages. A CPU entering
//! user mode stores its new mode (SeqCst) and then takes its `missed` flag
//! (SeqCst); if a flush raised it, it takes its mailbox and compares its
//! slot's `tlb_gen` with `mm.tlb_gen`, flushing if behind. Either the
//! flusher sees it in user mode and waits for it, or it sees the flag: the
//! two SeqCst store/load pairs cannot both miss (Dekker). A lazy CPU that
//! runs its mm again announces kernel mode (SeqCst, a fence) and then
//! compares generations, as x86's `switch_mm_irqs_off` with `was_lazy`: a
//! flusher that skipped it bumped the generation first. A generation bumped
//! with no flush sent (a batched unmap flush still queued, or owed by
//! MIGRC) makes no running CPU flush by itself: as on x86, a CPU running
//! the mm keeps its entries until a flush reaches it (which is then a full
//! one, its generation being more than one behind), it leaves lazy mode or
//! it switches mm; unless a flush looked at it since its last return to
//! user mode (see [`shootdown`]).
//!
//! The TLB caches paging-structure entries too ([`tlb`]), so that a table
//! freed without a flush that reached a CPU is caught when that CPU walks
//! from it: which is why a flush that freed tables is sent to lazy CPUs.
//!
//! A hardware walk and the TLB fill it makes are one step of an access, so a
//! request is handled either before the walk or after the fill: a fill made
//! from a PTE that was just cleared is removed by the flush that follows.
//!
//! `mm_cpumask` is set before a CPU reads `tlb_gen` when switching to an mm
//! (SeqCst both, a fence between), and read after `tlb_gen` is bumped by a
//! flusher, for the same reason.
//!
//! The steps of the handshake, with their orderings, are in [`shootdown`].
//! Everything shared here (the mode word, the mailbox and its flag, the TLB,
//! the loaded mm, `tlb_gen` and `mm_cpumask`) comes from
//! [`crate::sync::checked`], and the CPU layer needs of an address space only
//! what [`TlbMm`] gives, so that `tests/loom_shootdown.rs` runs this very
//! code (`enter_user`, `poll`, `switch_mm`, `flush_tlb_func`,
//! `flush_tlb_mm_range`) under loom with small stand-in address spaces.

pub mod shootdown;
pub mod tlb;

use std::time::{Duration, Instant};

use crate::mm::Mm;
use crate::phys::Pfn;
use crate::sync::checked::{self, Mutex};
use crate::sync::{spin_until, Arc, AtomicBool, AtomicU64, Ordering};
use crate::vmstat::{Event, VmStat};
use shootdown::{Acks, CpuMode, MailFlag, TargetMode};
use tlb::Tlb;

/// `tlb_single_page_flush_ceiling`: above this many pages, flush everything.
pub const TLB_SINGLE_PAGE_FLUSH_CEILING: u64 = 33;
/// No address space loaded (a PFN no frame has).
const NO_PGD: u64 = u64::MAX;
/// `TLB_FLUSH_ALL`.
pub const TLB_FLUSH_ALL: u64 = u64::MAX;
/// Maximum CPUs (mm_cpumask is one word).
pub const MAX_CPUS: usize = 64;
/// A CPU that neither acknowledges nor leaves user mode for this long is
/// reported: its thread blocked while in user mode.
const SHOOTDOWN_TIMEOUT: Duration = Duration::from_secs(20);

/// What the CPU layer needs of an address space: the tag of its TLB
/// entries, the generation that flushes bump (`context.tlb_gen`), the CPUs
/// that have it loaded (`mm_cpumask`), and the root its walks start from.
pub trait TlbMm: Send + Sync + 'static {
    fn tlb_id(&self) -> u64;
    fn tlb_gen(&self) -> &checked::AtomicU64;
    fn cpumask(&self) -> &checked::AtomicU64;
    fn cr3(&self) -> Pfn;
}

impl TlbMm for Mm {
    #[inline]
    fn tlb_id(&self) -> u64 {
        self.id
    }
    #[inline]
    fn tlb_gen(&self) -> &checked::AtomicU64 {
        &self.tlb_gen
    }
    #[inline]
    fn cpumask(&self) -> &checked::AtomicU64 {
        &self.cpumask
    }
    #[inline]
    fn cr3(&self) -> Pfn {
        self.pgd.cr3()
    }
}

/// `struct flush_tlb_info`, shared by all the CPUs a shootdown targets.
pub struct FlushRequest<M: TlbMm = Mm> {
    /// The address space to flush; None for a batched flush
    /// (`arch_tlbbatch_flush`), which flushes whatever each CPU runs, in
    /// full, if it is behind its generation.
    pub mm: Option<Arc<M>>,
    pub start: u64,
    pub end: u64,
    pub stride_shift: u32,
    pub new_tlb_gen: u64,
    /// Page tables were freed (`flush_tlb_info.freed_tables`): lazy CPUs
    /// are sent the request too, since their paging-structure caches may
    /// still point into the freed tables.
    pub freed_tables: bool,
    /// CPUs that handled the request.
    acks: Acks,
}

pub struct Cpu<M: TlbMm = Mm> {
    pub id: usize,
    pub node: usize,
    mode: CpuMode,
    bound: AtomicBool,
    mail: MailFlag,
    mailbox: Mutex<Vec<Arc<FlushRequest<M>>>>,
    /// Requests sent while the CPU was lazy (tables were freed): x86's
    /// handler then only switches the CPU to `init_mm`, so the model keeps
    /// a count and no request (which would hold its mm), taken when the
    /// CPU leaves lazy mode. Relaxed: a count, ordered by nothing.
    lazy_mail: AtomicU64,
    /// Written only by the thread that plays this CPU (see [`tlb`]).
    pub tlb: Tlb,
    /// The loaded mm and its ASID slot (`cpu_tlbstate.loaded_mm`).
    loaded: Mutex<Option<(Arc<M>, usize)>>,
    /// The loaded mm's PGD ([`NO_PGD`]: none) and ASID slot, for the access path
    /// (CR3, as it were). Only the owning thread writes and reads them, in
    /// `switch_mm` and on every access, so Relaxed suffices and no lock is
    /// taken per access.
    cr3_pgd: AtomicU64,
    cr3_slot: AtomicU64,
    /// The shootdown cost model ([`Cpu::set_ipi_cost`]).
    ipi_cost: IpiCost,
}

/// A cost model for TLB shootdowns, off by default: what an IPI costs on
/// hardware that the model's mailbox does not (the initiator's interrupt
/// send and wait, the target's interrupt entry and exit), in nanoseconds
/// of busy time, so that a run's time can be read with it. Calibrated on
/// the host by `usermm bench migrc --ipi-cost host`. Not part of the
/// shootdown protocol: std atomics, set before the CPUs run.
#[derive(Default)]
struct IpiCost {
    send_ns: std::sync::atomic::AtomicU64,
    recv_ns: std::sync::atomic::AtomicU64,
}

/// Busy for `ns` nanoseconds (the cost model's time; never under loom).
#[inline]
fn busy_ns(ns: u64) {
    #[cfg(not(loom))]
    if ns > 0 {
        let t = Instant::now();
        while (t.elapsed().as_nanos() as u64) < ns {
            std::hint::spin_loop();
        }
    }
    #[cfg(loom)]
    let _ = ns;
}

impl<M: TlbMm> Cpu<M> {
    pub fn new(id: usize, node: usize) -> Cpu<M> {
        Cpu {
            id,
            node,
            mode: CpuMode::new(),
            bound: AtomicBool::new(false),
            mail: MailFlag::default(),
            mailbox: Mutex::new(Vec::new()),
            lazy_mail: AtomicU64::new(0),
            tlb: Tlb::default(),
            loaded: Mutex::new(None),
            cr3_pgd: AtomicU64::new(NO_PGD),
            cr3_slot: AtomicU64::new(0),
            ipi_cost: IpiCost::default(),
        }
    }

    /// The shootdown cost model: each shootdown this CPU sends costs it
    /// `send_ns`, each request it handles `recv_ns` (0, 0: off, the
    /// default).
    pub fn set_ipi_cost(&self, send_ns: u64, recv_ns: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.ipi_cost.send_ns.store(send_ns, Relaxed);
        self.ipi_cost.recv_ns.store(recv_ns, Relaxed);
    }

    /// Model checking only: this CPU returns to user mode with the
    /// handshake's two steps swapped (see `shootdown::CpuMode`).
    #[cfg(loom)]
    pub fn break_return_to_user(&mut self) {
        self.mode.break_return_to_user();
    }

    /// This CPU's bit in an mm_cpumask; none for a CPU beyond the mask's 64
    /// (a kernel thread's, such as kswapd's, which runs no user mm).
    #[inline]
    pub fn bit(&self) -> u64 {
        1u64.checked_shl(self.id as u32).unwrap_or(0)
    }

    /// Claim the CPU for the calling thread; false if another thread has it.
    pub fn try_bind(&self) -> bool {
        self.bound
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    pub fn unbind(&self) {
        self.bound.store(false, Ordering::Release);
    }

    pub fn is_bound(&self) -> bool {
        self.bound.load(Ordering::Relaxed)
    }

    #[inline(always)]
    pub fn in_user(&self) -> bool {
        self.mode.in_user()
    }

    /// Whether this CPU compares its loaded mm's generation on its next
    /// return to user mode (a flush looked at it since the last one).
    pub fn catches_up_on_return(&self) -> bool {
        self.mode.missed_raised()
    }

    pub fn loaded_mm(&self) -> Option<Arc<M>> {
        self.loaded.lock().as_ref().map(|(mm, _)| mm.clone())
    }

    /// The loaded mm, lent to `f` without taking a count (the kernel's
    /// `current->mm` in a fault, which no fault pins: a shared counter
    /// bumped twice per fault is the very cost the fault locks avoid).
    ///
    /// # Safety
    ///
    /// The caller is the thread that plays this CPU, the only one that
    /// switches its mm, and `f` does not switch it: so the `Arc` lent stays
    /// in `loaded`, holding its count, until `f` returns.
    pub unsafe fn with_loaded_mm<R>(&self, f: impl FnOnce(&Arc<M>) -> R) -> Option<R> {
        let mm: *const Arc<M> = self.loaded.lock().as_ref().map(|(mm, _)| mm as *const _)?;
        // SAFETY: by the caller's promise, `loaded` is not written while
        // `f` runs, so the pointer stays valid and the count held.
        Some(f(unsafe { &*mm }))
    }

    /// The loaded mm's PGD and ASID slot, for the access path. Owner only.
    #[inline(always)]
    pub fn loaded_pgd(&self) -> Option<(crate::phys::Pfn, usize)> {
        let pgd = self.cr3_pgd.load(Ordering::Relaxed);
        (pgd != NO_PGD).then(|| (pgd, self.cr3_slot.load(Ordering::Relaxed) as usize))
    }

    /// Whether the CPU is in lazy TLB mode (see [`Cpu::enter_lazy`]).
    #[inline]
    pub fn is_lazy(&self) -> bool {
        self.mode.is_lazy()
    }

    /// Enter user mode (return from the kernel): take what was posted and
    /// catch up with flushes that did not wait for us (only if one did
    /// not).
    pub fn enter_user(&self, vmstat: &VmStat) {
        if self.in_user() {
            return;
        }
        if self.is_lazy() {
            self.leave_lazy(vmstat);
        }
        if !self.mode.return_to_user() {
            return;
        }
        self.handle_flush_requests(vmstat);
        self.catch_up(vmstat);
    }

    /// Compare the loaded mm's generation with its slot's, and flush the
    /// slot if behind (a flush that did not wait for this CPU).
    fn catch_up(&self, vmstat: &VmStat) {
        let loaded = self.loaded.lock();
        if let Some((mm, slot)) = loaded.as_ref() {
            let gen = mm.tlb_gen().load(Ordering::SeqCst);
            let tlb = &self.tlb;
            if tlb.slot_tlb_gen(*slot) < gen {
                tlb.flush_slot(*slot);
                tlb.set_slot_tlb_gen(*slot, gen);
                vmstat.count(self.id, Event::TLB_LAZY_FLUSH, 1);
            }
        }
    }

    /// Enter kernel mode: from user mode (a fault, a system call), taking
    /// what was posted first, as an interrupt taken on the way in; from
    /// kernel mode (the next system call), taking what was posted since,
    /// as interrupts are on between two; from lazy mode, switching back to
    /// the loaded mm ([`Cpu::leave_lazy`]).
    pub fn enter_kernel(&self, vmstat: &VmStat) {
        if self.is_lazy() {
            self.leave_lazy(vmstat);
        } else if self.in_user() {
            self.handle_flush_requests(vmstat);
            self.mode.leave_user();
        } else {
            self.poll(vmstat);
            self.count_lazy_mail(vmstat);
        }
    }

    /// Enter kernel mode to switch to another thread's mm (the scheduler's
    /// `context_switch`): as [`Cpu::enter_kernel`], except that a lazy CPU
    /// does not compare the generations of the mm it kept; the
    /// [`Cpu::switch_mm`] that follows compares those of the mm it loads,
    /// as x86's `switch_mm_irqs_off` does whether it returns to the lazy
    /// mm or goes to another (which flushes nothing of the lazy one).
    pub fn enter_kernel_to_switch(&self, vmstat: &VmStat) {
        if self.is_lazy() {
            self.mode.leave_lazy();
            self.count_lazy_mail(vmstat);
        } else {
            self.enter_kernel(vmstat);
        }
    }

    /// `enter_lazy_tlb`: the thread of the loaded mm stops running here
    /// (it blocks, waits or goes idle) and the CPU keeps the mm loaded.
    /// Flushers then skip the CPU unless they freed page tables, and
    /// never wait for it; it compares generations when it leaves lazy mode.
    pub fn enter_lazy(&self, vmstat: &VmStat) {
        if self.is_lazy() {
            return;
        }
        self.enter_kernel(vmstat);
        // With no mm loaded (x86's `init_mm`) there is nothing to be lazy
        // about: the CPU is in no mm's mask.
        if self.loaded_pgd().is_some() {
            self.mode.enter_lazy();
        }
    }

    /// `switch_mm_irqs_off` back to the mm a lazy CPU kept loaded: what
    /// was posted meanwhile (a flush that freed page tables) is counted,
    /// as x86's handler counts it when, finding the CPU lazy, it switches
    /// to `init_mm`; then the slot is flushed in full if behind its mm, as
    /// the switch back does.
    fn leave_lazy(&self, vmstat: &VmStat) {
        self.mode.leave_lazy();
        self.count_lazy_mail(vmstat);
        self.catch_up(vmstat);
    }

    /// Count the requests sent to this CPU while it was lazy as received.
    /// Also on kernel entries after it left lazy mode: a flusher that saw
    /// it lazy may add its count only after the CPU has left.
    #[inline]
    fn count_lazy_mail(&self, vmstat: &VmStat) {
        if self.lazy_mail.load(Ordering::Relaxed) != 0 {
            let sent = self.lazy_mail.swap(0, Ordering::Relaxed);
            vmstat.count(self.id, Event::NR_TLB_REMOTE_FLUSH_RECEIVED, sent);
        }
    }

    /// Requests sent and not taken yet (for the invariant checker).
    pub fn nr_posted(&self) -> usize {
        self.mailbox.lock().len() + self.lazy_mail.load(Ordering::Relaxed) as usize
    }

    /// Whether a request waits in the mailbox (one relaxed load).
    #[inline(always)]
    pub fn mail_waiting(&self) -> bool {
        self.mail.is_raised()
    }

    /// Poll the mailbox (a cheap load when empty), as an interrupt would be
    /// taken between two instructions.
    #[inline]
    pub fn poll(&self, vmstat: &VmStat) {
        if self.mail.is_raised() {
            self.handle_flush_requests(vmstat);
        }
    }

    /// Empty the mailbox: count each request received, apply it
    /// (`flush_tlb_func`) and acknowledge it.
    fn handle_flush_requests(&self, vmstat: &VmStat) {
        let reqs = {
            let mut mb = self.mailbox.lock();
            self.mail.lower();
            std::mem::take(&mut *mb)
        };
        if reqs.is_empty() {
            return;
        }
        let loaded = self.loaded.lock();
        let recv_ns = self
            .ipi_cost
            .recv_ns
            .load(std::sync::atomic::Ordering::Relaxed);
        for req in reqs {
            busy_ns(recv_ns);
            vmstat.count(self.id, Event::NR_TLB_REMOTE_FLUSH_RECEIVED, 1);
            flush_tlb_func(&self.tlb, &req, loaded.as_ref(), None, vmstat);
            req.acks.ack(self.id);
        }
    }

    /// `smp_send_reschedule`: make the CPU's next access take the slow
    /// path, where, after its mailbox, it looks whether a kernel thread
    /// waits to run on it ([`crate::sched`]). Nothing is posted: the raised
    /// flag finds the mailbox empty. The mailbox lock is taken first, as a
    /// poster takes it, so that a CPU that saw the flag, and then took the
    /// lock to lower it, sees what the caller stored before (the request).
    pub fn send_reschedule(&self) {
        drop(self.mailbox.lock());
        self.mail.raise();
    }

    fn post(&self, req: Arc<FlushRequest<M>>) {
        self.mailbox.lock().push(req);
        self.mail.raise();
    }

    /// `switch_mm_irqs_off`: load `next` (or nothing). Kernel mode only.
    pub fn switch_mm(&self, next: Option<&Arc<M>>) {
        debug_assert!(!self.in_user());
        let mut loaded = self.loaded.lock();
        self.cr3_pgd.store(NO_PGD, Ordering::Relaxed);
        if let Some((prev, _)) = loaded.take() {
            prev.cpumask().fetch_and(!(1 << self.id), Ordering::SeqCst);
        }
        if let Some(next) = next {
            // SeqCst: the cpumask bit is visible before we read tlb_gen.
            next.cpumask().fetch_or(1 << self.id, Ordering::SeqCst);
            checked::fence(Ordering::SeqCst);
            let gen = next.tlb_gen().load(Ordering::SeqCst);
            let tlb = &self.tlb;
            let (slot, _new) = tlb.assign_slot(next.tlb_id(), gen);
            if tlb.slot_tlb_gen(slot) < gen {
                tlb.flush_slot(slot);
            }
            tlb.set_slot_tlb_gen(slot, gen);
            *loaded = Some((next.clone(), slot));
            self.cr3_slot.store(slot as u64, Ordering::Relaxed);
            self.cr3_pgd.store(next.cr3(), Ordering::Relaxed);
        }
    }
}

/// `flush_tlb_func`: apply one request to a TLB, on a CPU that runs
/// `loaded` (mm, ASID slot). `local` is the initiating CPU's id when this
/// is the local flush (it counts the local events).
fn flush_tlb_func<M: TlbMm>(
    tlb: &Tlb,
    req: &FlushRequest<M>,
    loaded: Option<&(Arc<M>, usize)>,
    local: Option<usize>,
    vmstat: &VmStat,
) {
    let Some(mm) = &req.mm else {
        // A batched flush: the loaded mm's TLB, in full, unless it is up
        // to date already (its generation was bumped when the work was
        // queued, so a CPU that ran it since has caught up).
        let Some((mm, slot)) = loaded else {
            return;
        };
        let mm_gen = mm.tlb_gen().load(Ordering::Acquire);
        if tlb.slot_tlb_gen(*slot) >= mm_gen {
            return;
        }
        tlb.flush_slot(*slot);
        tlb.set_slot_tlb_gen(*slot, mm_gen);
        if let Some(cpu) = local {
            vmstat.count(cpu, Event::NR_TLB_LOCAL_FLUSH_ALL, 1);
        }
        return;
    };
    // The CPU switched away from the mm since the request was posted
    // (x86 clears its bit of the mm_cpumask here; the model cleared it at
    // the switch): the switch back compares generations.
    let Some(&(_, slot)) = loaded.filter(|(m, _)| m.tlb_id() == mm.tlb_id()) else {
        return;
    };
    let local_gen = tlb.slot_tlb_gen(slot);
    let mm_gen = mm.tlb_gen().load(Ordering::Acquire);
    if local_gen >= req.new_tlb_gen {
        // An earlier full flush already covered this request.
        return;
    }
    if req.end != TLB_FLUSH_ALL && req.new_tlb_gen == local_gen + 1 {
        let mut addr = req.start;
        let mut nr = 0;
        while addr < req.end {
            tlb.flush_one(slot, addr);
            addr += 1 << req.stride_shift;
            nr += 1;
        }
        tlb.set_slot_tlb_gen(slot, req.new_tlb_gen);
        if let Some(cpu) = local {
            vmstat.count(cpu, Event::NR_TLB_LOCAL_FLUSH_ONE, nr);
        }
    } else {
        tlb.flush_slot(slot);
        tlb.set_slot_tlb_gen(slot, mm_gen);
        if let Some(cpu) = local {
            vmstat.count(cpu, Event::NR_TLB_LOCAL_FLUSH_ALL, 1);
        }
    }
}

/// What a flush covers, the caller's part of `struct flush_tlb_info`:
/// `[start, end)` in steps of `1 << stride_shift`, and whether page tables
/// were unhooked too (`freed_tables`), so that lazy CPUs are not skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlushRange {
    pub start: u64,
    pub end: u64,
    pub stride_shift: u32,
    pub freed_tables: bool,
}

impl FlushRange {
    /// Everything (`TLB_FLUSH_ALL`).
    pub fn all(freed_tables: bool) -> Self {
        FlushRange {
            start: 0,
            end: TLB_FLUSH_ALL,
            stride_shift: crate::phys::PAGE_SHIFT,
            freed_tables,
        }
    }
}

/// `flush_tlb_mm_range`: invalidate `range` of `mm` on every CPU that may
/// cache it, and return only when none can use a stale translation. `me`
/// is the calling CPU (in kernel mode).
pub fn flush_tlb_mm_range<M: TlbMm>(
    cpus: &[Cpu<M>],
    me: &Cpu<M>,
    mm: &Arc<M>,
    range: FlushRange,
    vmstat: &VmStat,
) {
    let FlushRange {
        start,
        end,
        stride_shift,
        freed_tables,
    } = range;
    let end =
        if end == TLB_FLUSH_ALL || (end - start) >> stride_shift > TLB_SINGLE_PAGE_FLUSH_CEILING {
            TLB_FLUSH_ALL
        } else {
            end
        };
    // Ordered before the cpumask and mode loads below (pairs with
    // switch_mm, enter_user and leave_lazy).
    let new_tlb_gen = shootdown::next_tlb_gen(mm.tlb_gen());
    let req = Arc::new(FlushRequest {
        mm: Some(mm.clone()),
        start,
        end,
        stride_shift,
        new_tlb_gen,
        freed_tables,
        acks: Acks::default(),
    });

    {
        let loaded = me.loaded.lock();
        if loaded
            .as_ref()
            .is_some_and(|(m, _)| m.tlb_id() == mm.tlb_id())
        {
            flush_tlb_func(&me.tlb, &req, loaded.as_ref(), Some(me.id), vmstat);
        }
    }

    let others = mm.cpumask().load(Ordering::SeqCst) & !me.bit();
    flush_tlb_multi(cpus, me, others, &req, vmstat);
}

std::thread_local! {
    /// A model-only event under which this thread's remote flushes are
    /// counted as well ([`RemoteFlushAccount`]).
    static REMOTE_FLUSH_ACCOUNT: std::cell::Cell<Option<Event>> =
        const { std::cell::Cell::new(None) };
}

/// While held, every shootdown the calling thread sends is also counted
/// under a model-only event, so that an experiment can tell whose flushes
/// they were (the kernel has no such counter; its tracepoint gives a
/// reason, not a caller). Nested accounts restore the outer one as they
/// drop.
pub struct RemoteFlushAccount(Option<Event>);

impl RemoteFlushAccount {
    pub fn enter(event: Event) -> RemoteFlushAccount {
        RemoteFlushAccount(REMOTE_FLUSH_ACCOUNT.with(|a| a.replace(Some(event))))
    }
}

impl Drop for RemoteFlushAccount {
    fn drop(&mut self) {
        REMOTE_FLUSH_ACCOUNT.with(|a| a.set(self.0));
    }
}

/// `native_flush_tlb_multi` with `should_flush_tlb`: send `req` to the
/// CPUs of `others` that are not lazy (to all of them if page tables were
/// freed), and wait until each that was in user mode has handled it or
/// left user mode. x86 waits for every CPU it interrupts; the model's
/// CPUs in kernel or lazy mode take the request before they next use
/// their TLB, which is all the waiting guarantees, and a thread blocked in
/// the kernel could not answer (see the module doc).
fn flush_tlb_multi<M: TlbMm>(
    cpus: &[Cpu<M>],
    me: &Cpu<M>,
    others: u64,
    req: &Arc<FlushRequest<M>>,
    vmstat: &VmStat,
) {
    if others == 0 {
        return;
    }
    vmstat.count(me.id, Event::NR_TLB_REMOTE_FLUSH, 1);
    if let Some(e) = REMOTE_FLUSH_ACCOUNT.with(|a| a.get()) {
        vmstat.count(me.id, e, 1);
    }
    let mut waits = Vec::new();
    let mut sent = 0;
    for cpu in cpus.iter().filter(|c| others & (1 << c.id) != 0) {
        match cpu.mode.needs_request() {
            TargetMode::User(seen) => {
                cpu.post(req.clone());
                waits.push((cpu, seen));
            }
            TargetMode::Kernel => cpu.post(req.clone()),
            TargetMode::Lazy if req.freed_tables => {
                cpu.lazy_mail.fetch_add(1, Ordering::Relaxed);
            }
            TargetMode::Lazy => continue,
        }
        sent += 1;
    }
    if sent > 0 {
        vmstat.count(me.id, Event::TLB_IPI_SENT, sent);
        busy_ns(
            me.ipi_cost
                .send_ns
                .load(std::sync::atomic::Ordering::Relaxed),
        );
    }
    let start = Instant::now();
    let deadline = start + SHOOTDOWN_TIMEOUT;
    let waited = !waits.is_empty();
    for (cpu, seen) in waits {
        spin_until(|| {
            let done = shootdown::target_done(&cpu.mode, seen, &req.acks, cpu.id);
            assert!(
                done || Instant::now() < deadline,
                "CPU {} did not acknowledge a TLB shootdown: its thread blocked while in user mode (call OnCpu::idle first)",
                cpu.id
            );
            done
        });
    }
    if waited {
        // Model-only: the sender's time waiting for the targets, which
        // hardware spends in microseconds and the model, whose targets
        // answer between accesses and may wait for a host core, may spend
        // in many more. Each wait is rounded down to a microsecond.
        vmstat.count(
            me.id,
            Event::TLB_SHOOTDOWN_WAIT_US,
            start.elapsed().as_micros() as u64,
        );
    }
}

/// `arch_tlbbatch_add_pending`: queue a flush of `mm` on `batch`, the
/// CPUs that may cache it. The mm's generation is bumped first (SeqCst,
/// before the cpumask is read, as a range flush does), so that a CPU that
/// runs it again before the batch is flushed catches up by itself.
pub fn arch_tlbbatch_add_pending<M: TlbMm>(batch: &mut u64, mm: &M) {
    shootdown::next_tlb_gen(mm.tlb_gen());
    *batch |= mm.cpumask().load(Ordering::SeqCst);
}

/// `arch_tlbbatch_should_defer`: whether a CPU other than `me` may cache
/// `mm` (flushing locally at once is cheaper than batching otherwise).
pub fn arch_tlbbatch_should_defer<M: TlbMm>(me: &Cpu<M>, mm: &M) -> bool {
    mm.cpumask().load(Ordering::SeqCst) & !me.bit() != 0
}

/// `arch_tlbbatch_flush`: a full flush on every CPU of `batch` that runs
/// an mm behind its generation: one shootdown for all of them (counted
/// once in `nr_tlb_remote_flush`), or only the local flush if the batch
/// holds this CPU alone.
pub fn arch_tlbbatch_flush<M: TlbMm>(cpus: &[Cpu<M>], me: &Cpu<M>, batch: u64, vmstat: &VmStat) {
    let req = Arc::new(FlushRequest {
        mm: None,
        start: 0,
        end: TLB_FLUSH_ALL,
        stride_shift: crate::phys::PAGE_SHIFT,
        new_tlb_gen: 0,
        freed_tables: false,
        acks: Acks::default(),
    });
    if batch & me.bit() != 0 {
        let loaded = me.loaded.lock();
        flush_tlb_func(&me.tlb, &req, loaded.as_ref(), Some(me.id), vmstat);
    }
    flush_tlb_multi(cpus, me, batch & !me.bit(), &req, vmstat);
}

/// `flush_tlb_mm`: everything, with `freed_tables` (as x86's does).
pub fn flush_tlb_mm<M: TlbMm>(cpus: &[Cpu<M>], me: &Cpu<M>, mm: &Arc<M>, vmstat: &VmStat) {
    flush_tlb_mm_range(cpus, me, mm, FlushRange::all(true), vmstat)
}
