//! Layer 3: files (include/linux/fs.h): the filesystems a machine has,
//! their inodes, each inode's page cache ([`AddressSpace`]) and the open
//! files that mappings hold.
//!
//! An inode's bytes live in one of two places below its page cache:
//!
//! * a file the machine made ([`Backing::Blocks`]): its blocks on a
//!   modelled disk, 4 KiB each, held in host memory; a hole reads as
//!   zeroes; writeback copies a dirty folio's pages there;
//! * a host file opened read-only ([`Backing::Host`]): its bytes are read
//!   from the host when a folio is first filled, and nothing is written.
//!
//! The page cache is what the kernel's is: folios of this machine's
//! physical memory, found by file offset, each holding one reference per
//! page for the cache and one per mapping entry, on the file LRU lists.
//! Reads fill a folio whole and synchronously (there is no I/O time to
//! model, and no folio is ever seen !uptodate); the counts the kernel
//! keeps of the I/O (major faults, `nr_dirty`, `nr_writeback`) are kept.
//!
//! # Lifetime
//!
//! An inode lives while a name or an open file refers to it; open files
//! are held by the scenario or program (its file descriptors) and by the
//! VMAs that map them (`vm_file`). When the last goes, the inode is
//! evicted and its page cache freed (`truncate_inode_pages_final`); no
//! folio of it can still be mapped, since every mapping held a VMA that
//! held the file.

pub mod address_space;

use std::collections::HashMap;

use crate::errno::{Errno, KResult};
use crate::phys::{Folio, PhysMem, PAGE_SHIFT, PAGE_SIZE};
use crate::sync::{Arc, AtomicU64, Mutex, Ordering};

pub use address_space::{AddressSpace, IMmapWriteGuard};

/// The kind of filesystem a file lives on, which decides what its page
/// cache may hold and how its shared mappings are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FsKind {
    /// ext4 as 6.18 has it: large folios in the page cache (since v6.16,
    /// `mapping_set_large_folios` for regular files), `page_mkwrite`, and
    /// dirty accounting (shared writable PTEs start clean and read-only).
    Ext4,
    /// A disk filesystem without large folio support (ext2's
    /// `mapping_large_folio_support` is false): order-0 folios only.
    Ext2,
    /// tmpfs (shmem), as mounted by default (`huge=never`): its page cache
    /// is all there is of a file (no writeback; without swap, never
    /// reclaimed), its folios are swap-backed (on the anon LRU lists,
    /// counted in `Shmem` and `RssShmem`) and always dirty; no
    /// write-notify. Shared anonymous memory and memfds live on an
    /// internal mount of it ([`FsKind::ShmMnt`]).
    Tmpfs,
    /// The kernel's internal tmpfs mount (`shm_mnt`), of shared anonymous
    /// memory and memfds: tmpfs whose `huge` follows `shmem_enabled`.
    ShmMnt,
}

impl FsKind {
    pub fn name(self) -> &'static str {
        match self {
            FsKind::Ext4 => "ext4",
            FsKind::Ext2 => "ext2",
            FsKind::Tmpfs | FsKind::ShmMnt => "tmpfs",
        }
    }

    pub fn parse(s: &str) -> Option<FsKind> {
        [FsKind::Ext4, FsKind::Ext2, FsKind::Tmpfs]
            .into_iter()
            .find(|k| k.name() == s)
    }

    /// Whether its shared writable mappings start write-protected
    /// (`vma_wants_writenotify`: ext2 and ext4 have `page_mkwrite` and a
    /// writeback-capable device).
    pub fn writenotify(self) -> bool {
        matches!(self, FsKind::Ext4 | FsKind::Ext2)
    }

    /// `shmem_mapping`: its files are shmem's.
    pub fn shmem(self) -> bool {
        matches!(self, FsKind::Tmpfs | FsKind::ShmMnt)
    }

    /// `mapping_large_folio_support` for this filesystem's regular files.
    pub fn large_folios(self) -> bool {
        matches!(self, FsKind::Ext4)
    }
}

