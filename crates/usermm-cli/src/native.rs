//! The same operations on the host kernel, through libc.

use std::time::Instant;

const THP: &str = "/sys/kernel/mm/transparent_hugepage";

const MIN_FREE_KBYTES: &str = "/proc/sys/vm/min_free_kbytes";

/// The host's `min_free_kbytes` from before its THP knobs were changed.
/// Enabling 2 MiB THPs raises it (khugepaged's recommended reserve);
/// disabling them computes it afresh, unless the administrator has set
/// it (`vm.min_free_kbytes`), in which case the kernel keeps the raised
/// value. [`MinFreeKbytes::put_back`] writes the old value back only in
/// that case: where the kernel has lowered it by itself, a write would
/// make the value the administrator's.
#[derive(Clone, Copy)]
pub struct MinFreeKbytes(Option<u64>);

impl MinFreeKbytes {
    pub fn read() -> MinFreeKbytes {
        MinFreeKbytes(
            std::fs::read_to_string(MIN_FREE_KBYTES)
                .ok()
                .and_then(|s| s.trim().parse().ok()),
        )
    }

    /// After the THP knobs were put back: the old reserve, if the host
    /// kept a larger one.
    pub fn put_back(self) {
        if let (Some(old), MinFreeKbytes(Some(now))) = (self.0, MinFreeKbytes::read()) {
            if now > old {
                let _ = std::fs::write(MIN_FREE_KBYTES, old.to_string());
            }
        }
    }
}

/// Host mTHP knobs set for one folio size, restored on drop.
pub struct HostKnobs {
    saved: Vec<(String, String)>,
    min_free_kbytes: MinFreeKbytes,
}

fn read_mode(path: &str) -> Option<String> {
    let s = std::fs::read_to_string(path).ok()?;
    let start = s.find('[')? + 1;
    let end = s.find(']')?;
    Some(s[start..end].to_string())
}

impl HostKnobs {
    /// Make `folio_kb` the only enabled anonymous size (top level never),
    /// or with `shmem` the only size shmem takes (`shmem_enabled`, the
    /// top level never). Fails when not root or the kernel lacks the knob.
    pub fn only_size(folio_kb: u64, shmem: bool) -> Result<HostKnobs, String> {
        let knob = if shmem { "shmem_enabled" } else { "enabled" };
        let mut files = vec![format!("{THP}/{knob}")];
        let sizes: &[u64] = if shmem {
            &[8, 16, 32, 64, 128, 256, 512, 1024, 2048]
        } else {
            &[16, 32, 64, 128, 256, 512, 1024, 2048]
        };
        for kb in sizes {
            files.push(format!("{THP}/hugepages-{kb}kB/{knob}"));
        }
        let min_free_kbytes = MinFreeKbytes::read();
        let mut saved = vec![];
        for f in &files {
            saved.push((
                f.clone(),
                read_mode(f).ok_or_else(|| format!("cannot read {f}"))?,
            ));
        }
        let k = HostKnobs {
            saved,
            min_free_kbytes,
        };
        for (f, old) in &k.saved {
            let want = if f.ends_with(&format!("hugepages-{folio_kb}kB/{knob}")) {
                "always"
            } else {
                "never"
            };
            crate::knob_guard::changing(f, old);
            std::fs::write(f, want).map_err(|e| format!("cannot set {f}: {e}"))?;
        }
        Ok(k)
    }
}

/// The host's knobs for one folio size at a time, held across the rounds
/// of a size and changed only when the size does: each change of the
/// top-level THP knob wakes khugepaged, whose scans of the engine's memory
/// (a MADV_HUGEPAGE mapping) would run beside the rounds.
#[derive(Default)]
pub struct KnobsBySize {
    held: Option<(u64, HostKnobs)>,
}

impl KnobsBySize {
    /// The knobs for `folio_kb` (shmem's with `shmem`), as
    /// [`HostKnobs::only_size`] sets them.
    pub fn only_size(&mut self, folio_kb: u64, shmem: bool) -> Result<(), String> {
        if self.held.as_ref().is_some_and(|(kb, _)| *kb == folio_kb) {
            return Ok(());
        }
        // The former size's knobs are put back before the new are read.
        self.held = None;
        self.held = Some((folio_kb, HostKnobs::only_size(folio_kb, shmem)?));
        Ok(())
    }
}

