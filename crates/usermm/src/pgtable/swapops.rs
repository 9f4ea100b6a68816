//! Non-present entries (include/linux/swapops.h, x86's `__swp_entry`).
//!
//! A PTE or PMD that is neither none nor present holds a *swap entry*: a
//! 5-bit type in bits 59..63 and a type-specific offset stored inverted in
//! bits 9..58 (the L1TF mitigation: a stale walk of a non-present entry
//! points at no real memory). Bits 1, 2 and 3 keep the soft-dirty, uffd-wp
//! and PageAnonExclusive bits across the entry's life; bits 0 (present), 7
//! (PSE) and 8 (PROTNONE) are always clear, so no such entry is mistaken
//! for a present one or a huge leaf.
//!
//! The types above the swap files' are the kernel's special entries, in its
//! order for a kernel with CONFIG_MIGRATION, CONFIG_MEMORY_FAILURE,
//! CONFIG_DEVICE_PRIVATE and CONFIG_PTE_MARKER: hardware-poison, the three
//! migration entries, four device entries, and PTE markers. Of these the
//! model makes migration entries (whose offset is the PFN, with the young
//! and dirty bits above it, as `migration_entry_supports_ad` allows on x86)
//! and PTE markers (uffd-wp, poisoned, guard). Swap files and device memory
//! are not modelled: their types decode, and any path that meets one says
//! so.

use super::entry::{Pmd, Pte};
use crate::phys::Pfn;

/// `SWP_TYPE_BITS`.
const SWP_TYPE_BITS: u32 = 5;
/// `SWP_OFFSET_FIRST_BIT`: above `_PAGE_BIT_PROTNONE`.
const SWP_OFFSET_FIRST_BIT: u32 = 9;
const SWP_OFFSET_SHIFT: u32 = SWP_OFFSET_FIRST_BIT + SWP_TYPE_BITS;
/// `_PAGE_SWP_SOFT_DIRTY` (`_PAGE_RW`'s bit).
pub const _PAGE_SWP_SOFT_DIRTY: u64 = 1 << 1;
/// `_PAGE_SWP_UFFD_WP` (`_PAGE_USER`'s bit).
pub const _PAGE_SWP_UFFD_WP: u64 = 1 << 2;
/// `_PAGE_SWP_EXCLUSIVE` (`_PAGE_PWT`'s bit): the page was
/// PageAnonExclusive when it was unmapped.
pub const _PAGE_SWP_EXCLUSIVE: u64 = 1 << 3;
/// The bits of a swap PTE that are not its entry.
const SWP_PTE_BITS: u64 = _PAGE_SWP_SOFT_DIRTY | _PAGE_SWP_UFFD_WP | _PAGE_SWP_EXCLUSIVE;

/// `MAX_SWAPFILES_SHIFT`.
const MAX_SWAPFILES_SHIFT: u32 = 5;
const SWP_DEVICE_NUM: u32 = 4;
const SWP_MIGRATION_NUM: u32 = 3;
const SWP_HWPOISON_NUM: u32 = 1;
const SWP_PTE_MARKER_NUM: u32 = 1;
/// `MAX_SWAPFILES`: the types below are swap files.
pub const MAX_SWAPFILES: u32 = (1 << MAX_SWAPFILES_SHIFT)
    - SWP_DEVICE_NUM
    - SWP_MIGRATION_NUM
    - SWP_HWPOISON_NUM
    - SWP_PTE_MARKER_NUM;
pub const SWP_HWPOISON: u32 = MAX_SWAPFILES;
pub const SWP_MIGRATION_READ: u32 = MAX_SWAPFILES + SWP_HWPOISON_NUM;
pub const SWP_MIGRATION_READ_EXCLUSIVE: u32 = SWP_MIGRATION_READ + 1;
pub const SWP_MIGRATION_WRITE: u32 = SWP_MIGRATION_READ + 2;
pub const SWP_DEVICE_WRITE: u32 = MAX_SWAPFILES + SWP_HWPOISON_NUM + SWP_MIGRATION_NUM;
pub const SWP_PTE_MARKER: u32 = SWP_DEVICE_WRITE + SWP_DEVICE_NUM;

