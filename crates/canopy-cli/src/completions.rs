//! Shell completion and the manual page, both generated from the clap grammar
//! (`clap_complete`, `clap_mangen`), and `canopy complete`, the candidates the bash script
//! asks the running daemon for (handles, channels, pending request ids, open issue numbers). Owns the small
//! bash wrapper that routes those positions to `canopy complete`; zsh and fish get the
//! static scripts. Does not change anything: every candidate comes from a read.

use canopy_config::DataDir;
use canopy_proto::api::*;
use canopy_proto::method;
use clap::CommandFactory;

use crate::args::{Cli, CompleteWhat};
use crate::client::Client;
use crate::writer::errln;

/// The bash positions whose values come from the daemon, and the function that answers
/// them before handing everything else to clap's completion.
const BASH_DYNAMIC: &str = r#"
# Handles, channels, request ids and issue numbers come from the running daemon (`canopy complete`).
_canopy_dynamic() {
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}" what=""
    local before="${COMP_WORDS[COMP_CWORD-2]}"
    if [[ " ${COMP_WORDS[*]:1:COMP_CWORD-1} " == *" issues "* ]]; then
        # Issue numbers, owners and states of `canopy issues ...`.
        case "$prev" in
            show|assign|move|comment|close|edit|budget|--parent|--depends-on|--blocked-by) what=issues ;;
            --owner|--subtree|--assign) what=handles ;;
            --state) COMPREPLY=( $(compgen -W "open in_progress blocked in_review done wontdo" -- "$cur") ); return 0 ;;
        esac
        case "$before" in
            assign) what=handles ;;
            move) COMPREPLY=( $(compgen -W "open in_progress blocked in_review" -- "$cur") ); return 0 ;;
        esac
    else
        case "$prev" in
            --channel) what=channels ;;
            --agent|--parent|--handle|--poster) what=handles ;;
            watch|show|start|stop|interrupt|despawn|budget|reparent) what=handles ;;
            approve|deny) what=requests ;;
        esac
    fi
    if [[ -n "$what" && "$cur" != -* ]]; then
        COMPREPLY=( $(compgen -W "$(canopy complete "$what" 2>/dev/null)" -- "$cur") )
        return 0
    fi
    _canopy "$@"
}
complete -F _canopy_dynamic -o bashdefault -o default canopy
"#;

/// `canopy completions SHELL`.
pub fn script(shell: clap_complete::Shell) -> u8 {
    let mut command = Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut command, "canopy", &mut out);
    if shell == clap_complete::Shell::Bash {
        out.extend_from_slice(BASH_DYNAMIC.as_bytes());
    }
    crate::writer::out_bytes(&out);
    0
}

/// `canopy man`: the manual page of every command, as roff.
pub fn man() -> u8 {
    let mut out = Vec::new();
    if let Err(e) = clap_mangen::Man::new(Cli::command()).render(&mut out) {
        errln!("error: rendering the manual page: {e}");
        return 1;
    }
    crate::writer::out_bytes(&out);
    0
}

/// `canopy complete WHAT`: candidates one per line; nothing (and success) without a daemon,
/// so a completion never prints an error into the operator's command line.
pub async fn candidates(dir: &DataDir, what: CompleteWhat) -> u8 {
    let Ok(client) = Client::connect(dir).await else { return 0 };
    let names: Vec<String> = match what {
        CompleteWhat::Handles => match client.roster().await {
            Ok(r) => r.agents.into_iter().map(|a| a.handle.to_string()).collect(),
            Err(_) => Vec::new(),
        },
        CompleteWhat::Channels => match client.send::<method::ChannelsList>(&ChannelsListRequest {}).await {
            Ok(r) => r.channels.into_iter().map(|c| c.name.to_string()).collect(),
            Err(_) => Vec::new(),
        },
        CompleteWhat::Requests => {
            let spawns = SpawnListRequest { state: Some(canopy_core::SpawnState::Pending) };
            let merges = MergesListRequest { state: Some(canopy_core::MergeState::Pending) };
            let mut ids: Vec<String> = match client.send::<method::SpawnList>(&spawns).await {
                Ok(r) => r.requests.into_iter().map(|r| r.id).collect(),
                Err(_) => Vec::new(),
            };
            if let Ok(r) = client.send::<method::MergesList>(&merges).await {
                ids.extend(r.merges.into_iter().map(|m| m.id));
            }
            ids
        }
        // The first page of open issues: a completion answers at once or not at all.
        CompleteWhat::Issues => match client.send::<method::IssuesList>(&IssuesListRequest::default()).await {
            Ok(r) => r.issues.into_iter().map(|i| i.number.to_string()).collect(),
            Err(_) => Vec::new(),
        },
    };
    let mut text = names.join("\n");
    text.push('\n');
    crate::writer::out_bytes(text.as_bytes());
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every subcommand says what it does and every flag and argument says what it takes:
    /// `--help`, the completions and the manual page are all made from these.
    #[test]
    fn every_command_and_flag_has_help() {
        fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" || arg.is_hide_set() {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in command.get_subcommands() {
                let name = format!("{path} {}", sub.get_name());
                if sub.get_about().is_none() && !sub.is_hide_set() && sub.get_name() != "help" {
                    missing.push(name.clone());
                }
                walk(sub, &name, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "canopy", &mut missing);
        assert!(missing.is_empty(), "without help: {missing:#?}");
    }
}