impl Drop for HostKnobs {
    fn drop(&mut self) {
        for (f, v) in &self.saved {
            if std::fs::write(f, v).is_ok() {
                crate::knob_guard::restored(f);
            }
        }
        self.min_free_kbytes.put_back();
    }
}

/// `anon_fault_alloc` of one size, to verify what the host gave us.
pub fn anon_fault_alloc(folio_kb: u64) -> u64 {
    mthp_stat(folio_kb, "anon_fault_alloc")
}

/// One size's mTHP statistic (`hugepages-<size>kB/stats/<name>`), 0
/// where the host has none.
pub fn mthp_stat(folio_kb: u64, name: &str) -> u64 {
    std::fs::read_to_string(format!("{THP}/hugepages-{folio_kb}kB/stats/{name}"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Populate `len` bytes by write faults and munmap them; (populate s, munmap s).
pub fn populate_munmap(len: usize) -> (f64, f64) {
    let mut r = HostRegion::map(len);
    let populate = r.touch();
    (populate, r.munmap())
}

/// A file of `len` bytes in the temporary folder, written in `chunk`-byte
/// writes and `fsync`ed (untimed), then timed: its private read-only
/// mapping read a byte a page, and the munmap of it (the file still open).
pub fn file_read_munmap(len: usize, chunk: usize) -> std::io::Result<(f64, f64)> {
    use std::io::Write;
    use std::os::unix::io::AsRawFd;
    let path = std::env::temp_dir().join(format!("usermm-bench-{}.file", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)?;
    std::fs::remove_file(&path)?;
    let buf = vec![1u8; chunk];
    let mut done = 0;
    while done < len {
        let n = chunk.min(len - done);
        f.write_all(&buf[..n])?;
        done += n;
    }
    f.sync_all()?;
    // SAFETY: a private read-only mapping of our own file; checked below.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            f.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    let t = Instant::now();
    for off in (0..len).step_by(4096) {
        // SAFETY: inside the mapping, within the file.
        unsafe { std::ptr::read_volatile((ptr as *const u8).add(off)) };
    }
    let populate = t.elapsed().as_secs_f64();
    let t = Instant::now();
    // SAFETY: unmapping exactly what we mapped.
    unsafe { libc::munmap(ptr, len) };
    let unmap = t.elapsed().as_secs_f64();
    drop(f);
    Ok((populate, unmap))
}

/// An anonymous private mapping on the host, populated by write faults.
pub struct HostRegion {
    pub ptr: *mut libc::c_void,
    pub len: usize,
    mapped: bool,
    /// The file a file-backed region maps, kept open (as a program keeps
    /// its descriptor), so that an unmap does not also evict the file.
    _file: Option<std::fs::File>,
}

impl HostRegion {
    /// Map `len` bytes of anonymous private memory, not yet touched.
    pub fn map(len: usize) -> HostRegion {
        // SAFETY: an anonymous private mapping of our own; checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(ptr != libc::MAP_FAILED, "host mmap failed");
        HostRegion {
            ptr,
            len,
            mapped: true,
            _file: None,
        }
    }

    /// Write one byte per page (the write faults); returns the time taken.
    pub fn touch(&mut self) -> f64 {
        let t = Instant::now();
        for off in (0..self.len).step_by(4096) {
            // SAFETY: inside the mapping.
            unsafe { std::ptr::write_volatile((self.ptr as *mut u8).add(off), 1) };
        }
        t.elapsed().as_secs_f64()
    }

    /// Map and populate `len` bytes. With `split_pmd`, every PMD-mapped THP
    /// is then remapped by PTEs (cow.c's trick: make one page read-only,
    /// which splits the PMD, and restore it).
    pub fn populate(len: usize, split_pmd: bool) -> HostRegion {
        let mut r = HostRegion::map(len);
        r.touch();
        if split_pmd {
            let base = r.ptr as usize;
            let first = (base + (2 << 20) - 1) & !((2 << 20) - 1);
            for blk in (first..base + len).step_by(2 << 20) {
                let page = (blk + 4096) as *mut libc::c_void;
                // SAFETY: one page inside the mapping.
                unsafe {
                    libc::mprotect(page, 4096, libc::PROT_READ);
                    libc::mprotect(page, 4096, libc::PROT_READ | libc::PROT_WRITE);
                }
            }
        }
        r
    }

    /// `len` bytes of shared anonymous memory, write-faulted a byte a
    /// page, its shmem file held open (through `/proc/self/map_files`,
    /// which needs CAP_SYS_ADMIN) so that an unmap does not also evict
    /// it; with `nohuge`, the range is then `MADV_NOHUGEPAGE`, its
    /// mappings zapped and faulted again, so that the cached PMD-sized
    /// folios are mapped by PTEs.
    pub fn populate_shmem(len: usize, nohuge: bool) -> std::io::Result<HostRegion> {
        // SAFETY: a shared anonymous mapping of our own; checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let mut r = HostRegion {
            ptr,
            len,
            mapped: true,
            _file: None,
        };
        let start = ptr as usize;
        r._file = Some(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(format!("/proc/self/map_files/{start:x}-{:x}", start + len))?,
        );
        r.touch();
        if nohuge {
            // SAFETY: advice on our own mapping.
            unsafe {
                libc::madvise(ptr, len, libc::MADV_NOHUGEPAGE);
                libc::madvise(ptr, len, libc::MADV_DONTNEED);
            }
            r.touch();
        }
        Ok(r)
    }

    /// A file of `len` bytes in the temporary folder, written in
    /// `chunk`-byte writes (on a filesystem with large folios, the page
    /// cache then holds folios of that size) and `fsync`ed, mapped private
    /// and read-only, and read a byte a page; with `nohuge`, the range is
    /// `MADV_NOHUGEPAGE` first, so that a PMD-sized folio is mapped by
    /// PTEs. The file is unlinked at once: the region keeps it open.
    pub fn populate_file(len: usize, chunk: usize, nohuge: bool) -> std::io::Result<HostRegion> {
        use std::io::Write;
        use std::os::unix::io::AsRawFd;
        let path = std::env::temp_dir().join(format!("usermm-bench-{}.file", std::process::id()));
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        std::fs::remove_file(&path)?;
        let buf = vec![1u8; chunk];
        let mut done = 0;
        while done < len {
            let n = chunk.min(len - done);
            f.write_all(&buf[..n])?;
            done += n;
        }
        f.sync_all()?;
        // SAFETY: a private read-only mapping of our own file; checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                f.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        if nohuge {
            // SAFETY: advice on our own mapping.
            unsafe { libc::madvise(ptr, len, libc::MADV_NOHUGEPAGE) };
        }
        for off in (0..len).step_by(4096) {
            // SAFETY: inside the mapping, within the file.
            unsafe { std::ptr::read_volatile((ptr as *const u8).add(off)) };
        }
        Ok(HostRegion {
            ptr,
            len,
            mapped: true,
            _file: Some(f),
        })
    }

    /// Time one munmap of the whole region.
    pub fn munmap(&mut self) -> f64 {
        let t = Instant::now();
        // SAFETY: unmapping exactly what we mapped.
        unsafe { libc::munmap(self.ptr, self.len) };
        self.mapped = false;
        t.elapsed().as_secs_f64()
    }

    /// Time one MADV_DONTNEED of the whole region.
    pub fn dontneed(&mut self) -> f64 {
        let t = Instant::now();
        // SAFETY: our own mapping.
        unsafe { libc::madvise(self.ptr, self.len, libc::MADV_DONTNEED) };
        t.elapsed().as_secs_f64()
    }

    /// Time one fork() in the parent; the child exits at once and is reaped
    /// outside the timing.
    pub fn fork(&mut self) -> f64 {
        let t = Instant::now();
        // SAFETY: the child only calls _exit, which is async-signal-safe.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: leave the child without running any destructor.
            unsafe { libc::_exit(0) };
        }
        let dt = t.elapsed().as_secs_f64();
        assert!(pid > 0, "host fork failed");
        let mut status = 0;
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        dt
    }
}

impl HostRegion {
    /// Fork a child that exits at once, reap it, then time a write of one
    /// byte to every page: each a write fault on a PTE the fork
    /// write-protected, of a folio that only this process maps again.
    pub fn write_after_fork(&mut self) -> f64 {
        self.fork();
        let t = Instant::now();
        for off in (0..self.len).step_by(4096) {
            // SAFETY: inside our own mapping, read-write.
            unsafe { std::ptr::write_volatile((self.ptr as *mut u8).add(off), 2) };
        }
        t.elapsed().as_secs_f64()
    }
}

impl Drop for HostRegion {
    fn drop(&mut self) {
        if self.mapped {
            // SAFETY: unmapping exactly what we mapped.
            unsafe { libc::munmap(self.ptr, self.len) };
        }
    }
}

/// A field (in kB) of the /proc/self/smaps entries of the VMAs inside
/// `[start, start + len)`, summed.
pub fn smaps_range_kb(start: usize, len: usize, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut inside = false;
    let mut total = 0;
    for line in s.lines() {
        let mut words = line.split_whitespace();
        let first = words.next()?;
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                inside = a >= start && b <= start + len;
                continue;
            }
        }
        if inside && first == format!("{field}:") {
            total += words.next()?.parse::<u64>().ok()?;
        }
    }
    Some(total)
}

