//! NUMA memory policies (mm/mempolicy.c): where a fault's folio is
//! allocated. A VMA's policy (`mbind(2)`) comes first, then the process's
//! (`set_mempolicy(2)`; the kernel's is per thread, the model's per
//! address space), then the default: the faulting CPU's node, falling
//! back to the others.
//!
//! | mode | allocation |
//! |---|---|
//! | `MPOL_DEFAULT`, `MPOL_LOCAL` | the CPU's node, then any |
//! | `MPOL_PREFERRED` | its node, then any |
//! | `MPOL_PREFERRED_MANY` | its nodes, then any |
//! | `MPOL_BIND` | its nodes only, the CPU's first if it is one |
//! | `MPOL_INTERLEAVE`, `MPOL_WEIGHTED_INTERLEAVE` | one of its nodes by the page's offset in the VMA (every weight 1), then any |
//!
//! `mbind` with `MPOL_MF_MOVE` (or `_MOVE_ALL`) migrates the pages of the
//! range that the new policy does not allow where they are; with
//! `MPOL_MF_STRICT` a page it could not move fails the call with EIO. A
//! page another process maps too is left where it is under `MPOL_MF_MOVE`,
//! which is no failure (`migrate_folio_add`), and moved under `_MOVE_ALL`.
//! The mode flags `MPOL_F_STATIC_NODES` and `MPOL_F_RELATIVE_NODES` are
//! checked and kept, and change nothing: without cpusets the allowed nodes
//! never change.

use crate::errno::{Errno, KResult};
use crate::machine::OnCpu;
use crate::mm::{Mm, Vma};
use crate::phys::{AllocFlags, Folio, PAGE_SHIFT, PAGE_SIZE};
use crate::sync::Arc;

pub use crate::mm::policy::*;

/// `MAX_NUMNODES` of a kernel built with `NODES_SHIFT` 10.
const MAX_NUMNODES: u64 = 1024;

/// `sanitize_mpol_flags` + `get_nodes` + `mpol_new` + `mpol_set_nodemask`:
/// the policy a system call asks for, None for the default; EINVAL for a
/// bad mode, flag or node set, as the kernel answers.
pub fn mpol_new(
    nr_nodes: usize,
    mode: i32,
    nmask: &[u64],
    maxnode: u64,
) -> KResult<Option<Mempolicy>> {
    let flags = mode & MPOL_MODE_FLAGS;
    let mut mode = mode & !MPOL_MODE_FLAGS;
    if !(0..MPOL_MAX).contains(&mode) {
        return Err(Errno::EINVAL);
    }
    if flags & MPOL_F_STATIC_NODES != 0 && flags & MPOL_F_RELATIVE_NODES != 0 {
        return Err(Errno::EINVAL);
    }
    if flags & MPOL_F_NUMA_BALANCING != 0 && mode != MPOL_BIND && mode != MPOL_PREFERRED_MANY {
        return Err(Errno::EINVAL);
    }
    let nodes = get_nodes(nmask, maxnode)?;
    if mode == MPOL_DEFAULT {
        return if nodes == 0 {
            Ok(None)
        } else {
            Err(Errno::EINVAL)
        };
    }
    if nodes == 0 {
        // MPOL_PREFERRED with no nodes is MPOL_LOCAL, unless flagged.
        if mode == MPOL_PREFERRED && flags & (MPOL_F_STATIC_NODES | MPOL_F_RELATIVE_NODES) == 0 {
            mode = MPOL_LOCAL;
        } else if mode != MPOL_LOCAL {
            return Err(Errno::EINVAL);
        }
    } else if mode == MPOL_LOCAL {
        return Err(Errno::EINVAL);
    }
    // Only nodes with memory count (`node_states[N_MEMORY]`).
    let with_memory = if nr_nodes >= 64 {
        u64::MAX
    } else {
        (1u64 << nr_nodes) - 1
    };
    let mut nodes = nodes & with_memory;
    if mode != MPOL_LOCAL && nodes == 0 {
        return Err(Errno::EINVAL);
    }
    if mode == MPOL_PREFERRED {
        // One node: the first.
        nodes &= nodes.wrapping_neg();
    }
    Ok(Some(Mempolicy { mode, flags, nodes }))
}

