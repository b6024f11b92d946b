//! Redaction of secrets and bulk from text that Canopy stores, shows or hands to an agent.
//!
//! One module, used by every path that lets harness output or message text out again:
//! activity storage (and so `canopy watch`), `history_search`, session reasons and roster
//! activity lines. It masks credentials (provider API keys, Canopy tokens, bearer tokens,
//! JWTs, PEM private keys, `KEY=value` pairs whose key looks secret, `Authorization`
//! headers), removes login and magic links (URLs carrying tokens or one-time codes, or a
//! password), replaces data URIs and long base64 runs with a placeholder carrying their
//! size, and cuts what is left beyond a length with a note. It does not decide how long a
//! preview is (callers pass `max_chars`) and it never looks at anything but the text.
//!
//! The rules work on ASCII structure only, so slicing at the positions they find is always
//! on a character boundary; text in other scripts passes through untouched.

use serde_json::Value;

/// What a masked credential becomes.
pub const REDACTED: &str = "[redacted]";

/// Redacts `text` and cuts it to at most `max_chars` characters (with a note).
pub fn redact(text: &str, max_chars: usize) -> String {
    cut(&redact_all(text), max_chars)
}

/// Redacts every string (and object key) inside a JSON value; a value under a key that
/// looks secret (`"password": ..`) is masked whole. Arrays and objects keep their first
/// `max_items` entries; each string is cut to `max_chars`.
pub fn redact_value(value: &Value, max_chars: usize, max_items: usize) -> Value {
    match value {
        Value::String(s) => Value::String(redact(s, max_chars)),
        Value::Array(items) => {
            Value::Array(items.iter().take(max_items).map(|v| redact_value(v, max_chars, max_items)).collect())
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .take(max_items)
                .map(|(k, v)| {
                    let masked = is_secret_name(k) && matches!(v, Value::String(_) | Value::Number(_));
                    let v = if masked { Value::String(REDACTED.into()) } else { redact_value(v, max_chars, max_items) };
                    (redact(k, 200), v)
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Every rule, in an order where an earlier rule's placeholder never feeds a later rule.
fn redact_all(text: &str) -> String {
    let text = private_keys(text);
    let text = data_uris(&text);
    let text = links(&text);
    let text = headers(&text);
    let text = bearer(&text);
    let text = pairs(&text);
    let text = tokens(&text);
    base64_runs(&text)
}

/// Applies non-overlapping replacements (sorted by start) to `text`.
fn splice(text: &str, mut edits: Vec<(usize, usize, String)>) -> String {
    if edits.is_empty() {
        return text.to_owned();
    }
    edits.sort_by_key(|e| e.0);
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (start, end, with) in edits {
        if start < at {
            continue;
        }
        out.push_str(&text[at..start]);
        out.push_str(&with);
        at = end;
    }
    out.push_str(&text[at..]);
    out
}

fn find_ci(haystack: &str, needle: &str, from: usize) -> Option<usize> {
    let hay = haystack.as_bytes();
    let needle = needle.as_bytes();
    (from..=hay.len().checked_sub(needle.len())?).find(|&i| hay[i..i + needle.len()].eq_ignore_ascii_case(needle))
}

/// `-----BEGIN ... PRIVATE KEY-----` blocks, to their END line (or the end of the text).
fn private_keys(text: &str) -> String {
    let mut edits = Vec::new();
    let mut from = 0;
    while let Some(start) = text[from..].find("-----BEGIN").map(|i| i + from) {
        let header_end = text[start + 10..].find("-----").map_or(text.len(), |i| start + 10 + i + 5);
        if !text[start..header_end].contains("PRIVATE KEY") {
            from = header_end.max(start + 1);
            continue;
        }
        let end = match text[header_end..].find("-----END") {
            Some(i) => {
                let end_start = header_end + i;
                text[end_start + 8..].find("-----").map_or(text.len(), |j| end_start + 8 + j + 5)
            }
            None => text.len(),
        };
        edits.push((start, end, "[redacted private key]".to_owned()));
        from = end;
    }
    splice(text, edits)
}

fn is_base64_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"+/=_-".contains(&b)
}

/// `data:<type>;base64,<payload>` becomes `[data uri <type>, N bytes]`.
fn data_uris(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut edits = Vec::new();
    let mut from = 0;
    while let Some(start) = find_ci(text, "data:", from) {
        // The marker must follow within a media type's length, so text full of `data:` words
        // costs one short look each, never a scan to the end.
        let window = &bytes[start..(start + 5 + 128 + 8).min(bytes.len())];
        let Some(marker) = window.windows(8).position(|w| w == b";base64,").map(|i| start + i) else {
            from = start + 5;
            continue;
        };
        let mime = &text[start + 5..marker];
        if mime.len() > 100 || mime.bytes().any(|b| b.is_ascii_whitespace() || b"\"'<>".contains(&b)) {
            from = start + 5;
            continue;
        }
        let mut end = marker + 8;
        while end < bytes.len() && is_base64_byte(bytes[end]) {
            end += 1;
        }
        let mime = if mime.is_empty() { "data" } else { mime };
        edits.push((start, end, format!("[data uri {mime}, {} bytes]", end - start)));
        from = end;
    }
    splice(text, edits)
}

/// Query parameters (and path words) that make a URL a login or magic link.
const LINK_PARAMS: &[&str] = &[
    "token",
    "access_token",
    "id_token",
    "refresh_token",
    "auth",
    "code",
    "otp",
    "key",
    "api_key",
    "apikey",
    "secret",
    "password",
    "pass",
    "sig",
    "signature",
    "x-amz-signature",
    "x-amz-credential",
    "x-amz-security-token",
    "magic",
    "ticket",
    "sessionid",
    "jwt",
    "login_token",
];

/// URLs that carry a token, a one-time code or a password are removed whole.
fn links(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut edits = Vec::new();
    let mut from = 0;
    while let Some(start) = find_ci(text, "://", from).map(|i| {
        let mut s = i;
        while s > 0 && bytes[s - 1].is_ascii_alphanumeric() {
            s -= 1;
        }
        (s, i)
    }) {
        let (start, scheme_end) = start;
        let mut end = scheme_end + 3;
        while end < bytes.len() && !bytes[end].is_ascii_whitespace() && !b"\"'<>`()[]{}|\\^".contains(&bytes[end]) {
            end += 1;
        }
        let url = &text[start..end];
        if start < scheme_end && is_login_link(url) {
            edits.push((start, end, "[login link removed]".to_owned()));
        }
        from = end.max(scheme_end + 3);
    }
    splice(text, edits)
}

fn is_login_link(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('@') {
        return true; // user:password@host
    }
    let lower = rest.to_ascii_lowercase();
    let path = lower.split(['?', '#']).next().unwrap_or("");
    const LOGIN_PATHS: &[&str] = &[
        "magic-link",
        "magic_link",
        "magiclink",
        "magic-login",
        "/magic/",
        "/login/",
        "/verify",
        "/signin/",
        "/sign-in/",
        "/auth/callback",
        "/reset-password",
        "/invite/",
    ];
    if LOGIN_PATHS.iter().any(|w| path.contains(w))
        && (lower.contains('?') || path.split('/').any(|seg| seg.len() >= 16))
    {
        return true;
    }
    let query = lower.split_once(['?', '#']).map_or("", |(_, q)| q);
    query.split(['&', ';', '#', '?']).any(|param| {
        let (name, value) = param.split_once('=').unwrap_or((param, ""));
        !value.is_empty() && LINK_PARAMS.iter().any(|p| name == *p || name.ends_with(&format!("_{p}")))
    })
}

/// Header lines whose whole value is a credential.
const SECRET_HEADERS: &[&str] =
    &["authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key", "x-auth-token", "api-key"];

/// `Authorization: ...` and friends: the value is masked to the end of its line or quote.
fn headers(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut edits = Vec::new();
    for header in SECRET_HEADERS {
        let mut from = 0;
        while let Some(at) = find_ci(text, header, from) {
            from = at + header.len();
            if at > 0
                && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'-' || bytes[at - 1] == b'_')
                && !escaped(bytes, at - 1)
            {
                continue;
            }
            let mut i = at + header.len();
            if i < bytes.len() && (bytes[i] == b'"' || bytes[i] == b'\'') {
                i += 1;
            }
            while i < bytes.len() && bytes[i] == b' ' {
                i += 1;
            }
            if i >= bytes.len() || bytes[i] != b':' {
                continue;
            }
            i += 1;
            while i < bytes.len() && (bytes[i] == b' ' || bytes[i] == b'"' || bytes[i] == b'\'') {
                i += 1;
            }
            let end = (i..bytes.len()).find(|&j| b"\r\n\"'".contains(&bytes[j])).unwrap_or(bytes.len());
            if end > i && &text[i..end] != REDACTED {
                edits.push((i, end, REDACTED.to_owned()));
            }
            from = end;
        }
    }
    splice(text, dedup(edits))
}

fn dedup(mut edits: Vec<(usize, usize, String)>) -> Vec<(usize, usize, String)> {
    edits.sort_by_key(|e| e.0);
    let mut out: Vec<(usize, usize, String)> = Vec::new();
    for edit in edits {
        if out.last().is_none_or(|last| edit.0 >= last.1) {
            out.push(edit);
        }
    }
    out
}

/// `Bearer <token>` (and `Basic <credentials>`): the word after is masked.
fn bearer(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut edits = Vec::new();
    for scheme in ["bearer", "basic", "token"] {
        let mut from = 0;
        while let Some(at) = find_ci(text, scheme, from) {
            from = at + scheme.len();
            if at > 0 && bytes[at - 1].is_ascii_alphanumeric() && !escaped(bytes, at - 1) {
                continue;
            }
            let mut i = at + scheme.len();
            let spaces = i;
            while i < bytes.len() && (bytes[i] == b' ' || bytes[i] == b'\t') {
                i += 1;
            }
            if i == spaces || i >= bytes.len() {
                continue;
            }
            let end = (i..bytes.len()).find(|&j| !is_token_byte(bytes[j]) && !b"+/=".contains(&bytes[j]));
            let end = end.unwrap_or(bytes.len());
            let word = &text[i..end];
            // `token` is an ordinary word: only a credential-shaped word after it counts.
            let credential = if scheme == "token" { word.len() >= 12 && looks_random(word) } else { word.len() >= 8 };
            if credential {
                edits.push((i, end, REDACTED.to_owned()));
            }
            from = end;
        }
    }
    splice(text, dedup(edits))
}

/// Whether a name (`OPENAI_API_KEY`, `password`, `client-secret`) looks like it holds a secret.
pub fn is_secret_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    // Counts, not credentials: `input_tokens`, `max_tokens`.
    if lower.ends_with("tokens") {
        return false;
    }
    if [
        "token",
        "secret",
        "password",
        "passwd",
        "api_key",
        "apikey",
        "api-key",
        "private_key",
        "credential",
        "access_key",
    ]
    .iter()
    .any(|s| lower.contains(s))
    {
        return true;
    }
    lower
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|part| ["auth", "pwd", "otp", "cookie", "sig", "signature", "pat"].contains(&part))
}

/// `NAME=value`, `NAME: value` and `"name": "value"` where the name looks secret.
fn pairs(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut edits = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let starts = (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_')
            && (i == 0 || !is_name_byte(bytes[i - 1]) || escaped(bytes, i - 1));
        if !starts || escaped(bytes, i) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && is_name_byte(bytes[i]) {
            i += 1;
        }
        let name = &text[start..i];
        if !is_secret_name(name) {
            continue;
        }
        let mut j = i;
        if j < bytes.len() && (bytes[j] == b'"' || bytes[j] == b'\'') {
            j += 1;
        }
        while j < bytes.len() && bytes[j] == b' ' {
            j += 1;
        }
        if j >= bytes.len() || !(bytes[j] == b'=' || bytes[j] == b':') {
            continue;
        }
        let colon = bytes[j] == b':';
        j += 1;
        while j < bytes.len() && bytes[j] == b' ' {
            j += 1;
        }
        let (value_start, value_end) = match bytes.get(j) {
            Some(&quote @ (b'"' | b'\'')) => {
                let end = (j + 1..bytes.len()).find(|&k| bytes[k] == quote || bytes[k] == b'\n').unwrap_or(bytes.len());
                (j + 1, end)
            }
            _ => {
                let end = (j..bytes.len())
                    .find(|&k| bytes[k].is_ascii_whitespace() || b",;&)]}\"'<>`".contains(&bytes[k]))
                    .unwrap_or(bytes.len());
                (j, end)
            }
        };
        let value = &text[value_start..value_end];
        // `OPENAI_API_KEY: set it in the environment` explains, it does not assign: after a
        // colon, a short lowercase word followed by more words is prose.
        let prose = colon
            && value.len() <= 10
            && value.bytes().all(|b| b.is_ascii_lowercase())
            && text[value_end..]
                .strip_prefix(' ')
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_lowercase()));
        if !value.is_empty() && !value.starts_with('[') && !prose {
            edits.push((value_start, value_end, REDACTED.to_owned()));
        }
        i = value_end.max(i);
    }
    splice(text, edits)
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.'
}

