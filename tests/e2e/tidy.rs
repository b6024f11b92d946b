//! House rules that a reviewer would otherwise have to remember: every Rust file says what
//! it owns in a `//!` header, and no two files of a crate import each other (directly or
//! through others), so each crate's files stand in layers a reader can follow.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_rust_file_starts_with_a_module_doc() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    rust_files(&root.join("crates"), &mut files);
    rust_files(&root.join("tests"), &mut files);
    assert!(files.len() > 20, "found only {} Rust files; is the walk broken?", files.len());
    let missing: Vec<String> = files
        .iter()
        .filter(|f| !std::fs::read_to_string(f).unwrap_or_default().starts_with("//!"))
        .map(|f| f.display().to_string())
        .collect();
    assert!(missing.is_empty(), "files without a //! header saying what they own: {missing:?}");
}

/// A crate's production files by module path (`a`, `a::b`), without the crate root (every
/// module names the root for its shared items, and the root declares every module) and
/// without test code (`tests.rs`, `testing.rs`, anything under a `tests` folder).
fn modules(src: &Path) -> Vec<(String, PathBuf)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut out = Vec::new();
    for file in files {
        let Ok(relative) = file.strip_prefix(src) else { continue };
        let parts: Vec<String> =
            relative.iter().map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned()).collect();
        let test = parts.iter().any(|p| p == "tests" || p == "testing");
        let root = parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main");
        if test || root || parts.first().is_some_and(|p| p == "bin") {
            continue;
        }
        let mut path = parts;
        if path.last().is_some_and(|p| p == "mod") {
            path.pop();
        }
        out.push((path.join("::"), file));
    }
    out
}

/// The text of a file without comments, string literals or its trailing `#[cfg(test)]` module.
fn production_code(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") {
            break;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        // Drop string literals (a path inside a message is no import) and trailing comments.
        let mut in_string = false;
        let mut previous = ' ';
        for (i, c) in line.char_indices() {
            if c == '"' && previous != '\\' {
                in_string = !in_string;
            } else if !in_string && c == '/' && line[i..].starts_with("//") {
                break;
            } else if !in_string {
                out.push(c);
            }
            previous = c;
        }
        out.push('\n');
    }
    out
}

/// Every module path a file names: `crate::a::b`, `super::x`, `self::x`, a child module's
/// `x::`, and each path inside a `use crate::{..}` group, resolved to the longest module
/// prefix that is a file of the crate.
fn imports(module: &str, code: &str, known: &std::collections::BTreeSet<String>) -> Vec<String> {
    let parent: Vec<&str> = module.split("::").collect();
    let is_dir_module = |m: &str| known.iter().any(|k| k.starts_with(&format!("{m}::")));
    let children: Vec<String> = known
        .iter()
        .filter_map(|k| k.strip_prefix(&format!("{module}::")).filter(|rest| !rest.contains("::")).map(str::to_owned))
        .collect();
    let mut paths: Vec<Vec<String>> = Vec::new();
    let tokens: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < tokens.len() {
        let boundary = i == 0 || !(tokens[i - 1].is_alphanumeric() || tokens[i - 1] == '_' || tokens[i - 1] == ':');
        if !boundary {
            i += 1;
            continue;
        }
        let rest: String = tokens[i..tokens.len().min(i + 400)].iter().collect();
        let start = ["crate::", "super::", "self::"]
            .into_iter()
            .find(|p| rest.starts_with(p))
            .map(str::to_owned)
            .or_else(|| children.iter().find(|c| rest.starts_with(&format!("{c}::"))).map(|c| format!("{c}::")));
        let Some(start) = start else {
            i += 1;
            continue;
        };
        let base: Vec<String> = match start.as_str() {
            "crate::" => Vec::new(),
            // In `a/mod.rs` (a directory module) `super` is a's parent, `self` is a.
            "super::" if is_dir_module(module) => {
                parent[..parent.len().saturating_sub(1)].iter().map(|s| s.to_string()).collect()
            }
            "super::" => parent[..parent.len().saturating_sub(1)].iter().map(|s| s.to_string()).collect(),
            "self::" => parent.iter().map(|s| s.to_string()).collect(),
            child => {
                let mut p: Vec<String> = parent.iter().map(|s| s.to_string()).collect();
                p.push(child.trim_end_matches("::").to_owned());
                p
            }
        };
        let tail = &rest[start.len()..];
        for path in expand(tail) {
            let mut full = base.clone();
            full.extend(path);
            paths.push(full);
        }
        i += start.len();
    }
    let mut found = Vec::new();
    for path in paths {
        for len in (1..=path.len()).rev() {
            let candidate = path[..len].join("::");
            if known.contains(&candidate) {
                if candidate != module {
                    found.push(candidate);
                }
                break;
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

/// The paths at the start of `text` (after a `crate::`): `a::b::C`, or each of a `{..}` group.
fn expand(text: &str) -> Vec<Vec<String>> {
    let mut segments = Vec::new();
    let mut rest = text;
    loop {
        let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(rest.len());
        if end > 0 {
            segments.push(rest[..end].to_owned());
            rest = &rest[end..];
        }
        if let Some(after) = rest.strip_prefix("::") {
            rest = after;
            continue;
        }
        break;
    }
    if let Some(group) = rest.strip_prefix('{') {
        let mut depth = 1;
        let mut close = group.len();
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                close = i;
                break;
            }
        }
        let inner = &group[..close];
        let mut items = Vec::new();
        let (mut depth, mut from) = (0, 0);
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    items.push(&inner[from..i]);
                    from = i + 1;
                }
                _ => {}
            }
        }
        items.push(&inner[from..]);
        let mut out = Vec::new();
        for item in items.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
            for tail in expand(item) {
                let mut path = segments.clone();
                path.extend(tail);
                out.push(path);
            }
        }
        return out;
    }
    vec![segments]
}

