//! The page geometry (arch/x86/include/asm/page_types.h, and
//! include/linux/huge_mm.h's PMD-sized THP): below every layer, since the
//! counters print THPs in these units as well as the allocator and the page
//! tables count in them. [`crate::phys`] re-exports them.

pub const PAGE_SHIFT: u32 = 12;
pub const PAGE_SIZE: u64 = 1 << PAGE_SHIFT;
pub const PAGE_MASK: u64 = !(PAGE_SIZE - 1);
/// Largest buddy order (`MAX_PAGE_ORDER`, 4 MiB blocks).
pub const MAX_PAGE_ORDER: u32 = 10;
/// `HPAGE_PMD_ORDER`: a PMD maps 2 MiB.
pub const HPAGE_PMD_ORDER: u32 = 9;
pub const HPAGE_PMD_NR: u64 = 1 << HPAGE_PMD_ORDER;
pub const HPAGE_PMD_SIZE: u64 = PAGE_SIZE << HPAGE_PMD_ORDER;
