//! Files of the data directory.

use std::fs;
use std::path::{Path, PathBuf};

/// Moves a file of the data directory that is not what it should be aside,
/// to `<name>.bad-<now as unix ms>`, for an operator to look at; returns
/// where, or `None` when it could not be moved.
pub(crate) fn set_aside(path: &Path, now: u64) -> Option<PathBuf> {
    let mut name = path.file_name()?.to_os_string();
    name.push(format!(".bad-{now}"));
    let aside = path.with_file_name(name);
    fs::rename(path, &aside).ok().map(|()| aside)
}