/// The host CPUs this process may run on, as the first call found them:
/// [`main`](crate) calls it before any thread is pinned, since a pinned
/// thread's own affinity (which the threads it spawns inherit) would say
/// one.
pub fn process_cpus() -> &'static [usize] {
    static CPUS: std::sync::OnceLock<Vec<usize>> = std::sync::OnceLock::new();
    CPUS.get_or_init(|| {
        // SAFETY: the set is zeroed, then filled by sched_getaffinity for
        // the calling thread (0) within its size; CPU_ISSET reads it.
        let cpus: Vec<usize> = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
                return vec![0];
            }
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &set))
                .collect()
        };
        if cpus.is_empty() {
            vec![0]
        } else {
            cpus
        }
    })
}

/// How many host CPUs this process may use ([`process_cpus`]).
pub fn host_cpus() -> usize {
    process_cpus().len()
}

/// Pin the calling thread to the `i`-th of this process's host CPUs,
/// modulo their number (as the reference programs pin their threads);
/// does nothing if the CPU cannot be had.
pub fn pin_to_cpu(i: usize) {
    let cpus = process_cpus();
    let cpu = cpus[i % cpus.len()];
    // SAFETY: the cpu_set_t is zeroed and filled by the libc helper before
    // sched_setaffinity reads it; 0 names the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Pin the calling thread to host CPU `cpu` ([`pin_to_cpu`]) until the
/// guard drops, which puts its former affinity back.
pub fn pin_thread(cpu: usize) -> AffinityRestore {
    let saved = AffinityRestore::save();
    pin_to_cpu(cpu);
    saved
}

/// The calling thread's CPU affinity, put back on drop.
#[must_use = "the affinity is put back as soon as the guard drops"]
pub struct AffinityRestore(libc::cpu_set_t);

impl AffinityRestore {
    fn save() -> AffinityRestore {
        // SAFETY: the set is zeroed, then filled by sched_getaffinity for
        // the calling thread (0), within its size.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set);
            AffinityRestore(set)
        }
    }
}

