//! The memory-policy types an address space and its VMAs hold
//! (include/linux/mempolicy.h's `struct mempolicy`, and the UAPI's modes
//! and flags): below [`crate::mm`]'s users, so that a VMA can carry its
//! policy. What a policy decides (allocation, `mbind`, `set_mempolicy`)
//! is [`crate::mempolicy`]'s, which re-exports these.

use crate::sync::Arc;

pub const MPOL_DEFAULT: i32 = 0;
pub const MPOL_PREFERRED: i32 = 1;
pub const MPOL_BIND: i32 = 2;
pub const MPOL_INTERLEAVE: i32 = 3;
pub const MPOL_LOCAL: i32 = 4;
pub const MPOL_PREFERRED_MANY: i32 = 5;
pub const MPOL_WEIGHTED_INTERLEAVE: i32 = 6;
pub(crate) const MPOL_MAX: i32 = 7;

pub const MPOL_F_NUMA_BALANCING: i32 = 1 << 13;
pub const MPOL_F_RELATIVE_NODES: i32 = 1 << 14;
pub const MPOL_F_STATIC_NODES: i32 = 1 << 15;
pub(crate) const MPOL_MODE_FLAGS: i32 =
    MPOL_F_STATIC_NODES | MPOL_F_RELATIVE_NODES | MPOL_F_NUMA_BALANCING;

pub const MPOL_MF_STRICT: u32 = 1 << 0;
pub const MPOL_MF_MOVE: u32 = 1 << 1;
pub const MPOL_MF_MOVE_ALL: u32 = 1 << 2;
pub(crate) const MPOL_MF_VALID: u32 = MPOL_MF_STRICT | MPOL_MF_MOVE | MPOL_MF_MOVE_ALL;

/// `struct mempolicy`: a mode and its nodes (a mask of at most 64 nodes,
/// as the model's machines have).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mempolicy {
    pub mode: i32,
    pub flags: i32,
    pub nodes: u64,
}

impl Mempolicy {
    /// Nodes in order, lowest first.
    pub(crate) fn node_list(&self) -> impl Iterator<Item = usize> + '_ {
        (0..64).filter(|n| self.nodes & (1 << n) != 0)
    }

    /// `mpol_misplaced`-style check for `mbind`'s MPOL_MF_MOVE: may a page
    /// stay on `nid` under this policy?
    pub(crate) fn allows(&self, nid: usize) -> bool {
        match self.mode {
            MPOL_BIND | MPOL_INTERLEAVE | MPOL_WEIGHTED_INTERLEAVE | MPOL_PREFERRED_MANY => {
                self.nodes & (1 << nid) != 0
            }
            MPOL_PREFERRED => self.nodes & (1 << nid) != 0,
            _ => true,
        }
    }
}

/// The process's policy (`current->mempolicy`). The kernel's task reads
/// its own without a lock; here the policy belongs to the mm, which every
/// CPU running it shares, so it sits under a mutex, and a flag beside it
/// lets the default policy's faults (every fault of a process that never
/// called set_mempolicy) read no more than that flag: no fault writes the
/// mutex's line that another CPU's fault writes too.
#[derive(Debug, Default)]
pub struct TaskPolicy {
    /// Whether `pol` holds a policy.
    set: crate::sync::AtomicBool,
    pol: crate::sync::Mutex<Option<Arc<Mempolicy>>>,
}

impl TaskPolicy {
    /// The policy, None for the default.
    pub fn get(&self) -> Option<Arc<Mempolicy>> {
        // Relaxed: a fault racing a set_mempolicy may take either policy,
        // as in the kernel; the mutex orders the policy's contents.
        if !self.set.load(crate::sync::Ordering::Relaxed) {
            return None;
        }
        self.pol.lock().clone()
    }

    /// `do_set_mempolicy`: replace it (None: back to the default).
    pub fn set(&self, pol: Option<Arc<Mempolicy>>) {
        let mut held = self.pol.lock();
        self.set
            .store(pol.is_some(), crate::sync::Ordering::Relaxed);
        *held = pol;
    }
}
