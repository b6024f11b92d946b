//! The script file: a TOML list of rules, each a match on the input and a list of actions.
//!
//! Owns loading, validation (every error names the file and the 1-based line), rule matching
//! and placeholder substitution. It does not run actions or talk to the host: that is `run`.
//! The daemon uses `parse`/`load` to refuse a bad script when an agent is created, so the
//! validation is deliberately strict: unknown keys and ambiguous actions are errors.

use std::io::Read;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map as JsonMap, Number, Value};
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use crate::protocol::InputMeta;

/// Scripts larger than this are refused: a script is a handful of rules, never a data file.
pub const MAX_SCRIPT_BYTES: usize = 1024 * 1024;

/// The kinds an input can have (`InputMeta::kind`); `match.kind` must be one of them.
pub const INPUT_KINDS: [&str; 2] = ["start", "message"];

/// The keys that make an action what it is; a table must have exactly one of them.
const ACTION_KEYS: [&str; 9] = ["call", "say", "sleep", "compact", "end_turn", "crash", "usage", "fake_tool", "shell"];

/// The keys of a `usage` table.
const USAGE_KEYS: [&str; 5] = ["input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "cost_usd"];

/// A validated script.
#[derive(Debug, Clone, PartialEq)]
pub struct Script {
    /// Rules in file order; the first one that matches an input runs.
    pub rules: Vec<Rule>,
}

/// One `[[rule]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// The 1-based line the rule starts on, for messages.
    pub line: usize,
    /// What the input must look like; the default matches everything.
    pub matcher: Match,
    /// The actions to run, in order.
    pub actions: Vec<Action>,
    /// For a start rule: run at every session start, not once per agent.
    pub every_start: bool,
}

/// The `match` table of a rule. Every present field must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Match {
    /// Equal to `InputMeta::kind` (`start` or `message`).
    pub kind: Option<String>,
    /// A substring of the input text.
    pub text_contains: Option<String>,
    /// Equal to `InputMeta::sender`.
    pub sender: Option<String>,
    /// Equal to `InputMeta::channel`.
    pub channel: Option<String>,
    /// Equal to `InputMeta::topic`.
    pub topic: Option<String>,
    /// Whether the input arrived as a steer (true) or a prompt (false).
    pub steer: Option<bool>,
    /// Whether the input carries a message an earlier session was handed (`InputMeta::redelivered`).
    pub redelivered: Option<bool>,
}

/// One step of a rule.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Call a native tool over MCP; string leaves of `args` take placeholders.
    Call { tool: String, args: Value },
    /// Emit model text; takes placeholders.
    Say { text: String },
    /// A pretend tool call named `sleep` that lasts `duration`, or until an abort cuts it off.
    Sleep { duration: Duration, text: String },
    /// Emit a context compaction (start, then end).
    Compact,
    /// Drop the remaining actions of the turn.
    EndTurn,
    /// Exit at once with code 101, without ending the turn.
    Crash,
    /// Report the tokens (and cost) this model turn used, as a real harness does after a
    /// model call; `None` (`usage = "none"`) reports nothing, as a harness whose usage never
    /// arrives. A turn with no `usage` action reports zero when it completes: the stand-in
    /// for the model costs nothing.
    Usage(Option<ScriptUsage>),
    /// A pretend tool call named `tool` whose output is `output` (takes placeholders): how a
    /// test makes a session produce tool output, secrets and all, without a real tool.
    FakeTool { tool: String, output: String },
    /// Run `command` with `sh -c` in the session's own sandbox, as a coding agent's shell tool
    /// does, and report its exit status and output as the tool result (`shell`); takes
    /// placeholders. `expect` records whether the command was meant to fail or succeed, so a
    /// transcript says which attempts went as the test or demo meant.
    Shell { command: String, expect: Option<ShellExpect> },
}

/// What a `shell` action's command is meant to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShellExpect {
    /// Exit 0.
    Ok,
    /// Exit non-zero (or be killed).
    Fail,
}

impl ShellExpect {
    pub fn as_str(self) -> &'static str {
        match self {
            ShellExpect::Ok => "ok",
            ShellExpect::Fail => "fail",
        }
    }
}

/// The numbers of a `usage` action.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScriptUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
    pub cost_usd: Option<f64>,
}

/// Why a script was refused. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    /// The file could not be read.
    #[error("{}: cannot read script: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    /// The file is over `MAX_SCRIPT_BYTES`.
    #[error("{}: script is larger than {MAX_SCRIPT_BYTES} bytes", path.display())]
    TooLarge { path: PathBuf },
    /// The file is not UTF-8 text.
    #[error("{}: script is not valid utf-8", path.display())]
    NotUtf8 { path: PathBuf },
    /// A syntax or validation error at a line.
    #[error("{}:{line}: {message}", path.display())]
    Invalid { path: PathBuf, line: usize, message: String },
}

impl ScriptError {
    /// The 1-based line of the error, when it has one.
    pub fn line(&self) -> Option<usize> {
        match self {
            ScriptError::Invalid { line, .. } => Some(*line),
            _ => None,
        }
    }
}

