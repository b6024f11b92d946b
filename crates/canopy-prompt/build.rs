//! Embeds the shipped prompt bundle (the repository's `config/prompts`, `config/roles`,
//! `agents`, `skills` and `rules`) so `canopy` works without the repository beside it.
//! It only lists files; parsing and validation happen at run time in `bundle.rs`.

use std::path::{Path, PathBuf};

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root exists");
    let mut files = Vec::new();
    for dir in ["config/prompts", "config/roles", "agents", "skills", "rules"] {
        let path = root.join(dir);
        println!("cargo:rerun-if-changed={}", path.display());
        collect(&root, &path, &mut files);
    }
    files.sort();
    let mut out = String::from(
        "/// The shipped bundle: (path relative to the bundle root, text).\npub const FILES: &[(&str, &str)] = &[\n",
    );
    for (rel, abs) in files {
        out.push_str(&format!("    ({rel:?}, include_str!({abs:?})),\n"));
    }
    out.push_str("];\n");
    let dest = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("embedded.rs");
    std::fs::write(dest, out).expect("writing embedded.rs");
}

fn collect(root: &Path, dir: &Path, files: &mut Vec<(String, String)>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(root, &path, files);
        } else if matches!(path.extension().and_then(|e| e.to_str()), Some("md" | "toml")) {
            let rel = path.strip_prefix(root).expect("under the root").to_string_lossy().replace('\\', "/");
            files.push((rel, path.to_string_lossy().into_owned()));
        }
    }
}
