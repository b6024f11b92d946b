//! `canopy top`: a live full-screen view of the tree for operators who live in a terminal (over
//! SSH, in tmux), redrawn every `--interval`: the tree with presence and activity, what waits
//! for you and for how long, budget alerts, the newest messages. Keys act through the API as
//! the CLI's commands do: approve (`a`) or deny (`d`, asking the reason) the selected request,
//! watch the selected agent (`w`), post to its home channel (`p`), quit (`q`). A daemon that
//! restarts (a new port in `daemon.json`) is followed, as `tail` follows it. The terminal is
//! drawn with ratatui on crossterm; raw mode and the alternate screen are undone on every exit.
//!
//! - `model.rs`: what a frame shows, read each tick, and the acts.
//! - `draw.rs`: one frame.

mod draw;
mod model;

use std::time::Duration;

use canopy_config::DataDir;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::crossterm::{execute, terminal};
use tokio::sync::mpsc;

use crate::client::Client;
use draw::{Focus, Screen};
use model::Snapshot;

/// What the keys are doing.
#[derive(Debug, Clone, PartialEq)]
enum Mode {
    Keys,
    /// Typing the reason to deny `id`.
    Deny {
        id: String,
        text: String,
    },
    /// Typing a post to `handle`'s home channel.
    Post {
        handle: String,
        text: String,
    },
}

/// The view's state between frames.
struct State {
    dir: DataDir,
    client: Option<Client>,
    /// The pid of the daemon `client` reached, read from `daemon.json` when connecting.
    pid: u32,
    snapshot: Snapshot,
    header: String,
    focus: Focus,
    tree_at: usize,
    waiting_at: usize,
    watching: Option<String>,
    mode: Mode,
    said: Option<String>,
}

const KEYS: &str = "↑↓ move · Tab tree/waiting · a approve · d deny · w watch · p post home · q quit";

/// Restores the terminal when dropped, however `top` ends.
struct Terminal;

impl Drop for Terminal {
    fn drop(&mut self) {
        // Nothing else can be done with a terminal that will not take these.
        let _ = execute!(std::io::stdout(), terminal::LeaveAlternateScreen);
        let _ = terminal::disable_raw_mode();
    }
}

/// Runs the view until `q`; the exit code of a terminal that could not be drawn on follows
/// the writer's (141 for a closed one, 74 otherwise).
pub async fn run(dir: &DataDir, interval: Duration) -> u8 {
    if let Err(e) = terminal::enable_raw_mode() {
        crate::writer::errln!("error: canopy top needs a terminal: {e}");
        return crate::exit::EXIT_USAGE;
    }
    let guard = Terminal;
    let drawn = execute!(std::io::stdout(), terminal::EnterAlternateScreen);
    let backend = ratatui::backend::CrosstermBackend::new(std::io::stdout());
    let mut screen = match drawn.and_then(|()| ratatui::Terminal::new(backend)) {
        Ok(screen) => screen,
        Err(e) => return failed(guard, &e),
    };
    let (keys, mut pressed) = mpsc::channel::<KeyEvent>(64);
    std::thread::spawn(move || read_keys(keys));
    let mut state = State {
        dir: dir.clone(),
        client: None,
        pid: 0,
        snapshot: Snapshot::default(),
        header: "canopy top: connecting…".into(),
        focus: Focus::Waiting,
        tree_at: 0,
        waiting_at: 0,
        watching: None,
        mode: Mode::Keys,
        said: None,
    };
    let colour = std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let mut tick = tokio::time::interval(interval);
    loop {
        if let Err(e) = screen.draw(|f| draw::frame(f, &state.screen(colour))) {
            return failed(guard, &e);
        }
        tokio::select! {
            _ = tick.tick() => state.refresh().await,
            key = pressed.recv() => match key {
                Some(key) if !state.key(key).await => return 0,
                Some(_) => {}
                None => return 0,
            },
        }
    }
}

