//! The vDSO (arch/x86/entry/vdso/vma.c): the pages exec maps into every
//! x86-64 process, as 6.18 lays them out. One search finds room for all
//! of them below what exec has mapped already: `[vvar]` (the vDSO's data,
//! 4 pages), `[vvar_vclock]` (the clock pages, 2), then `[vdso]`, the
//! code (2 pages: the host's vDSO image is 8 KiB).
//!
//! `[vdso]` maps the image's pages on fault, a page at a time
//! (`vdso_fault`, through `special_mapping_fault`): each mapping takes a
//! reference and a file mapcount and counts in `RssFile`, as
//! `finish_fault` counts any page it maps that is not anonymous. The
//! image is the host's own (its bytes read from this process's vDSO), so
//! a program's loader finds a real ELF there. The model keeps no data
//! pages: `[vvar]` and `[vvar_vclock]` are there with the kernel's flags,
//! and an access to them is SIGBUS, where the kernel inserts the time and
//! clock pages' frames (`vvar_fault`, `VM_PFNMAP`: no RSS either way).

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
