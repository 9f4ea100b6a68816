//! Entry formats: the x86-64 bit layout and the kernel's software bits.

use crate::phys::{Pfn, PAGE_SHIFT};

pub const _PAGE_PRESENT: u64 = 1 << 0;
pub const _PAGE_RW: u64 = 1 << 1;
pub const _PAGE_USER: u64 = 1 << 2;
pub const _PAGE_PWT: u64 = 1 << 3;
pub const _PAGE_PCD: u64 = 1 << 4;
pub const _PAGE_ACCESSED: u64 = 1 << 5;
pub const _PAGE_DIRTY: u64 = 1 << 6;
/// Page size (a leaf at PMD or PUD level).
pub const _PAGE_PSE: u64 = 1 << 7;
pub const _PAGE_GLOBAL: u64 = 1 << 8;
/// `_PAGE_SPECIAL` (software bit 1): no struct page behind it to refcount,
/// such as the zero page.
pub const _PAGE_SPECIAL: u64 = 1 << 9;
/// `_PAGE_UFFD_WP` (software bit 2).
pub const _PAGE_UFFD_WP: u64 = 1 << 10;
/// `_PAGE_SOFT_DIRTY` (software bit 3).
pub const _PAGE_SOFT_DIRTY: u64 = 1 << 11;
/// `_PAGE_PROTNONE` shares the global bit: meaningful only when not present.
pub const _PAGE_PROTNONE: u64 = _PAGE_GLOBAL;
pub const _PAGE_NX: u64 = 1 << 63;
pub const PTE_PFN_MASK: u64 = ((1u64 << 52) - 1) & !((1u64 << PAGE_SHIFT) - 1);
/// A huge PMD's page-attribute bit (bit 7, `_PAGE_PAT`, is its page size).
pub const _PAGE_PAT_LARGE: u64 = 1 << 12;
/// A huge PMD's PFN field starts at bit 21 (bit 12 is PAT there).
pub const PMD_PFN_MASK: u64 = ((1u64 << 52) - 1) & !((1u64 << 21) - 1);
/// Flags of an entry that points to a lower table (`_PAGE_TABLE`).
pub const _PAGE_TABLE: u64 = _PAGE_PRESENT | _PAGE_RW | _PAGE_USER | _PAGE_ACCESSED | _PAGE_DIRTY;
/// Bits that `pte_modify` keeps when the protection changes (`_PAGE_CHG_MASK`).
pub const _PAGE_CHG_MASK: u64 = PTE_PFN_MASK
    | _PAGE_PCD
    | _PAGE_PWT
    | _PAGE_SPECIAL
    | _PAGE_ACCESSED
    | _PAGE_DIRTY
    | _PAGE_SOFT_DIRTY
    | _PAGE_UFFD_WP;

/// x86's `pte_flags_need_flush`: whether a TLB entry made from an entry
/// with `old` flags may be wrong for one with `new` flags. The bits the
/// MMU sets itself (present, accessed, dirty) matter only when cleared: a
/// TLB entry without them makes the MMU walk again, not misbehave. Bits of
/// permission, page size and caching matter either way, a permission
/// gained included (x86 flushes for it rather than take a spurious fault).
/// Software bits never do; nor does the accessed bit, with `ignore_access`.
fn flags_need_flush(old: u64, new: u64, ignore_access: bool) -> bool {
    const FLUSH_ON_CLEAR: u64 = _PAGE_DIRTY | _PAGE_PRESENT | _PAGE_ACCESSED;
    const SOFTWARE: u64 = _PAGE_SPECIAL | _PAGE_UFFD_WP | _PAGE_SOFT_DIRTY;
    const FLUSH_ON_CHANGE: u64 = _PAGE_RW
        | _PAGE_USER
        | _PAGE_PWT
        | _PAGE_PCD
        | _PAGE_PSE
        | _PAGE_GLOBAL
        | _PAGE_PAT_LARGE
        | _PAGE_NX;
    let mut diff = (old ^ new) & !SOFTWARE;
    if ignore_access {
        diff &= !_PAGE_ACCESSED;
    }
    diff & old & FLUSH_ON_CLEAR != 0 || diff & FLUSH_ON_CHANGE != 0
}

/// x86's `pte_needs_flush`: whether changing a PTE from `old` to `new`
/// needs the TLBs flushed. An entry the MMU could not use was never cached.
pub fn pte_needs_flush(old: Pte, new: Pte) -> bool {
    if old.0 & _PAGE_PRESENT == 0 {
        return false;
    }
    old.pfn() != new.pfn() || flags_need_flush(old.0 & !PTE_PFN_MASK, new.0 & !PTE_PFN_MASK, true)
}