/// `get_nodes`: the first `maxnode - 1` bits of the user's mask (the
/// kernel's off-by-one, kept for compatibility). Bits at or above
/// `MAX_NUMNODES` must be clear; the model's masks hold 64 nodes, so any
/// bit above those is one no node has.
fn get_nodes(nmask: &[u64], maxnode: u64) -> KResult<u64> {
    let maxnode = maxnode.saturating_sub(1);
    if maxnode == 0 || nmask.is_empty() {
        return Ok(0);
    }
    if maxnode > PAGE_SIZE * 8 {
        return Err(Errno::EINVAL);
    }
    let bit = |i: u64| {
        nmask
            .get((i / 64) as usize)
            .is_some_and(|w| w >> (i % 64) & 1 != 0)
    };
    if (MAX_NUMNODES..maxnode).any(bit) {
        return Err(Errno::EINVAL);
    }
    Ok((0..maxnode.min(64))
        .filter(|&i| bit(i))
        .fold(0, |m, i| m | 1 << i))
}

/// `get_vma_policy`: the VMA's, else the process's, else None (default).
pub fn get_vma_policy(mm: &Mm, vma: &Vma) -> Option<Arc<Mempolicy>> {
    vma.policy().cloned().or_else(|| mm.mempolicy.get())
}

/// `vma_policy_mof`: whether NUMA balancing may move the VMA's pages on
/// fault (`MPOL_F_MOF`), which decides whether its scan visits the VMA at
/// all. With no policy of the VMA's nor the process's, the default for
/// the CPU's node (`preferred_node_policy`) has the flag; a policy set by
/// `mbind` or `set_mempolicy` has it only if made with
/// `MPOL_F_NUMA_BALANCING` (`sanitize_mpol_flags` adds it, with
/// `MPOL_F_MORON`, to `MPOL_BIND` and `MPOL_PREFERRED_MANY`).
pub fn vma_policy_mof(mm: &Mm, vma: &Vma) -> bool {
    get_vma_policy(mm, vma).is_none_or(|pol| pol.flags & MPOL_F_NUMA_BALANCING != 0)
}

/// `mpol_misplaced`: the node a NUMA hinting fault on `vma`, taken on a
/// CPU of node `this_nid`, may move its folio to, before the hot and rate
/// checks (`should_numa_migrate_memory`, which the caller makes); None to
/// leave it.
/// * No policy of the VMA's nor the process's: the default for the CPU's
///   node (`preferred_node_policy`) moves the folio to that node.
/// * A policy made without `MPOL_F_NUMA_BALANCING` (no `MPOL_F_MOF`)
///   never moves it: such a VMA is not scanned, but a hinting entry made
///   before the policy was set can still fault.
/// * `MPOL_BIND` or `MPOL_PREFERRED_MANY` with it (`MPOL_F_MORON`): to the
///   CPU's node if the policy's nodes include it, else nowhere.
pub fn mpol_misplaced(mm: &Mm, vma: &Vma, this_nid: usize) -> Option<usize> {
    match get_vma_policy(mm, vma) {
        None => Some(this_nid),
        Some(pol) if pol.flags & MPOL_F_NUMA_BALANCING == 0 => None,
        Some(pol) => (pol.nodes & (1 << this_nid) != 0).then_some(this_nid),
    }
}

/// `vma_alloc_folio`: a folio of `order` for a fault at `addr` of `vma`,
/// placed by its policy.
pub fn vma_alloc_folio(
    oncpu: &OnCpu,
    mm: &Mm,
    vma: &Vma,
    addr: u64,
    order: u32,
    gfp: AllocFlags,
) -> Option<Folio> {
    let mem = oncpu.mem();
    let local = oncpu.cpu.node;
    let Some(pol) = get_vma_policy(mm, vma) else {
        return mem.folio_alloc(local, order, oncpu.id(), gfp);
    };
    match pol.mode {
        MPOL_PREFERRED => {
            let nid = pol.node_list().next().unwrap_or(local);
            mem.folio_alloc(nid, order, oncpu.id(), gfp)
        }
        MPOL_BIND | MPOL_PREFERRED_MANY => {
            // The local node if the policy has it, else its first, then
            // the others of the set; PREFERRED_MANY then falls back to any.
            let first = if pol.nodes & (1 << local) != 0 {
                local
            } else {
                pol.node_list().next().unwrap_or(local)
            };
            let f = mem.folio_alloc_nodemask(first, order, oncpu.id(), gfp, pol.nodes);
            if f.is_none() && pol.mode == MPOL_PREFERRED_MANY {
                return mem.folio_alloc(local, order, oncpu.id(), gfp);
            }
            f
        }
        MPOL_INTERLEAVE | MPOL_WEIGHTED_INTERLEAVE => {
            // interleave_nid: the page's offset in the VMA (in units of the
            // folio) picks one of the nodes.
            let ilx = (vma.pgoff() + ((addr - vma.start()) >> PAGE_SHIFT)) >> order;
            let n = pol.nodes.count_ones() as u64;
            let nid = pol
                .node_list()
                .nth((ilx % n.max(1)) as usize)
                .unwrap_or(local);
            mem.folio_alloc(nid, order, oncpu.id(), gfp)
        }
        _ => mem.folio_alloc(local, order, oncpu.id(), gfp),
    }
}