/// Whether the byte at `i` is the letter of a JSON or C escape (`\n`, `\t`, `\"`): text that
/// went through `serde_json::to_string` keeps its line breaks as two bytes, and the letter
/// must not glue the next word onto it.
fn escaped(bytes: &[u8], i: usize) -> bool {
    i > 0 && bytes[i - 1] == b'\\' && b"ntr\"/bfu".contains(&bytes[i])
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.'
}

/// Prefixes of credentials the usual providers issue, with the length of the random part
/// that must follow.
const KEY_PREFIXES: &[(&str, usize)] = &[
    ("cnp_", 8),
    ("cns_", 8),
    ("cnr_", 8),
    ("sk-ant-", 8),
    ("sk-proj-", 8),
    ("sk-", 10),
    ("sk_live_", 8),
    ("sk_test_", 8),
    ("rk_live_", 8),
    ("rk_test_", 8),
    ("whsec_", 8),
    ("ghp_", 8),
    ("gho_", 8),
    ("ghu_", 8),
    ("ghs_", 8),
    ("ghr_", 8),
    ("github_pat_", 8),
    ("xoxb-", 8),
    ("xoxp-", 8),
    ("xoxa-", 8),
    ("xoxs-", 8),
    ("xoxe-", 8),
    ("xapp-", 8),
    ("AKIA", 16),
    ("ASIA", 16),
    ("AIza", 20),
    ("glpat-", 8),
    ("hf_", 16),
    ("npm_", 16),
    ("pypi-", 16),
    ("shpat_", 16),
    ("dop_v1_", 16),
    ("ya29.", 16),
];

