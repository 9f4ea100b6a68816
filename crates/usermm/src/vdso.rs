//! The vDSO (arch/x86/entry/vdso/vma.c): the pages exec maps into every
//! x86-64 process, as 6.18 lays them out. One search finds room for all
//! of them below what exec has mapped already: `[vvar]` (the vDSO's data,
//! 4 pages), `[vvar_vclock]` (the clock pages, 2), then `[vdso]`, the
//! code (2 pages: the host's vDSO image is 8 KiB).
//!
//! `[vvar]`'s time and random-state pages are inserted on fault as the
//! kernel's `vvar_fault` inserts their frames (`VM_PFNMAP`: special
//! entries, no reference, no RSS); the model keeps no clock data, so they
//! map the zero page. Its time-namespace page (no namespace), its arch
//! page (x86 keeps no arch data) and `[vvar_vclock]` (as on a host whose
//! vDSO reads the TSC, not a paravirtual clock) are SIGBUS, as there.
//!
//! `[vdso]` maps the image's pages on fault, a page at a time
//! (`vdso_fault`, through `special_mapping_fault`): each mapping takes a
//! reference and a file mapcount and counts in `RssFile`, as
//! `finish_fault` counts any page it maps that is not anonymous. The
//! image is the host's own (its bytes read from this process's vDSO), so
//! a program's loader finds a real ELF there.

use crate::errno::KResult;
use crate::mm::vma::*;
use crate::mm::Mm;
use crate::phys::PAGE_SIZE;
use crate::sync::Arc;

/// `VDSO_NR_PAGES`: the data pages of `[vvar]`.
const VDSO_NR_PAGES: u64 = 4;
/// `VDSO_NR_VCLOCK_PAGES`: the clock pages of `[vvar_vclock]`.
const VDSO_NR_VCLOCK_PAGES: u64 = 2;
/// `vdso_image_64.size`.
const VDSO_IMAGE_SIZE: u64 = crate::machine::VDSO_IMAGE_PAGES * PAGE_SIZE;

pub static VDSO_MAPPING: SpecialMapping = SpecialMapping { name: "[vdso]" };
pub static VVAR_MAPPING: SpecialMapping = SpecialMapping { name: "[vvar]" };
pub static VVAR_VCLOCK_MAPPING: SpecialMapping = SpecialMapping {
    name: "[vvar_vclock]",
};

/// `[vvar]`'s pages (`VDSO_TIME_PAGE_OFFSET` and on).
const VDSO_TIME_PAGE_OFFSET: u64 = 0;
const VDSO_RNG_PAGE_OFFSET: u64 = 2;

/// `vvar_fault` (and `vvar_vclock_fault`, always SIGBUS here): the data
/// page at the fault's offset, as a special entry of the zero page.
pub(crate) fn vvar_fault(vmf: &mut crate::memory::VmFault<'_>) -> crate::memory::VmFaultResult {
    let vvar = vmf
        .vma
        .special()
        .is_some_and(|sm| std::ptr::eq(sm, &VVAR_MAPPING));
    let pgoff = (vmf.address - vmf.vma.start()) / PAGE_SIZE;
    if !vvar || !matches!(pgoff, VDSO_TIME_PAGE_OFFSET | VDSO_RNG_PAGE_OFFSET) {
        return crate::memory::VmFaultResult::Sigbus;
    }
    crate::memory::map_zero_page_special(vmf)
}

/// `map_vdso`: returns the vDSO's code address (`AT_SYSINFO_EHDR`).
pub fn map_vdso(mm: &Arc<Mm>) -> KResult<u64> {
    let data = (VDSO_NR_PAGES + VDSO_NR_VCLOCK_PAGES) * PAGE_SIZE;
    let _g = mm.mmap_lock.write();
    let mut tree = mm.vma_tree_draft();
    let addr = crate::mmap::get_unmapped_area(&tree, mm.mmap_base(), 0, VDSO_IMAGE_SIZE + data, 0)?;
    let text = addr + data;
    let vvar = VM_READ | VM_MAYREAD | VM_IO | VM_DONTDUMP | VM_PFNMAP;
    let pieces: [(u64, u64, VmFlags, &'static SpecialMapping); 3] = [
        (
            text,
            VDSO_IMAGE_SIZE,
            VM_READ | VM_EXEC | VM_MAYREAD | VM_MAYWRITE | VM_MAYEXEC,
            &VDSO_MAPPING,
        ),
        (addr, VDSO_NR_PAGES * PAGE_SIZE, vvar, &VVAR_MAPPING),
        (
            addr + VDSO_NR_PAGES * PAGE_SIZE,
            VDSO_NR_VCLOCK_PAGES * PAGE_SIZE,
            vvar,
            &VVAR_VCLOCK_MAPPING,
        ),
    ];
    for (start, len, flags, sm) in pieces {
        crate::mmap::install_special_mapping(mm, &mut tree, (start, len), flags, sm)?;
    }
    mm.vma_tree_publish(&mut tree, &crate::sync::epoch::pin());
    Ok(text)
}
