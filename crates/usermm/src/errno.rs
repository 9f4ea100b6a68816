//! The kernel's error numbers, as the system calls of the model return them.

use std::fmt;

/// An errno value. The numbers are Linux's (x86-64), so that results can be
/// compared with the host kernel's.
#[derive(Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Errno(pub i32);

impl Errno {
    pub const EPERM: Errno = Errno(1);
    pub const ENOENT: Errno = Errno(2);
    pub const EINTR: Errno = Errno(4);
    pub const EIO: Errno = Errno(5);
    pub const E2BIG: Errno = Errno(7);
    pub const ENOEXEC: Errno = Errno(8);
    pub const EBADF: Errno = Errno(9);
    pub const EAGAIN: Errno = Errno(11);
    pub const ENOMEM: Errno = Errno(12);
    pub const EACCES: Errno = Errno(13);
    pub const EFAULT: Errno = Errno(14);
    pub const EBUSY: Errno = Errno(16);
    pub const EEXIST: Errno = Errno(17);
    pub const ENODEV: Errno = Errno(19);
    pub const ENOTDIR: Errno = Errno(20);
    pub const EISDIR: Errno = Errno(21);
    pub const EINVAL: Errno = Errno(22);
    pub const ENOSYS: Errno = Errno(38);
    pub const ELOOP: Errno = Errno(40);
    pub const EOVERFLOW: Errno = Errno(75);
    pub const ELIBBAD: Errno = Errno(80);
    pub const EOPNOTSUPP: Errno = Errno(95);
    /// Not a system call's here: a scenario's wait that ran out.
    pub const ETIMEDOUT: Errno = Errno(110);
    /// Not an errno: a user access that took SIGBUS (a file mapping's
    /// page at or past the end of its file), as EFAULT stands for the
    /// SIGSEGV of an access nothing maps.
    pub const SIGBUS: Errno = Errno(-7);

    pub fn name(self) -> &'static str {
        match self.0 {
            1 => "EPERM",
            2 => "ENOENT",
            4 => "EINTR",
            5 => "EIO",
            7 => "E2BIG",
            8 => "ENOEXEC",
            9 => "EBADF",
            11 => "EAGAIN",
            12 => "ENOMEM",
            13 => "EACCES",
            14 => "EFAULT",
            16 => "EBUSY",
            17 => "EEXIST",
            19 => "ENODEV",
            20 => "ENOTDIR",
            21 => "EISDIR",
            22 => "EINVAL",
            38 => "ENOSYS",
            40 => "ELOOP",
            75 => "EOVERFLOW",
            80 => "ELIBBAD",
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
            Errno::EINTR,
            Errno::EIO,
            Errno::E2BIG,
            Errno::ENOEXEC,
            Errno::EBADF,
            Errno::EAGAIN,
            Errno::ENOMEM,
            Errno::EACCES,
            Errno::EFAULT,
            Errno::EBUSY,
            Errno::EEXIST,
            Errno::ENODEV,
            Errno::ENOTDIR,
            Errno::EISDIR,
            Errno::EINVAL,
            Errno::ENOSYS,
            Errno::ELOOP,
            Errno::EOVERFLOW,
            Errno::ELIBBAD,
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
