//! ELF executables (fs/binfmt_elf.c): `load_elf_binary` lays a program
//! and its interpreter out in a new address space, as 6.18 does on x86-64
//! with address-space randomisation off (a process run under `setarch
//! -R`): the program's `PT_LOAD` segments as private file mappings (a
//! position-independent one at `ELF_ET_DYN_BASE`), each segment's bss as
//! brk memory after the tail of its last file page is zeroed, the
//! interpreter where a top-down search puts it, brk just past the
//! program's bss.
//!
//! The headers are read from the host file directly, not through the
//! model's page cache (the kernel's `kernel_read` fills the page cache as
//! it reads them; the model's cache fills at the first fault instead).

use crate::errno::{Errno, KResult};
use crate::exec::LinuxBinprm;
use crate::machine::OnCpu;
use crate::mm::vma::VM_EXEC;
use crate::mm::{Mm, TASK_SIZE};
use crate::mmap::{do_mmap, do_munmap, vm_brk_flags, MmapSource};
use crate::phys::{PAGE_MASK, PAGE_SIZE};
use crate::sync::Arc;

const ET_EXEC: u16 = 2;
const ET_DYN: u16 = 3;
const EM_X86_64: u16 = 62;
const PT_LOAD: u32 = 1;
const PT_INTERP: u32 = 3;
const PT_GNU_STACK: u32 = 0x6474_e551;
const PF_X: u32 = 1;
const PF_W: u32 = 2;
const PF_R: u32 = 4;
/// `sizeof(struct elf64_phdr)`.
const PHDR_SIZE: usize = 56;
/// `ELF_MIN_ALIGN` less one: the page offset of an address.
const PAGE_OFFSET_MASK: u64 = PAGE_SIZE - 1;
/// `ELF_ET_DYN_BASE` for 64-bit tasks: two thirds of the 47-bit user
/// window, where a PIE program is loaded.
pub const ELF_ET_DYN_BASE: u64 = TASK_SIZE / 3 * 2;
/// `PATH_MAX`: the longest interpreter path.
const PATH_MAX: u64 = 4096;

/// `struct elf64_phdr`, the fields the loader reads.
#[derive(Clone, Copy, Debug)]
pub struct ElfPhdr {
    pub p_type: u32,
    pub p_flags: u32,
    pub p_offset: u64,
    pub p_vaddr: u64,
    pub p_filesz: u64,
    pub p_memsz: u64,
    pub p_align: u64,
}

/// An ELF file's header and program headers (`struct elfhdr` and
/// `load_elf_phdrs`).
#[derive(Clone, Debug)]
pub struct ElfImage {
    pub e_type: u16,
    pub e_entry: u64,
    pub e_phoff: u64,
    pub phdrs: Vec<ElfPhdr>,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Read `len` bytes of `file` at `off` (`elf_read`): a short read is
/// `EIO`, as the kernel's is.
fn elf_read(file: &std::fs::File, off: u64, len: usize) -> KResult<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, off).map_err(|_| Errno::EIO)?;
    Ok(buf)
}