/// `SWP_PFN_BITS`: `MAX_PHYSMEM_BITS` (46 with four-level tables) less the
/// page shift.
const SWP_PFN_BITS: u32 = 46 - 12;
/// `SWP_MIG_YOUNG_BIT` / `SWP_MIG_DIRTY_BIT`: above the PFN of a
/// migration entry.
const SWP_MIG_YOUNG: u64 = 1 << SWP_PFN_BITS;
const SWP_MIG_DIRTY: u64 = 1 << (SWP_PFN_BITS + 1);
const SWP_PFN_MASK: u64 = (1 << SWP_PFN_BITS) - 1;

/// `pte_marker` bits.
pub const PTE_MARKER_UFFD_WP: u64 = 1 << 0;
/// A page whose contents were lost (`PTE_MARKER_POISONED`): an access gets
/// SIGBUS.
pub const PTE_MARKER_POISONED: u64 = 1 << 1;
/// A guard region's page (`PTE_MARKER_GUARD`, v6.13): an access gets
/// SIGSEGV.
pub const PTE_MARKER_GUARD: u64 = 1 << 2;
const PTE_MARKER_MASK: u64 = (1 << 3) - 1;

/// What a migration entry takes from the entry it replaces.
#[derive(Clone, Copy, Debug)]
pub struct MigrationBits {
    pub write: bool,
    /// The page was PageAnonExclusive.
    pub exclusive: bool,
    pub young: bool,
    pub dirty: bool,
}

/// `swp_entry_t`: a type and an offset, without the PTE's own bits.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SwpEntry(u64);

/// Which migration entry (`SWP_MIGRATION_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Migration {
    Read,
    /// Read-only, and the anon page was exclusive to this mapping.
    ReadExclusive,
    /// The mapping was writable (so the anon page was exclusive).
    Write,
}

/// What a swap entry is, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwpKind {
    /// A page in swap file `type_` (not modelled).
    Swap { type_: u32, offset: u64 },
    /// A page being migrated: accesses wait until the new one is mapped.
    Migration {
        kind: Migration,
        pfn: Pfn,
        young: bool,
        dirty: bool,
    },
    /// A hardware-poisoned page (not modelled).
    HwPoison { pfn: Pfn },
    /// Device memory (not modelled).
    Device { type_: u32, offset: u64 },
    /// A PTE marker: `PTE_MARKER_*` bits.
    Marker(u64),
}

impl SwpEntry {
    /// `swp_entry`.
    #[inline]
    pub fn new(type_: u32, offset: u64) -> SwpEntry {
        debug_assert!(type_ < 1 << SWP_TYPE_BITS);
        let val = (!offset << SWP_OFFSET_SHIFT >> SWP_TYPE_BITS)
            | ((type_ as u64) << (64 - SWP_TYPE_BITS));
        SwpEntry(val)
    }
    /// `swp_type`.
    #[inline]
    pub fn type_(self) -> u32 {
        (self.0 >> (64 - SWP_TYPE_BITS)) as u32
    }
    /// `swp_offset`.
    #[inline]
    pub fn offset(self) -> u64 {
        !self.0 << SWP_TYPE_BITS >> SWP_OFFSET_SHIFT
    }