/// Reads and validates the script at `path`.
pub fn load(path: &Path) -> Result<Script, ScriptError> {
    let file = std::fs::File::open(path).map_err(|source| ScriptError::Read { path: path.to_owned(), source })?;
    // Read one byte past the cap so an oversized file is detected without reading all of it.
    let mut bytes = Vec::new();
    file.take(MAX_SCRIPT_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| ScriptError::Read { path: path.to_owned(), source })?;
    if bytes.len() > MAX_SCRIPT_BYTES {
        return Err(ScriptError::TooLarge { path: path.to_owned() });
    }
    let text = String::from_utf8(bytes).map_err(|_| ScriptError::NotUtf8 { path: path.to_owned() })?;
    parse(path, &text)
}

/// Validates script text; `path_for_messages` only names the file in errors.
pub fn parse(path_for_messages: &Path, text: &str) -> Result<Script, ScriptError> {
    if text.len() > MAX_SCRIPT_BYTES {
        return Err(ScriptError::TooLarge { path: path_for_messages.to_owned() });
    }
    let checker = Checker { path: path_for_messages, text };
    // The recovering parser reports every error it finds; the earliest one in the file is the
    // cause, the later ones are usually its echo (an unclosed string unbalances the brackets).
    let (doc, errors) = DeTable::parse_recoverable(text);
    if let Some(first) = errors.iter().min_by_key(|e| e.span().map_or(usize::MAX, |span| span.start)) {
        let line = first.span().map_or(1, |span| checker.line_of(span.start));
        return Err(checker.error_at_line(line, format!("invalid toml: {}", one_line(first.message()))));
    }
    checker.script(doc.get_ref())
}

impl Script {
    /// The first rule whose `match` fits the input, if any.
    pub fn find_rule(&self, text: &str, meta: &InputMeta, steer: bool) -> Option<&Rule> {
        self.rules.iter().find(|rule| rule.matcher.matches(text, meta, steer))
    }
}

impl Match {
    /// Whether every present field of the match holds for this input.
    pub fn matches(&self, text: &str, meta: &InputMeta, steer: bool) -> bool {
        fn equal(want: &Option<String>, have: &Option<String>) -> bool {
            want.as_ref().is_none_or(|want| have.as_ref() == Some(want))
        }
        equal(&self.kind, &meta.kind)
            && self.text_contains.as_ref().is_none_or(|needle| text.contains(needle.as_str()))
            && equal(&self.sender, &meta.sender)
            && equal(&self.channel, &meta.channel)
            && equal(&self.topic, &meta.topic)
            && self.steer.is_none_or(|want| want == steer)
            && self.redelivered.is_none_or(|want| want == meta.redelivered)
    }
}

/// The values `{...}` placeholders expand to while one input is handled.
#[derive(Debug, Clone, Copy, Default)]
pub struct Placeholders<'a> {
    /// `{self}`: the agent handle (env `CANOPY_AGENT`).
    pub agent: &'a str,
    /// `{home}`: the agent's home channel (env `CANOPY_HOME_CHANNEL`).
    pub home: &'a str,
    /// `{input.text}`.
    pub text: &'a str,
    /// `{input.sender}`, empty when absent.
    pub sender: &'a str,
    /// `{input.channel}`, empty when absent.
    pub channel: &'a str,
    /// `{input.topic}`, empty when absent.
    pub topic: &'a str,
}

impl Placeholders<'_> {
    fn lookup(&self, name: &str) -> Option<&str> {
        match name {
            "self" => Some(self.agent),
            "home" => Some(self.home),
            "input.text" => Some(self.text),
            "input.sender" => Some(self.sender),
            "input.channel" => Some(self.channel),
            "input.topic" => Some(self.topic),
            _ => None,
        }
    }

    /// Expands known placeholders in `text`; unknown `{...}` stay as written. Expansion is a
    /// single pass, so braces inside substituted values are never expanded again.
    pub fn substitute(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(open) = rest.find('{') {
            out.push_str(&rest[..open]);
            let after = &rest[open + 1..];
            match after.find('}').and_then(|close| self.lookup(&after[..close]).map(|value| (close, value))) {
                Some((close, value)) => {
                    out.push_str(value);
                    rest = &after[close + 1..];
                }
                None => {
                    out.push('{');
                    rest = after;
                }
            }
        }
        out.push_str(rest);
        out
    }

    /// Expands placeholders in every string inside `value` (object keys are left alone).
    pub fn substitute_value(&self, value: &Value) -> Value {
        match value {
            Value::String(text) => Value::String(self.substitute(text)),
            Value::Array(items) => Value::Array(items.iter().map(|item| self.substitute_value(item)).collect()),
            Value::Object(map) => {
                Value::Object(map.iter().map(|(key, item)| (key.clone(), self.substitute_value(item))).collect())
            }
            other => other.clone(),
        }
    }
}

/// Turns a multi-line toml message into one line, so errors stay `file:line: message`.
fn one_line(message: &str) -> String {
    message.split('\n').map(str::trim).filter(|part| !part.is_empty()).collect::<Vec<_>>().join("; ")
}

type Entry<'a, 'i> = (&'a Spanned<std::borrow::Cow<'i, str>>, &'a Spanned<DeValue<'i>>);

/// Walks the parsed document and builds a `Script`, turning spans into line numbers.
struct Checker<'p> {
    path: &'p Path,
    text: &'p str,
}

