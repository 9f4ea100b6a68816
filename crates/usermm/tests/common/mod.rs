//! Helpers shared by the integration tests.

use std::sync::atomic::{AtomicBool, Ordering};

/// Stops the accessing CPUs when the driving closure ends, returning or
/// panicking: a failed operation must fail the test, not hang it.
pub struct StopOnDrop<'a>(pub &'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}
