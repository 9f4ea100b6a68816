//! The vDSO's image: the frames every process's `[vdso]` maps (vdso.rs),
//! allocated and filled once, as the machine boots.

use crate::errno::{Errno, KResult};
use crate::phys::{AllocFlags, Pfn, PhysMem, PAGE_SIZE};
use crate::sync::Ordering;

/// `vdso_image_64.size` in pages (the vDSO's code: vdso.rs maps it).
pub const VDSO_IMAGE_PAGES: u64 = 2;
const VDSO_IMAGE_SIZE: u64 = VDSO_IMAGE_PAGES * PAGE_SIZE;

/// The image's frames, filled from the host's vDSO (zero where the host
/// has none or a smaller one), with their offsets in the image as their
/// index; the caller keeps the one reference each.
pub(super) fn alloc_vdso_image(mem: &PhysMem) -> KResult<[Pfn; VDSO_IMAGE_PAGES as usize]> {
    let host = host_vdso_image();
    let mut pages = [0; VDSO_IMAGE_PAGES as usize];
    for (i, p) in pages.iter_mut().enumerate() {
        let flags = AllocFlags {
            zero: true,
            ..Default::default()
        };
        *p = mem.alloc_pages(0, 0, 0, flags).ok_or(Errno::ENOMEM)?;
        mem.page(*p).index.store(i as u64, Ordering::Relaxed);
        let from = (i as u64 * PAGE_SIZE) as usize;
        if let Some(bytes) = host.get(from..(from + PAGE_SIZE as usize).min(host.len())) {
            // SAFETY: the frame was just allocated, PAGE_SIZE bytes long,
            // and `bytes` is at most a page.
            unsafe { crate::phys::copy_to_frame(bytes, mem.frame_ptr(*p)) };
        }
    }
    Ok(pages)
}

/// This process's vDSO image (`AT_SYSINFO_EHDR`), at most the model's
/// image size; empty where there is none.
fn host_vdso_image() -> Vec<u8> {
    // SAFETY: getauxval only reads the auxiliary vector.
    let at = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) } as usize;
    if at == 0 {
        return Vec::new();
    }
    let mut out = vec![0u8; VDSO_IMAGE_SIZE as usize];
    // The host maps as many pages of its image as it has; read no more
    // than /proc/self/maps shows for [vdso].
    let len = std::fs::read_to_string("/proc/self/maps")
        .ok()
        .and_then(|maps| {
            maps.lines().find(|l| l.ends_with("[vdso]")).and_then(|l| {
                let (s, e) = l.split_whitespace().next()?.split_once('-')?;
                let (s, e) = (
                    usize::from_str_radix(s, 16).ok()?,
                    usize::from_str_radix(e, 16).ok()?,
                );
                (s == at).then_some(e - s)
            })
        })
        .unwrap_or(0)
        .min(out.len());
    // SAFETY: [at, at + len) is this process's vDSO mapping, readable
    // (r-x) for as long as the process lives.
    unsafe { std::ptr::copy_nonoverlapping(at as *const u8, out.as_mut_ptr(), len) };
    out.truncate(len);
    out
}
