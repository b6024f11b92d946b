//! Prompt assembly: the bundle on disk (or embedded), the renderer, and the lint.
//!
//! `Bundle` reads and validates `config/prompts`, `config/roles`, `agents`, `skills` and
//! `rules`; `Renderer` turns a bundle plus a session's facts into the exact text the harness
//! receives, with its hash; `lint` proves no prompt names a tool its role does not have.
//! Nothing here talks to the store, NATS or a harness: the daemon decides when to render,
//! the runner decides how the text reaches the harness.

pub mod bundle;
pub mod frontmatter;
pub mod lint;
pub mod render;

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/embedded.rs"));
}

pub use bundle::{Bundle, Definition, Mode, Role, Rule, Skill};
pub use lint::{Finding, Gated, Vocabulary, gated, lint, lint_with};
pub use render::{Facts, RenderError, Rendered, Renderer};

/// A bundle file that failed to load, with where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", location(file, *line))]
pub struct BundleError {
    /// Relative to the bundle root.
    pub file: String,
    /// 1-based; 0 when the problem is the file as a whole.
    pub line: usize,
    pub message: String,
}

impl BundleError {
    pub fn at(file: &str, line: usize, message: String) -> BundleError {
        BundleError { file: file.to_owned(), line, message }
    }
}

/// `file:line`, or just `file` when the problem is the whole file (line 0).
pub(crate) fn location(file: &str, line: usize) -> String {
    match line {
        0 => file.to_owned(),
        n => format!("{file}:{n}"),
    }
}
