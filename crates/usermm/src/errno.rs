//! The kernel's error numbers, as the system calls of the model return them.

use std::fmt;

/// An errno value. The numbers are Linux's (x86-64), so that results can be
/// compared with the host kernel's.
#[derive(Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Errno(pub i32);

impl Errno {
    pub const EPERM: Errno = Errno(1);
    pub const ENOENT: Errno = Errno(2);
    pub const EBADF: Errno = Errno(9);
    pub const EINTR: Errno = Errno(4);
    pub const EIO: Errno = Errno(5);
    pub const EAGAIN: Errno = Errno(11);
    pub const ENOMEM: Errno = Errno(12);
    pub const EACCES: Errno = Errno(13);
    pub const EFAULT: Errno = Errno(14);
    pub const EBUSY: Errno = Errno(16);
    pub const EEXIST: Errno = Errno(17);
    pub const ENODEV: Errno = Errno(19);
    pub const EINVAL: Errno = Errno(22);
    pub const EOVERFLOW: Errno = Errno(75);
    /// Not a system call's here: a scenario's wait that ran out.
    pub const ETIMEDOUT: Errno = Errno(110);
    pub const EOPNOTSUPP: Errno = Errno(95);
    /// Not an errno: a user access that took SIGBUS (a file mapping's
    /// page at or past the end of its file), as EFAULT stands for the
    /// SIGSEGV of an access nothing maps.
    pub const SIGBUS: Errno = Errno(-7);

    pub fn name(self) -> &'static str {
        match self.0 {
            1 => "EPERM",
            2 => "ENOENT",
            9 => "EBADF",
            4 => "EINTR",
            5 => "EIO",
            11 => "EAGAIN",
            12 => "ENOMEM",
            13 => "EACCES",
            14 => "EFAULT",
            16 => "EBUSY",
            17 => "EEXIST",
            19 => "ENODEV",
            22 => "EINVAL",
            75 => "EOVERFLOW",
            95 => "EOPNOTSUPP",
            110 => "ETIMEDOUT",
            -7 => "SIGBUS",
            _ => "E?",
        }
    }

    pub fn from_name(name: &str) -> Option<Errno> {
        [
            Errno::EPERM,
            Errno::ENOENT,
            Errno::EBADF,
            Errno::EINTR,
            Errno::EIO,
            Errno::EAGAIN,
            Errno::ENOMEM,
            Errno::EACCES,
            Errno::EFAULT,
            Errno::EBUSY,
            Errno::EEXIST,
            Errno::ENODEV,
            Errno::EINVAL,
            Errno::EOVERFLOW,
            Errno::EOPNOTSUPP,
            Errno::ETIMEDOUT,
            Errno::SIGBUS,
        ]
        .into_iter()
        .find(|e| e.name() == name)
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.name(), self.0)
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl std::error::Error for Errno {}

pub type KResult<T> = Result<T, Errno>;
