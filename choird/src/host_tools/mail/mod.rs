//! Mail for agents (`agents.<id>.email`): `choir.email.send` (SMTP through
//! lettre), `choir.email.check` and `choir.email.receive` (IMAP through the
//! `imap` crate over our own rustls stream), messages parsed with
//! `mailparse`. One TLS stack (rustls with ring), certificate checks always
//! on — the public roots, or the account's own CA file for a self-hosted
//! server; `security: none` only to loopback (config validation). The
//! password stays in choird. What a message holds is outside content:
//! wrapped and marked untrusted, with its sender recorded.

use std::sync::Arc;

use crate::host_tools::{Registry, RegistryError};
use crate::shared::Shared;

pub mod account;
pub mod imap_session;
pub mod parse;
pub mod read;
pub mod send;
pub mod tls;

/// Registers the mail tools.
pub fn register(shared: &Arc<Shared>, registry: &mut Registry) -> Result<(), RegistryError> {
    registry.register(Arc::new(send::Send::new(shared.clone())))?;
    registry.register(Arc::new(read::Check::new(shared.clone())))?;
    registry.register(Arc::new(read::Receive::new(shared.clone())))?;
    Ok(())
}