/// x86's `huge_pmd_needs_flush`: [`pte_needs_flush`] for a huge PMD, whose
/// accessed bit cleared does need a flush.
pub fn huge_pmd_needs_flush(old: Pmd, new: Pmd) -> bool {
    if old.0 & _PAGE_PRESENT == 0 {
        return false;
    }
    old.pfn() != new.pfn() || flags_need_flush(old.0 & !PMD_PFN_MASK, new.0 & !PMD_PFN_MASK, false)
}

/// `pgprot_t`: protection and cache bits of an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Pgprot(pub u64);

impl Pgprot {
    pub const NONE: Pgprot = Pgprot(_PAGE_PROTNONE | _PAGE_ACCESSED);
    pub const READONLY: Pgprot = Pgprot(_PAGE_PRESENT | _PAGE_USER | _PAGE_ACCESSED | _PAGE_NX);
    pub const READONLY_EXEC: Pgprot = Pgprot(_PAGE_PRESENT | _PAGE_USER | _PAGE_ACCESSED);
    pub const SHARED: Pgprot =
        Pgprot(_PAGE_PRESENT | _PAGE_RW | _PAGE_USER | _PAGE_ACCESSED | _PAGE_NX);
    pub const SHARED_EXEC: Pgprot = Pgprot(_PAGE_PRESENT | _PAGE_RW | _PAGE_USER | _PAGE_ACCESSED);
}

/// `pte_t`.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Pte(pub u64);

impl std::fmt::Debug for Pte {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pte({:#x}", self.0)?;
        for (bit, name) in [
            (_PAGE_PRESENT, " P"),
            (_PAGE_RW, " RW"),
            (_PAGE_USER, " U"),
            (_PAGE_ACCESSED, " A"),
            (_PAGE_DIRTY, " D"),
            (_PAGE_PSE, " PSE"),
            (_PAGE_SPECIAL, " SPECIAL"),
            (_PAGE_SOFT_DIRTY, " SD"),
            (_PAGE_UFFD_WP, " UFFD_WP"),
            (_PAGE_NX, " NX"),
        ] {
            if self.0 & bit != 0 {
                f.write_str(name)?;
            }
        }
        if self.0 & (_PAGE_PRESENT | _PAGE_PROTNONE) == _PAGE_PROTNONE {
            f.write_str(" PROTNONE")?;
        }
        write!(f, " pfn={:#x})", self.pfn())
    }
}

impl Pte {
    #[inline]
    pub fn new(pfn: Pfn, prot: Pgprot) -> Pte {
        Pte((pfn << PAGE_SHIFT) & PTE_PFN_MASK | prot.0)
    }
    #[inline]
    pub fn none(self) -> bool {
        self.0 == 0
    }
    /// `pte_present`: present to the kernel, which includes PROT_NONE entries
    /// (not present to the hardware, but mapping a page).
    #[inline]
    pub fn present(self) -> bool {
        self.0 & (_PAGE_PRESENT | _PAGE_PROTNONE) != 0
    }
    #[inline]
    pub fn pfn(self) -> Pfn {
        (self.0 & PTE_PFN_MASK) >> PAGE_SHIFT
    }
    #[inline]
    pub fn uffd_wp(self) -> bool {
        self.0 & _PAGE_UFFD_WP != 0
    }

