//! Layer 1: physical memory.
//!
//! NUMA nodes, each an [`arena::Arena`] of 4 KiB frames that hold real bytes,
//! a memmap of page descriptors ([`memmap::Page`]), folios of order 0..=9
//! ([`folio`]) and a buddy allocator per node with per-CPU page lists and
//! watermarks ([`page_alloc`]).
//!
//! A PFN names a frame machine-wide: the node number sits above
//! [`NODE_PFN_SHIFT`], the frame's offset in its node below, so that the node
//! of a PFN is one shift away (the kernel's `pfn_to_nid` with one section per
//! node).

pub mod arena;
pub mod folio;
pub mod luf;
pub mod memmap;
pub mod migrc;
pub mod mm_inline;
pub mod page_alloc;

use serde::{Deserialize, Serialize};

use crate::errno::KResult;
use crate::sync::{AtomicU64, AtomicU8, Ordering};
pub use folio::Folio;
pub use memmap::{pg, Page};
pub use page_alloc::{AllocContext, AllocFlags, Zone};

pub use crate::page_types::*;
/// Bits of a PFN that give the frame's offset inside its node (1 TiB a node).
pub const NODE_PFN_SHIFT: u32 = 28;

pub type Pfn = u64;

/// Memory tiers, as the kernel's memory-tiering code ranks them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Fast DRAM, usually with CPUs.
    Dram,
    /// Slow, CXL-like memory without CPUs.
    Slow,
}

/// How one node is built.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeConfig {
    pub size_bytes: u64,
    pub tier: Tier,
    /// Whether CPUs belong to this node (a CXL node has none).
    pub has_cpus: bool,
}

/// `pg_data_t` with its single zone.
pub struct Node {
    pub id: usize,
    pub tier: Tier,
    pub has_cpus: bool,
    pub nr_pages: u64,
    arena: arena::Arena,
    memmap: Box<[Page]>,
    pub zone: Zone,
    /// The node's LRU lists (`pgdat->__lruvec`).
    pub lruvec: mm_inline::Lruvec,
    /// `kswapd_failures`: kswapd's runs that reclaimed nothing since
    /// reclaim last made progress here. At [`MAX_RECLAIM_RETRIES`] the
    /// node is hopeless and kswapd is no longer woken, until reclaim
    /// makes progress (direct reclaim's, in the model as in the kernel's
    /// `shrink_node`), a free finds the zone back above its high
    /// watermark while a node numbered above it has memory (6.18's
    /// `free_frozen_page_commit`), or demotion is switched on.
    pub kswapd_failures: crate::sync::AtomicU32,
    /// NUMA balancing's promotion rate-limit window for this node
    /// (`nbp_rl_start`, `nbp_rl_nr_cand`).
    pub nbp_rl: PromoteRateLimit,
}

/// A node's promotion rate limit window (`nbp_rl_start`, `nbp_rl_nr_cand`):
/// the time the window began and the candidates counted in it, which
/// [`crate::numa_balancing`] keeps.
#[derive(Default)]
pub struct PromoteRateLimit {
    pub(crate) window: crate::sync::Mutex<(u64, u64)>,
}

/// `MAX_RECLAIM_RETRIES`: reclaim's retries before an allocation gives up,
/// and kswapd's failures before its node is hopeless.
pub const MAX_RECLAIM_RETRIES: u32 = 16;

impl Node {
    /// The node is hopeless (6.18's `atomic_read(&pgdat->kswapd_failures)
    /// >= MAX_RECLAIM_RETRIES`).
    pub fn kswapd_hopeless(&self) -> bool {
        self.kswapd_failures.load(crate::sync::Ordering::Relaxed) >= MAX_RECLAIM_RETRIES
    }

    /// A kswapd run reclaimed nothing.
    pub fn kswapd_failed(&self) {
        self.kswapd_failures
            .fetch_add(1, crate::sync::Ordering::Relaxed);
    }

