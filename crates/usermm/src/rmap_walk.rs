//! The rmap walk of anonymous folios (mm/rmap.c's `rmap_walk_anon` and
//! what `page_vma_mapped_walk` needs of it): every VMA that may map a
//! folio, with its address space, and the address of each of the folio's
//! pages in it. Migration (`try_to_migrate`, `remove_migration_ptes`) and
//! reclaim (`folio_referenced`, `try_to_unmap`) walk with it.
//!
//! The walk holds the anon_vma's lock for reading throughout, so that no
//! VMA it finds can be unlinked, and have its page tables freed, under it;
//! the caller holds a reference to the anon_vma
//! ([`crate::rmap::folio_get_anon_vma`]).

use crate::machine::OnCpu;
use crate::mm::{AnonVma, Mm, Vma};
use crate::phys::{Folio, PhysMem};
use crate::rmap;
use crate::sync::Arc;

/// `rmap_walk_anon`: `f` is called for each VMA chained to `anon_vma`
/// whose range may hold a page of `folio`, with the VMA's mm, the lock
/// held; it returns false to stop the walk.
pub fn rmap_walk_anon(
    oncpu: &OnCpu,
    folio: Folio,
    anon_vma: &AnonVma,
    mut f: impl FnMut(&Arc<Mm>, &Vma) -> bool,
) {
    let mem = oncpu.mem();
    let first = rmap::folio_page_pgoff(mem, folio, folio.pfn());
    let last = first + folio.nr_pages(mem) - 1;
    let g = anon_vma.lock_read();
    for vma in anon_vma.vmas_in_locked(&g, first, last) {
        let Some(mm) = oncpu.m.mm_by_id(vma.mm_id) else {
            continue;
        };
        if !f(&mm, &vma) {
            break;
        }
    }
}

/// The pages of `folio` that `vma` may map: (page number in the folio,
/// address).
pub fn folio_addresses<'a>(
    mem: &'a PhysMem,
    folio: Folio,
    vma: &'a Vma,
) -> impl Iterator<Item = (u64, u64)> + 'a {
    let first = rmap::folio_page_pgoff(mem, folio, folio.pfn());
    (0..folio.nr_pages(mem)).filter_map(move |i| vma.address_of(first + i).map(|a| (i, a)))
}
