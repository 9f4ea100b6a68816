//! Standard output that a closed reader cannot crash.
//!
//! `println!` panics when stdout is a pipe whose reader has gone
//! (`usermm bench | head -1`). [`outln!`] writes the same text, and on the
//! first failed write marks stdout closed: later writes are dropped and
//! long runs can ask [`closed`] whether anyone still reads, so they end
//! early, quietly, cleaning up as on any other return.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

static CLOSED: AtomicBool = AtomicBool::new(false);

/// Write formatted text to stdout, unless it was found closed.
pub fn write(args: std::fmt::Arguments) {
    if CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let mut out = std::io::stdout().lock();
    if out.write_fmt(args).and_then(|()| out.flush()).is_err() {
        CLOSED.store(true, Ordering::Relaxed);
    }
}

/// Whether a write to stdout has failed (its reader is gone).
pub fn closed() -> bool {
    CLOSED.load(Ordering::Relaxed)
}

/// `println!` that never panics (see the module doc).
#[macro_export]
macro_rules! outln {
    () => { $crate::out::write(format_args!("\n")) };
    ($($t:tt)*) => { $crate::out::write(format_args!("{}\n", format_args!($($t)*))) };
}

/// `print!` that never panics.
#[macro_export]
macro_rules! out {
    ($($t:tt)*) => { $crate::out::write(format_args!($($t)*)) };
}
