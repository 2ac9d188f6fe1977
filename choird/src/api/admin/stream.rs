//! Admin answers that are written over time (a build's progress, a chat's
//! partial text, followed logs, a memory export): a task thread fills a
//! pipe the connection streams from.

use crate::daemon::Daemon;
use crate::error::Error;
use crate::http::Response;

/// A streamed answer: `fill` writes it from a task thread named `name`
/// while the connection reads the other end.
pub(super) fn stream(
    d: &Daemon,
    name: String,
    content_type: &'static str,
    fill: impl FnOnce(&mut std::io::PipeWriter) + Send + 'static,
) -> Result<Response, Error> {
    let (reader, mut writer) = std::io::pipe().map_err(|e| Error::Internal(e.to_string()))?;
    d.tasks.spawn(name, move || fill(&mut writer)).map_err(|e| Error::Internal(e.to_string()))?;
    let mut response = Response::streaming(reader);
    response.content_type = content_type;
    Ok(response)
}
