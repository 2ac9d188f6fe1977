//! choird's `log` facade: each record goes to stderr in a human format (for a
//! terminal or the journal) and to `logs/choird.log` as JSON through the
//! [`LogManager`]. A message that begins `agent <id>` is tagged with that
//! agent, so `choirctl logs <id>` shows what choird said about it.
//! `choird cluster`, a second process on the same home, logs to stderr
//! only: one writer per log file.

use std::io::Write;
use std::sync::Arc;

use choir_common::admin::LogRecord;
use choir_common::ids::AgentId;

use super::{now, LogManager};

/// The logger.
pub struct Facade {
    filter: env_filter::Filter,
    manager: Option<Arc<LogManager>>,
}

impl Facade {
    /// Installs the logger for the process (`filters`: `RUST_LOG` syntax).
    pub fn install(manager: Arc<LogManager>, filters: &str) -> Result<(), log::SetLoggerError> {
        Facade::install_to(Some(manager), filters)
    }

    /// Installs a logger writing to stderr alone.
    pub fn install_stderr_only(filters: &str) -> Result<(), log::SetLoggerError> {
        Facade::install_to(None, filters)
    }

    fn install_to(manager: Option<Arc<LogManager>>, filters: &str) -> Result<(), log::SetLoggerError> {
        let filter = env_filter::Builder::new().parse(filters).build();
        let max = filter.filter();
        log::set_boxed_logger(Box::new(Facade { filter, manager }))?;
        log::set_max_level(max);
        Ok(())
    }
}

/// The agent a message is about, when it begins `agent <id>`.
pub fn agent_of(msg: &str) -> Option<String> {
    let rest = msg.strip_prefix("agent ")?;
    let id: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
    AgentId::parse(&id).ok().map(|a| a.as_str().to_owned())
}

impl log::Log for Facade {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        self.filter.enabled(metadata)
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.filter.matches(record) {
            return;
        }
        // One record, one line: whatever a client or a model put in a message
        // (newlines, escape sequences) is escaped, never a new line.
        let msg = choir_common::text::one_line(&record.args().to_string());
        let r = LogRecord {
            ts: now(),
            level: record.level().to_string(),
            component: record.target().to_owned(),
            agent: agent_of(&msg),
            msg,
        };
        let _ = writeln!(std::io::stderr().lock(), "{}", r.human());
        if let Some(m) = &self.manager {
            m.own(r);
        }
    }

    fn flush(&self) {
        if let Some(m) = &self.manager {
            m.flush(std::time::Duration::from_secs(2));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_about_an_agent_are_tagged() {
        assert_eq!(agent_of("agent a1: restarting").as_deref(), Some("a1"));
        assert_eq!(agent_of("agent a_2 did not stop").as_deref(), Some("a_2"));
        assert_eq!(agent_of("agent A1: x"), None);
        assert_eq!(agent_of("the agent a1"), None);
    }
}
