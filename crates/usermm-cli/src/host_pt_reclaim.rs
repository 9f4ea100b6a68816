//! The seed's PT-reclaim loop of `bench pt_reclaim` on the host kernel.
//!
//! It runs in a fresh copy of this program (`usermm host-pt-reclaim MODE
//! ITERATIONS`), so that `VmPTE` counts the loop's tables and the
//! program's own, not the page tables that map the engine's memory in the
//! bench process. The child prints one JSON object with the figures of
//! `/proc/self/status` before and after the loop and the loop's seconds.

use std::process::Command;
use std::time::Instant;

use anyhow::{anyhow, bail, Context};
use serde::{Deserialize, Serialize};

pub const PAGE: usize = 4096;
pub const CHUNK: usize = 2 << 20;
/// The seed's mapping: 50 GiB.
pub const SEED_MAPPING: usize = 50 << 30;

/// How each 2 MiB chunk is given back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// One MADV_DONTNEED over the chunk (the seed's loop).
    Whole,
    /// Two MADV_DONTNEEDs of 1 MiB: no single zap covers the PTE table.
    Halves,
    /// One MADV_DONTNEED over a chunk that starts 4 KiB past a 2 MiB
    /// boundary: each call covers parts of two tables.
    Offset4k,
    /// MADV_FREE over the chunk, then MADV_PAGEOUT, which discards the
    /// clean lazyfree pages at once (the explicit discard that reclaim
    /// would do under memory pressure).
    Free,
}

impl Mode {
    pub const ALL: [Mode; 4] = [Mode::Whole, Mode::Halves, Mode::Offset4k, Mode::Free];

    /// Its place in [`Mode::ALL`].
    pub fn index(self) -> usize {
        let i = self as usize;
        debug_assert_eq!(Mode::ALL[i], self, "ALL lists the modes as declared");
        i
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::Whole => "whole",
            Mode::Halves => "halves",
            Mode::Offset4k => "offset4k",
            Mode::Free => "free",
        }
    }

    /// Where chunk 0 starts in the mapping.
    pub fn offset(self) -> usize {
        if self == Mode::Offset4k {
            PAGE
        } else {
            0
        }
    }

    /// The mapping's length for `iterations` chunks: the seed's 50 GiB,
    /// or more if the chunks need it (one more chunk when shifted).
    pub fn mapping_len(self, iterations: usize) -> usize {
        let chunks = iterations + usize::from(self == Mode::Offset4k);
        SEED_MAPPING.max(chunks * CHUNK)
    }

    /// The madvise calls that give back the chunk at `c`: (offset, length,
    /// advice) with Linux's advice numbers, which the engine shares.
    pub fn calls(self) -> &'static [(usize, usize, i32)] {
        const DONTNEED: i32 = 4;
        const FREE: i32 = 8;
        const PAGEOUT: i32 = 21;
        match self {
            Mode::Whole | Mode::Offset4k => &[(0, CHUNK, DONTNEED)],
            Mode::Halves => &[(0, CHUNK / 2, DONTNEED), (CHUNK / 2, CHUNK / 2, DONTNEED)],
            Mode::Free => &[(0, CHUNK, FREE), (0, CHUNK, PAGEOUT)],
        }
    }
}

/// `/proc/self/status` figures, in kB.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct Figures {
    pub vmsize_kb: u64,
    pub vmrss_kb: u64,
    pub vmpte_kb: u64,
}

/// One run of the loop.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct LoopResult {
    pub before: Figures,
    pub after: Figures,
    pub loop_s: f64,
    /// Whether the mapping started on a 2 MiB boundary (the kernel aligns
    /// anonymous mappings whose length is a multiple of 2 MiB).
    pub aligned: bool,
}

/// Run the loop in a fresh copy of this program and read its figures.
pub fn run(mode: Mode, iterations: usize) -> anyhow::Result<LoopResult> {
    let exe = std::env::current_exe().context("finding this program")?;
    let out = Command::new(exe)
        .args(["host-pt-reclaim", mode.name(), &iterations.to_string()])
        .output()
        .context("starting the host PT-reclaim loop")?;
    if !out.status.success() {
        bail!(
            "host PT-reclaim loop ({}): {}{}",
            mode.name(),
            String::from_utf8_lossy(&out.stderr).trim(),
            out.status
        );
    }
    serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "host PT-reclaim loop printed {:?}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// `usermm host-pt-reclaim MODE ITERATIONS`: run the loop here and print
/// its figures as JSON.
pub fn main(mode: Mode, iterations: usize) -> anyhow::Result<i32> {
    let r = run_here(mode, iterations)?;
    println!("{}", serde_json::to_string(&r)?);
    Ok(0)
}

fn status_kb(field: &str) -> anyhow::Result<u64> {
    let s = std::fs::read_to_string("/proc/self/status")?;
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow!("no {field} in /proc/self/status"))
}

fn figures() -> anyhow::Result<Figures> {
    Ok(Figures {
        vmsize_kb: status_kb("VmSize")?,
        vmrss_kb: status_kb("VmRSS")?,
        vmpte_kb: status_kb("VmPTE")?,
    })
}

fn os_err(what: &str) -> anyhow::Error {
    anyhow!("{what}: {}", std::io::Error::last_os_error())
}

fn run_here(mode: Mode, iterations: usize) -> anyhow::Result<LoopResult> {
    let len = mode.mapping_len(iterations);
    // SAFETY: a fresh private anonymous mapping; nothing else uses it.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(os_err("mmap"));
    }
    let base = p.cast::<u8>();
    let before = figures()?;
    let t = Instant::now();
    for i in 0..iterations {
        let off = mode.offset() + i * CHUNK;
        for o in (0..CHUNK).step_by(PAGE) {
            // SAFETY: inside the mapping made above (`mapping_len` holds
            // every chunk), written by this thread only.
            unsafe { base.add(off + o).write_volatile(1) };
        }
        for &(at, n, advice) in mode.calls() {
            // SAFETY: a range of the mapping made above.
            if unsafe { libc::madvise(base.add(off + at).cast(), n, advice) } != 0 {
                return Err(os_err("madvise"));
            }
        }
    }
    let loop_s = t.elapsed().as_secs_f64();
    let after = figures()?;
    // SAFETY: the mapping made above, not used after this.
    unsafe { libc::munmap(p, len) };
    Ok(LoopResult {
        before,
        after,
        loop_s,
        aligned: (base as usize).is_multiple_of(CHUNK),
    })
}