impl Drop for AffinityRestore {
    fn drop(&mut self) {
        // SAFETY: the set was filled by sched_getaffinity; 0 names the
        // calling thread.
        unsafe {
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.0);
        }
    }
}

/// What a TLB shootdown costs on this host, measured: the initiator's wait
/// per shootdown, and the time the target loses handling one; medians of
/// several calibrations, with the least and the most each gave (one
/// calibration on a shared host can be off by the whole cost).
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct ShootdownCost {
    pub send_ns: u64,
    pub recv_ns: u64,
    pub send_ns_range: [u64; 2],
    pub recv_ns_range: [u64; 2],
    /// Calibrations, and shootdowns in each.
    pub trials: usize,
    pub samples: u64,
}

/// Calibrate [`ShootdownCost`], `trials` times: each time CPU 0 zaps and
/// refaults one page (`MADV_DONTNEED`, then a write) `n` times, alone in
/// its process (the other thread asleep, so that its CPU is idle and no
/// flush goes to it) and then with that thread on CPU 1 spinning on loads
/// of another page of the same process (so that each zap's flush is an IPI
/// to it); the difference per zap is the send cost. The spinning thread's
/// loads per second, with CPU 0 sleeping and with it zapping, give the
/// receive cost. None if the host has fewer than two CPUs.
pub fn shootdown_cost(n: u64, trials: usize) -> Option<ShootdownCost> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    if host_cpus() < 2 || trials == 0 {
        return None;
    }
    let mut zapped = HostRegion::map(4096);
    zapped.touch();
    let mut other = HostRegion::map(4096);
    other.touch();
    let (zp, op) = (zapped.ptr as usize, other.ptr as usize);
    // The caller's affinity, restored on the way out: threads it spawns
    // later inherit it.
    let _restore = AffinityRestore::save();
    let zaps = |n: u64| -> f64 {
        let t = Instant::now();
        for i in 0..n {
            // SAFETY: `zp` is a live private anonymous page of this
            // process; MADV_DONTNEED on it is defined (it reads as zero
            // afterwards), and the write refaults it.
            unsafe {
                libc::madvise(zp as *mut libc::c_void, 4096, libc::MADV_DONTNEED);
                std::ptr::write_volatile(zp as *mut u64, i);
            }
        }
        t.elapsed().as_secs_f64()
    };
    pin_to_cpu(0);
    zaps(n / 10);
    let stop = AtomicBool::new(false);
    let go = AtomicBool::new(false);
    let spins = AtomicU64::new(0);
    let mut sends = Vec::with_capacity(trials);
    let mut recvs = Vec::with_capacity(trials);
    std::thread::scope(|s| {
        s.spawn(|| {
            pin_to_cpu(1);
            while !stop.load(Relaxed) {
                let mut k = 0u64;
                while go.load(Relaxed) && !stop.load(Relaxed) {
                    // SAFETY: `op` is a live page of this process, never
                    // zapped: a load of it is defined.
                    unsafe { std::ptr::read_volatile(op as *const u64) };
                    k += 1;
                    if k.is_multiple_of(4096) {
                        spins.fetch_add(4096, Relaxed);
                    }
                }
                // Asleep between the spins: CPU 1 idle, not sent to.
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        });
        for _ in 0..trials {
            std::thread::sleep(std::time::Duration::from_millis(5));
            let alone = zaps(n);
            go.store(true, Relaxed);
            std::thread::sleep(std::time::Duration::from_millis(5));
            // The spinner's rate with CPU 0 asleep, then with it zapping.
            let t = Instant::now();
            let s0 = spins.load(Relaxed);
            std::thread::sleep(std::time::Duration::from_secs_f64(alone.max(0.02)));
            let idle_rate = (spins.load(Relaxed) - s0) as f64 / t.elapsed().as_secs_f64();
            let s1 = spins.load(Relaxed);
            let busy = zaps(n);
            let busy_rate = (spins.load(Relaxed) - s1) as f64 / busy;
            go.store(false, Relaxed);
            let lost = if idle_rate > 0.0 {
                (1.0 - busy_rate / idle_rate).max(0.0) * busy
            } else {
                0.0
            };
            sends.push(((busy - alone) / n as f64).max(0.0) * 1e9);
            recvs.push(lost / n as f64 * 1e9);
        }
        stop.store(true, Relaxed);
    });
    sends.sort_by(f64::total_cmp);
    recvs.sort_by(f64::total_cmp);
    // The lower median, and the least and the most.
    let median = |v: &[f64]| v[(v.len() - 1) / 2] as u64;
    let range = |v: &[f64]| [v[0] as u64, v[v.len() - 1] as u64];
    Some(ShootdownCost {
        send_ns: median(&sends),
        recv_ns: median(&recvs),
        send_ns_range: range(&sends),
        recv_ns_range: range(&recvs),
        trials,
        samples: n,
    })
}

#[cfg(test)]
mod tests {
    /// No calibration is made for none; the medians of several lie within
    /// the least and the most they gave.
    #[test]
    fn shootdown_cost_medians_lie_within_their_range() {
        assert!(super::shootdown_cost(100, 0).is_none());
        if super::host_cpus() < 2 {
            assert!(super::shootdown_cost(100, 1).is_none());
            return;
        }
        let c = super::shootdown_cost(2_000, 3).expect("two host CPUs");
        assert_eq!((c.trials, c.samples), (3, 2_000));
        for (median, [least, most]) in [(c.send_ns, c.send_ns_range), (c.recv_ns, c.recv_ns_range)]
        {
            assert!(least <= median && median <= most, "{c:?}");
        }
    }
}
