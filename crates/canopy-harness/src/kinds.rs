//! The per-kind dispatch: which adapter prepares a launch of each `HarnessKind`.
//!
//! Sits above the codecs (`claude`, `codex`, `omp`, `pi`, `scripted`) so that `session`,
//! which starts the process, names none of them: it asks this module for the kind's codec.
//! Does not build command lines or files itself; each adapter's `prepare` does.

use tokio::process::Command;

use crate::HarnessKind;
use crate::codec::Codec;
use crate::launch::{LaunchError, LaunchSpec, Resume};
use crate::{claude, codex, omp, pi, scripted};

/// Adds `spec.kind`'s arguments, files and environment to `command` and returns the codec
/// that speaks its protocol. `resume` says whether the previous conversation may be resumed.
pub(crate) fn prepare(spec: &LaunchSpec, command: &mut Command, resume: Resume) -> Result<Box<dyn Codec>, LaunchError> {
    match spec.kind {
        HarnessKind::Scripted => scripted::prepare(spec, command),
        HarnessKind::Claude => claude::prepare(spec, command, resume),
        HarnessKind::Codex => codex::prepare(spec, command, resume),
        HarnessKind::Omp => omp::prepare(spec, command, resume),
        HarnessKind::Pi => pi::prepare(spec, command, resume),
    }
}