    /// `make_readable_migration_entry` & co.
    pub fn migration(kind: Migration, pfn: Pfn) -> SwpEntry {
        debug_assert!(pfn <= SWP_PFN_MASK);
        let t = match kind {
            Migration::Read => SWP_MIGRATION_READ,
            Migration::ReadExclusive => SWP_MIGRATION_READ_EXCLUSIVE,
            Migration::Write => SWP_MIGRATION_WRITE,
        };
        SwpEntry::new(t, pfn)
    }
    /// `make_migration_entry_young`.
    pub fn mkyoung(self) -> SwpEntry {
        debug_assert!(self.is_migration());
        SwpEntry::new(self.type_(), self.offset() | SWP_MIG_YOUNG)
    }
    /// `make_migration_entry_dirty`.
    pub fn mkdirty(self) -> SwpEntry {
        debug_assert!(self.is_migration());
        SwpEntry::new(self.type_(), self.offset() | SWP_MIG_DIRTY)
    }
    /// `make_readable_migration_entry(swp_offset(entry))` & co.: the same
    /// migration entry (PFN, young and dirty bits) with another kind.
    pub fn with_migration_kind(self, kind: Migration) -> SwpEntry {
        debug_assert!(self.is_migration());
        SwpEntry::migration(kind, 0).with_offset(self.offset())
    }
    fn with_offset(self, offset: u64) -> SwpEntry {
        SwpEntry::new(self.type_(), offset)
    }
    /// The migration entry of page `pfn`, unmapped from an entry with
    /// `bits`: writable, readable-exclusive or readable, and young and
    /// dirty where the kernel keeps them (`migration_entry_supports_ad`:
    /// `supports_ad`).
    pub fn make_migration_entry(pfn: Pfn, bits: MigrationBits, supports_ad: bool) -> SwpEntry {
        let kind = if bits.write {
            Migration::Write
        } else if bits.exclusive {
            Migration::ReadExclusive
        } else {
            Migration::Read
        };
        let mut entry = SwpEntry::migration(kind, pfn);
        if supports_ad && bits.young {
            entry = entry.mkyoung();
        }
        if supports_ad && bits.dirty {
            entry = entry.mkdirty();
        }
        entry
    }
    /// `make_pte_marker_entry`.
    pub fn marker(bits: u64) -> SwpEntry {
        debug_assert!(bits != 0 && bits & !PTE_MARKER_MASK == 0);
        SwpEntry::new(SWP_PTE_MARKER, bits)
    }

    /// `is_migration_entry`.
    #[inline]
    pub fn is_migration(self) -> bool {
        (SWP_MIGRATION_READ..=SWP_MIGRATION_WRITE).contains(&self.type_())
    }

    /// Decode.
    pub fn kind(self) -> SwpKind {
        let (t, off) = (self.type_(), self.offset());
        match t {
            t if t < MAX_SWAPFILES => SwpKind::Swap {
                type_: t,
                offset: off,
            },
            SWP_HWPOISON => SwpKind::HwPoison {
                pfn: off & SWP_PFN_MASK,
            },
            SWP_MIGRATION_READ..=SWP_MIGRATION_WRITE => SwpKind::Migration {
                kind: match t {
                    SWP_MIGRATION_READ => Migration::Read,
                    SWP_MIGRATION_READ_EXCLUSIVE => Migration::ReadExclusive,
                    _ => Migration::Write,
                },
                pfn: off & SWP_PFN_MASK,
                young: off & SWP_MIG_YOUNG != 0,
                dirty: off & SWP_MIG_DIRTY != 0,
            },
            SWP_PTE_MARKER => SwpKind::Marker(off & PTE_MARKER_MASK),
            t => SwpKind::Device {
                type_: t,
                offset: off,
            },
        }
    }

    /// `swp_entry_to_pte`.
    #[inline]
    pub fn to_pte(self) -> Pte {
        Pte(self.0)
    }
    /// `swp_entry_to_pmd`.
    #[inline]
    pub fn to_pmd(self) -> Pmd {
        Pmd(self.0)
    }
}

impl std::fmt::Debug for SwpEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SwpEntry({:?})", self.kind())
    }
}

impl Pte {
    /// `is_swap_pte`: not none and not present.
    #[inline]
    pub fn is_swap(self) -> bool {
        !self.none() && !self.present()
    }
    /// `pte_to_swp_entry`: the entry without the PTE's swap bits.
    #[inline]
    pub fn swp_entry(self) -> SwpEntry {
        debug_assert!(self.is_swap(), "{self:?} is not a swap PTE");
        SwpEntry(self.0 & !SWP_PTE_BITS)
    }
    /// `pte_swp_soft_dirty`.
    #[inline]
    pub fn swp_soft_dirty(self) -> bool {
        self.0 & _PAGE_SWP_SOFT_DIRTY != 0
    }
    /// `pte_swp_uffd_wp`.
    #[inline]
    pub fn swp_uffd_wp(self) -> bool {
        self.0 & _PAGE_SWP_UFFD_WP != 0
    }
    /// `pte_swp_exclusive`.
    #[inline]
    pub fn swp_exclusive(self) -> bool {
        self.0 & _PAGE_SWP_EXCLUSIVE != 0
    }
    /// `pte_swp_mksoft_dirty`.
    #[inline]
    pub fn swp_mksoft_dirty(self) -> Pte {
        Pte(self.0 | _PAGE_SWP_SOFT_DIRTY)
    }
    /// `pte_swp_clear_uffd_wp`.
    #[inline]
    pub fn swp_clear_uffd_wp(self) -> Pte {
        Pte(self.0 & !_PAGE_SWP_UFFD_WP)
    }
    /// `pte_swp_mkexclusive`.
    #[inline]
    pub fn swp_mkexclusive(self) -> Pte {
        Pte(self.0 | _PAGE_SWP_EXCLUSIVE)
    }
}

