//! The system calls, as a thread on a CPU makes them: each enters the
//! kernel, acts on the CPU's current mm, and returns.

use crate::errno::KResult;
use crate::machine::OnCpu;

impl OnCpu<'_> {
    /// `mmap(2)` of anonymous memory (a file mapping without a file is
    /// EBADF).
    pub fn mmap(&self, addr: u64, len: u64, prot: u32, flags: u32) -> KResult<u64> {
        self.mmap_file(addr, len, prot, flags, None, 0)
    }

    /// `mmap(2)`: `file` (its descriptor) from byte `off`, or anonymous
    /// memory with `MAP_ANONYMOUS`.
    pub fn mmap_file(
        &self,
        addr: u64,
        len: u64,
        prot: u32,
        flags: u32,
        file: Option<&crate::sync::Arc<crate::fs::File>>,
        off: u64,
    ) -> KResult<u64> {
        self.kernel_enter();
        let src = crate::mmap::MmapSource { file, off };
        crate::mmap::do_mmap(self, &self.mm()?, addr, len, prot, flags, src)
    }

    /// `munmap(2)`.
    pub fn munmap(&self, addr: u64, len: u64) -> KResult<()> {
        self.kernel_enter();
        crate::mmap::do_munmap(self, &self.mm()?, addr, len)
    }

    /// `mprotect(2)`.
    pub fn mprotect(&self, addr: u64, len: u64, prot: u32) -> KResult<()> {
        self.kernel_enter();
        crate::mprotect::do_mprotect(self, &self.mm()?, addr, len, prot)
    }

    /// `mremap(2)`: returns the mapping's address.
    pub fn mremap(
        &self,
        addr: u64,
        old_len: u64,
        new_len: u64,
        flags: u32,
        new_addr: u64,
    ) -> KResult<u64> {
        self.kernel_enter();
        crate::mremap::do_mremap(self, &self.mm()?, addr, old_len, new_len, flags, new_addr)
    }

    /// `brk(2)`: the heap's new end, or its old one if the move was
    /// refused (`brk(0)` asks where it is).
    pub fn brk(&self, brk: u64) -> KResult<u64> {
        self.kernel_enter();
        Ok(crate::mmap::sys_brk(self, &self.mm()?, brk))
    }

    /// `execve(2)` with randomisation off: the current process runs
    /// `path` from its first instruction in a new mm, returned; the old
    /// one is torn down.
    pub fn execve(
        &self,
        path: &str,
        argv: &[&str],
        envp: &[&str],
    ) -> KResult<crate::sync::Arc<crate::mm::Mm>> {
        self.kernel_enter();
        crate::exec::do_execve(self, path, argv, envp, false, None)
    }

    /// `execve(2)` with randomisation on, its random numbers given.
    pub fn execve_randomized(
        &self,
        path: &str,
        argv: &[&str],
        envp: &[&str],
        rnd: crate::exec::ExecRandom,
    ) -> KResult<crate::sync::Arc<crate::mm::Mm>> {
        self.kernel_enter();
        crate::exec::do_execve(self, path, argv, envp, false, Some(rnd))
    }

    /// `execve(2)` by a vfork child, which runs its parent's mm: as
    /// [`OnCpu::execve`], but the old mm stays, its parent's again.
    pub fn execve_vfork_child(
        &self,
        path: &str,
        argv: &[&str],
        envp: &[&str],
    ) -> KResult<crate::sync::Arc<crate::mm::Mm>> {
        self.kernel_enter();
        crate::exec::do_execve(self, path, argv, envp, true, None)
    }

    /// `memfd_create(2)`: a new, empty shmem file.
    pub fn memfd_create(&self) -> KResult<crate::sync::Arc<crate::fs::File>> {
        self.kernel_enter();
        crate::shmem::memfd_create(self)
    }

    /// `msync(2)`.
    pub fn msync(&self, addr: u64, len: u64, flags: u32) -> KResult<()> {
        self.kernel_enter();
        crate::msync::do_msync(self, &self.mm()?, addr, len, flags)
    }

    /// `ftruncate(2)` of an open file.
    pub fn ftruncate(&self, file: &crate::fs::File, size: u64) -> KResult<()> {
        self.kernel_enter();
        crate::filemap::do_truncate(self, file, size)
    }

    /// `pwrite(2)` of `buf` at byte `pos` of an open file, through the page
    /// cache.
    pub fn pwrite(&self, file: &crate::fs::File, pos: u64, buf: &[u8]) -> KResult<usize> {
        self.kernel_enter();
        crate::filemap::generic_perform_write(self, file, pos, buf)
    }

    /// `fsync(2)` of an open file: its dirty pages written back.
    pub fn fsync(&self, file: &crate::fs::File) -> KResult<()> {
        self.kernel_enter();
        crate::filemap::filemap_write_and_wait_range(self, &file.inode, 0, u64::MAX >> 12);
        Ok(())
    }

    /// `mincore(2)`: one byte per page, 1 where the page is resident.
    pub fn mincore(&self, addr: u64, len: u64) -> KResult<Vec<u8>> {
        self.kernel_enter();
        crate::mincore::sys_mincore(self, &self.mm()?, addr, len)
    }

    /// `mlock(2)`.
    pub fn mlock(&self, addr: u64, len: u64) -> KResult<()> {
        self.kernel_enter();
        crate::mlock::do_mlock(self, &self.mm()?, addr, len, crate::mm::vma::VM_LOCKED)
    }

    /// `mlock2(2)`: `MLOCK_ONFAULT` locks pages as they are faulted in.
    pub fn mlock2(&self, addr: u64, len: u64, flags: u32) -> KResult<()> {
        self.kernel_enter();
        let vm_flags = crate::mlock::mlock2_flags(flags)?;
        crate::mlock::do_mlock(self, &self.mm()?, addr, len, vm_flags)
    }

    /// `munlock(2)`.
    pub fn munlock(&self, addr: u64, len: u64) -> KResult<()> {
        self.kernel_enter();
        crate::mlock::do_munlock(self, &self.mm()?, addr, len)
    }

    /// `mlockall(2)`.
    pub fn mlockall(&self, flags: u32) -> KResult<()> {
        self.kernel_enter();
        crate::mlock::do_mlockall(self, &self.mm()?, flags)
    }

    /// `munlockall(2)`.
    pub fn munlockall(&self) -> KResult<()> {
        self.kernel_enter();
        crate::mlock::do_munlockall(self, &self.mm()?)
    }

    /// `madvise(2)`.
    pub fn madvise(&self, addr: u64, len: u64, advice: i32) -> KResult<()> {
        self.kernel_enter();
        crate::madvise::do_madvise(self, &self.mm()?, addr, len, advice)
    }

    /// `fork(2)`'s memory half: a child process whose address space is a
    /// copy-on-write copy of this CPU's. This CPU keeps running the parent;
    /// run the child with [`OnCpu::switch_mm`].
    pub fn fork(&self) -> KResult<crate::sync::Arc<crate::mm::Mm>> {
        self.kernel_enter();
        crate::fork::dup_mm(self, &self.mm()?)
    }

    /// `move_pages(2)` for this process: see
    /// [`crate::migrate::kernel_move_pages`].
    pub fn move_pages(
        &self,
        pages: &[u64],
        nodes: Option<&[i32]>,
        status: &mut [i32],
    ) -> KResult<usize> {
        self.kernel_enter();
        crate::migrate::kernel_move_pages(self, pages, nodes, status, false)
    }

    /// `mbind(2)`: see [`crate::mempolicy::kernel_mbind`]. `nmask` holds
    /// the node bits, `maxnode` counts them as the system call does.
    pub fn mbind(
        &self,
        start: u64,
        len: u64,
        mode: i32,
        nmask: &[u64],
        maxnode: u64,
        flags: u32,
    ) -> KResult<()> {
        self.kernel_enter();
        crate::mempolicy::kernel_mbind(self, start, len, mode, nmask, maxnode, flags)
    }

    /// `set_mempolicy(2)` for this process.
    pub fn set_mempolicy(&self, mode: i32, nmask: &[u64], maxnode: u64) -> KResult<()> {
        self.kernel_enter();
        crate::mempolicy::kernel_set_mempolicy(self, mode, nmask, maxnode)
    }

    /// The process exits: its address space is torn down and this CPU is left
    /// running no mm.
    pub fn exit_mm(&self) -> KResult<()> {
        self.kernel_enter();
        let mm = self.mm()?;
        crate::mmap::exit_mmap(self, &mm);
        self.cpu.switch_mm(None);
        Ok(())
    }

    /// One thread of the process exits while others go on: this CPU stops
    /// running the mm and drops its reference (what `exit_mm` in
    /// kernel/exit.c does before the last thread; the model's CPU then runs
    /// no mm, where x86's would keep the exiting one loaded, lazily, until
    /// it next switches).
    pub fn exit_thread(&self) {
        self.kernel_enter();
        self.cpu.switch_mm(None);
    }
}