/// The first node a policy allows, for migrating pages `mbind` moves
/// (`alloc_migration_target_by_mpol`, simplified to one target node).
fn policy_target(pol: &Mempolicy, local: usize) -> usize {
    if pol.nodes & (1 << local) != 0 {
        local
    } else {
        pol.node_list().next().unwrap_or(local)
    }
}

/// `set_mempolicy(2)`: the process's policy.
pub fn kernel_set_mempolicy(oncpu: &OnCpu, mode: i32, nmask: &[u64], maxnode: u64) -> KResult<()> {
    let mm = oncpu.mm()?;
    let pol = mpol_new(oncpu.mem().nodes.len(), mode, nmask, maxnode)?;
    mm.mempolicy.set(pol.map(Arc::new));
    Ok(())
}

/// `mbind(2)`: give `[start, start+len)` the policy, splitting and merging
/// VMAs as mprotect does; with MPOL_MF_MOVE, migrate the range's pages the
/// policy does not allow where they are. EFAULT if a hole lies in the
/// range; EIO with MPOL_MF_STRICT if a page stays misplaced.
pub fn kernel_mbind(
    oncpu: &OnCpu,
    start: u64,
    len: u64,
    mode: i32,
    nmask: &[u64],
    maxnode: u64,
    flags: u32,
) -> KResult<()> {
    let mm = oncpu.mm()?;
    if flags & !MPOL_MF_VALID != 0 {
        return Err(Errno::EINVAL);
    }
    if start & !crate::phys::PAGE_MASK != 0 {
        return Err(Errno::EINVAL);
    }
    let len = len.checked_add(PAGE_SIZE - 1).ok_or(Errno::EINVAL)? & crate::phys::PAGE_MASK;
    let end = start.checked_add(len).ok_or(Errno::EINVAL)?;
    let pol = mpol_new(oncpu.mem().nodes.len(), mode, nmask, maxnode)?;
    if end == start {
        return Ok(());
    }
    crate::mmap::mbind_range(oncpu, &mm, start, end, pol.clone().map(Arc::new))?;
    if flags & (MPOL_MF_MOVE | MPOL_MF_MOVE_ALL) == 0 {
        return Ok(());
    }
    let Some(pol) = pol else {
        return Ok(());
    };
    let target = policy_target(&pol, oncpu.cpu.node) as i32;
    let pages: Vec<u64> = (start..end).step_by(PAGE_SIZE as usize).collect();
    let mut misplaced = Vec::new();
    {
        let mut status = vec![0; pages.len()];
        crate::migrate::kernel_move_pages(oncpu, &pages, None, &mut status, false)?;
        for (&addr, &s) in pages.iter().zip(&status) {
            if s >= 0 && !pol.allows(s as usize) {
                misplaced.push(addr);
            }
        }
    }
    if misplaced.is_empty() {
        return Ok(());
    }
    let nodes = vec![target; misplaced.len()];
    let mut status = vec![0; misplaced.len()];
    let move_all = flags & MPOL_MF_MOVE_ALL != 0;
    let left =
        crate::migrate::kernel_move_pages(oncpu, &misplaced, Some(&nodes), &mut status, move_all)?;
    // A shared page refused under MPOL_MF_MOVE was not to be moved.
    let stuck = left > 0
        || status
            .iter()
            .any(|&s| s < 0 && s != -Errno::EBUSY.0 && s != -Errno::EACCES.0);
    if stuck && flags & MPOL_MF_STRICT != 0 {
        return Err(Errno::EIO);
    }
    Ok(())
}