/// Where an inode's bytes live below its page cache.
pub enum Backing {
    /// The blocks of a file this machine made, by page index; a block
    /// never written is a hole.
    Blocks(Mutex<HashMap<u64, Box<[u8]>>>),
    /// A host file, read-only.
    Host(std::fs::File),
}

static NEXT_INO: AtomicU64 = AtomicU64::new(2);

/// `struct inode`, for a regular file.
pub struct Inode {
    pub ino: u64,
    pub kind: FsKind,
    /// `i_size`, in bytes.
    i_size: AtomicU64,
    /// `i_mapping`: the page cache and the mappings of the file.
    pub i_mapping: AddressSpace,
    backing: Backing,
    /// Where the page cache's folios go back to when it is evicted.
    mem: Arc<PhysMem>,
    /// A host file's path, for reports; None for the machine's own.
    pub host_path: Option<std::path::PathBuf>,
    /// A host file's device and inode number: the same host file opened
    /// twice is one inode, as the kernel has one.
    pub host_id: Option<(u64, u64)>,
    /// The pages charged to the overcommit commitment for this inode (a
    /// shared anonymous mapping's whole size, `shmem_acct_size`), and
    /// what gives them back when the inode goes.
    acct: Mutex<Option<Accounted>>,
}

/// Pages charged to the overcommit commitment, and what gives them back.
type Accounted = (u64, Box<dyn FnOnce(u64) + Send>);

impl std::fmt::Debug for Inode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Inode({} {} size={})",
            self.ino,
            self.kind.name(),
            self.size()
        )
    }
}

impl Inode {
    fn new(
        mem: &Arc<PhysMem>,
        kind: FsKind,
        size: u64,
        backing: Backing,
        host_path: Option<std::path::PathBuf>,
    ) -> Arc<Inode> {
        Arc::new_cyclic(|me| Inode {
            ino: NEXT_INO.fetch_add(1, Ordering::Relaxed),
            kind,
            i_size: AtomicU64::new(size),
            i_mapping: AddressSpace::new(kind.large_folios(), kind.shmem(), me.clone()),
            backing,
            mem: mem.clone(),
            host_id: host_path.as_ref().and_then(|p| {
                use std::os::unix::fs::MetadataExt;
                std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
            }),
            host_path,
            acct: Mutex::new(None),
        })
    }

    /// An empty regular file of `size` bytes on a filesystem of `kind`
    /// (`ftruncate` of a new file: every block a hole).
    pub(crate) fn create(mem: &Arc<PhysMem>, kind: FsKind, size: u64) -> Arc<Inode> {
        Inode::new(
            mem,
            kind,
            size,
            Backing::Blocks(Mutex::new(HashMap::new())),
            None,
        )
    }

