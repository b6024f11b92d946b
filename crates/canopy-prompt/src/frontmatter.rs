//! The frontmatter of bundle markdown files: a small, strict subset of YAML.
//!
//! A file may open with a block between two `---` lines holding `key: value` lines, where a
//! value is `true`/`false`, a flow list `[a, "b"]`, a double-quoted string, or a plain
//! string. That covers every file Canopy reads (agents, skills, rules); anything else (nested
//! maps, multi-line values, anchors) is an error naming the file and line rather than a
//! guess. The block is bounded in lines and bytes. The same subset, plus block lists (`key:`
//! then `  - item` lines) and `#` comments, reads a whole YAML role file (`document`). This
//! module does not know which keys a file needs; `bundle.rs` checks that.

use std::collections::BTreeMap;

use crate::BundleError;

/// Most lines a frontmatter block may have.
pub const MAX_LINES: usize = 40;
/// Most bytes a frontmatter block may have.
pub const MAX_BYTES: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Bool(bool),
    Str(String),
    List(Vec<String>),
}

/// Parsed frontmatter: each key with its value and the line it was on.
#[derive(Debug, Clone, Default)]
pub struct Frontmatter {
    pub fields: BTreeMap<String, (Value, usize)>,
    /// The line after the closing `---` (1-based); the body starts there.
    pub body_line: usize,
}

/// Splits `text` into its frontmatter and body. A file without frontmatter is an error:
/// every file that goes through here needs at least a description.
pub fn split<'t>(file: &str, text: &'t str) -> Result<(Frontmatter, &'t str), BundleError> {
    let err = |line: usize, message: String| BundleError::at(file, line, message);
    let rest = text
        .strip_prefix("---\n")
        .or_else(|| text.strip_prefix("---\r\n"))
        .ok_or_else(|| err(1, "must start with a `---` frontmatter line".into()))?;
    let mut fields = BTreeMap::new();
    let mut offset = text.len() - rest.len();
    for (index, raw) in rest.split_inclusive('\n').enumerate() {
        let line_no = index + 2;
        offset += raw.len();
        if line_no > MAX_LINES + 1 || offset > MAX_BYTES {
            return Err(err(line_no, format!("frontmatter is longer than {MAX_LINES} lines or {MAX_BYTES} bytes")));
        }
        let line = raw.trim_end_matches(['\n', '\r']);
        if line == "---" {
            let body = &text[offset..];
            return Ok((Frontmatter { fields, body_line: line_no + 1 }, body));
        }
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if line.starts_with([' ', '\t']) {
            return Err(err(
                line_no,
                "nested or multi-line values are not supported; use one `key: value` line".into(),
            ));
        }
        let (key, value) =
            line.split_once(':').ok_or_else(|| err(line_no, format!("expected `key: value`, found {line:?}")))?;
        let key = key.trim();
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(err(line_no, format!("{key:?} is not a valid key")));
        }
        let value = parse_value(value.trim()).map_err(|m| err(line_no, format!("`{key}`: {m}")))?;
        if fields.insert(key.to_owned(), (value, line_no)).is_some() {
            return Err(err(line_no, format!("`{key}` appears twice")));
        }
    }
    Err(err(1, "the frontmatter is not closed with a `---` line".into()))
}

/// Reads a whole YAML document of the subset: `key: value` lines, flow lists, block lists
/// (`key:` followed by indented `- item` lines), comments and blank lines, an optional
/// leading `---`. Anything else is an error naming the line.
pub fn document(file: &str, text: &str) -> Result<Frontmatter, BundleError> {
    let err = |line: usize, message: String| BundleError::at(file, line, message);
    let mut fields: BTreeMap<String, (Value, usize)> = BTreeMap::new();
    let mut list: Option<(String, usize, Vec<String>)> = None;
    let finish = |list: &mut Option<(String, usize, Vec<String>)>, fields: &mut BTreeMap<String, (Value, usize)>| {
        if let Some((key, line, items)) = list.take() {
            fields.insert(key, (Value::List(items), line));
        }
    };
    for (index, raw) in text.lines().enumerate() {
        let line_no = index + 1;
        let line = strip_comment(raw);
        let trimmed = line.trim();
        if trimmed.is_empty() || (index == 0 && trimmed == "---") {
            continue;
        }
        if line.starts_with([' ', '\t']) {
            let item = trimmed.strip_prefix("- ").or_else(|| (trimmed == "-").then_some(""));
            match (&mut list, item) {
                (Some((_, _, items)), Some(item)) => {
                    items.push(scalar(item.trim()).map_err(|m| err(line_no, m))?);
                    continue;
                }
                _ => return Err(err(line_no, "only `- item` lines under a `key:` line may be indented".into())),
            }
        }
        finish(&mut list, &mut fields);
        let (key, value) =
            line.split_once(':').ok_or_else(|| err(line_no, format!("expected `key: value`, found {line:?}")))?;
        let key = key.trim();
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(err(line_no, format!("{key:?} is not a valid key")));
        }
        if fields.contains_key(key) {
            return Err(err(line_no, format!("`{key}` appears twice")));
        }
        if value.trim().is_empty() {
            list = Some((key.to_owned(), line_no, Vec::new()));
            continue;
        }
        let value = parse_value(value.trim()).map_err(|m| err(line_no, format!("`{key}`: {m}")))?;
        fields.insert(key.to_owned(), (value, line_no));
    }
    finish(&mut list, &mut fields);
    Ok(Frontmatter { fields, body_line: 0 })
}

