//! The fork chain of `bench vma` on the host kernel.
//!
//! A chain of `depth` processes, each the child of the one before, is torn
//! down from the youngest up, and the teardown timed, as the engine's chain
//! is. The engine's processes have one VMA each; a host process has its
//! program's own (stack, data, heap), each chained to every ancestor's
//! anon_vmas as well. So the chain runs twice, with and without
//! [`EXTRA_VMAS`] extra 16-page private VMAs in each of which every process
//! writes its own copy of a page, and the difference, divided by their
//! number, is the host's cost of one VMA such as the engine's chain has
//! (several, so that the difference stands out of the run-to-run noise of
//! the program's own VMAs).
//!
//! The chain runs in a fresh copy of this program (`usermm
//! host-fork-chain`), whose address space is small: forking the bench
//! process itself would copy the engine's memory at every link. Each
//! process asks to be killed when its parent dies (`PR_SET_PDEATHSIG`), so
//! that nothing outlives a failed run.

use std::process::Command;
use std::time::Instant;

use anyhow::{anyhow, bail, Context};

/// Pages of each extra VMA, as the engine's chain maps.
const REGION_PAGES: usize = 16;
/// Extra VMAs of the run that has them.
const EXTRA_VMAS: usize = 8;
const PAGE: usize = 4096;

/// Seconds the host takes to tear down a chain of `depth` processes, for
/// the one VMA the engine's chain has: the time with it less the time
/// without.
pub fn teardown_one_vma(depth: usize) -> anyhow::Result<f64> {
    let with = run_helper(depth, EXTRA_VMAS)?;
    let without = run_helper(depth, 0)?;
    Ok((with - without) / EXTRA_VMAS as f64)
}

fn run_helper(depth: usize, vmas: usize) -> anyhow::Result<f64> {
    let exe = std::env::current_exe().context("finding this program")?;
    let out = Command::new(exe)
        .args(["host-fork-chain", &depth.to_string()])
        .args(["--vmas", &vmas.to_string()])
        .output()
        .context("starting the host fork chain")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "host fork chain of {depth}: {}{}",
            String::from_utf8_lossy(&out.stderr).trim(),
            out.status
        );
    }
    text.trim()
        .parse()
        .map_err(|_| anyhow!("host fork chain printed {text:?}"))
}

/// `usermm host-fork-chain DEPTH --vmas N`: build the chain in this
/// process, each with N extra VMAs, and print the teardown's seconds.
pub fn main(depth: usize, vmas: usize) -> anyhow::Result<i32> {
    if depth < 2 {
        bail!("a chain needs two processes or more");
    }
    let secs = chain(depth, vmas)?;
    println!("{secs}");
    Ok(0)
}

fn os_err(what: &str) -> anyhow::Error {
    anyhow!("{what}: {}", std::io::Error::last_os_error())
}

/// One 16-page private mapping, with a guard page after it so that the
/// next one does not merge with it.
fn map_region() -> anyhow::Result<*mut u8> {
    let len = (REGION_PAGES + 1) * PAGE;
    // SAFETY: a fresh private anonymous mapping; nothing else uses it.
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
    if p == libc::MAP_FAILED {
        return Err(os_err("mmap"));
    }
    // SAFETY: the last page of the mapping just made.
    if unsafe {
        libc::mprotect(
            p.cast::<u8>().add(REGION_PAGES * PAGE).cast(),
            PAGE,
            libc::PROT_NONE,
        )
    } != 0
    {
        return Err(os_err("mprotect"));
    }
    Ok(p.cast())
}

fn pipe() -> anyhow::Result<[libc::c_int; 2]> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe writes.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(os_err("pipe"));
    }
    Ok(fds)
}

/// Build the chain and time its teardown. Only this (top) process returns;
/// the others end in `_exit`, and between fork and exit they make only
/// async-signal-safe calls.
fn chain(depth: usize, vmas: usize) -> anyhow::Result<f64> {
    // `go`: the youngest waits for its end of file. `ready`: the youngest
    // writes one byte when the chain is complete; every other process
    // closes its copy, so that a broken chain reads as end of file.
    let go = pipe()?;
    let ready = pipe()?;
    let regions = (0..vmas)
        .map(|_| map_region())
        .collect::<anyhow::Result<Vec<_>>>()?;
    let touch = |i: usize| {
        for &a in &regions {
            // SAFETY: a mapping of this process's own, made above (private
            // to each process after its fork).
            unsafe { a.write_volatile(i as u8) };
        }
    };
    touch(0);
    // SAFETY: getpid has no preconditions.
    let top = unsafe { libc::getpid() };
    let mut child = 0;
    for i in 1..depth {
        // SAFETY: this program is single-threaded here (the helper starts
        // no threads), and the child makes only async-signal-safe calls.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            if i == 1 {
                return Err(os_err("fork"));
            }
            // SAFETY: ends this process of the chain; its parent's wait returns.
            unsafe { libc::_exit(2) };
        }
        if pid > 0 {
            child = pid;
            // SAFETY: closing our copy of a descriptor we own.
            unsafe { libc::close(ready[1]) };
            break;
        }
        // The child: die with the parent; stop if it is already gone.
        // SAFETY: prctl and getppid have no memory preconditions.
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::getppid() == 1 {
                libc::_exit(2);
            }
        }
        if i == 1 {
            // SAFETY: our copy of the write end; the top keeps its own.
            unsafe { libc::close(go[1]) };
        }
        touch(i);
        if i == depth - 1 {
            let mut b = 1u8;
            // SAFETY: one byte to and from buffers on this stack, then exit.
            unsafe {
                libc::write(ready[1], (&raw const b).cast(), 1);
                libc::read(go[0], (&raw mut b).cast(), 1);
                libc::_exit(0);
            }
        }
    }
    // SAFETY: getpid has no preconditions.
    if unsafe { libc::getpid() } != top {
        let mut status = 0;
        // SAFETY: waits for our own child, then ends this process.
        unsafe {
            libc::waitpid(child, &mut status, 0);
            libc::_exit(0);
        }
    }
    let mut b = 0u8;
    // SAFETY: one byte into a buffer on this stack.
    let n = unsafe { libc::read(ready[0], (&raw mut b).cast(), 1) };
    if n != 1 {
        let mut status = 0;
        // SAFETY: reaps our own child.
        unsafe { libc::waitpid(child, &mut status, 0) };
        bail!("the chain broke before it was complete (fork failed in it)");
    }
    let t = Instant::now();
    let mut status = 0;
    // SAFETY: closing our write end lets the youngest go; then wait for
    // our own child, which exits after its own.
    unsafe {
        libc::close(go[1]);
        libc::waitpid(child, &mut status, 0);
    }
    Ok(t.elapsed().as_secs_f64())
}