impl ElfImage {
    /// Parse the header at the file's start; `bad` is the errno of a file
    /// that is not an x86-64 ELF executable (ENOEXEC for the program,
    /// ELIBBAD for its interpreter).
    pub fn parse(file: &std::fs::File, bad: Errno) -> KResult<ElfImage> {
        let ehdr = elf_read(file, 0, 64).map_err(|_| bad)?;
        if &ehdr[..4] != b"\x7fELF" {
            return Err(bad);
        }
        let e_type = u16_at(&ehdr, 16);
        // elf_check_arch: 64-bit, little-endian, x86-64.
        if ehdr[4] != 2 || ehdr[5] != 1 || u16_at(&ehdr, 18) != EM_X86_64 {
            return Err(bad);
        }
        if e_type != ET_EXEC && e_type != ET_DYN {
            return Err(bad);
        }
        let e_phoff = u64_at(&ehdr, 32);
        let phentsize = u16_at(&ehdr, 54) as usize;
        let phnum = u16_at(&ehdr, 56) as usize;
        // load_elf_phdrs: whole entries, at least one, at most 64 KiB.
        if phentsize != PHDR_SIZE || phnum < 1 || phnum * PHDR_SIZE > 65536 {
            return Err(Errno::ENOEXEC);
        }
        let raw = elf_read(file, e_phoff, phnum * PHDR_SIZE)?;
        let phdrs = raw
            .chunks_exact(PHDR_SIZE)
            .map(|p| ElfPhdr {
                p_type: u32_at(p, 0),
                p_flags: u32_at(p, 4),
                p_offset: u64_at(p, 8),
                p_vaddr: u64_at(p, 16),
                p_filesz: u64_at(p, 32),
                p_memsz: u64_at(p, 40),
                p_align: u64_at(p, 48),
            })
            .collect();
        Ok(ElfImage {
            e_type,
            e_entry: u64_at(&ehdr, 24),
            e_phoff,
            phdrs,
        })
    }

    /// The interpreter's path (`PT_INTERP`), if the program names one.
    pub fn interpreter(&self, file: &std::fs::File) -> KResult<Option<String>> {
        let Some(p) = self.phdrs.iter().find(|p| p.p_type == PT_INTERP) else {
            return Ok(None);
        };
        if p.p_filesz > PATH_MAX || p.p_filesz < 2 {
            return Err(Errno::ENOEXEC);
        }
        let raw = elf_read(file, p.p_offset, p.p_filesz as usize)?;
        let Some((&0, path)) = raw.split_last() else {
            return Err(Errno::ENOEXEC);
        };
        String::from_utf8(path.to_vec())
            .map(Some)
            .map_err(|_| Errno::ENOEXEC)
    }

    /// Whether `PT_GNU_STACK` asks for an executable stack
    /// (`EXSTACK_ENABLE_X`); x86-64 gives none by default.
    pub fn executable_stack(&self) -> bool {
        self.phdrs
            .iter()
            .find(|p| p.p_type == PT_GNU_STACK)
            .is_some_and(|p| p.p_flags & PF_X != 0)
    }

    fn loads(&self) -> impl Iterator<Item = &ElfPhdr> {
        self.phdrs.iter().filter(|p| p.p_type == PT_LOAD)
    }

    /// `total_mapping_size`: from the first `PT_LOAD`'s page to the last
    /// one's end.
    fn total_mapping_size(&self) -> u64 {
        match (self.loads().next(), self.loads().last()) {
            (Some(first), Some(last)) => {
                (last.p_vaddr + last.p_memsz).saturating_sub(first.p_vaddr & PAGE_MASK)
            }
            _ => 0,
        }
    }

    /// `maximum_alignment`: the largest power-of-two `p_align` of the
    /// `PT_LOAD`s, at least a page.
    fn maximum_alignment(&self) -> u64 {
        let a = self
            .loads()
            .map(|p| p.p_align)
            .filter(|a| a.is_power_of_two())
            .max()
            .unwrap_or(0);
        elf_pagealign(a).unwrap_or(PAGE_SIZE).max(PAGE_SIZE)
    }
}

fn elf_pagealign(v: u64) -> Option<u64> {
    v.checked_add(PAGE_OFFSET_MASK).map(|v| v & PAGE_MASK)
}

/// `make_prot`: a segment's `PF_*` flags as `PROT_*`.
fn make_prot(p_flags: u32) -> u32 {
    use crate::mmap::{PROT_EXEC, PROT_READ, PROT_WRITE};
    let mut prot = 0;
    if p_flags & PF_R != 0 {
        prot |= PROT_READ;
    }
    if p_flags & PF_W != 0 {
        prot |= PROT_WRITE;
    }
    if p_flags & PF_X != 0 {
        prot |= PROT_EXEC;
    }
    prot
}

/// `BAD_ADDR`: an address at or past `TASK_SIZE` (an errno, or a mapping
/// the kernel could not have made).
fn bad_addr(a: u64) -> bool {
    a >= TASK_SIZE
}