    /// Reclaim made progress, or the node may have some again: kswapd is
    /// woken again (`atomic_set(&pgdat->kswapd_failures, 0)`).
    pub fn kswapd_clear_hopeless(&self) {
        self.kswapd_failures
            .store(0, crate::sync::Ordering::Relaxed);
    }

    #[inline]
    pub fn start_pfn(&self) -> Pfn {
        (self.id as u64) << NODE_PFN_SHIFT
    }

    #[inline]
    pub fn contains(&self, pfn: Pfn) -> bool {
        pfn >> NODE_PFN_SHIFT == self.id as u64
            && (pfn & ((1 << NODE_PFN_SHIFT) - 1)) < self.nr_pages
    }
}

/// All the machine's physical memory.
pub struct PhysMem {
    pub nodes: Vec<Node>,
    /// The machine's counters; kept here because every layer counts.
    pub vmstat: crate::vmstat::VmStat,
    /// Frames whose freeing waits for an epoch grace period (page tables).
    rcu_pending: crate::sync::AtomicU64,
    /// Each CPU's RCU callbacks ([`crate::rcu`]).
    pub rcu: crate::rcu::Rcu,
    /// The node of each CPU (`cpu_to_node`).
    cpu_node: Box<[usize]>,
    /// Each CPU's folio batches (`cpu_fbatches`), on lines of their own.
    pub cpu_fbatches: Box<[crate::sync::CachePadded<crate::sync::Mutex<mm_inline::CpuFbatches>>]>,
    /// `lru_disable_count`: while above zero, folios go onto the LRU at
    /// once instead of through the batches (`lru_cache_disable`).
    pub lru_disable_count: crate::sync::AtomicU32,
    /// Reclaim, which the allocator's slow path calls on.
    reclaimer: crate::sync::OnceLock<std::sync::Weak<dyn page_alloc::Reclaimer>>,
    /// LUF's generations and batches ([`luf`]).
    pub luf: luf::Luf,
    /// MIGRC's deferred flushes and kept sources (tunable `migrc`).
    pub migrc: migrc::Migrc,
    /// `min_free_kbytes`, the reserve the zones' watermarks share; its
    /// lock serialises setting it with setting the watermarks from it
    /// (`setup_per_zone_wmarks`'s lock).
    min_free_kbytes: crate::sync::Mutex<u64>,
}

impl PhysMem {
    /// The nodes of `configs`, for CPUs on the nodes `cpu_node` gives.
    pub fn new(configs: &[NodeConfig], cpu_node: &[usize]) -> KResult<PhysMem> {
        let nr_cpus = cpu_node.len();
        let mut nodes = Vec::with_capacity(configs.len());
        for (id, c) in configs.iter().enumerate() {
            let nr_pages = c.size_bytes >> PAGE_SHIFT;
            // MachineConfig::validate says why, for people.
            if !(1 << MAX_PAGE_ORDER..1 << NODE_PFN_SHIFT).contains(&nr_pages) {
                return Err(crate::errno::Errno::EINVAL);
            }
            let arena = arena::Arena::new((nr_pages << PAGE_SHIFT) as usize)?;
            let memmap: Box<[Page]> = (0..nr_pages).map(|_| Page::default()).collect();
            let node_cpus = cpu_node.iter().filter(|&&n| n == id).count();
            let zone = Zone::new(nr_cpus, node_cpus);
            nodes.push(Node {
                id,
                tier: c.tier,
                has_cpus: c.has_cpus,
                nr_pages,
                arena,
                memmap,
                zone,
                lruvec: mm_inline::Lruvec::default(),
                kswapd_failures: Default::default(),
                nbp_rl: Default::default(),
            });
        }
        let mem = PhysMem {
            nodes,
            vmstat: crate::vmstat::VmStat::new(nr_cpus),
            rcu_pending: crate::sync::AtomicU64::new(0),
            rcu: crate::rcu::Rcu::new(nr_cpus),
            cpu_node: cpu_node.into(),
            // One more for the kernel threads (kswapd), which play no CPU.
            cpu_fbatches: (0..=nr_cpus).map(|_| Default::default()).collect(),
            lru_disable_count: crate::sync::AtomicU32::new(0),
            reclaimer: crate::sync::OnceLock::new(),
            luf: luf::Luf::new(nr_cpus),
            migrc: Default::default(),
            min_free_kbytes: crate::sync::Mutex::new(0),
        };
        // `init_per_zone_wmark_min`, before any watermark is set.
        mem.calculate_min_free_kbytes();
        for node in &mem.nodes {
            page_alloc::init_free_area(&mem, node);
        }
        Ok(mem)
    }