/// `line` without a trailing `# comment` (a `#` inside double quotes is kept).
fn strip_comment(line: &str) -> &str {
    let mut quoted = false;
    for (i, c) in line.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '#' if !quoted && (i == 0 || line[..i].ends_with([' ', '\t'])) => return &line[..i],
            _ => {}
        }
    }
    line
}

fn parse_value(raw: &str) -> Result<Value, String> {
    match raw {
        "true" => return Ok(Value::Bool(true)),
        "false" => return Ok(Value::Bool(false)),
        _ => {}
    }
    if let Some(inner) = raw.strip_prefix('[') {
        let inner = inner.strip_suffix(']').ok_or("a list must end with `]` on the same line")?;
        if inner.trim().is_empty() {
            return Ok(Value::List(Vec::new()));
        }
        return inner.split(',').map(|item| scalar(item.trim())).collect::<Result<_, _>>().map(Value::List);
    }
    scalar(raw).map(Value::Str)
}

fn scalar(raw: &str) -> Result<String, String> {
    if let Some(inner) = raw.strip_prefix('"') {
        let inner = inner.strip_suffix('"').ok_or("a quoted string must end with `\"`")?;
        if inner.contains('"') {
            return Err("quotes inside a quoted string are not supported".into());
        }
        return Ok(inner.to_owned());
    }
    if raw.is_empty() {
        return Err("the value is empty".into());
    }
    if raw.starts_with(['{', '&', '*', '|', '>', '!', '\'']) {
        return Err(format!("{raw:?} uses YAML that is not supported; write a plain or double-quoted string"));
    }
    Ok(raw.to_owned())
}

impl Frontmatter {
    /// A required string field.
    pub fn string(&self, file: &str, key: &str) -> Result<String, BundleError> {
        match self.fields.get(key) {
            Some((Value::Str(s), _)) => Ok(s.clone()),
            Some((_, line)) => Err(BundleError::at(file, *line, format!("`{key}` must be a string"))),
            None => Err(BundleError::at(file, 1, format!("the frontmatter needs `{key}`"))),
        }
    }

    pub fn optional_string(&self, file: &str, key: &str) -> Result<Option<String>, BundleError> {
        match self.fields.contains_key(key) {
            true => self.string(file, key).map(Some),
            false => Ok(None),
        }
    }

    pub fn optional_bool(&self, file: &str, key: &str) -> Result<Option<bool>, BundleError> {
        match self.fields.get(key) {
            Some((Value::Bool(b), _)) => Ok(Some(*b)),
            Some((_, line)) => Err(BundleError::at(file, *line, format!("`{key}` must be true or false"))),
            None => Ok(None),
        }
    }

    /// A list field; a single string counts as a list of one.
    pub fn optional_list(&self, file: &str, key: &str) -> Result<Option<Vec<String>>, BundleError> {
        match self.fields.get(key) {
            Some((Value::List(items), _)) => Ok(Some(items.clone())),
            Some((Value::Str(s), _)) => Ok(Some(vec![s.clone()])),
            Some((_, line)) => Err(BundleError::at(file, *line, format!("`{key}` must be a list like [a, b]"))),
            None => Ok(None),
        }
    }