/// Whether a word looks machine-made: it mixes digits with letters.
fn looks_random(word: &str) -> bool {
    word.bytes().any(|b| b.is_ascii_digit()) && word.bytes().any(|b| b.is_ascii_alphabetic())
}

/// Provider keys and JWTs, wherever they stand as a word.
fn tokens(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut edits = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if !is_token_byte(bytes[i]) || escaped(bytes, i) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && is_token_byte(bytes[i]) && !escaped(bytes, i) {
            i += 1;
        }
        let word = text[start..i].trim_end_matches('.');
        let end = start + word.len();
        let key = KEY_PREFIXES.iter().any(|(prefix, min)| {
            word.starts_with(prefix) && {
                let rest = &word[prefix.len()..];
                let aws = matches!(*prefix, "AKIA" | "ASIA")
                    && rest.len() == 16
                    && rest.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit());
                aws || rest.len() >= *min && (looks_random(rest) || rest.len() >= 20)
            }
        });
        let jwt = word.starts_with("eyJ") && word.len() >= 20 && (word.contains('.') || word.len() >= 30);
        if key || jwt {
            edits.push((start, end, if jwt { "[redacted jwt]".to_owned() } else { REDACTED.to_owned() }));
        }
    }
    splice(text, edits)
}

/// Shortest base64 run replaced by a placeholder.
const BLOB_MIN: usize = 100;
/// A base64 payload wrapped over lines: every line but the last is at least this long.
const WRAPPED_LINE_MIN: usize = 40;

