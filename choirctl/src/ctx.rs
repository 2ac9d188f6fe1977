//! What every command gets: the admin client and the output choices.

use crate::client::Client;

/// A command's context.
pub(crate) struct Ctx {
    /// The admin API client.
    pub(crate) client: Client,
    /// Print the API's JSON instead of tables.
    pub(crate) json: bool,
    /// Stream answers as they are written (`chat`).
    pub(crate) stream: bool,
}

/// Prints a value as pretty JSON, safe for a terminal and still JSON that
/// parses to the same value (`text::clean_json`; `say!`'s escaping would
/// not parse).
pub(crate) fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    crate::term::out(&format!("{}\n", choir_common::text::clean_json(&serde_json::to_string_pretty(v)?)));
    Ok(())
}

/// Prints a value as one line of JSON (JSON lines: `logs`, followed
/// events), escaped as [`print_json`] does.
pub(crate) fn print_json_line(v: &impl serde::Serialize) -> anyhow::Result<()> {
    crate::term::out(&format!("{}\n", choir_common::text::clean_json(&serde_json::to_string(v)?)));
    Ok(())
}