    #[inline]
    pub fn nid(pfn: Pfn) -> usize {
        (pfn >> NODE_PFN_SHIFT) as usize
    }

    #[inline]
    fn offset(pfn: Pfn) -> usize {
        (pfn & ((1 << NODE_PFN_SHIFT) - 1)) as usize
    }

    #[inline]
    pub fn node(&self, pfn: Pfn) -> &Node {
        &self.nodes[Self::nid(pfn)]
    }

    /// Whether `pfn` names a frame of this machine.
    pub fn pfn_valid(&self, pfn: Pfn) -> bool {
        self.nodes
            .get(Self::nid(pfn))
            .is_some_and(|n| n.contains(pfn))
    }

    /// `pfn_to_page`.
    #[inline]
    pub fn page(&self, pfn: Pfn) -> &Page {
        &self.node(pfn).memmap[Self::offset(pfn)]
    }

    /// The descriptors of `nr` consecutive frames of one node (the pages
    /// of a folio, walked as the kernel walks `page++`).
    #[inline]
    pub fn pages(&self, pfn: Pfn, nr: u64) -> &[Page] {
        let off = Self::offset(pfn);
        &self.node(pfn).memmap[off..off + nr as usize]
    }

    /// The frame's bytes (`page_address`).
    #[inline]
    pub fn frame_ptr(&self, pfn: Pfn) -> *mut u8 {
        let node = self.node(pfn);
        debug_assert!(node.contains(pfn), "pfn {pfn:#x} outside node {}", node.id);
        // SAFETY: the offset is inside the node's arena (checked above in
        // debug builds; PFNs come from the allocator or from page tables that
        // only hold allocator PFNs).
        unsafe { node.arena.base().add(Self::offset(pfn) << PAGE_SHIFT) }
    }

    /// `page_folio`: the folio a page belongs to.
    #[inline]
    pub fn page_folio(&self, pfn: Pfn) -> Folio {
        let head = self
            .page(pfn)
            .compound_head
            .load(crate::sync::Ordering::Relaxed);
        if head & memmap::COMPOUND_TAIL != 0 {
            Folio(head & !memmap::COMPOUND_TAIL)
        } else {
            Folio(pfn)
        }
    }

    /// Back every node's frames with host memory now (before timed runs).
    pub fn prefault(&self) {
        for n in &self.nodes {
            n.arena.prefault();
        }
    }

    /// Fill a frame with zeroes (`clear_page`). The caller owns the frame.
    pub fn clear_page(&self, pfn: Pfn) {
        // SAFETY: the frame is PAGE_SIZE bytes inside the arena and owned by
        // the caller (just allocated, not yet mapped anywhere).
        unsafe { std::ptr::write_bytes(self.frame_ptr(pfn), 0, PAGE_SIZE as usize) }
    }

    /// Whether the frame holds only zeroes (`pages_identical` with the zero
    /// page). The caller keeps every writer out (no PTE maps it writably,
    /// no TLB caches such a translation).
    pub fn page_is_zero(&self, pfn: Pfn) -> bool {
        // SAFETY: the frame is PAGE_SIZE bytes inside the arena, and by the
        // caller's promise nothing writes it while it is read.
        let bytes = unsafe { std::slice::from_raw_parts(self.frame_ptr(pfn), PAGE_SIZE as usize) };
        bytes.iter().all(|&b| b == 0)
    }