/// Long base64 runs (also wrapped over lines) become `[blob, N bytes]`.
fn base64_runs(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut edits = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if !is_base64_byte(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        let mut end;
        loop {
            let segment = i;
            while i < bytes.len() && is_base64_byte(bytes[i]) {
                i += 1;
            }
            end = i;
            // A line break continues the run only after a long, full-looking line.
            let newline = if i < bytes.len() && bytes[i] == b'\n' {
                1
            } else if i + 1 < bytes.len() && (&bytes[i..i + 2] == b"\r\n" || &bytes[i..i + 2] == b"\\n") {
                2
            } else {
                0
            };
            if newline > 0
                && i - segment >= WRAPPED_LINE_MIN
                && i + newline < bytes.len()
                && is_base64_byte(bytes[i + newline])
            {
                i += newline;
                continue;
            }
            break;
        }
        let run = &text[start..end];
        let payload = run.bytes().filter(|b| is_base64_byte(*b)).count();
        let mixed = run.bytes().any(|b| b.is_ascii_digit())
            && run.bytes().any(|b| b.is_ascii_uppercase())
            && run.bytes().any(|b| b.is_ascii_lowercase());
        let uniform = payload >= BLOB_MIN * 2 && run.bytes().filter(|b| is_base64_byte(*b)).all(|b| b == bytes[start]);
        if payload >= BLOB_MIN && (mixed || uniform) {
            edits.push((start, end, format!("[blob, {} bytes]", end - start)));
        }
        i = end.max(start + 1);
    }
    splice(text, edits)
}

