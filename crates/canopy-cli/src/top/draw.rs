//! One frame of `canopy top`: a header (the daemon, or why it is away), the tree with
//! presence and activity lines, what waits for the operator with its age, budget alerts, the
//! newest messages (or the watched agent's activity), and a footer with the keys or the line
//! being typed. Colour only when `NO_COLOR` is unset. Does not read anything or act.

use canopy_core::Presence;
use ratatui::Frame;
use ratatui::layout::{Constraint, Direction, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, List, ListItem, ListState, Paragraph, Wrap};

use super::model::{Item, Snapshot};
use crate::output::{age, one_line};

/// Which list the arrow keys move in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Focus {
    Tree,
    Waiting,
}

/// What a frame shows besides the snapshot.
pub struct Screen<'a> {
    pub header: String,
    pub snapshot: &'a Snapshot,
    pub focus: Focus,
    pub tree_at: usize,
    pub waiting_at: usize,
    pub watching: Option<&'a str>,
    /// The footer: the keys, a prompt being typed, or the last act's outcome.
    pub footer: String,
    pub colour: bool,
}

fn presence_colour(presence: Presence) -> Color {
    match presence {
        Presence::Working | Presence::Starting | Presence::Compacting => Color::Blue,
        Presence::Idle => Color::Green,
        Presence::WaitingApproval | Presence::PausedBudget => Color::Yellow,
        Presence::Failing | Presence::Stalled | Presence::Crashed => Color::Red,
        Presence::Offline | Presence::Despawned => Color::DarkGray,
    }
}

pub fn frame(f: &mut Frame<'_>, s: &Screen<'_>) {
    let paint = |style: Style| if s.colour { style } else { Style::default() };
    let outer = Layout::default()
        .direction(Direction::Vertical)
        .constraints([Constraint::Length(1), Constraint::Min(8), Constraint::Length(9), Constraint::Length(1)])
        .split(f.area());
    f.render_widget(
        Paragraph::new(s.header.clone()).style(paint(Style::default().add_modifier(Modifier::BOLD))),
        outer[0],
    );
    let middle = Layout::default()
        .direction(Direction::Horizontal)
        .constraints([Constraint::Percentage(55), Constraint::Percentage(45)])
        .split(outer[1]);
    tree(f, s, middle[0], &paint);
    let right = Layout::default()
        .direction(Direction::Vertical)
        .constraints([Constraint::Min(4), Constraint::Length(4)])
        .split(middle[1]);
    waiting(f, s, right[0], &paint);
    let alerts = if s.snapshot.alerts.is_empty() { "none".to_owned() } else { s.snapshot.alerts.join("; ") };
    let block = Block::default().borders(Borders::ALL).title("Budgets");
    f.render_widget(Paragraph::new(alerts).wrap(Wrap { trim: true }).block(block), right[1]);
    bottom(f, s, outer[2]);
    f.render_widget(
        Paragraph::new(s.footer.clone()).style(paint(Style::default().add_modifier(Modifier::REVERSED))),
        outer[3],
    );
}

fn tree(f: &mut Frame<'_>, s: &Screen<'_>, area: Rect, paint: &dyn Fn(Style) -> Style) {
    let items: Vec<ListItem> = s
        .snapshot
        .rows
        .iter()
        .map(|row| {
            let indent = "  ".repeat(row.depth);
            let mut spans = vec![Span::raw(format!("{indent}{} ", row.handle))];
            match &row.entry {
                Some(e) => {
                    spans.push(Span::styled(
                        e.presence.as_str().to_owned(),
                        paint(Style::default().fg(presence_colour(e.presence))),
                    ));
                    if let Some(activity) = &e.activity {
                        spans.push(Span::raw(format!("  {}", one_line(activity, 50))));
                    } else if let Some(reason) = &e.reason {
                        spans.push(Span::raw(format!("  ({})", one_line(reason, 50))));
                    }
                }
                None => spans.push(Span::raw(format!("({})", row.role))),
            }
            ListItem::new(Line::from(spans))
        })
        .collect();
    let title = format!("Tree ({} agents)", s.snapshot.rows.len());
    let at = (s.focus == Focus::Tree).then_some(s.tree_at);
    selectable(f, area, items, at, title, paint);
}

/// A bordered list with its selected row (when it has the focus) shown reversed.
fn selectable(
    f: &mut Frame<'_>,
    area: Rect,
    items: Vec<ListItem<'_>>,
    at: Option<usize>,
    title: String,
    paint: &dyn Fn(Style) -> Style,
) {
    let mut state = ListState::default();
    if let Some(at) = at.filter(|_| !items.is_empty()) {
        state.select(Some(at.min(items.len() - 1)));
    }
    let list = List::new(items)
        .block(Block::default().borders(Borders::ALL).title(title))
        .highlight_style(paint(Style::default().add_modifier(Modifier::REVERSED)))
        .highlight_symbol("> ");
    f.render_stateful_widget(list, area, &mut state);
}

fn waiting(f: &mut Frame<'_>, s: &Screen<'_>, area: Rect, paint: &dyn Fn(Style) -> Style) {
    let now = std::time::SystemTime::now();
    let items: Vec<ListItem> = s
        .snapshot
        .waiting
        .iter()
        .map(|item| {
            // How long it has waited comes first: the line is cut on a narrow screen.
            let waited = |since: &str| age(since, now);
            let text = match item {
                Item::Spawn { id, from, what, since } => format!("{:>4}  {id} {from} {what}", waited(since)),
                Item::Merge { id, from, what, since } => format!("{:>4}  {id} {from}: {what}", waited(since)),
                Item::Failing { handle, why, since } => {
                    format!("{:>4}  {handle} {why}", since.as_deref().map_or("-".to_owned(), waited))
                }
                Item::Issue { number, title, since } => {
                    format!("{:>4}  #{number} {title}: waits for your answer", waited(since))
                }
            };
            ListItem::new(one_line(&text, 200))
        })
        .collect();
    let title = format!("Waiting for you ({})", s.snapshot.waiting.len());
    let at = (s.focus == Focus::Waiting).then_some(s.waiting_at);
    selectable(f, area, items, at, title, paint);
}

fn bottom(f: &mut Frame<'_>, s: &Screen<'_>, area: Rect) {
    let (title, lines): (String, Vec<String>) = match s.watching {
        Some(handle) => (
            format!("Watching {handle} (Esc to stop)"),
            s.snapshot
                .activity
                .iter()
                .map(|i| format!("{} {}", short_time(&i.at), one_line(&i.summary, 160)))
                .collect(),
        ),
        None => (
            "Newest messages".to_owned(),
            s.snapshot
                .messages
                .iter()
                .map(|m| {
                    format!(
                        "{} #{} {}: {}",
                        short_time(&m.created_at),
                        m.channel,
                        m.sender.handle,
                        one_line(&m.body, 160)
                    )
                })
                .collect(),
        ),
    };
    let shown = lines.len().saturating_sub(area.height.saturating_sub(2) as usize);
    let text = lines[shown..].join("\n");
    f.render_widget(Paragraph::new(text).block(Block::default().borders(Borders::ALL).title(title)), area);
}

/// `HH:MM:SS` of an RFC 3339 time in this machine's zone (or as given).
fn short_time(at: &str) -> String {
    let local = crate::output::time(at);
    local.get(11..19).map_or(local.clone(), str::to_owned)
}
