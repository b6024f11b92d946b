//! Where the tests find the real harness CLIs (`claude`, `codex`) at the versions
//! `scripts/install-harnesses.sh` pins: its `CANOPY_TEST_*_BIN` variables, or for Codex its
//! cache directory. A missing binary fails the test with the command that installs it;
//! nothing is skipped.
//!
//! Owns only the lookup. Does not install anything or run the binaries. Used by the
//! end-to-end tests and, through `#[path]`, by `crates/canopy-harness/tests/claude.rs` and
//! `codex.rs`, so it needs only `std`.

#![allow(dead_code, reason = "each test binary uses a different part of it")]

use std::path::PathBuf;

/// The installed Claude Code CLI; a missing one fails the test with the way to get it.
pub fn claude_bin() -> PathBuf {
    match std::env::var_os("CANOPY_TEST_CLAUDE_BIN") {
        Some(path) if std::path::Path::new(&path).is_file() => path.into(),
        other => panic!(
            "CANOPY_TEST_CLAUDE_BIN is {other:?}: these tests drive the real Claude Code CLI. Run \
             `eval \"$(scripts/install-harnesses.sh)\"` (or scripts/test.sh), which installs \
             @anthropic-ai/claude-code@2.1.332 from npm"
        ),
    }
}

/// The pinned Codex binary: `CANOPY_TEST_CODEX_BIN`, else where `scripts/install-harnesses.sh`
/// puts it. Missing means failing, with the command that installs it.
pub fn codex_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("CANOPY_TEST_CODEX_BIN") {
        let bin = PathBuf::from(bin);
        assert!(bin.is_file(), "CANOPY_TEST_CODEX_BIN={} is not a file", bin.display());
        return bin;
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_default();
    let bin = cache.join(
        "canopy/npm/codex-0.171.0/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex",
    );
    assert!(
        bin.is_file(),
        "the Codex CLI (@openai/codex@0.171.0) is not installed: run `eval \"$(scripts/install-harnesses.sh)\"` \
         (sets CANOPY_TEST_CODEX_BIN); looked for {}",
        bin.display()
    );
    bin
}

/// The pinned omp launcher: `CANOPY_TEST_OMP_BIN`, else where `scripts/install-harnesses.sh`
/// puts it. Missing means failing, with the command that installs it.
pub fn omp_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("CANOPY_TEST_OMP_BIN") {
        let bin = PathBuf::from(bin);
        assert!(bin.is_file(), "CANOPY_TEST_OMP_BIN={} is not a file", bin.display());
        return bin;
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_default();
    let bin = cache.join("canopy/npm/omp-18.2.3/bin/omp");
    assert!(
        bin.is_file(),
        "oh-my-pi (@oh-my-pi/pi-coding-agent@18.2.3) is not installed: run `eval \"$(scripts/install-harnesses.sh)\"` \
         (sets CANOPY_TEST_OMP_BIN); looked for {}",
        bin.display()
    );
    bin
}

/// The pinned pi launcher: `CANOPY_TEST_PI_BIN`, else where `scripts/install-harnesses.sh`
/// puts it. Missing means failing, with the command that installs it.
pub fn pi_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("CANOPY_TEST_PI_BIN") {
        let bin = PathBuf::from(bin);
        assert!(bin.is_file(), "CANOPY_TEST_PI_BIN={} is not a file", bin.display());
        return bin;
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_default();
    let bin = cache.join("canopy/npm/pi-0.73.1/bin/pi");
    assert!(
        bin.is_file(),
        "pi (@mariozechner/pi-coding-agent@0.73.1) is not installed: run `eval \"$(scripts/install-harnesses.sh)\"` \
         (sets CANOPY_TEST_PI_BIN); looked for {}",
        bin.display()
    );
    bin
}
