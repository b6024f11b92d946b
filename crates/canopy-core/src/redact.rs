//! Redaction of secrets and bulk from text that is stored or shown (activity, watch).
//!
//! Masks bearer tokens, Canopy tokens, API-key shapes of the usual providers, JWTs,
//! private-key blocks and `KEY=value` pairs whose key looks secret; replaces long base64
//! runs and data URIs with a placeholder carrying their size; cuts text beyond a length.
//! The Continuity issue widens this module and adds property tests; every path that stores
//! or shows harness output already goes through it.

/// Redacts `text` and cuts it to at most `max_chars` characters (with a note).
pub fn redact(text: &str, max_chars: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max_chars + 32));
    let tokens: Vec<&str> = text.split_inclusive(|c: char| c.is_whitespace()).collect();
    let mut mask_next = false;
    for piece in tokens {
        let word = piece.trim_end();
        let tail = &piece[word.len()..];
        if mask_next && !word.is_empty() {
            out.push_str("[redacted]");
            out.push_str(tail);
            mask_next = false;
            continue;
        }
        if word.eq_ignore_ascii_case("bearer") {
            mask_next = true;
            out.push_str(piece);
            continue;
        }
        out.push_str(&redact_word(word));
        out.push_str(tail);
    }
    cut(&out, max_chars)
}

fn redact_word(word: &str) -> String {
    const PREFIXES: &[&str] = &[
        "cnp_",
        "sk-",
        "sk_live_",
        "sk_test_",
        "ghp_",
        "gho_",
        "ghs_",
        "github_pat_",
        "xoxb-",
        "xoxp-",
        "AKIA",
        "AIza",
        "glpat-",
    ];
    let core = word.trim_matches(|c: char| "\"'`,;()[]{}<>".contains(c));
    if let Some((key, value)) = core.split_once('=')
        && !value.is_empty()
        && secret_name(key)
    {
        return word.replace(value, "[redacted]");
    }
    if core.starts_with("data:") && core.contains(";base64,") {
        return word.replace(core, &format!("[data uri, {} bytes]", core.len()));
    }
    if PREFIXES.iter().any(|p| core.starts_with(p) && core.len() >= p.len() + 8) {
        return word.replace(core, "[redacted]");
    }
    if core.starts_with("eyJ") && core.matches('.').count() == 2 && core.len() > 30 {
        return word.replace(core, "[redacted jwt]");
    }
    if core.len() >= 200 && core.bytes().all(|b| b.is_ascii_alphanumeric() || b"+/=_-".contains(&b)) {
        return word.replace(core, &format!("[blob, {} bytes]", core.len()));
    }
    if core.starts_with("-----BEGIN") && core.contains("PRIVATE") {
        return "[redacted private key]".to_owned();
    }
    word.to_owned()
}

fn secret_name(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    ["token", "secret", "password", "passwd", "api_key", "apikey", "private_key", "credential", "auth"]
        .iter()
        .any(|s| key.contains(s))
}

/// Cuts text to `max_chars` characters, saying how much was cut.
pub fn cut(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        None => text.to_owned(),
        Some((at, _)) => format!("{}… [{} more chars cut]", &text[..at], text[at..].chars().count()),
    }
}

#[cfg(test)]
mod tests {
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
        assert!(redact(&uri, 1000).starts_with("[data uri"));
        let long = "word ".repeat(100);
        let out = redact(&long, 20);
        assert!(out.contains("more chars cut") && out.chars().count() < 60, "{out}");
        assert_eq!(redact("plain text stays", 100), "plain text stays");
    }
}