    /// A host file, read-only; it is read when its pages are first needed.
    /// The file as it stands is what this inode holds: one that changes on
    /// the host meanwhile is read as it is then.
    pub(crate) fn open_host(
        mem: &Arc<PhysMem>,
        path: &std::path::Path,
    ) -> std::io::Result<Arc<Inode>> {
        let file = std::fs::File::open(path)?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(std::io::Error::other(format!(
                "{}: not a regular file",
                path.display()
            )));
        }
        Ok(Inode::new(
            mem,
            FsKind::Ext4,
            meta.len(),
            Backing::Host(file),
            Some(path.to_path_buf()),
        ))
    }

    /// `i_size_read`.
    #[inline]
    pub fn size(&self) -> u64 {
        self.i_size.load(Ordering::Acquire)
    }

    /// `i_size_write`: the caller holds what serialises size changes
    /// (`inode_lock`, in the kernel).
    pub(crate) fn set_size(&self, size: u64) {
        self.i_size.store(size, Ordering::Release);
    }

    /// Charge `pages` to this inode, given back by `release` when it goes
    /// (`shmem_acct_size` / `shmem_unacct_size`).
    pub fn set_accounted(&self, pages: u64, release: Box<dyn FnOnce(u64) + Send>) {
        *self.acct.lock() = Some((pages, release));
    }

    /// The pages charged to this inode.
    pub fn accounted_pages(&self) -> u64 {
        self.acct.lock().as_ref().map_or(0, |(p, _)| *p)
    }

    /// Whether the inode's bytes may be written (a host file may not).
    pub fn writable(&self) -> bool {
        matches!(self.backing, Backing::Blocks(_))
    }

    /// The page index one past the last page holding a byte of the file
    /// (`DIV_ROUND_UP(i_size, PAGE_SIZE)`).
    pub fn size_pages(&self) -> u64 {
        self.size().div_ceil(PAGE_SIZE)
    }

    /// Read page `index` of the file from below the page cache into frame
    /// `pfn` (the `read_folio` of one page): zeroes past EOF and in holes.
    pub(crate) fn read_page(&self, mem: &PhysMem, index: u64, pfn: u64) {
        let mut buf = vec![0u8; PAGE_SIZE as usize];
        let pos = index << PAGE_SHIFT;
        let size = self.size();
        if pos < size {
            let want = ((size - pos).min(PAGE_SIZE)) as usize;
            match &self.backing {
                Backing::Blocks(blocks) => {
                    if let Some(b) = blocks.lock().get(&index) {
                        buf[..want].copy_from_slice(&b[..want]);
                    }
                }
                Backing::Host(file) => {
                    use std::os::unix::fs::FileExt;
                    let mut done = 0;
                    while done < want {
                        match file.read_at(&mut buf[done..want], pos + done as u64) {
                            Ok(0) | Err(_) => break, // shrunk on the host: zeroes
                            Ok(n) => done += n,
                        }
                    }
                }
            }
        }
        mem.write_frame(pfn, 0, &buf);
    }

    /// Write frame `pfn`, page `index` of the file, to the blocks below the
    /// page cache (`writepage`); the part past EOF is not kept.
    pub(crate) fn write_page(&self, mem: &PhysMem, index: u64, pfn: u64) {
        let Backing::Blocks(blocks) = &self.backing else {
            debug_assert!(false, "writeback of a read-only host file");
            return;
        };
        let mut buf = vec![0u8; PAGE_SIZE as usize].into_boxed_slice();
        mem.read_frame(pfn, 0, &mut buf);
        blocks.lock().insert(index, buf);
    }

    /// Drop the blocks from page `from` on, and zero the rest of the page
    /// that holds byte `size` (the disk side of a truncate).
    /// A hole punched in bytes `start..end` of a file this machine
    /// made: the blocks wholly inside go, the parts of the others inside
    /// read zeroes.
    pub(crate) fn punch_blocks(&self, start: u64, end: u64) {
        let Backing::Blocks(blocks) = &self.backing else {
            return;
        };
        let mut b = blocks.lock();
        for (&i, block) in b.iter_mut() {
            let from = i << PAGE_SHIFT;
            let (lo, hi) = (start.max(from), end.min(from + PAGE_SIZE));
            if lo < hi {
                block[(lo - from) as usize..(hi - from) as usize].fill(0);
            }
        }
        b.retain(|&i, _| !(start <= i << PAGE_SHIFT && (i + 1) << PAGE_SHIFT <= end));
    }

    pub(crate) fn truncate_blocks(&self, size: u64) {
        let Backing::Blocks(blocks) = &self.backing else {
            return;
        };
        let mut b = blocks.lock();
        let first_gone = size.div_ceil(PAGE_SIZE);
        b.retain(|&i, _| i < first_gone);
        if !size.is_multiple_of(PAGE_SIZE) {
            if let Some(last) = b.get_mut(&(size >> PAGE_SHIFT)) {
                last[(size % PAGE_SIZE) as usize..].fill(0);
            }
        }
    }
}

impl Drop for Inode {
    /// `evict` → `truncate_inode_pages_final`: the page cache goes with
    /// the inode. Nothing maps it any more (every mapping held the file),
    /// and no rmap walk can be inside it (a walker holds a mapping, or the
    /// folio lock, which the removal takes first).
    fn drop(&mut self) {
        let mem = self.mem.clone();
        // truncate_inode_pages_range's folio_batch_release drains the LRU
        // batches of the CPU that evicts (the one whose last fput this
        // is), once it has found a folio.
        if self.i_mapping.nrpages() > 0 {
            mem.lru_add_drain_here();
        }
        // Freed from no CPU: straight to the buddy lists.
        self.i_mapping.remove_all(&mem, mem.vmstat.no_cpu(), |_| ());
        if let Some((pages, release)) = self.acct.get_mut().take() {
            release(pages);
        }
    }
}