/// One file being loaded: what `elf_map` and `elf_load` map from.
struct ElfFile<'a> {
    oncpu: &'a OnCpu<'a>,
    mm: &'a Arc<Mm>,
    file: &'a Arc<crate::fs::File>,
}

impl ElfFile<'_> {
    /// `elf_map`: map the file part of `p` at `addr` (page-aligned down);
    /// with `total_size`, the first mapping of an image reserves the whole
    /// image and gives back what lies past this segment.
    fn elf_map(&self, addr: u64, p: &ElfPhdr, prot: u32, flags: u32, total: u64) -> KResult<u64> {
        let size =
            elf_pagealign(p.p_filesz + (p.p_vaddr & PAGE_OFFSET_MASK)).ok_or(Errno::EINVAL)?;
        let off = p.p_offset.wrapping_sub(p.p_vaddr & PAGE_OFFSET_MASK);
        let addr = addr & PAGE_MASK;
        if size == 0 {
            return Ok(addr);
        }
        let src = MmapSource {
            file: Some(self.file),
            off,
        };
        if total != 0 {
            let total = elf_pagealign(total).ok_or(Errno::EINVAL)?;
            let a = do_mmap(self.oncpu, self.mm, addr, total, prot, flags, src)?;
            if total > size {
                do_munmap(self.oncpu, self.mm, a + size, total - size)?;
            }
            Ok(a)
        } else {
            do_mmap(self.oncpu, self.mm, addr, size, prot, flags, src)
        }
    }

    /// `elf_load`: map segment `p` at `addr`; zero the rest of its last
    /// file page (`padzero`, which faults that page in as a private copy)
    /// and map the pages of bss past it as brk memory.
    fn elf_load(&self, addr: u64, p: &ElfPhdr, prot: u32, flags: u32, total: u64) -> KResult<u64> {
        use crate::mmap::PROT_WRITE;
        let in_page = p.p_vaddr & PAGE_OFFSET_MASK;
        let (map_addr, zero_start, zero_end);
        if p.p_filesz != 0 {
            map_addr = self.elf_map(addr, p, prot, flags, total)?;
            zero_start = map_addr + in_page + p.p_filesz;
            zero_end = map_addr + in_page + p.p_memsz;
            if p.p_memsz > p.p_filesz
                && padzero(self.oncpu, zero_start).is_err()
                && prot & PROT_WRITE != 0
            {
                return Err(Errno::EFAULT);
            }
        } else {
            map_addr = addr & PAGE_MASK;
            zero_start = map_addr;
            zero_end = map_addr + in_page + p.p_memsz;
        }
        if p.p_memsz > p.p_filesz {
            let start = elf_pagealign(zero_start).ok_or(Errno::ENOMEM)?;
            let end = elf_pagealign(zero_end).ok_or(Errno::ENOMEM)?;
            let exec = if prot & crate::mmap::PROT_EXEC != 0 {
                VM_EXEC
            } else {
                0
            };
            vm_brk_flags(self.oncpu, self.mm, start, end - start, exec)?;
        }
        Ok(map_addr)
    }
}

/// `padzero`: clear from `address` to the end of its page, through the
/// user's mapping (`clear_user`).
fn padzero(oncpu: &OnCpu, address: u64) -> KResult<()> {
    let nbyte = address & PAGE_OFFSET_MASK;
    if nbyte == 0 {
        return Ok(());
    }
    oncpu.write_bytes(address, &vec![0u8; (PAGE_SIZE - nbyte) as usize])
}

/// What loading left for `create_elf_tables` and the mm's layout.
#[derive(Clone, Copy, Debug, Default)]
pub struct ElfLoaded {
    pub load_bias: u64,
    pub phdr_addr: u64,
    pub e_entry: u64,
    pub elf_entry: u64,
    pub interp_load_addr: u64,
    pub start_code: u64,
    pub end_code: u64,
    pub start_data: u64,
    pub end_data: u64,
    pub elf_brk: u64,
}

