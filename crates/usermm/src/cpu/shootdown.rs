//! The shootdown handshake, on its own so that it can be model-checked.
//!
//! These are the steps of the protocol the module doc of [`crate::cpu`]
//! describes, with their memory orderings; `Cpu` and `flush_tlb_mm_range`
//! are built from them, and `tests/loom_shootdown.rs` runs those under loom
//! (`RUSTFLAGS="--cfg loom" cargo test --release --test loom_shootdown`),
//! which explores the interleavings and every value the C++ memory model
//! allows a load to return.
//!
//! Two store-then-load pairs make it work (a Dekker handshake): the
//! flusher's raise of the target's `missed` flag before its read of the
//! target's mode, and the target's mode change before its read (and
//! clearing) of `missed`. Either the flusher sees the target in user mode
//! (and posts the request and waits for it), or the target sees the flag
//! (and compares its TLB's generation with the mm's, flushing if behind,
//! before it uses its TLB). Each pair has a SeqCst fence between its store
//! and its load (the kernel's `smp_mb()`): on x86 the locked
//! read-modify-write already is one, and the explicit fence is what the
//! C++ model, and loom, need to order a store before a later load of
//! another location.
//!
//! Only a CPU that some flush looked at since its last return to user
//! mode catches up on the next one: a generation bumped without a flush
//! being sent (the queue of a batched unmap flush, which MIGRC may defer)
//! leaves the CPUs that run the mm with their entries, as on x86, where a
//! CPU compares generations only when a flush reaches it, it leaves lazy
//! mode, or it switches mm. The flag is lowered only there: a target that
//! lowered it while handling its mailbox could then leave user mode before
//! a flusher that raised it earlier reads its mode, and that flusher would
//! skip it (the interleaving `tests/loom_shootdown.rs` finds). A flag
//! raised for a CPU that was sent the request and handled it costs one
//! needless comparison at its next return to user mode, or a full flush if
//! the generation moved again meanwhile, which x86 would not do.
//!
//! Lazy mode is a third mode: a flusher that finds a target lazy sends it
//! nothing unless page tables were freed, and never waits for it; the
//! target, leaving lazy mode, stores its new mode, fences, and then reads
//! the mm's generation ([`CpuMode::leave_lazy`]), the same Dekker pair.

use crate::sync::checked::{fence, AtomicBool, AtomicU64};
use crate::sync::Ordering;

/// The mode bits of [`CpuMode`]'s word; the rest counts changes.
const MODE_MASK: u64 = 3;
const KERNEL: u64 = 0;
const USER: u64 = 1;
/// `cpu_tlbstate_shared.is_lazy`: the CPU runs no thread of its loaded mm
/// (idle, or a kernel thread) and keeps it loaded.
const LAZY: u64 = 2;
/// What one mode change adds to the word.
const STEP: u64 = 4;

/// What a flusher found a target doing ([`CpuMode::needs_request`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetMode {
    /// Running user accesses through its TLB: sent the request and waited
    /// for, with the mode word seen.
    User(u64),
    /// Running kernel code for a thread of the mm (a system call, a
    /// fault): sent the request, which it takes at its next
    /// kernel entry or before its next user access, as an interrupt is
    /// taken once interrupts are on again. Its TLB is not used meanwhile,
    /// so the flusher does not wait.
    Kernel,
    /// Lazy: sent nothing unless page tables were freed; it compares
    /// generations when it leaves lazy mode.
    Lazy,
}

/// A CPU's mode word: the mode in its low bits ([`KERNEL`], [`USER`] or
/// [`LAZY`]) and a count of changes above them. Only the owning CPU writes
/// it.
pub struct CpuMode {
    word: AtomicU64,
    /// Raised by a flusher before it looks at the mode: a flush may not
    /// have waited for this CPU.
    missed: AtomicBool,
    /// Model checking only: do [`CpuMode::return_to_user`]'s two steps in
    /// the wrong order, to show that the checker catches it.
    #[cfg(loom)]
    broken_return: bool,
}

impl Default for CpuMode {
    fn default() -> Self {
        CpuMode {
            word: AtomicU64::new(KERNEL),
            missed: AtomicBool::new(false),
            #[cfg(loom)]
            broken_return: false,
        }
    }
}

impl CpuMode {
    pub fn new() -> Self {
        Self::default()
    }

    /// Model checking only: read the generation before announcing user
    /// mode (the Dekker pair broken), for the loom test that must fail.
    #[cfg(loom)]
    pub fn break_return_to_user(&mut self) {
        self.broken_return = true;
    }

    /// The owner asks (no ordering needed: only it writes the word).
    #[inline]
    fn mode(&self) -> u64 {
        self.word.load(Ordering::Relaxed) & MODE_MASK
    }

    #[inline]
    pub fn in_user(&self) -> bool {
        self.mode() == USER
    }

    #[inline]
    pub fn is_lazy(&self) -> bool {
        self.mode() == LAZY
    }

    /// Owner: move to `mode`. A read-modify-write (SeqCst), so that the
    /// flushers' loads and this store have one order (see the module doc).
    #[inline]
    fn set(&self, mode: u64) {
        let w = self.word.load(Ordering::Relaxed);
        self.word
            .swap(((w & !MODE_MASK) + STEP) | mode, Ordering::SeqCst);
    }