    /// Copy one frame to another (`copy_user_highpage`). The destination is
    /// owned by the caller; the source is mapped read-only everywhere (COW).
    pub fn copy_page(&self, dst: Pfn, src: Pfn) {
        debug_assert!(
            self.page_folio(src).ref_count(self) > 0,
            "copying from free frame {src:#x}: the caller must hold a reference"
        );
        // SAFETY: both frames are PAGE_SIZE bytes inside the arena; dst is
        // owned by the caller; src is held by the caller (it cannot be freed
        // and reused meanwhile) and write-protected in every page table and
        // TLB (COW), so no store races with this read.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.frame_ptr(src),
                self.frame_ptr(dst),
                PAGE_SIZE as usize,
            )
        }
    }

    /// Count a frame whose free is deferred past a grace period.
    pub fn rcu_pending_add(&self, n: i64) {
        if n >= 0 {
            self.rcu_pending
                .fetch_add(n as u64, crate::sync::Ordering::AcqRel);
        } else {
            self.rcu_pending
                .fetch_sub((-n) as u64, crate::sync::Ordering::AcqRel);
        }
    }

    /// Frames still waiting for a grace period.
    pub fn rcu_pending(&self) -> u64 {
        self.rcu_pending.load(crate::sync::Ordering::Acquire)
    }

    /// `__folio_batch_release`'s drain: the calling thread's CPU drains its
    /// LRU and mlock batches (nothing on a thread that plays no CPU).
    pub fn lru_add_drain_here(&self) {
        let cpu = crate::sync::this_cpu(self.machine_id());
        if cpu == crate::sync::NO_CPU {
            return;
        }
        if let Some(r) = self.reclaimer.get().and_then(|w| w.upgrade()) {
            r.lru_add_drain(cpu);
        }
    }

    /// Register reclaim (once, by the machine).
    pub fn set_reclaimer(&self, r: std::sync::Weak<dyn page_alloc::Reclaimer>) {
        let _ = self.reclaimer.set(r);
    }

    /// `mod_node_page_state`: a node statistic changes, on the calling
    /// CPU's part of it.
    #[inline]
    pub fn mod_node_state(&self, item: crate::vmstat::NodeStat, delta: i64) {
        let cpu = crate::sync::this_cpu(self.machine_id());
        self.vmstat.mod_node_on(cpu, item, delta);
    }

    /// An identity of this machine's memory, unique while it lives (for
    /// [`crate::sync::this_cpu`]).
    #[inline]
    pub fn machine_id(&self) -> usize {
        self as *const PhysMem as usize
    }

    /// The number of CPUs (`nr_cpu_ids`).
    #[inline]
    pub fn nr_cpus(&self) -> usize {
        self.cpu_node.len()
    }

    /// `cpu_to_node`: the node CPU `cpu` belongs to, where the default
    /// (local) memory policy allocates for it.
    #[inline]
    pub fn cpu_to_node(&self, cpu: usize) -> usize {
        self.cpu_node.get(cpu).copied().unwrap_or(0)
    }

    /// Free pages in the buddy allocator plus those on per-CPU lists.
    pub fn nr_free_pages(&self) -> u64 {
        self.nodes.iter().map(|n| n.zone.nr_free_pages()).sum()
    }

    /// Every frame of every node: `totalram_pages()` (the model reserves
    /// none at boot).
    pub fn nr_pages(&self) -> u64 {
        self.nodes.iter().map(|n| n.nr_pages).sum()
    }
}

