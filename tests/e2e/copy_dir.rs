//! `copy_dir`: a recursive copy of a directory tree, for tests that plant edits in a copy of
//! a prompt bundle.
//!
//! Owns only the copy (symlinks are followed, files copied with `std::fs::copy`); it does
//! not compare or clean up trees. Used by the end-to-end tests and, through `#[path]`, by
//! `crates/canopy-prompt/tests/render.rs`, so it needs only `std`.

#![allow(clippy::unwrap_used, reason = "tests fail loudly by design")]

use std::path::Path;

/// Copies everything under `from` into `to`, creating `to` and its subdirectories.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}