    /// Fails on keys outside `allowed`, naming the line.
    pub fn only(&self, file: &str, allowed: &[&str]) -> Result<(), BundleError> {
        match self.fields.iter().find(|(k, _)| !allowed.contains(&k.as_str())) {
            Some((key, (_, line))) => Err(BundleError::at(
                file,
                *line,
                format!("unknown key `{key}` (expected one of: {})", allowed.join(", ")),
            )),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly on purpose")]

    use super::*;
    use canopy_core::fuzz::{Rng, mutate};

    /// How many cases a property test runs: `CANOPY_FUZZ_CASES`, else `default`.
    fn cases(default: usize) -> usize {
        std::env::var("CANOPY_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
    }

    #[test]
    fn fuzzed_frontmatter_is_parsed_or_refused_with_a_line_never_a_panic() {
        let seeds = [
            "---\nname: reviewer\ndescription: \"Reviews code\"\ntools: [comms_post_message, tree_show]\nalways: true\n---\nBody text.\n",
            "---\nrequires: [runs_merge]\n---\n",
            "name: x\nlist: [a, \"b, c\"]\nflag: false\n",
        ];
        let mut rng = Rng::new(0x6672_6f6e);
        for case in 0..cases(20_000) {
            let text = mutate(&mut rng, seeds[case % seeds.len()]);
            if let Ok((front, _body)) = split("fuzz.md", &text) {
                let _ = front.only("fuzz.md", &["name", "description", "tools", "always", "requires"]);
                let _ = front.optional_list("fuzz.md", "tools");
                let _ = front.optional_bool("fuzz.md", "always");
            }
            if let Err(e) = document("fuzz.yaml", &text) {
                assert!(!e.to_string().is_empty(), "an error that says nothing for {text:?}");
            }
        }
    }

    #[test]
    fn reads_the_supported_subset() {
        let text = "---\nname: x\ndescription: \"a: b\"\nalwaysApply: true\nglobs: [\"*.rs\", docs/**]\n---\nbody\n";
        let (fm, body) = split("f.md", text).unwrap();
        assert_eq!(body, "body\n");
        assert_eq!(fm.body_line, 7);
        assert_eq!(fm.string("f.md", "description").unwrap(), "a: b");
        assert_eq!(fm.optional_bool("f.md", "alwaysApply").unwrap(), Some(true));
        assert_eq!(fm.optional_list("f.md", "globs").unwrap().unwrap(), vec!["*.rs", "docs/**"]);
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let cases = [
            ("no frontmatter\n", 1, "must start"),
            ("---\nname: x\n", 1, "not closed"),
            ("---\nname: x\n  nested: y\n---\n", 3, "nested"),
            ("---\nname: x\nname: y\n---\n", 3, "twice"),
            ("---\nname: x\nbad line\n---\n", 3, "key: value"),
            ("---\nname: {a: b}\n---\n", 2, "not supported"),
            ("---\nglobs: [a, b\n---\n", 2, "must end"),
            ("---\nname:\n---\n", 2, "empty"),
        ];
        for (text, line, needle) in cases {
            let e = split("agents/x.md", text).unwrap_err();
            assert_eq!((e.file.as_str(), e.line), ("agents/x.md", line), "{text:?}: {e}");
            assert!(e.to_string().contains(needle), "{text:?}: {e}");
        }
    }

    #[test]
    fn a_yaml_document_reads_block_lists_and_comments() {
        let text = "# a role\nid: reviewer\nmode: replace  # the block-0 replaces the prompt\ntools:\n  - comms_*\n  - \"tree_show\"\nskills: [review]\n";
        let doc = document("config/roles/reviewer.yaml", text).unwrap();
        assert_eq!(doc.string("f", "id").unwrap(), "reviewer");
        assert_eq!(doc.string("f", "mode").unwrap(), "replace");
        assert_eq!(doc.optional_list("f", "tools").unwrap().unwrap(), vec!["comms_*", "tree_show"]);
        assert_eq!(doc.optional_list("f", "skills").unwrap().unwrap(), vec!["review"]);
        for (bad, line) in [("id: x\n  nested: y\n", 2), ("id: x\nid: y\n", 2), ("tools:\n  - {a: b}\n", 2)] {
            let e = document("r.yaml", bad).unwrap_err();
            assert_eq!(e.line, line, "{bad:?}: {e}");
        }
    }

    #[test]
    fn a_huge_frontmatter_is_rejected() {
        let many = format!("---\n{}---\n", (0..MAX_LINES + 5).map(|i| format!("k{i}: v\n")).collect::<String>());
        assert!(split("f.md", &many).unwrap_err().to_string().contains("longer than"));
        let wide = format!("---\nk: {}\n---\n", "x".repeat(MAX_BYTES));
        assert!(split("f.md", &wide).unwrap_err().to_string().contains("longer than"));
    }
}