/// The circles among a crate's files: groups of two or more files that import each other,
/// directly or through others (Tarjan's strongly connected components).
fn circles(graph: &std::collections::BTreeMap<String, Vec<String>>) -> Vec<Vec<String>> {
    struct Walk<'g> {
        graph: &'g std::collections::BTreeMap<String, Vec<String>>,
        index: std::collections::HashMap<&'g str, usize>,
        low: std::collections::HashMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: std::collections::HashSet<&'g str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'g>(w: &mut Walk<'g>, node: &'g str) {
        let n = w.index.len();
        w.index.insert(node, n);
        w.low.insert(node, n);
        w.stack.push(node);
        w.on_stack.insert(node);
        for next in w.graph.get(node).into_iter().flatten() {
            let next = next.as_str();
            if !w.index.contains_key(next) {
                visit(w, next);
                let low = w.low[node].min(w.low[next]);
                w.low.insert(node, low);
            } else if w.on_stack.contains(next) {
                let low = w.low[node].min(w.index[next]);
                w.low.insert(node, low);
            }
        }
        if w.low[node] == w.index[node] {
            let mut group = Vec::new();
            while let Some(top) = w.stack.pop() {
                w.on_stack.remove(top);
                group.push(top.to_owned());
                if top == node {
                    break;
                }
            }
            if group.len() > 1 {
                group.sort();
                w.out.push(group);
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: Default::default(),
        low: Default::default(),
        stack: Vec::new(),
        on_stack: Default::default(),
        out: Vec::new(),
    };
    for node in graph.keys() {
        if !walk.index.contains_key(node.as_str()) {
            visit(&mut walk, node);
        }
    }
    walk.out
}

/// The file graph of one crate's `src/`.
fn file_graph(src: &Path) -> std::collections::BTreeMap<String, Vec<String>> {
    let modules = modules(src);
    let known: std::collections::BTreeSet<String> = modules.iter().map(|(m, _)| m.clone()).collect();
    modules
        .iter()
        .map(|(module, file)| {
            let code = production_code(&std::fs::read_to_string(file).unwrap_or_default());
            (module.clone(), imports(module, &code, &known))
        })
        .collect()
}

#[test]
fn the_circle_finder_finds_a_circle_through_a_use_group_and_super() {
    let known: std::collections::BTreeSet<String> = ["a", "b", "c", "c::d"].iter().map(|s| s.to_string()).collect();
    assert_eq!(imports("a", "use crate::{b::X, c::{d::Y, Z}};\n", &known), ["b", "c", "c::d"]);
    assert_eq!(imports("c::d", "fn f() { super::helper() }\n", &known), vec!["c".to_owned()]);
    assert_eq!(imports("c", "use d::Y;\n", &known), vec!["c::d".to_owned()]);
    assert!(imports("a", &production_code("// crate::b::X\nlet s = \"crate::b\";\n"), &known).is_empty());
    let mut graph = std::collections::BTreeMap::new();
    graph.insert("a".to_owned(), vec!["b".to_owned()]);
    graph.insert("b".to_owned(), vec!["c".to_owned()]);
    graph.insert("c".to_owned(), vec!["a".to_owned()]);
    graph.insert("d".to_owned(), vec!["a".to_owned()]);
    assert_eq!(circles(&graph), vec![vec!["a".to_owned(), "b".to_owned(), "c".to_owned()]]);
}

#[test]
fn no_two_files_of_a_crate_import_each_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("crates");
    let mut found = Vec::new();
    let mut crates = 0;
    for entry in std::fs::read_dir(&root).into_iter().flatten().flatten() {
        let src = entry.path().join("src");
        if !src.is_dir() {
            continue;
        }
        crates += 1;
        for circle in circles(&file_graph(&src)) {
            found.push(format!("{}: {}", entry.file_name().to_string_lossy(), circle.join(" <-> ")));
        }
    }
    assert!(crates > 10, "found only {crates} crates; is the walk broken?");
    assert!(found.is_empty(), "files that import each other (move what both need below both):\n{}", found.join("\n"));
}