/// Copy `dst.len()` bytes of a frame, from `src`: 8-byte relaxed atomic
/// loads between byte loads at the unaligned ends, so that an aligned word
/// another CPU stores concurrently is read whole, as on x86. (Racing
/// atomics of different sizes on one word, an 8-byte load here against a
/// 1-byte store there, are outside Rust's memory model, as they already
/// were between `load_u64` and `store_u8`; on x86 each is one plain move,
/// and the hardware defines the result.)
///
/// # Safety
///
/// `src .. src + dst.len()` lies inside one live frame.
pub unsafe fn copy_from_frame(src: *const u8, dst: &mut [u8]) {
    let n = dst.len();
    let head = (src.align_offset(8)).min(n);
    let words = (n - head) / 8;
    for (i, d) in dst[..head].iter_mut().enumerate() {
        // SAFETY: inside the frame (the caller's promise).
        *d = unsafe { AtomicU8::from_ptr(src.add(i) as *mut u8) }.load(Ordering::Relaxed);
    }
    let out = dst.as_mut_ptr();
    for w in 0..words {
        let at = head + w * 8;
        // SAFETY: inside the frame, 8-aligned (head aligned it); `out + at`
        // has 8 bytes of `dst` (words counts whole words left).
        unsafe {
            let v = AtomicU64::from_ptr(src.add(at) as *mut u64).load(Ordering::Relaxed);
            std::ptr::write_unaligned(out.add(at) as *mut u64, v);
        }
    }
    for (i, d) in dst.iter_mut().enumerate().skip(head + words * 8) {
        // SAFETY: inside the frame.
        *d = unsafe { AtomicU8::from_ptr(src.add(i) as *mut u8) }.load(Ordering::Relaxed);
    }
}

/// Copy `src` into a frame at `dst`, as [`copy_from_frame`] reads.
///
/// # Safety
///
/// `dst .. dst + src.len()` lies inside one live frame.
pub unsafe fn copy_to_frame(src: &[u8], dst: *mut u8) {
    let n = src.len();
    let head = (dst.align_offset(8)).min(n);
    let words = (n - head) / 8;
    for (i, &b) in src[..head].iter().enumerate() {
        // SAFETY: inside the frame (the caller's promise).
        unsafe { AtomicU8::from_ptr(dst.add(i)) }.store(b, Ordering::Relaxed);
    }
    let from = src.as_ptr();
    for w in 0..words {
        let at = head + w * 8;
        // SAFETY: `from + at` has 8 bytes of `src`; the frame's side is
        // inside it and 8-aligned.
        unsafe {
            let v = std::ptr::read_unaligned(from.add(at) as *const u64);
            AtomicU64::from_ptr(dst.add(at) as *mut u64).store(v, Ordering::Relaxed);
        }
    }
    for (i, &b) in src.iter().enumerate().skip(head + words * 8) {
        // SAFETY: inside the frame.
        unsafe { AtomicU8::from_ptr(dst.add(i)) }.store(b, Ordering::Relaxed);
    }
}

impl PhysMem {
    /// Read `buf.len()` bytes of frame `pfn` from byte `off`
    /// (`memcpy_from_folio` for one page). The caller holds the frame (a
    /// reference to its folio); another CPU may store to it meanwhile, as
    /// user stores race with the kernel's reads of a mapped page.
    pub fn read_frame(&self, pfn: Pfn, off: usize, buf: &mut [u8]) {
        assert!(off + buf.len() <= PAGE_SIZE as usize, "read past the frame");
        // SAFETY: `off..off + len` lies inside the frame (asserted), which
        // the caller holds.
        unsafe { copy_from_frame(self.frame_ptr(pfn).add(off), buf) }
    }

    /// Write `buf` into frame `pfn` at byte `off` (`memcpy_to_folio`), as
    /// [`PhysMem::read_frame`] reads.
    pub fn write_frame(&self, pfn: Pfn, off: usize, buf: &[u8]) {
        assert!(
            off + buf.len() <= PAGE_SIZE as usize,
            "write past the frame"
        );
        // SAFETY: as in read_frame.
        unsafe { copy_to_frame(buf, self.frame_ptr(pfn).add(off)) }
    }
}