    pub fn clear_soft_dirty(self) -> Pte {
        Pte(self.0 & !_PAGE_SOFT_DIRTY)
    }
    /// `pte_modify`: keep PFN, A/D and software bits, take the new protection.
    #[inline]
    pub fn modify(self, prot: Pgprot) -> Pte {
        Pte((self.0 & _PAGE_CHG_MASK) | (prot.0 & !_PAGE_CHG_MASK))
    }
    /// `pte_advance_pfn`.
    #[inline]
    pub fn advance_pfn(self, nr: u64) -> Pte {
        Pte(self.0 + (nr << PAGE_SHIFT))
    }
}

/// `pmd_t`: a pointer to a PTE table, or a huge (PSE) leaf.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Pmd(pub u64);

impl Pmd {
    /// `pmd_populate`: point at a PTE table.
    #[inline]
    pub(in crate::pgtable) fn table(pfn: Pfn) -> Pmd {
        Pmd((pfn << PAGE_SHIFT) | _PAGE_TABLE)
    }
    /// `pfn_pmd` + `pmd_mkhuge`.
    #[inline]
    pub fn huge(pfn: Pfn, prot: Pgprot) -> Pmd {
        Pmd(((pfn << PAGE_SHIFT) & PMD_PFN_MASK) | prot.0 | _PAGE_PSE)
    }
    #[inline]
    pub fn none(self) -> bool {
        self.0 == 0
    }
    /// `pmd_present`: to the kernel a huge PMD is present also while
    /// [`Pmd::mkinvalid`] hides it from the MMU (x86 tests `_PAGE_PSE` too).
    #[inline]
    pub fn present(self) -> bool {
        self.0 & (_PAGE_PRESENT | _PAGE_PROTNONE | _PAGE_PSE) != 0
    }
    /// `pmd_trans_huge`: a huge leaf, valid or invalidated for a split.
    #[inline]
    pub fn trans_huge(self) -> bool {
        self.0 & _PAGE_PSE != 0
    }
    /// `pmd_mkinvalid`: not present to the MMU (its accesses fault), still
    /// huge and never none to the kernel's lockless readers; what
    /// `pmdp_invalidate` leaves while a split rebuilds the PMD.
    #[inline]
    pub fn mkinvalid(self) -> Pmd {
        Pmd(self.0 & !(_PAGE_PRESENT | _PAGE_PROTNONE))
    }
    #[inline]
    pub(in crate::pgtable) fn table_pfn(self) -> Pfn {
        (self.0 & PTE_PFN_MASK) >> PAGE_SHIFT
    }
    #[inline]
    pub fn pfn(self) -> Pfn {
        if self.0 & _PAGE_PSE != 0 {
            (self.0 & PMD_PFN_MASK) >> PAGE_SHIFT
        } else {
            self.table_pfn()
        }
    }
    /// The leaf's bits as a PTE would carry them (for splitting).
    #[inline]
    pub fn leaf_pte(self, pfn: Pfn) -> Pte {
        Pte(((pfn << PAGE_SHIFT) & PTE_PFN_MASK)
            | (self.0 & !PMD_PFN_MASK & !_PAGE_PSE & !(1 << 12)))
    }
    /// `pmd_modify`.
    #[inline]
    pub fn modify(self, prot: Pgprot) -> Pmd {
        let keep = (_PAGE_CHG_MASK & !PTE_PFN_MASK) | PMD_PFN_MASK | _PAGE_PSE;
        Pmd((self.0 & keep) | (prot.0 & !keep))
    }
}

/// The bits a PTE and a PMD leaf share, read and changed alike: x86 writes
/// each pair over one helper (`pte_flags` / `pmd_flags`, `pte_set_flags` /
/// `pmd_set_flags`, `pte_clear_flags` / `pmd_clear_flags`); one macro
/// writes both here.
macro_rules! leaf_bits {
    ($t:ident) => {
        impl $t {
            #[inline]
            fn has(self, bits: u64) -> bool {
                self.0 & bits != 0
            }
            #[inline]
            fn set_flags(self, bits: u64) -> $t {
                $t(self.0 | bits)
            }
            #[inline]
            fn clear_flags(self, bits: u64) -> $t {
                $t(self.0 & !bits)
            }
            /// `pte_protnone` / `pmd_protnone`: a NUMA hinting entry, present
            /// to the kernel and not to the MMU.
            #[inline]
            pub fn protnone(self) -> bool {
                self.0 & (_PAGE_PRESENT | _PAGE_PROTNONE) == _PAGE_PROTNONE
            }
            #[inline]
            pub fn write(self) -> bool {
                self.has(_PAGE_RW)
            }
            #[inline]
            pub fn dirty(self) -> bool {
                self.has(_PAGE_DIRTY)
            }
            #[inline]
            pub fn young(self) -> bool {
                self.has(_PAGE_ACCESSED)
            }
            #[inline]
            pub fn special(self) -> bool {
                self.has(_PAGE_SPECIAL)
            }
            #[inline]
            pub fn soft_dirty(self) -> bool {
                self.has(_PAGE_SOFT_DIRTY)
            }
            #[inline]
            pub fn mkwrite(self) -> $t {
                self.set_flags(_PAGE_RW)
            }
            #[inline]
            pub fn wrprotect(self) -> $t {
                self.clear_flags(_PAGE_RW)
            }
            /// Dirty, and soft-dirty with it (`pte_mkdirty` / `pmd_mkdirty`).
            #[inline]
            pub fn mkdirty(self) -> $t {
                self.set_flags(_PAGE_DIRTY | _PAGE_SOFT_DIRTY)
            }
            #[inline]
            pub fn mkclean(self) -> $t {
                self.clear_flags(_PAGE_DIRTY)
            }
            #[inline]
            pub fn mkyoung(self) -> $t {
                self.set_flags(_PAGE_ACCESSED)
            }
            #[inline]
            pub fn mkold(self) -> $t {
                self.clear_flags(_PAGE_ACCESSED)
            }
            #[inline]
            pub fn mkspecial(self) -> $t {
                self.set_flags(_PAGE_SPECIAL)
            }
            #[inline]
            pub fn mksoft_dirty(self) -> $t {
                self.set_flags(_PAGE_SOFT_DIRTY)
            }
        }
    };
}

leaf_bits!(Pte);
leaf_bits!(Pmd);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pte_bits_round_trip() {
        let pte = Pte::new(0x1234_5678, Pgprot::READONLY);
        assert!(pte.present() && !pte.write() && !pte.dirty() && pte.young());
        assert_eq!(pte.pfn(), 0x1234_5678);
        let w = pte.mkwrite().mkdirty();
        assert!(w.write() && w.dirty() && w.soft_dirty());
        assert_eq!(w.wrprotect().mkclean().0 & (_PAGE_RW | _PAGE_DIRTY), 0);
        assert_eq!(w.advance_pfn(3).pfn(), 0x1234_567b);
    }

