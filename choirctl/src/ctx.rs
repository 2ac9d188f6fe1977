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

/// Prints a value as pretty JSON (through the terminal's escaping).
pub(crate) fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    say!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}