fn failed(guard: Terminal, e: &std::io::Error) -> u8 {
    drop(guard);
    match e.kind() {
        std::io::ErrorKind::BrokenPipe => crate::writer::EXIT_CLOSED,
        _ => {
            crate::writer::errln!("error: drawing canopy top: {e}");
            crate::writer::EXIT_IO
        }
    }
}

/// Reads key presses on a thread of its own (crossterm's reads block) until the view ends.
fn read_keys(keys: mpsc::Sender<KeyEvent>) {
    loop {
        match event::read() {
            Ok(Event::Key(key)) if key.kind != KeyEventKind::Release => {
                if keys.blocking_send(key).is_err() {
                    return;
                }
            }
            Ok(_) => {}
            Err(_) => return,
        }
    }
}

impl State {
    fn screen(&self, colour: bool) -> Screen<'_> {
        let footer = match &self.mode {
            Mode::Deny { id, text } => format!("deny {id}, reason (Enter to send, Esc to cancel): {text}"),
            Mode::Post { handle, text } => format!("post to #home-{handle} (Enter to send, Esc to cancel): {text}"),
            Mode::Keys => match &self.said {
                Some(said) => format!("{said} · {KEYS}"),
                None => KEYS.to_owned(),
            },
        };
        Screen {
            header: self.header.clone(),
            snapshot: &self.snapshot,
            focus: self.focus,
            tree_at: self.tree_at,
            waiting_at: self.waiting_at,
            watching: self.watching.as_deref(),
            footer,
            colour,
        }
    }

    /// Reads the workspace again; a daemon that went away is looked for in `daemon.json`
    /// until it answers (a restart gives it a new port).
    async fn refresh(&mut self) {
        if self.client.is_none() {
            match Client::connect(&self.dir).await {
                Ok(client) => {
                    self.pid = crate::client::connection_info(&self.dir).map(|i| i.pid).unwrap_or_default();
                    self.client = Some(client);
                }
                Err(e) => {
                    self.header = format!("canopy top: the daemon is away ({}); waiting for it", one(&e.to_string()));
                    return;
                }
            }
        }
        let Some(client) = &self.client else { return };
        match model::read(client, self.watching.as_deref(), 20).await {
            Ok(snapshot) => {
                // The selection stays on the same item when the list moves under it.
                let kept = self.snapshot.waiting.get(self.waiting_at).cloned();
                let agent = self.snapshot.rows.get(self.tree_at).map(|r| r.handle.clone());
                self.waiting_at =
                    kept.and_then(|k| snapshot.waiting.iter().position(|i| *i == k)).unwrap_or(self.waiting_at);
                self.tree_at =
                    agent.and_then(|h| snapshot.rows.iter().position(|r| r.handle == h)).unwrap_or(self.tree_at);
                self.waiting_at = self.waiting_at.min(snapshot.waiting.len().saturating_sub(1));
                self.tree_at = self.tree_at.min(snapshot.rows.len().saturating_sub(1));
                let pid = self.pid;
                let now =
                    crate::output::time(&humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string());
                self.header = format!("canopy top · daemon pid {pid} · {} · q quits", now.get(11..19).unwrap_or(&now));
                self.snapshot = snapshot;
            }
            Err(e) => {
                self.header = format!("canopy top: the daemon is away ({}); waiting for it", one(&e.to_string()));
                // Connect anew next tick: the daemon may be back on another port.
                if matches!(e, canopy_bus::CallError::Unreachable(_)) {
                    self.client = None;
                }
            }
        }
    }

    /// Handles a key; false to quit.
    async fn key(&mut self, key: KeyEvent) -> bool {
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return false;
        }
        match std::mem::replace(&mut self.mode, Mode::Keys) {
            Mode::Keys => return self.command(key.code).await,
            Mode::Deny { id, text } => match typed(key.code, text) {
                Typed::More(text) => self.mode = Mode::Deny { id, text },
                Typed::Done(reason) if !reason.trim().is_empty() => {
                    self.act(|client| Box::pin(async move { model::decide(client, &id, Some(reason)).await })).await;
                }
                Typed::Done(_) => self.said = Some("a denial needs a reason".into()),
                Typed::Cancelled => self.said = None,
            },
            Mode::Post { handle, text } => match typed(key.code, text) {
                Typed::More(text) => self.mode = Mode::Post { handle, text },
                Typed::Done(body) if !body.trim().is_empty() => {
                    self.act(|client| Box::pin(async move { model::post_home(client, &handle, &body).await })).await;
                }
                Typed::Done(_) | Typed::Cancelled => self.said = None,
            },
        }
        true
    }

    /// A key outside a prompt; false to quit.
    async fn command(&mut self, code: KeyCode) -> bool {
        let selected_agent = self.snapshot.rows.get(self.tree_at).map(|r| r.handle.clone());
        // Only what the operator sees highlighted: the waiting list must have the focus.
        let selected_item = match self.focus {
            Focus::Waiting => self.snapshot.waiting.get(self.waiting_at).and_then(|i| i.decidable()).map(str::to_owned),
            Focus::Tree => None,
        };
        match code {
            KeyCode::Char('q') => return false,
            KeyCode::Tab => self.focus = if self.focus == Focus::Tree { Focus::Waiting } else { Focus::Tree },
            KeyCode::Up | KeyCode::Char('k') => self.step(-1),
            KeyCode::Down | KeyCode::Char('j') => self.step(1),
            KeyCode::Char('a') => match selected_item {
                Some(id) => self.act(|client| Box::pin(async move { model::decide(client, &id, None).await })).await,
                None => self.said = Some("select a spawn or merge request under Waiting (Tab) to approve".into()),
            },
            KeyCode::Char('d') => match selected_item {
                Some(id) => self.mode = Mode::Deny { id, text: String::new() },
                None => self.said = Some("select a spawn or merge request under Waiting (Tab) to deny".into()),
            },
            KeyCode::Char('w') | KeyCode::Enter => {
                self.watching = selected_agent;
                self.refresh().await;
            }
            KeyCode::Esc => {
                self.watching = None;
                self.refresh().await;
            }
            KeyCode::Char('p') => match selected_agent {
                Some(handle) => self.mode = Mode::Post { handle, text: String::new() },
                None => self.said = Some("select an agent in the tree (Tab) to post to its home channel".into()),
            },
            _ => {}
        }
        true
    }

    fn step(&mut self, by: isize) {
        let (at, len) = match self.focus {
            Focus::Tree => (&mut self.tree_at, self.snapshot.rows.len()),
            Focus::Waiting => (&mut self.waiting_at, self.snapshot.waiting.len()),
        };
        *at = at.saturating_add_signed(by).min(len.saturating_sub(1));
    }

    /// Runs one act through the API, says how it went, and reads the workspace again.
    async fn act<F>(&mut self, act: F)
    where
        F: for<'c> FnOnce(
            &'c Client,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<String, canopy_bus::CallError>> + Send + 'c>,
        >,
    {
        let Some(client) = &self.client else {
            self.said = Some("the daemon is away; try again when it is back".into());
            return;
        };
        self.said = Some(match act(client).await {
            Ok(done) => done,
            Err(e) => format!("refused: {}", one(&e.to_string())),
        });
        self.refresh().await;
    }
}

enum Typed {
    More(String),
    Done(String),
    Cancelled,
}

/// A key typed into a one-line prompt.
fn typed(code: KeyCode, mut text: String) -> Typed {
    match code {
        KeyCode::Enter => Typed::Done(text),
        KeyCode::Esc => Typed::Cancelled,
        KeyCode::Backspace => {
            text.pop();
            Typed::More(text)
        }
        KeyCode::Char(c) if text.chars().count() < 2000 => {
            text.push(c);
            Typed::More(text)
        }
        _ => Typed::More(text),
    }
}

fn one(text: &str) -> String {
    crate::output::one_line(text, 120)
}