    #[test]
    fn protnone_is_present_to_the_kernel_only() {
        let p = Pte::new(7, Pgprot::READONLY).mkdirty().modify(Pgprot::NONE);
        assert!(p.present() && p.protnone());
        assert_eq!(p.0 & _PAGE_PRESENT, 0);
        assert!(p.dirty(), "pte_modify keeps the dirty bit");
        assert_eq!(p.pfn(), 7);
    }

    #[test]
    fn huge_pmd_leaf_and_split_ptes() {
        let pmd = Pmd::huge(0x200, Pgprot::SHARED).mkdirty();
        assert!(pmd.trans_huge());
        assert_eq!(pmd.pfn(), 0x200);
        let pte = pmd.leaf_pte(0x201);
        assert_eq!(pte.pfn(), 0x201);
        assert!(pte.write() && pte.dirty() && pte.present());
        assert_eq!(pte.0 & _PAGE_PSE, 0);
        let table = Pmd::table(0x99);
        assert!(!table.trans_huge() && table.present());
        let inv = pmd.mkinvalid();
        assert!(inv.trans_huge() && inv.present() && !inv.none());
        assert_eq!(inv.0 & _PAGE_PRESENT, 0, "the MMU faults on it");
        assert_eq!(inv.pfn(), 0x200);
        assert_eq!(table.table_pfn(), 0x99);
    }

    /// x86's flush rule: permission changes flush both ways, the bits the
    /// MMU sets only when they are cleared, software bits and the
    /// accessed bit never, and nothing the MMU could not use.
    #[test]
    fn pte_needs_flush_follows_x86() {
        let ro = Pte::new(7, Pgprot::READONLY);
        let rw = Pte::new(7, Pgprot::SHARED);
        assert!(pte_needs_flush(rw, ro), "write lost");
        assert!(pte_needs_flush(ro, rw), "write gained");
        let rwx = Pte::new(7, Pgprot::SHARED_EXEC);
        assert!(
            pte_needs_flush(rw, rwx) && pte_needs_flush(rwx, rw),
            "NX changed"
        );
        assert!(pte_needs_flush(rw.mkdirty(), rw), "dirty cleared");
        assert!(!pte_needs_flush(rw, rw.mkdirty()), "dirty set");
        assert!(!pte_needs_flush(rw, rw.mkold()), "accessed cleared");
        assert!(!pte_needs_flush(rw, rw.mkspecial()), "a software bit");
        assert!(
            pte_needs_flush(rw, rw.modify(Pgprot::NONE)),
            "made PROT_NONE"
        );
        assert!(
            !pte_needs_flush(rw.modify(Pgprot::NONE), rw),
            "never cached"
        );
        assert!(
            pte_needs_flush(rw, Pte::new(8, Pgprot::SHARED)),
            "another page"
        );
        let huge = Pmd::huge(0x200, Pgprot::SHARED);
        assert!(huge_pmd_needs_flush(huge, huge.wrprotect()));
        assert!(!huge_pmd_needs_flush(huge, huge.mkdirty()));
        assert!(!huge_pmd_needs_flush(huge.mkinvalid(), huge));
        assert!(
            huge_pmd_needs_flush(huge, huge.mkold()),
            "not ignored for a PMD"
        );
    }
}