impl Checker<'_> {
    fn line_of(&self, offset: usize) -> usize {
        let end = offset.min(self.text.len());
        self.text.as_bytes()[..end].iter().filter(|b| **b == b'\n').count() + 1
    }

    fn error_at_line(&self, line: usize, message: String) -> ScriptError {
        ScriptError::Invalid { path: self.path.to_owned(), line, message }
    }

    fn error(&self, span: Range<usize>, message: impl Into<String>) -> ScriptError {
        self.error_at_line(self.line_of(span.start), message.into())
    }

    /// Table entries in file order: the map itself is sorted by key, which would make the
    /// reported error depend on key names rather than on where the mistake is.
    fn entries<'a, 'i>(table: &'a DeTable<'i>) -> Vec<Entry<'a, 'i>> {
        let mut entries: Vec<_> = table.iter().collect();
        entries.sort_by_key(|(key, _)| key.span().start);
        entries
    }

    fn script(&self, root: &DeTable<'_>) -> Result<Script, ScriptError> {
        let mut rules = Vec::new();
        for (key, value) in Self::entries(root) {
            if key.get_ref() != "rule" {
                return Err(self.error(key.span(), format!("unknown key `{}` (expected `rule`)", key.get_ref())));
            }
            let DeValue::Array(items) = value.get_ref() else {
                return Err(self.error(value.span(), "`rule` must be an array of tables (`[[rule]]`)"));
            };
            for item in items.iter() {
                rules.push(self.rule(item)?);
            }
        }
        Ok(Script { rules })
    }

    fn rule(&self, item: &Spanned<DeValue<'_>>) -> Result<Rule, ScriptError> {
        let DeValue::Table(table) = item.get_ref() else {
            return Err(self.error(item.span(), "rule must be a table"));
        };
        let mut matcher = Match::default();
        let mut actions = None;
        let mut every_start = false;
        for (key, value) in Self::entries(table) {
            match key.get_ref().as_ref() {
                "match" => matcher = self.matcher(value)?,
                "actions" => actions = Some(self.actions(value)?),
                "every_start" => match value.get_ref() {
                    DeValue::Boolean(flag) => every_start = *flag,
                    _ => return Err(self.error(value.span(), "`every_start` must be true or false")),
                },
                other => {
                    return Err(self.error(
                        key.span(),
                        format!("unknown key `{other}` in rule (expected `match`, `actions` or `every_start`)"),
                    ));
                }
            }
        }
        let Some(actions) = actions else {
            return Err(self.error(item.span(), "rule has no `actions`"));
        };
        Ok(Rule { line: self.line_of(item.span().start), matcher, actions, every_start })
    }

    fn matcher(&self, value: &Spanned<DeValue<'_>>) -> Result<Match, ScriptError> {
        let DeValue::Table(table) = value.get_ref() else {
            return Err(self.error(value.span(), "`match` must be a table"));
        };
        let mut matcher = Match::default();
        for (key, value) in Self::entries(table) {
            let name = key.get_ref().as_ref();
            match name {
                "kind" => {
                    let kind = self.string(value, "match.kind")?;
                    if !INPUT_KINDS.contains(&kind.as_str()) {
                        return Err(self.error(
                            value.span(),
                            format!("`match.kind` is `{kind}`; it must be `start` or `message`"),
                        ));
                    }
                    matcher.kind = Some(kind);
                }
                "text_contains" => matcher.text_contains = Some(self.string(value, "match.text_contains")?),
                "sender" => matcher.sender = Some(self.string(value, "match.sender")?),
                "channel" => matcher.channel = Some(self.string(value, "match.channel")?),
                "topic" => matcher.topic = Some(self.string(value, "match.topic")?),
                "steer" => match value.get_ref() {
                    DeValue::Boolean(steer) => matcher.steer = Some(*steer),
                    _ => return Err(self.error(value.span(), "`match.steer` must be a boolean")),
                },
                "redelivered" => match value.get_ref() {
                    DeValue::Boolean(again) => matcher.redelivered = Some(*again),
                    _ => return Err(self.error(value.span(), "`match.redelivered` must be a boolean")),
                },
                other => {
                    return Err(self.error(
                        key.span(),
                        format!(
                            "unknown key `{other}` in match (expected kind, text_contains, sender, channel, topic, \
                             steer or redelivered)"
                        ),
                    ));
                }
            }
        }
        Ok(matcher)
    }

    fn actions(&self, value: &Spanned<DeValue<'_>>) -> Result<Vec<Action>, ScriptError> {
        let DeValue::Array(items) = value.get_ref() else {
            return Err(self.error(value.span(), "`actions` must be an array of tables"));
        };
        items.iter().map(|item| self.action(item)).collect()
    }

    fn action(&self, item: &Spanned<DeValue<'_>>) -> Result<Action, ScriptError> {
        let DeValue::Table(table) = item.get_ref() else {
            return Err(self.error(item.span(), "action must be a table"));
        };
        let entries = Self::entries(table);
        let mut kinds = Vec::new();
        let mut args = None;
        let mut output = None;
        let mut expect = None;
        for &(key, value) in &entries {
            let name = key.get_ref().as_ref();
            if ACTION_KEYS.contains(&name) {
                kinds.push((name, value));
            } else if name == "args" {
                args = Some((key, value));
            } else if name == "expect" {
                expect = Some((key, value));
            } else if name == "output" {
                output = Some((key, value));
            } else {
                return Err(self.error(
                    key.span(),
                    format!(
                        "unknown key `{name}` in action (expected one of call, say, sleep, compact, end_turn, crash, \
                         usage, fake_tool, shell, args, output, expect)"
                    ),
                ));
            }
        }
        let (kind, value) = match kinds.as_slice() {
            [] => {
                return Err(self.error(
                    item.span(),
                    "action has none of `call`, `say`, `sleep`, `compact`, `end_turn`, `crash`, `usage`, `fake_tool`, \
                     `shell`",
                ));
            }
            [one] => *one,
            [first, second] => {
                return Err(self.error(item.span(), format!("action has both `{}` and `{}`", first.0, second.0)));
            }
            many => {
                let names: Vec<String> = many.iter().map(|(name, _)| format!("`{name}`")).collect();
                return Err(self.error(item.span(), format!("action has {}; it needs exactly one", names.join(", "))));
            }
        };
        if let Some((key, _)) = args
            && kind != "call"
        {
            return Err(self.error(key.span(), format!("`args` belongs to a `call` action, not `{kind}`")));
        }
        if let Some((key, _)) = output
            && kind != "fake_tool"
        {
            return Err(self.error(key.span(), format!("`output` belongs to a `fake_tool` action, not `{kind}`")));
        }
        if let Some((key, _)) = expect
            && kind != "shell"
        {
            return Err(self.error(key.span(), format!("`expect` belongs to a `shell` action, not `{kind}`")));
        }
        match kind {
            "call" => {
                let tool = self.string(value, "call")?;
                if tool.trim().is_empty() {
                    return Err(self.error(value.span(), "`call` names no tool"));
                }
                let args = match args {
                    None => Value::Object(JsonMap::new()),
                    Some((_, args)) => match args.get_ref() {
                        DeValue::Table(_) => self.json(args)?,
                        _ => return Err(self.error(args.span(), "`args` must be a table")),
                    },
                };
                Ok(Action::Call { tool, args })
            }
            "say" => Ok(Action::Say { text: self.string(value, "say")? }),
            "sleep" => {
                let text = self.string(value, "sleep")?;
                let duration = humantime::parse_duration(text.trim())
                    .map_err(|e| self.error(value.span(), format!("bad duration `{text}` in `sleep`: {e}")))?;
                Ok(Action::Sleep { duration, text })
            }
            "compact" => self.flag(value, "compact").map(|()| Action::Compact),
            "end_turn" => self.flag(value, "end_turn").map(|()| Action::EndTurn),
            "usage" => self.usage(value).map(Action::Usage),
            "fake_tool" => {
                let tool = self.string(value, "fake_tool")?;
                if tool.trim().is_empty() {
                    return Err(self.error(value.span(), "`fake_tool` names no tool"));
                }
                let output = match output {
                    Some((_, output)) => self.string(output, "output")?,
                    None => return Err(self.error(item.span(), "a `fake_tool` action needs `output`")),
                };
                Ok(Action::FakeTool { tool, output })
            }
            "shell" => {
                let command = self.string(value, "shell")?;
                if command.trim().is_empty() {
                    return Err(self.error(value.span(), "`shell` names no command"));
                }
                let expect = match expect {
                    None => None,
                    Some((_, expect)) => match self.string(expect, "expect")?.as_str() {
                        "ok" => Some(ShellExpect::Ok),
                        "fail" => Some(ShellExpect::Fail),
                        other => {
                            return Err(
                                self.error(expect.span(), format!("`expect` is \"ok\" or \"fail\", not {other:?}"))
                            );
                        }
                    },
                };
                Ok(Action::Shell { command, expect })
            }
            _ => self.flag(value, "crash").map(|()| Action::Crash),
        }
    }

    /// A `usage` action: `"none"`, or the numbers of a model call.
    fn usage(&self, value: &Spanned<DeValue<'_>>) -> Result<Option<ScriptUsage>, ScriptError> {
        match value.get_ref() {
            DeValue::String(text) if text.as_ref() == "none" => Ok(None),
            _ => self.usage_numbers(value).map(Some),
        }
    }

    fn usage_numbers(&self, value: &Spanned<DeValue<'_>>) -> Result<ScriptUsage, ScriptError> {
        let DeValue::Table(table) = value.get_ref() else {
            return Err(self.error(
                value.span(),
                "`usage` must be \"none\" or a table like { input_tokens = 10, output_tokens = 5 }",
            ));
        };
        let mut usage = ScriptUsage::default();
        for (key, item) in Self::entries(table) {
            let name = key.get_ref().as_ref();
            if !USAGE_KEYS.contains(&name) {
                return Err(self.error(
                    key.span(),
                    format!("unknown key `{name}` in usage (expected one of {})", USAGE_KEYS.join(", ")),
                ));
            }
            let number = match self.json(item)? {
                Value::Number(n) => n,
                _ => return Err(self.error(item.span(), format!("`usage.{name}` must be a number"))),
            };
            if name == "cost_usd" {
                match number.as_f64().filter(|c| c.is_finite() && *c >= 0.0) {
                    Some(cost) => usage.cost_usd = Some(cost),
                    None => return Err(self.error(item.span(), "`usage.cost_usd` must be a non-negative number")),
                }
                continue;
            }
            let Some(count) = number.as_u64() else {
                return Err(self.error(item.span(), format!("`usage.{name}` must be a non-negative integer")));
            };
            match name {
                "input_tokens" => usage.input_tokens = count,
                "output_tokens" => usage.output_tokens = count,
                "cache_read_tokens" => usage.cache_read_tokens = count,
                _ => usage.cache_write_tokens = count,
            }
        }
        Ok(usage)
    }

    fn string(&self, value: &Spanned<DeValue<'_>>, what: &str) -> Result<String, ScriptError> {
        match value.get_ref() {
            DeValue::String(text) => Ok(text.to_string()),
            other => Err(self.error(value.span(), format!("`{what}` must be a string, not {}", other.type_str()))),
        }
    }

    /// `compact`, `end_turn` and `crash` only mean something as `true`; `false` is refused
    /// rather than read as "do nothing", since it is almost certainly a mistake.
    fn flag(&self, value: &Spanned<DeValue<'_>>, what: &str) -> Result<(), ScriptError> {
        match value.get_ref() {
            DeValue::Boolean(true) => Ok(()),
            _ => Err(self.error(value.span(), format!("`{what}` must be `true`"))),
        }
    }

    fn json(&self, value: &Spanned<DeValue<'_>>) -> Result<Value, ScriptError> {
        Ok(match value.get_ref() {
            DeValue::String(text) => Value::String(text.to_string()),
            DeValue::Integer(int) => {
                let number = i64::from_str_radix(int.as_str(), int.radix())
                    .map(Number::from)
                    .or_else(|_| u64::from_str_radix(int.as_str(), int.radix()).map(Number::from))
                    .map_err(|_| self.error(value.span(), format!("integer `{int}` in `args` is out of range")))?;
                Value::Number(number)
            }
            DeValue::Float(float) => {
                let number =
                    float.as_str().parse::<f64>().ok().and_then(Number::from_f64).ok_or_else(|| {
                        self.error(value.span(), format!("float `{float}` in `args` is not valid json"))
                    })?;
                Value::Number(number)
            }
            DeValue::Boolean(flag) => Value::Bool(*flag),
            DeValue::Datetime(datetime) => Value::String(datetime.to_string()),
            DeValue::Array(items) => Value::Array(items.iter().map(|item| self.json(item)).collect::<Result<_, _>>()?),
            DeValue::Table(table) => {
                let mut map = JsonMap::new();
                for (key, item) in Self::entries(table) {
                    map.insert(key.get_ref().to_string(), self.json(item)?);
                }
                Value::Object(map)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly on purpose")]

    use super::*;
    use canopy_core::fuzz::{Rng, mutate};
    use serde_json::json;

    /// How many cases a property test runs: `CANOPY_FUZZ_CASES`, else `default`.
    fn cases(default: usize) -> usize {
        std::env::var("CANOPY_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
    }

    #[test]
    fn fuzzed_scripts_are_parsed_or_refused_with_a_line_never_a_panic() {
        let seeds = [
            "[[rule]]\nmatch = { kind = \"start\" }\nactions = [{ call = \"comms_post_message\", args = { channel = \"x\", topic = \"t\", body = \"{{input}}\" } }, { sleep = \"2s\" }, { say = \"done\" }]\n",
            "[[rule]]\nmatch = { steer = true, contains = \"stop\" }\nactions = [{ say = \"heard\" }]\n[[rule]]\nmatch = { kind = \"message\" }\nactions = [{ fail = \"no\" }]\n",
        ];
        let mut rng = Rng::new(0x7363_7269);
        for case in 0..cases(20_000) {
            let text = mutate(&mut rng, seeds[case % seeds.len()]);
            if let Err(e) = parse(std::path::Path::new("fuzz.toml"), &text) {
                assert!(!e.to_string().is_empty(), "an error that says nothing for {text:?}");
            }
        }
    }

    fn ok(text: &str) -> Script {
        match parse(Path::new("script.toml"), text) {
            Ok(script) => script,
            Err(e) => panic!("script should parse: {e}"),
        }
    }

    /// Asserts the script is refused at `line` with a message containing `needle`.
    fn refused(text: &str, line: usize, needle: &str) {
        let err = parse(Path::new("script.toml"), text).unwrap_err();
        let shown = err.to_string();
        assert_eq!(err.line(), Some(line), "wrong line in `{shown}`");
        assert!(shown.starts_with(&format!("script.toml:{line}: ")), "bad prefix in `{shown}`");
        assert!(shown.contains(needle), "`{shown}` does not mention `{needle}`");
        assert!(!shown.contains('\n'), "`{shown}` spans lines");
    }

    fn meta(kind: &str) -> InputMeta {
        InputMeta { kind: Some(kind.to_owned()), ..InputMeta::default() }
    }

    const EXAMPLE: &str = r#"
# every rule is tried in order
[[rule]]
match = { kind = "start" }
actions = [
  { call = "comms_post_message", args = { channel = "{home}", topic = "status", body = "{self} is online", create_topic = true } },
  { say = "posted my status" },
  { sleep = "2s" },
  { compact = true },
  { end_turn = true },
  { crash = true },
]
[[rule]]
match = { steer = true, text_contains = "stop" }
actions = [{ say = "stopping" }, { end_turn = true }]
"#;

    #[test]
    fn the_documented_example_parses() {
        let script = ok(EXAMPLE);
        assert_eq!(script.rules.len(), 2);
        let first = &script.rules[0];
        assert_eq!(first.line, 3);
        assert_eq!(first.matcher, Match { kind: Some("start".into()), ..Match::default() });
        assert_eq!(
            first.actions,
            vec![
                Action::Call {
                    tool: "comms_post_message".into(),
                    args: json!({"channel": "{home}", "topic": "status", "body": "{self} is online", "create_topic": true}),
                },
                Action::Say { text: "posted my status".into() },
                Action::Sleep { duration: Duration::from_secs(2), text: "2s".into() },
                Action::Compact,
                Action::EndTurn,
                Action::Crash,
            ]
        );
        let second = &script.rules[1];
        assert_eq!(second.line, 13);
        assert_eq!(second.matcher.steer, Some(true));
        assert_eq!(second.matcher.text_contains.as_deref(), Some("stop"));
    }

    #[test]
    fn other_toml_spellings_parse_too() {
        let script = ok(r#"
[[rule]]
[rule.match]
sender = "alice"
channel = "general"
topic = "plans"

[[rule.actions]]
call = "comms_read"
[rule.actions.args]
limit = 0x10
ratio = 0.5
tags = ["a", "{input.sender}"]
when = 1979-05-27T07:32:00Z
nested = { deep = { x = -3 } }

[[rule.actions]]
say = "done"

[[rule]]
actions = []
"#);
        assert_eq!(script.rules.len(), 2);
        let rule = &script.rules[0];
        assert_eq!(rule.line, 2);
        assert_eq!(rule.matcher.sender.as_deref(), Some("alice"));
        assert_eq!(rule.matcher.channel.as_deref(), Some("general"));
        assert_eq!(rule.matcher.topic.as_deref(), Some("plans"));
        assert_eq!(
            rule.actions[0],
            Action::Call {
                tool: "comms_read".into(),
                args: json!({
                    "limit": 16, "ratio": 0.5, "tags": ["a", "{input.sender}"],
                    "when": "1979-05-27T07:32:00Z", "nested": {"deep": {"x": -3}},
                }),
            }
        );
        assert!(script.rules[1].actions.is_empty());
        assert_eq!(script.rules[1].matcher, Match::default());
    }

    #[test]
    fn empty_scripts_and_calls_without_args_are_fine() {
        assert!(ok("").rules.is_empty());
        assert!(ok("# nothing yet\n").rules.is_empty());
        let script = ok("[[rule]]\nmatch = {}\nactions = [{ call = \"whoami\" }, { sleep = \"1m 30s\" }]\n");
        assert_eq!(script.rules[0].actions[0], Action::Call { tool: "whoami".into(), args: json!({}) });
        assert_eq!(
            script.rules[0].actions[1],
            Action::Sleep { duration: Duration::from_secs(90), text: "1m 30s".into() }
        );
    }

    /// The issue tools need no action of their own: a `call` names them, and numbers and
    /// lists of numbers (`issue`, `issues`, `blocked_by`) reach the tool as JSON integers.
    #[test]
    fn issue_tools_are_called_like_any_tool() {
        let script = ok(r#"
[[rule]]
match = { kind = "message", text_contains = "filed #1" }
actions = [
  { call = "issues_update", args = { issue = 1, state = "in_progress", note = "on it" } },
  { call = "agents_run_subagent", args = { definition = "implementer", brief = "do it", issue = 1 } },
  { call = "merge_request", args = { title = "t", summary = "s", issues = [1, 2] } },
  { call = "issues_update", args = { issue = 2, state = "blocked", note = "waits", blocked_by = [3] } },
  { call = "issues_update", args = { issue = 1, state = "done", note = "landed", resolution = "shipped in merge-1" } },
]
"#);
        let calls: Vec<(String, Value)> = script.rules[0]
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Call { tool, args } => Some((tool.clone(), args.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(calls[0], ("issues_update".into(), json!({"issue": 1, "state": "in_progress", "note": "on it"})));
        assert_eq!(calls[1].1["issue"], json!(1));
        assert_eq!(calls[2].1["issues"], json!([1, 2]));
        assert_eq!(calls[3].1["blocked_by"], json!([3]));
        assert_eq!(calls[4].1["resolution"], json!("shipped in merge-1"));
        assert!(calls.iter().all(|(_, args)| args.as_object().is_some()));
    }

    #[test]
    fn syntax_errors_name_the_line() {
        refused("[[rule]]\nactions = [\n  { say = \"hi\" },\n  { say = \"unterminated },\n]\n", 4, "invalid toml");
        refused("[[rule]]\nactions = []\nactions = []\n", 3, "duplicate key");
        // The array is never closed; toml notices where the next element should have been.
        refused("[[rule]]\nactions = [{ say = \"a\" }\n\n[[rule]]\n", 4, "invalid toml");
        refused("[[rule]]\nactions = [\n  { say = hi },\n]\n", 3, "invalid toml");
    }

    #[test]
    fn unknown_keys_are_errors_at_their_line() {
        refused("[[rule]]\nactions = []\n\n[settings]\nx = 1\n", 4, "unknown key `settings`");
        refused("[[rule]]\nactions = []\nwhen = \"now\"\n", 3, "unknown key `when` in rule");
        refused(
            "[[rule]]\nmatch = { kind = \"start\",\n  sendr = \"bob\" }\nactions = []\n",
            3,
            "unknown key `sendr` in match",
        );
        refused(
            "[[rule]]\nactions = [\n  { say = \"a\" },\n  { say = \"b\", loud = true },\n]\n",
            4,
            "unknown key `loud` in action",
        );
        refused("rule = 3\n", 1, "`rule` must be an array of tables");
    }

    #[test]
    fn actions_need_exactly_one_kind() {
        refused(
            "[[rule]]\nactions = [\n  { say = \"hi\", sleep = \"1s\" },\n]\n",
            3,
            "action has both `say` and `sleep`",
        );
        refused("[[rule]]\nactions = [\n  { say = \"a\" },\n  {},\n]\n", 4, "action has none of");
        refused("[[rule]]\nactions = [{ args = { a = 1 } }]\n", 2, "action has none of");
        refused("[[rule]]\nactions = [{ crash = true, compact = true, say = \"x\" }]\n", 2, "it needs exactly one");
        refused("[[rule]]\nactions = [\"say hi\"]\n", 2, "action must be a table");
        refused("[[rule]]\nactions = { say = \"hi\" }\n", 2, "`actions` must be an array");
    }

    #[test]
    fn rules_need_actions() {
        refused("[[rule]]\nactions = []\n\n[[rule]]\nmatch = { kind = \"start\" }\n", 4, "rule has no `actions`");
        refused("rule = [{ match = {} }]\n", 1, "rule has no `actions`");
    }

    #[test]
    fn action_values_are_checked() {
        refused("[[rule]]\nactions = [\n  { sleep = \"2 fortnights\" },\n]\n", 3, "bad duration `2 fortnights`");
        refused("[[rule]]\nactions = [{ sleep = 2 }]\n", 2, "`sleep` must be a string");
        refused("[[rule]]\nactions = [{ say = 1 }]\n", 2, "`say` must be a string");
        refused("[[rule]]\nactions = [{ call = \"\" }]\n", 2, "`call` names no tool");
        refused("[[rule]]\nactions = [\n  { call = \"x\", args = \"y\" },\n]\n", 3, "`args` must be a table");
        refused("[[rule]]\nactions = [\n  { call = \"x\", args = [1] },\n]\n", 3, "`args` must be a table");
        refused("[[rule]]\nactions = [{ say = \"x\",\n  args = {} }]\n", 3, "`args` belongs to a `call` action");
        refused("[[rule]]\nactions = [{ compact = false }]\n", 2, "`compact` must be `true`");
        refused("[[rule]]\nactions = [{ end_turn = \"yes\" }]\n", 2, "`end_turn` must be `true`");
        refused("[[rule]]\nactions = [{ crash = 1 }]\n", 2, "`crash` must be `true`");
        refused("[[rule]]\nactions = [\n{ call = \"x\", args = { big = 99999999999999999999 } }]\n", 3, "out of range");
        refused("[[rule]]\nactions = [\n{ call = \"x\", args = { n = nan } }]\n", 3, "not valid json");
    }

    #[test]
    fn usage_and_fake_tool_actions_parse_and_are_checked() {
        let script = ok(r#"
[[rule]]
actions = [
  { usage = { input_tokens = 1200, output_tokens = 300, cache_read_tokens = 5, cost_usd = 0.25 } },
  { fake_tool = "bash", output = "token for {self}" },
  { usage = "none" },
]
"#);
        assert_eq!(
            script.rules[0].actions,
            vec![
                Action::Usage(Some(ScriptUsage {
                    input_tokens: 1200,
                    output_tokens: 300,
                    cache_read_tokens: 5,
                    cache_write_tokens: 0,
                    cost_usd: Some(0.25),
                })),
                Action::FakeTool { tool: "bash".into(), output: "token for {self}".into() },
                Action::Usage(None),
            ]
        );
        refused("[[rule]]\nactions = [\n  { usage = { input_tokens = -1 } },\n]\n", 3, "non-negative integer");
        refused("[[rule]]\nactions = [\n  { usage = { tokens = 1 } },\n]\n", 3, "unknown key `tokens` in usage");
        refused("[[rule]]\nactions = [{ usage = 5 }]\n", 2, "`usage` must be \"none\" or a table");
        refused("[[rule]]\nactions = [{ usage = \"some\" }]\n", 2, "`usage` must be \"none\" or a table");
        refused(
            "[[rule]]\nactions = [\n { usage = { cost_usd = \"free\" } }]\n",
            3,
            "`usage.cost_usd` must be a number",
        );
        refused("[[rule]]\nactions = [\n  { fake_tool = \"bash\" },\n]\n", 3, "needs `output`");
        refused(
            "[[rule]]\nactions = [\n  { say = \"x\", output = \"y\" },\n]\n",
            3,
            "`output` belongs to a `fake_tool`",
        );
        refused("[[rule]]\nactions = [{ fake_tool = \"\", output = \"y\" }]\n", 2, "names no tool");
    }

    #[test]
    fn match_values_are_checked() {
        refused("[[rule]]\nmatch = { steer = \"yes\" }\nactions = []\n", 2, "`match.steer` must be a boolean");
        refused("[[rule]]\nmatch = { kind = \"begin\" }\nactions = []\n", 2, "`match.kind` is `begin`");
        refused("[[rule]]\nmatch = { sender = 7 }\nactions = []\n", 2, "`match.sender` must be a string");
        refused("[[rule]]\nmatch = \"start\"\nactions = []\n", 2, "`match` must be a table");
    }

    #[test]
    fn oversized_and_unreadable_scripts_are_refused() {
        let big = format!("# {}\n", "x".repeat(MAX_SCRIPT_BYTES));
        assert!(matches!(parse(Path::new("big.toml"), &big), Err(ScriptError::TooLarge { .. })));

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.toml");
        std::fs::write(&path, &big).unwrap();
        let err = load(&path).unwrap_err();
        assert!(matches!(err, ScriptError::TooLarge { .. }));
        assert!(err.to_string().contains("big.toml"));

        let missing = dir.path().join("missing.toml");
        let err = load(&missing).unwrap_err();
        assert!(matches!(err, ScriptError::Read { .. }));
        assert!(err.to_string().contains("missing.toml"));

        let binary = dir.path().join("binary.toml");
        std::fs::write(&binary, [0xff, 0xfe, 0x00]).unwrap();
        assert!(matches!(load(&binary), Err(ScriptError::NotUtf8 { .. })));

        let good = dir.path().join("good.toml");
        std::fs::write(&good, EXAMPLE).unwrap();
        assert_eq!(load(&good).unwrap().rules.len(), 2);

        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, "[[rule]]\nactions = [{ say = \"a\", sleep = \"1s\" }]\n").unwrap();
        let err = load(&bad).unwrap_err();
        assert_eq!(err.to_string(), format!("{}:2: action has both `say` and `sleep`", bad.display()));
    }

    #[test]
    fn the_first_matching_rule_wins() {
        let script = ok(r#"
[[rule]]
match = { steer = true, text_contains = "stop" }
actions = [{ say = "stopping" }]
[[rule]]
match = { kind = "start" }
actions = [{ say = "hello" }]
[[rule]]
match = { kind = "message", sender = "alice", channel = "general", topic = "plans" }
actions = [{ say = "alice in plans" }]
[[rule]]
match = { steer = false }
actions = [{ say = "fallback prompt" }]
[[rule]]
actions = [{ say = "anything" }]
"#);
        let said = |text: &str, meta: &InputMeta, steer: bool| match script.find_rule(text, meta, steer) {
            Some(rule) => match &rule.actions[0] {
                Action::Say { text } => text.clone(),
                other => panic!("unexpected action {other:?}"),
            },
            None => "none".to_owned(),
        };
        assert_eq!(said("please stop now", &meta("start"), true), "stopping");
        // The steer flag must hold: the same text as a prompt does not match rule 1.
        assert_eq!(said("please stop now", &meta("start"), false), "hello");
        assert_eq!(said("hi", &meta("start"), true), "hello");
        let alice = InputMeta {
            sender: Some("alice".into()),
            channel: Some("general".into()),
            topic: Some("plans".into()),
            kind: Some("message".into()),
            seq: None,
            redelivered: false,
        };
        assert_eq!(said("hi", &alice, false), "alice in plans");
        let bob = InputMeta { sender: Some("bob".into()), ..alice.clone() };
        assert_eq!(said("hi", &bob, false), "fallback prompt");
        assert_eq!(said("hi", &bob, true), "anything");
        // A rule asking for a kind does not match an input without one.
        assert_eq!(said("hi", &InputMeta::default(), true), "anything");
        assert_eq!(ok("").find_rule("hi", &alice, false), None);
    }

    #[test]
    fn a_rule_can_match_a_redelivery() {
        let script = ok(r#"
[[rule]]
match = { redelivered = true }
actions = [{ say = "seen before?" }]
[[rule]]
match = { kind = "message" }
actions = [{ say = "new" }]
"#);
        let fresh = InputMeta { kind: Some("message".into()), ..InputMeta::default() };
        let again = InputMeta { redelivered: true, ..fresh.clone() };
        let first = |meta: &InputMeta| match &script.find_rule("x", meta, false).unwrap().actions[0] {
            Action::Say { text } => text.clone(),
            other => panic!("unexpected action {other:?}"),
        };
        assert_eq!(first(&again), "seen before?");
        assert_eq!(first(&fresh), "new");
        let refused = parse(Path::new("s.toml"), "[[rule]]\nmatch = { redelivered = \"yes\" }\nactions = []\n");
        assert!(refused.unwrap_err().to_string().contains("`match.redelivered` must be a boolean"));
    }

    #[test]
    fn placeholders_expand_known_names_only() {
        let values = Placeholders {
            agent: "ada",
            home: "ada-home",
            text: "hello {self}",
            sender: "bob",
            channel: "general",
            topic: "",
        };
        assert_eq!(values.substitute("{self} in {home}"), "ada in ada-home");
        assert_eq!(values.substitute("[{input.sender}@{input.channel}/{input.topic}]"), "[bob@general/]");
        // Substituted text is not expanded again, and unknown names stay as written.
        assert_eq!(values.substitute("echo: {input.text}"), "echo: hello {self}");
        assert_eq!(values.substitute("{unknown} {self"), "{unknown} {self");
        assert_eq!(values.substitute("{{self}}"), "{ada}");
        assert_eq!(values.substitute("}{"), "}{");
        assert_eq!(values.substitute("ünïcode {self} ✓"), "ünïcode ada ✓");

        let args = json!({"channel": "{home}", "n": 3, "list": ["{self}", {"deep": "{input.sender}"}], "{self}": true});
        assert_eq!(
            values.substitute_value(&args),
            json!({"channel": "ada-home", "n": 3, "list": ["ada", {"deep": "bob"}], "{self}": true})
        );
    }
}
