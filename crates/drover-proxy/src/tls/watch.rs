//! Certificates read again when their files change, with no reload: a renewal tool
//! (certbot, acme.sh, cert-manager) that replaces the files is enough. Each listener's
//! files are looked at every `INTERVAL` (a `stat` each); a change is read once the files
//! have stayed as they are for one more interval, so a certificate written before its
//! key is not read half-renewed. Files that fail the checks change nothing, and are
//! tried again once they change again.

use super::{Certificates, Error};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// How often a listener's certificate files are looked at.
pub const INTERVAL: Duration = Duration::from_secs(2);

/// What a file was when it was looked at: any change says it was rewritten or replaced
/// (a symlink switched to another file, as certbot's `live/` links are, has another
/// inode). `None`: it could not be looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    len: u64,
    inode: u64,
    mtime: i64,
    mtime_nsec: i64,
}

impl Stamp {
    pub(crate) fn of(path: &Path) -> Option<Stamp> {
        let m = std::fs::metadata(path).ok()?;
        Some(Stamp {
            len: m.len(),
            inode: m.ino(),
            mtime: m.mtime(),
            mtime_nsec: m.mtime_nsec(),
        })
    }
}

/// One listener's watch over the files of the certificates it serves.
#[derive(Debug, Default)]
pub struct Watch {
    /// Files seen changed at the last look, to be read if they look the same at the next.
    settling: Option<Vec<Option<Stamp>>>,
    /// Files as they were when reading them last failed: not read again until they change.
    failed: Option<Vec<Option<Stamp>>>,
}

impl Watch {
    /// Looks at the files of `current` (the certificates in force): `None` while nothing
    /// is to be done, else what reading them again gave.
    pub fn look(&mut self, current: &Certificates) -> Option<Result<Certificates, Error>> {
        let now = current.stamps_now();
        if now == current.stamps {
            self.settling = None;
            return None;
        }
        if self.failed.as_ref() == Some(&now) {
            return None;
        }
        if self.settling.as_ref() != Some(&now) {
            self.settling = Some(now);
            return None;
        }
        self.settling = None;
        let read = Certificates::load(&current.settings).and_then(|read| {
            read.check_renewal_of(current, SystemTime::now())
                .map(|()| read)
        });
        self.failed = read.is_err().then_some(now);
        Some(read)
    }
}