    /// Target, on return to user mode (from kernel mode): announce it,
    /// then take the `missed` flag; if it was raised, the caller takes its
    /// mailbox and compares the loaded mm's generation with its TLB's.
    /// SeqCst on both (see the module doc).
    #[inline]
    pub fn return_to_user(&self) -> bool {
        debug_assert_eq!(self.mode(), KERNEL);
        #[cfg(loom)]
        if self.broken_return {
            let missed = self.missed.swap(false, Ordering::SeqCst);
            self.set(USER);
            return missed;
        }
        self.set(USER);
        fence(Ordering::SeqCst);
        self.missed.swap(false, Ordering::SeqCst)
    }

    /// Whether a flush raised the flag since the CPU last returned to
    /// user mode (for the invariant checker, at rest).
    pub fn missed_raised(&self) -> bool {
        self.missed.load(Ordering::SeqCst)
    }

    /// Target, on leaving user mode (after handling what was posted).
    #[inline]
    pub fn leave_user(&self) {
        if self.in_user() {
            self.set(KERNEL);
        }
    }

    /// Target, from kernel mode: `enter_lazy_tlb`.
    #[inline]
    pub fn enter_lazy(&self) {
        debug_assert_eq!(self.mode(), KERNEL);
        self.set(LAZY);
    }

    /// Target, back from lazy mode to kernel mode (`switch_mm_irqs_off`
    /// with `was_lazy`): announce it, then (the caller) read the loaded
    /// mm's generation. A flusher that bumped it before this store may
    /// have skipped the CPU; one that bumps it after sees the CPU in kernel
    /// mode and posts (SeqCst both, a fence between: the Dekker pair of
    /// [`CpuMode::return_to_user`]).
    #[inline]
    pub fn leave_lazy(&self) {
        debug_assert_eq!(self.mode(), LAZY);
        self.set(KERNEL);
        fence(Ordering::SeqCst);
    }

    /// Flusher, after [`next_tlb_gen`]: raise the target's `missed` flag,
    /// then look at its mode.
    #[inline]
    pub fn needs_request(&self) -> TargetMode {
        // A read-modify-write, as the target's take is: one modification
        // order for both (loom, whose SeqCst stores are weaker than C++'s,
        // lets a plain store here be missed by the target's swap).
        self.missed.swap(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let s = self.word.load(Ordering::SeqCst);
        match s & MODE_MASK {
            USER => TargetMode::User(s),
            LAZY => TargetMode::Lazy,
            _ => TargetMode::Kernel,
        }
    }

    /// Flusher: has the target left the mode it was seen in? Then it
    /// handles what was posted before its next user access (its mailbox
    /// is polled before each), or sees its flag on the way back.
    #[inline]
    pub fn changed_since(&self, seen: u64) -> bool {
        self.word.load(Ordering::SeqCst) != seen
    }
}

/// Flusher: a new generation for the mm (SeqCst: before reading the
/// targets' mode words and `mm_cpumask`).
#[inline]
pub fn next_tlb_gen(mm_tlb_gen: &AtomicU64) -> u64 {
    let gen = mm_tlb_gen.fetch_add(1, Ordering::SeqCst) + 1;
    fence(Ordering::SeqCst);
    gen
}

/// The set of CPUs that handled one request.
pub struct Acks(AtomicU64);

impl Default for Acks {
    fn default() -> Self {
        Acks(AtomicU64::new(0))
    }
}

impl Acks {
    /// Target: Release, so that its accesses through the old translation
    /// happen before the flusher frees what they reached.
    #[inline]
    pub fn ack(&self, cpu: usize) {
        self.0.fetch_or(1 << cpu, Ordering::Release);
    }

    /// Flusher: Acquire, pairing with [`Acks::ack`].
    #[inline]
    pub fn acked(&self, cpu: usize) -> bool {
        self.0.load(Ordering::Acquire) & (1 << cpu) != 0
    }
}

/// Flusher: may it stop waiting for this target?
#[inline]
pub fn target_done(mode: &CpuMode, seen: u64, acks: &Acks, cpu: usize) -> bool {
    acks.acked(cpu) || mode.changed_since(seen)
}

/// The "mail waiting" flag in front of a CPU's mailbox: set (Release) after
/// a request is queued, tested (Relaxed) before every user access, cleared
/// by the target with the mailbox lock held before it empties the queue.
pub struct MailFlag(AtomicBool);

impl Default for MailFlag {
    fn default() -> Self {
        MailFlag(AtomicBool::new(false))
    }
}

impl MailFlag {
    #[inline]
    pub fn raise(&self) {
        self.0.store(true, Ordering::Release);
    }
    /// One relaxed load, before every user access. Relaxed suffices: the
    /// requests are read under the mailbox lock, which the poster held to
    /// queue them before it raised the flag, so a target that saw the flag
    /// takes the lock after the poster released it (coherence: had it
    /// taken it before, its look at the flag would precede the raise).
    #[inline]
    pub fn is_raised(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
    /// With the mailbox lock held: a request queued after this is seen by
    /// the next [`MailFlag::is_raised`].
    #[inline]
    pub fn lower(&self) {
        self.0.store(false, Ordering::Relaxed);
    }
}