/// `f_mode`: how a file was opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FMode {
    pub read: bool,
    pub write: bool,
}

/// `struct file`: an open file, as file descriptors and VMAs hold it.
pub struct File {
    pub inode: Arc<Inode>,
    pub f_mode: FMode,
    /// `f_ra`: the readahead state of this open file.
    pub f_ra: Mutex<FileRaState>,
    /// The file behind shared anonymous memory (`shmem_zero_setup`): no
    /// descriptor holds it, so the last VMA that maps it going is its
    /// last `fput`, which evicts its inode.
    pub shared_anon: bool,
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "File({:?} {:?})", self.inode, self.f_mode)
    }
}

impl File {
    /// `open(2)` of `inode`: EACCES for writing a read-only host file.
    pub fn open(inode: &Arc<Inode>, f_mode: FMode) -> KResult<Arc<File>> {
        if f_mode.write && !inode.writable() {
            return Err(Errno::EACCES);
        }
        Ok(Arc::new(File {
            inode: inode.clone(),
            f_mode,
            f_ra: Mutex::new(FileRaState::new()),
            shared_anon: false,
        }))
    }

    /// The file of shared anonymous memory (`shmem_zero_setup`), open for
    /// reading and writing.
    pub fn open_shared_anon(inode: &Arc<Inode>) -> Arc<File> {
        Arc::new(File {
            inode: inode.clone(),
            f_mode: FMode {
                read: true,
                write: true,
            },
            f_ra: Mutex::new(FileRaState::new()),
            shared_anon: true,
        })
    }

    #[inline]
    pub fn mapping(&self) -> &AddressSpace {
        &self.inode.i_mapping
    }
}

/// `struct file_ra_state`: the readahead window of an open file.
#[derive(Clone, Copy, Debug, Default)]
pub struct FileRaState {
    /// Where the current window starts (a page index).
    pub start: u64,
    /// Its size, in pages.
    pub size: u64,
    /// How many of its last pages start the next window when read
    /// (`PG_readahead` marks the first of them).
    pub async_size: u64,
    /// `ra_pages`: the largest window (`read_ahead_kb` / 4).
    pub ra_pages: u64,
    /// `mmap_miss`: faults that found their page missing, less those
    /// that found it cached; past `MMAP_LOTSAMISS`, read-around stops.
    pub mmap_miss: u32,
    /// The folio order the window was last read with (`ra->order`, v6.10+).
    pub order: u32,
    /// `prev_pos`.
    pub prev_pos: u64,
}

/// `VM_READAHEAD_PAGES`: the default `read_ahead_kb` of 128 KiB.
pub const VM_READAHEAD_PAGES: u64 = (128 * 1024) >> PAGE_SHIFT;

impl FileRaState {
    /// `file_ra_state_init`.
    pub fn new() -> FileRaState {
        FileRaState {
            ra_pages: VM_READAHEAD_PAGES,
            prev_pos: u64::MAX,
            ..FileRaState::default()
        }
    }
}

/// A folio of the page cache, as a lookup lends it: the folio and the
/// index of its first page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachedFolio {
    pub folio: Folio,
    pub index: u64,
}

/// `vma_link_file`: a new file VMA joins its file's `i_mmap`, so that the
/// file's rmap walks find it. Called once per VMA, when it is made.
pub fn vma_link_file(vma: &Arc<crate::mm::Vma>) {
    if let Some(file) = vma.file() {
        file.mapping().i_mmap_insert(vma);
    }
}

/// `unlink_file_vma`: a VMA leaving for good leaves its file's `i_mmap`.
/// Unlinking one that is not linked (again) does nothing.
pub fn unlink_file_vma(vma: &crate::mm::Vma) {
    if let Some(file) = vma.file() {
        file.mapping().i_mmap_remove(vma);
    }
}