/// Map the program's `PT_LOAD` segments (the loop of `load_elf_binary`).
fn load_program(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    bprm: &LinuxBinprm,
    has_interp: bool,
) -> KResult<ElfLoaded> {
    use crate::mmap::{MAP_FIXED, MAP_FIXED_NOREPLACE, MAP_PRIVATE};
    let elf = &bprm.elf;
    let f = ElfFile {
        oncpu,
        mm,
        file: &bprm.file,
    };
    let mut out = ElfLoaded {
        start_code: u64::MAX,
        ..Default::default()
    };
    let mut load_bias = 0u64;
    let mut first = true;
    for p in elf.loads() {
        let prot = make_prot(p.p_flags);
        let mut flags = MAP_PRIVATE;
        let vaddr = p.p_vaddr;
        let mut total = 0;
        if !first {
            flags |= MAP_FIXED;
        } else if elf.e_type == ET_EXEC {
            flags |= MAP_FIXED_NOREPLACE;
        } else {
            total = elf.total_mapping_size();
            if total == 0 {
                return Err(Errno::EINVAL);
            }
            let alignment = elf.maximum_alignment();
            if has_interp {
                // ELF_ET_DYN_BASE (plus the random offset), aligned down.
                let rnd = bprm.rnd.map_or(0, |r| r.pie);
                load_bias = (ELF_ET_DYN_BASE + rnd) & !(alignment - 1);
                flags |= MAP_FIXED_NOREPLACE;
            } else if alignment > PAGE_SIZE {
                // Find room for the aligned image, then map it there.
                load_bias = f.elf_load(0, p, prot, flags, total)?;
                do_munmap(
                    oncpu,
                    mm,
                    load_bias,
                    elf_pagealign(total).ok_or(Errno::EINVAL)?,
                )?;
                load_bias &= !(alignment - 1);
                flags |= MAP_FIXED_NOREPLACE;
            } else {
                load_bias = 0;
            }
            load_bias = load_bias.wrapping_sub(vaddr) & PAGE_MASK;
        }
        let at = load_bias.wrapping_add(vaddr);
        let mapped = f.elf_load(at, p, prot, flags, total)?;
        if first {
            first = false;
            if elf.e_type == ET_DYN {
                load_bias = load_bias.wrapping_add(mapped.wrapping_sub(at & PAGE_MASK));
            }
        }
        if p.p_offset <= elf.e_phoff && elf.e_phoff < p.p_offset + p.p_filesz {
            out.phdr_addr = elf.e_phoff - p.p_offset + p.p_vaddr;
        }
        let k = p.p_vaddr;
        if p.p_flags & PF_X != 0 && k < out.start_code {
            out.start_code = k;
        }
        out.start_data = out.start_data.max(k);
        if bad_addr(k)
            || p.p_filesz > p.p_memsz
            || p.p_memsz > TASK_SIZE
            || TASK_SIZE - p.p_memsz < k
        {
            return Err(Errno::EINVAL);
        }
        let k = p.p_vaddr + p.p_filesz;
        if p.p_flags & PF_X != 0 {
            out.end_code = out.end_code.max(k);
        }
        out.end_data = out.end_data.max(k);
        out.elf_brk = out.elf_brk.max(p.p_vaddr + p.p_memsz);
    }
    out.load_bias = load_bias;
    out.e_entry = elf.e_entry.wrapping_add(load_bias);
    out.phdr_addr = out.phdr_addr.wrapping_add(load_bias);
    out.elf_brk = out.elf_brk.wrapping_add(load_bias);
    out.start_code = out.start_code.wrapping_add(load_bias);
    out.end_code = out.end_code.wrapping_add(load_bias);
    out.start_data = out.start_data.wrapping_add(load_bias);
    out.end_data = out.end_data.wrapping_add(load_bias);
    Ok(out)
}