/// Cuts text to `max_chars` characters, saying how much was cut.
pub fn cut(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        None => text.to_owned(),
        Some((at, _)) => format!("{}… [{} more chars cut]", &text[..at], text[at..].chars().count()),
    }
}

/// Planted secrets for property tests here and in the crates that store or show text
/// (activity, `history_search`): a deterministic generator and one secret of each kind.
pub mod samples {
    /// A small deterministic generator (xorshift), so the property test needs no crate.
    pub struct Rng(pub u64);

    impl Rng {
        pub fn next_u64(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        pub fn below(&mut self, n: usize) -> usize {
            (self.next_u64() % n.max(1) as u64) as usize
        }
        pub fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
            items[self.below(items.len())]
        }
        pub fn chars(&mut self, alphabet: &[u8], len: usize) -> String {
            (0..len).map(|_| alphabet[self.below(alphabet.len())] as char).collect()
        }
    }

    const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    const UPPER_DIGITS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    const B64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    /// A random alphanumeric string that surely mixes digits, upper and lower case.
    fn random(rng: &mut Rng, len: usize) -> String {
        format!("Q7z{}", rng.chars(ALNUM, len.saturating_sub(3)))
    }

    /// (text to plant, the part that must never come out)
    pub fn planted_secret(rng: &mut Rng) -> (String, String) {
        let r = random(rng, 32);
        match rng.below(14) {
            0 => (format!("sk-ant-api03-{r}"), r),
            1 => (format!("sk-proj-{r}"), r),
            2 => (format!("sk-{r}"), r),
            3 => (format!("ghp_{r}"), r),
            4 => {
                let k = rng.chars(UPPER_DIGITS, 16);
                (format!("AKIA{k}"), k)
            }
            5 => (format!("xoxb-1234-5678-{r}"), r),
            6 => (format!("Bearer {r}"), r),
            7 => {
                let body = rng.chars(B64, 40).replace(['+', '/'], "x");
                (format!("eyJhbGciOiJIUzI1NiJ9.eyJ{body}.{r}"), body)
            }
            8 => (format!("-----BEGIN PRIVATE KEY-----\nMII{r}\n-----END PRIVATE KEY-----"), r),
            9 => {
                let name = rng.pick(&["SECRET_KEY", "DB_PASSWORD", "api_key", "GITHUB_TOKEN", "client-secret"]);
                (format!("{name}={r}"), r)
            }
            10 => {
                let blob = format!("Q7z{}", rng.chars(B64, 300));
                (blob.clone(), blob)
            }
            11 => {
                let blob = format!("Q7z{}", rng.chars(B64, 120));
                (format!("data:image/png;base64,{blob}"), blob)
            }
            12 => {
                let param = rng.pick(&["token", "code", "otp", "access_token", "magic"]);
                (format!("https://login.example.com/verify?{param}={r}&next=%2F"), r)
            }
            _ => (format!("Authorization: Token {r}"), r),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::samples::{Rng, planted_secret};
    use super::*;

    #[test]
    fn secrets_never_come_out() {
        let planted = [
            "Authorization: Bearer abcdef0123456789",
            "token cnp_0123456789abcdef0123456789abcdef",
            "key sk-ant-api03-abcdefghijklmnop",
            "export OPENAI_API_KEY=sk-zzzzzzzzzzzzzzzz",
            "PASSWORD=hunter2hunter2",
            "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        ];
        for text in planted {
            let out = redact(text, 1000);
            for secret in ["abcdef0123456789", "cnp_0123", "sk-ant", "sk-zzz", "hunter2", "eyJhbGci"] {
                assert!(!out.contains(secret), "{text:?} -> {out:?}");
            }
        }
    }

    #[test]
    fn blobs_become_placeholders_and_long_text_is_cut() {
        let blob = "A".repeat(500);
        assert!(redact(&blob, 1000).starts_with("[blob, 500 bytes]"));
        let uri = format!("data:image/png;base64,{}", "B".repeat(40));
        assert_eq!(redact(&uri, 1000), "[data uri image/png, 62 bytes]");
        let long = "word ".repeat(100);
        let out = redact(&long, 20);
        assert!(out.contains("more chars cut") && out.chars().count() < 60, "{out}");
        assert_eq!(redact("plain text stays", 100), "plain text stays");
    }

    #[test]
    fn ordinary_text_survives() {
        for text in [
            "the token limit was reached; see https://docs.rs/tokio/latest/tokio/ for more",
            "author=jane, path=/home/jane/src/canopy/crates/canopy-core/src/redact.rs",
            "sha256 3f786850e387550fdab836ed7e6dc881de23001b",
            "open issues: https://github.com/org/repo/issues?state=open and https://github.com/magic-wormhole/x",
            "tests pass: 10, session: 4, data: none",
            "run `cargo test -p canopy-store` and sk-learn notes",
            "password reset flow: call the reset endpoint",
            "Missing environment variable OPENAI_API_KEY: set it in the environment that runs canopy",
            "ünïcode stays ✓ and so does 日本語",
        ] {
            assert_eq!(redact(text, 1000), text);
        }
    }

    #[test]
    fn adversarial_inputs_stay_linear() {
        // Each of these would take minutes if a rule rescanned to the end per occurrence.
        for unit in ["data:x ", "-----BEGIN x ", "a:// ", "bearer ", "authorization ", "token= ", "\\n"] {
            let text = format!("{}{}", unit.repeat(200_000 / unit.len()), "data:image/png;base64,AAAA");
            let out = redact(&text, 100);
            assert!(out.chars().count() < 200, "{unit:?}");
        }
    }

    #[test]
    fn magic_links_and_credentials_in_urls_are_removed() {
        let out = redact("sign in at https://app.example.com/auth?token=abc123def456 now", 1000);
        assert_eq!(out, "sign in at [login link removed] now");
        let out = redact("code: https://x.io/cb?state=1&code=998877", 1000);
        assert!(!out.contains("998877"), "{out}");
        let out = redact("git clone https://bob:hunter2@github.com/x/y", 1000);
        assert!(!out.contains("hunter2"), "{out}");
        let out = redact("see https://example.com/docs?page=2", 1000);
        assert!(out.contains("page=2"), "{out}");
    }

    #[test]
    fn json_pairs_and_headers_are_masked() {
        let out = redact(r#"{"password": "hunter2!", "user": "bob"}"#, 1000);
        assert_eq!(out, r#"{"password": "[redacted]", "user": "bob"}"#);
        let out = redact("curl -H 'Authorization: Basic Ym9iOmh1bnRlcjI=' x", 1000);
        assert!(!out.contains("Ym9iOmh1bnRlcjI"), "{out}");
        let value = serde_json::json!({"api_key": "x9y8z7", "nested": ["AKIAIOSFODNN7EXAMPLE"]});
        let text = redact_value(&value, 100, 10).to_string();
        assert!(!text.contains("x9y8z7") && !text.contains("AKIAIOSFODNN7EXAMPLE"), "{text}");
    }

    #[test]
    fn pem_keys_and_wrapped_base64_are_replaced() {
        let pem =
            "before\n-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\nabc\n-----END RSA PRIVATE KEY-----\nafter";
        assert_eq!(redact(pem, 1000), "before\n[redacted private key]\nafter");
        let line = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGBgAAAABQABh6FO1AAAAABJRU5ErkJggg";
        let wrapped = format!("img:\n{line}\n{line}\n{}\nend", &line[..20]);
        let out = redact(&wrapped, 1000);
        assert!(out.starts_with("img:\n[blob, ") && out.ends_with("\nend"), "{out}");
    }

    const FILLER: &[&str] = &[
        "the",
        "build",
        "failed",
        "see",
        "log:",
        "{\"output\":",
        "\"ok\"}",
        "(done)",
        "path=/tmp/x",
        "token",
        "limit",
        "ünï",
        "→",
        "key",
        "=",
        "12345",
        "https://docs.rs/x",
    ];
    const SEPARATORS: &[&str] =
        &[" ", "\n", "\"", "'", " (", ") ", ": ", ", ", "`", "\t", "[", "]", "{\"v\":\"", "\"}"];

    #[test]
    fn a_planted_secret_never_comes_out_property() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for case in 0..5000 {
            let (secret, core) = planted_secret(&mut rng);
            let mut text = String::new();
            for _ in 0..rng.below(12) {
                text.push_str(rng.pick(FILLER));
                text.push_str(rng.pick(SEPARATORS));
            }
            text.push_str(rng.pick(SEPARATORS));
            text.push_str(&secret);
            text.push_str(rng.pick(SEPARATORS));
            for _ in 0..rng.below(12) {
                text.push_str(rng.pick(FILLER));
                text.push_str(rng.pick(SEPARATORS));
            }
            let max = [40, 300, 2000][rng.below(3)];
            let out = redact(&text, max);
            assert!(!out.contains(&core), "case {case}: {text:?} -> {out:?}");
            // Nor any long piece of it (a secret cut in half is still a leak).
            let piece = &core[..core.len().min(16)];
            assert!(!out.contains(piece), "case {case}: {text:?} -> {out:?}");
            // The same text after JSON escaping (how harness summaries often carry it).
            let escaped = redact(&serde_json::to_string(&text).unwrap_or_default(), max);
            assert!(!escaped.contains(piece), "case {case}: escaped {escaped}");
            let value = serde_json::json!({ "output": text, "list": [text] });
            let shown = redact_value(&value, max, 10).to_string();
            assert!(!shown.contains(piece), "case {case}: json {shown}");
        }
    }
}