impl Pmd {
    /// `is_swap_pmd`: not none and not present (a PMD migration entry).
    #[inline]
    pub fn is_swap(self) -> bool {
        !self.none() && !self.present()
    }
    /// `pmd_to_swp_entry`.
    #[inline]
    pub fn swp_entry(self) -> SwpEntry {
        debug_assert!(self.is_swap(), "{self:?} is not a swap PMD");
        SwpEntry(self.0 & !SWP_PTE_BITS)
    }
    /// `is_pmd_migration_entry`.
    #[inline]
    pub fn is_migration(self) -> bool {
        self.is_swap() && self.swp_entry().is_migration()
    }
    /// `pmd_swp_soft_dirty`.
    #[inline]
    pub fn swp_soft_dirty(self) -> bool {
        self.0 & _PAGE_SWP_SOFT_DIRTY != 0
    }
    /// `pmd_swp_mksoft_dirty`.
    #[inline]
    pub fn swp_mksoft_dirty(self) -> Pmd {
        Pmd(self.0 | _PAGE_SWP_SOFT_DIRTY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pgtable::entry::{_PAGE_PRESENT, _PAGE_PROTNONE, _PAGE_PSE};

    #[test]
    fn layout_is_x86s() {
        assert_eq!(MAX_SWAPFILES, 23);
        assert_eq!(SWP_PTE_MARKER, 31);
        let e = SwpEntry::new(5, 0x1234);
        assert_eq!((e.type_(), e.offset()), (5, 0x1234));
        // Type in the top five bits, the offset inverted from bit 9.
        assert_eq!(e.0 >> 59, 5);
        assert_eq!((!e.0 >> 9) & 0xffff, 0x1234);
        assert_eq!(e.0 & 0x1ff, 0, "P, PSE, PROTNONE and the swap bits clear");
    }

    #[test]
    fn migration_entries_keep_pfn_young_dirty_and_pte_bits() {
        let pfn = 0x3_ffff_0001;
        for kind in [Migration::Read, Migration::ReadExclusive, Migration::Write] {
            let e = SwpEntry::migration(kind, pfn).mkyoung().mkdirty();
            assert_eq!(
                e.kind(),
                SwpKind::Migration {
                    kind,
                    pfn,
                    young: true,
                    dirty: true
                }
            );
            let pte = e.to_pte().swp_mksoft_dirty().swp_mkexclusive();
            assert!(pte.is_swap() && !pte.present() && !pte.none());
            assert_eq!(pte.0 & (_PAGE_PRESENT | _PAGE_PROTNONE | _PAGE_PSE), 0);
            assert!(pte.swp_soft_dirty() && pte.swp_exclusive() && !pte.swp_uffd_wp());
            assert_eq!(pte.swp_entry(), e, "the PTE's own bits are not the entry's");
            let pmd = e.to_pmd();
            assert!(pmd.is_swap() && !pmd.trans_huge());
        }
        let plain = SwpEntry::migration(Migration::Read, 7);
        assert!(matches!(
            plain.kind(),
            SwpKind::Migration {
                young: false,
                dirty: false,
                ..
            }
        ));
    }

    #[test]
    fn markers_and_the_other_kinds_decode() {
        let m = SwpEntry::marker(PTE_MARKER_GUARD);
        assert_eq!(m.kind(), SwpKind::Marker(PTE_MARKER_GUARD));
        assert!(m.to_pte().is_swap());
        assert!(matches!(
            SwpEntry::new(0, 99).kind(),
            SwpKind::Swap {
                type_: 0,
                offset: 99
            }
        ));
        assert_eq!(
            SwpEntry::new(SWP_HWPOISON, 5).kind(),
            SwpKind::HwPoison { pfn: 5 }
        );
        assert!(matches!(
            SwpEntry::new(SWP_DEVICE_WRITE, 1).kind(),
            SwpKind::Device { .. }
        ));
    }
}