/// `load_elf_interp`: map the interpreter, its first segment where a
/// search finds room for the whole image (`no_base`: the program was
/// position-independent, so the interpreter's own addresses are not
/// used), the rest at their offsets from it. Returns its load address.
fn load_elf_interp(
    oncpu: &OnCpu,
    mm: &Arc<Mm>,
    interp: &ElfImage,
    file: &Arc<crate::fs::File>,
    no_base: u64,
) -> KResult<u64> {
    use crate::mmap::{MAP_FIXED, MAP_PRIVATE};
    let f = ElfFile { oncpu, mm, file };
    let mut total = interp.total_mapping_size();
    if total == 0 {
        return Err(Errno::EINVAL);
    }
    let mut load_addr = 0u64;
    let mut load_addr_set = false;
    for p in interp.loads() {
        let mut flags = MAP_PRIVATE;
        let vaddr = p.p_vaddr;
        if interp.e_type == ET_EXEC || load_addr_set {
            flags |= MAP_FIXED;
        } else if no_base != 0 && interp.e_type == ET_DYN {
            load_addr = vaddr.wrapping_neg();
        }
        let map_addr = f.elf_load(
            load_addr.wrapping_add(vaddr),
            p,
            make_prot(p.p_flags),
            flags,
            total,
        )?;
        total = 0;
        if !load_addr_set && interp.e_type == ET_DYN {
            load_addr = map_addr.wrapping_sub(vaddr & PAGE_MASK);
            load_addr_set = true;
        }
        let k = load_addr.wrapping_add(p.p_vaddr);
        if bad_addr(k)
            || p.p_filesz > p.p_memsz
            || p.p_memsz > TASK_SIZE
            || TASK_SIZE - p.p_memsz < k
        {
            return Err(Errno::ENOMEM);
        }
    }
    Ok(load_addr)
}

/// `load_elf_binary`, from `setup_arg_pages` on: the program, its
/// interpreter, the vDSO, the tables on the stack, brk. The new mm is the
/// CPU's current one.
pub fn load_elf_binary(oncpu: &OnCpu, mm: &Arc<Mm>, bprm: &mut LinuxBinprm) -> KResult<()> {
    crate::exec::setup_arg_pages(oncpu, mm, bprm, bprm.stack_top, bprm.elf.executable_stack())?;
    let has_interp = bprm.interp.is_some();
    let mut loaded = load_program(oncpu, mm, bprm, has_interp)?;
    if let Some((interp, file)) = &bprm.interp {
        let base = load_elf_interp(oncpu, mm, interp, file, loaded.load_bias)?;
        loaded.interp_load_addr = base;
        loaded.elf_entry = base.wrapping_add(interp.e_entry);
    } else {
        loaded.elf_entry = loaded.e_entry;
    }
    if bad_addr(loaded.elf_entry) {
        return Err(Errno::EINVAL);
    }
    let vdso = crate::vdso::map_vdso(mm)?;
    crate::exec::create_elf_tables(oncpu, mm, bprm, &loaded, vdso)?;
    // A static position-independent program's brk goes where a PIE
    // program would have been loaded (no CONFIG_COMPAT_BRK).
    let brk_moved = bprm.elf.e_type == ET_DYN && !has_interp;
    let elf_brk = if brk_moved {
        ELF_ET_DYN_BASE
    } else {
        loaded.elf_brk
    };
    let mut brk = elf_pagealign(elf_brk).ok_or(Errno::EINVAL)?;
    // With randomisation, a page's gap past the bss (unless moved), then
    // `arch_randomize_brk`.
    if let Some(r) = bprm.rnd {
        if !brk_moved {
            brk += PAGE_SIZE;
        }
        brk += r.brk;
    }
    let g = mm.mmap_lock.write();
    mm.set_layout(&g, |l| {
        l.start_code = loaded.start_code;
        l.end_code = loaded.end_code;
        l.start_data = loaded.start_data;
        l.end_data = loaded.end_data;
        l.start_stack = bprm.p;
        l.start_brk = brk;
        l.brk = brk;
    });
    Ok(())
}
