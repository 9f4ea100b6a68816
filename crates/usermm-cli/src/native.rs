//! The same operations on the host kernel, through libc.

use std::time::Instant;

const THP: &str = "/sys/kernel/mm/transparent_hugepage";

/// Host mTHP knobs set for one folio size, restored on drop.
pub struct HostKnobs {
    saved: Vec<(String, String)>,
}

fn read_mode(path: &str) -> Option<String> {
    let s = std::fs::read_to_string(path).ok()?;
    let start = s.find('[')? + 1;
    let end = s.find(']')?;
    Some(s[start..end].to_string())
}

impl HostKnobs {
    /// Make `folio_kb` the only enabled anonymous size (top level never).
    /// Fails when not root or the kernel lacks the knob.
    pub fn only_size(folio_kb: u64) -> Result<HostKnobs, String> {
        let mut files = vec![format!("{THP}/enabled")];
        for kb in [16u64, 32, 64, 128, 256, 512, 1024, 2048] {
            files.push(format!("{THP}/hugepages-{kb}kB/enabled"));
        }
        let mut saved = vec![];
        for f in &files {
            saved.push((
                f.clone(),
                read_mode(f).ok_or_else(|| format!("cannot read {f}"))?,
            ));
        }
        let k = HostKnobs { saved };
        for f in &files {
            let want = if f.ends_with(&format!("hugepages-{folio_kb}kB/enabled")) {
                "always"
            } else {
                "never"
            };
            std::fs::write(f, want).map_err(|e| format!("cannot set {f}: {e}"))?;
        }
        Ok(k)
    }
}

impl Drop for HostKnobs {
    fn drop(&mut self) {
        for (f, v) in &self.saved {
            let _ = std::fs::write(f, v);
        }
    }
}

/// `anon_fault_alloc` of one size, to verify what the host gave us.
pub fn anon_fault_alloc(folio_kb: u64) -> u64 {
    std::fs::read_to_string(format!(
        "{THP}/hugepages-{folio_kb}kB/stats/anon_fault_alloc"
    ))
    .ok()
    .and_then(|s| s.trim().parse().ok())
    .unwrap_or(0)
}

/// Populate `len` bytes by write faults and munmap them; (populate s, munmap s).
pub fn populate_munmap(len: usize) -> (f64, f64) {
    // SAFETY: an anonymous private mapping of our own; checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert!(p != libc::MAP_FAILED, "host mmap failed");
    let t = Instant::now();
    for off in (0..len).step_by(4096) {
        // SAFETY: inside the mapping just made.
        unsafe { std::ptr::write_volatile((p as *mut u8).add(off), 1) };
    }
    let populate = t.elapsed().as_secs_f64();
    let t = Instant::now();
    // SAFETY: unmapping exactly what we mapped.
    unsafe { libc::munmap(p, len) };
    (populate, t.elapsed().as_secs_f64())
}
