//! `choir.email.send {to[], cc?[], subject, body, attachments?[]}`: a
//! plain-text message from the agent's account, attachments read from its
//! workspace through descriptors (size-capped). `side_effect: external`,
//! not idempotent: the registry runs it at most once per call id, and its
//! Message-ID is derived from the agent and call id, so even a resend
//! by a server or a human would be recognisable as the same message.
//! Recipients and Message-ID are audited.

use std::sync::Arc;
use std::time::Duration;

use choir_common::ids::AgentId;
use choir_common::manifest::ToolManifest;
use lettre::message::header::ContentType;
use lettre::message::{Attachment, Mailbox, MultiPart, SinglePart};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::Tls;
use lettre::{SmtpTransport, Transport};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::config::{Config, Security};
use crate::error::Error;
use crate::host_tools::{HostCall, HostTool, ToolStatus};
use crate::secrets::Secrets;
use crate::shared::Shared;

/// Recipients (to + cc) at most.
const MAX_RECIPIENTS: usize = 20;
/// One attachment's largest size.
pub const MAX_ATTACHMENT: u64 = 10 * 1024 * 1024;
/// All attachments' largest total.
const MAX_TOTAL: u64 = 20 * 1024 * 1024;
/// Body length at most (characters).
const MAX_BODY: usize = 100_000;

/// The tool.
pub struct Send {
    shared: Arc<Shared>,
}

impl Send {
    /// The tool over `shared`'s config.
    pub fn new(shared: Arc<Shared>) -> Send {
        Send { shared }
    }
}

fn addresses(v: &Value, field: &str) -> Result<Vec<Mailbox>, Error> {
    v[field]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            let s = a.as_str().unwrap_or_default();
            s.parse::<Mailbox>().map_err(|_| Error::Malformed(format!("{field}: {s:?} is not a mail address")))
        })
        .collect()
}

/// The SMTP transport of the account.
pub fn transport(account: &super::account::Account) -> Result<SmtpTransport, String> {
    let s = &account.cfg.smtp;
    let tls = match s.security {
        Security::Tls => Tls::Wrapper(super::tls::smtp_parameters(&account.cfg)?),
        Security::Starttls => Tls::Required(super::tls::smtp_parameters(&account.cfg)?),
        Security::None => Tls::None,
    };
    Ok(SmtpTransport::builder_dangerous(s.host.clone())
        .port(s.port)
        .tls(tls)
        .credentials(Credentials::new(account.cfg.username.clone(), account.password.clone()))
        // PLAIN, over TLS (or loopback): one exchange, one clear answer.
        .authentication(vec![lettre::transport::smtp::authentication::Mechanism::Plain])
        .timeout(Some(Duration::from_secs(30)))
        .build())
}

/// What an SMTP failure means, without the password or the server's address.
pub fn smtp_error(e: &lettre::transport::smtp::Error) -> String {
    let text = e.to_string();
    if e.is_permanent() && text.contains("535") || text.to_ascii_lowercase().contains("authentication") {
        "the SMTP server refused the login; the operator must check the account's username and password".into()
    } else if e.is_permanent() {
        format!("the SMTP server refused the message: {}", choir_common::text::clipped(&text, 200))
    } else if text.contains("certificate") || text.contains("tls") || text.contains("TLS") {
        format!("TLS with the SMTP server failed: {}", choir_common::text::clipped(&text, 200))
    } else {
        format!("the SMTP server cannot be reached or failed: {}", choir_common::text::clipped(&text, 200))
    }
}

impl HostTool for Send {
    fn name(&self) -> &str {
        "choir.email.send"
    }

    fn manifest(&self) -> Option<ToolManifest> {
        serde_json::from_value(json!({
            "llm": {
                "name": "choir.email.send",
                "description": "Send an email from your account: plain-text body, optional cc and attachments (workspace paths).",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "to": {"type": "array", "minItems": 1, "maxItems": MAX_RECIPIENTS, "items": {"type": "string", "maxLength": 320}},
                        "cc": {"type": "array", "maxItems": MAX_RECIPIENTS, "items": {"type": "string", "maxLength": 320}},
                        "subject": {"type": "string", "maxLength": 998},
                        "body": {"type": "string", "maxLength": MAX_BODY},
                        "attachments": {"type": "array", "maxItems": 10, "items": {"type": "string", "minLength": 1, "maxLength": 4096}}
                    },
                    "required": ["to", "subject", "body"],
                    "additionalProperties": false
                }
            },
            "runtime": {"timeout_ms": 60000, "network": true, "side_effect": "external", "idempotent": false, "version": "1",
                        "roles": {"/to": "destination", "/cc": "destination", "/subject": "payload", "/body": "payload",
                                  "/attachments": "payload"},
                        "output_trust": "trusted"}
        }))
        .ok()
    }

    fn status(&self, config: &Config, secrets: &Secrets, agent: &AgentId) -> ToolStatus {
        super::account::status(config, secrets, agent)
    }

    fn check(&self, agent: &AgentId) -> Result<String, Error> {
        let account = super::account::account(&self.shared, agent)?;
        let t = transport(&account).map_err(Error::Unavailable)?;
        match t.test_connection() {
            Ok(true) => Ok(format!("the SMTP server {}:{} answers", account.cfg.smtp.host, account.cfg.smtp.port)),
            Ok(false) => Err(Error::Upstream("the SMTP server did not answer NOOP".into())),
            Err(e) => Err(Error::Upstream(smtp_error(&e))),
        }
    }

    fn audit_detail(&self, input: &Value, result: &Result<Value, Error>) -> Value {
        json!({"to": input["to"], "cc": input["cc"],
               "message_id": result.as_ref().ok().map(|v| v["message_id"].clone())})
    }

    fn execute(&self, call: &HostCall<'_>) -> Result<Value, Error> {
        let agent = &call.caller.agent;
        let account = super::account::account(&self.shared, agent)?;
        let input = call.input;
        let to = addresses(input, "to")?;
        let cc = addresses(input, "cc")?;
        if to.is_empty() || to.len() + cc.len() > MAX_RECIPIENTS {
            return Err(Error::Malformed(format!("between 1 and {MAX_RECIPIENTS} recipients")));
        }
        let from: Mailbox = account
            .cfg
            .from
            .parse()
            .map_err(|_| Error::Unavailable(format!("agents.{agent}.email.from is not a mail address")))?;
        let subject = input["subject"].as_str().unwrap_or_default();
        if subject.contains(['\r', '\n']) {
            return Err(Error::Malformed("the subject must be one line".into()));
        }
        let body = input["body"].as_str().unwrap_or_default().to_owned();
        // Files from the workspace, through descriptors.
        let config = self.shared.config();
        let workspace = config.workspace(&self.shared.home, agent);
        let mut files = Vec::new();
        let mut total = 0u64;
        for p in input["attachments"].as_array().into_iter().flatten() {
            let rel = p.as_str().unwrap_or_default();
            let data = crate::workspace_files::read_beneath(&workspace, rel, MAX_ATTACHMENT)
                .map_err(|e| Error::Malformed(format!("attachment {e}")))?;
            total += data.len() as u64;
            if total > MAX_TOTAL {
                return Err(Error::TooLarge(format!("attachments over {MAX_TOTAL} bytes in all")));
            }
            let name =
                std::path::Path::new(rel).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            files.push((crate::workspace_files::safe_name(&name), data));
        }
        // One Message-ID per (agent, call): a retry is the same message.
        let digest = Sha256::digest(format!("{agent}\0{}", call.call_id.unwrap_or_default()));
        let domain = from.email.domain().to_owned();
        let message_id = format!("<choir.{}@{domain}>", hex::encode(&digest[..12]));
        let mut builder = lettre::Message::builder().from(from).subject(subject).message_id(Some(message_id.clone()));
        for m in &to {
            builder = builder.to(m.clone());
        }
        for m in &cc {
            builder = builder.cc(m.clone());
        }
        let text = SinglePart::builder().header(ContentType::TEXT_PLAIN).body(body);
        let message = if files.is_empty() {
            builder.singlepart(text)
        } else {
            let mut mp = MultiPart::mixed().singlepart(text);
            for (name, data) in files {
                let ct = ContentType::parse("application/octet-stream").map_err(|e| Error::Internal(e.to_string()))?;
                // Base64, so the file arrives byte for byte (7bit would
                // normalise its line endings).
                let body = lettre::message::Body::new_with_encoding(
                    data,
                    lettre::message::header::ContentTransferEncoding::Base64,
                )
                .map_err(|_| Error::Internal("an attachment could not be encoded".into()))?;
                mp = mp.singlepart(Attachment::new(name).body(body, ct));
            }
            builder.multipart(mp)
        }
        .map_err(|e| Error::Malformed(format!("the message cannot be built: {e}")))?;
        let transport = transport(&account).map_err(Error::Unavailable)?;
        let response = transport.send(&message).map_err(|e| {
            log::warn!("agent {agent}: SMTP {}:{}: {e}", account.cfg.smtp.host, account.cfg.smtp.port);
            Error::Upstream(smtp_error(&e))
        })?;
        let recipients: Vec<String> = to.iter().chain(&cc).map(|m| m.email.to_string()).collect();
        Ok(json!({
            "summary": format!("sent to {} ({} recipient(s))", recipients.join(", "), recipients.len()),
            "message_id": message_id,
            "recipients": recipients,
            "server_said": choir_common::text::clipped(&response.message().collect::<Vec<_>>().join(" "), 200),
        }))
    }
}

#[cfg(test)]
mod tests {
    use choir_common::provenance::{normalise, text_holds, trace, values_in, Kind, Source};
    use lettre::message::Mailbox;

    use crate::test_gen::Gen;

    /// A recipient in the shapes people and attackers write: plain, tagged,
    /// display names (quoted, with `<` or `@` in them), quoted local parts
    /// hiding an address, stray brackets and spaces.
    fn recipient(g: &mut Gen) -> String {
        let local = g.pick(&[
            "me",
            "ME",
            "bob",
            "Bob.Smith",
            "bob+tag",
            "o'brien",
            "a_b-c",
            r#""<me@corp.test>""#,
            r#""me@corp.test""#,
            r#""a b""#,
        ]);
        let domain = g.pick(&["corp.test", "Evil.Test", "mail.evil.test", "corp.test.evil.test"]);
        let addr = format!("{local}@{domain}");
        match g.next() % 6 {
            0 => addr,
            1 => format!(" {addr} "),
            2 => format!("{} <{addr}>", g.pick(&["Bob", r#""Me, Inc.""#, r#""me@corp.test""#, r#""<me@corp.test>""#])),
            3 => format!("<{addr}>"),
            4 => format!("{addr} <{}>", g.pick(&["me@corp.test", "x@evil.test"])),
            _ => format!(r#""{}" <{addr}>"#, g.pick(&["me@corp.test", "Bob"])),
        }
    }

    #[test]
    fn provenance_reads_a_recipient_as_the_mailer_sends_to_it() {
        // The user gave me@corp.test; any recipient the mailer does not
        // send to exactly that address must not be traced to the user.
        let texts = [(Source::User, "please write to me@corp.test")];
        let mut g = Gen(0x9e37_79b9_7f4a_7c15);
        let (mut parsed, mut hidden) = (0, 0);
        for i in 0..3000 {
            let value = recipient(&mut g);
            let Ok(mailbox) = value.parse::<Mailbox>() else { continue };
            parsed += 1;
            let sends_to = mailbox.email.to_string().to_ascii_lowercase();
            hidden += usize::from(sends_to != "me@corp.test" && sends_to.contains("me@corp.test"));
            let (kind, norm) = normalise(&value);
            if kind == Kind::Address {
                assert_eq!(norm, sends_to, "case {i}: {value:?}");
            }
            let from_user = trace(&value, &texts).sources.contains(&Source::User);
            assert_eq!(from_user, sends_to == "me@corp.test", "case {i}: {value:?} goes to {sends_to}");
        }
        assert!(parsed > 1000, "the generator makes mostly valid recipients: {parsed}");
        assert!(hidden > 50, "the user's address hidden in another one is among them: {hidden}");
        // This mailer refuses a quoted local part outright (provenance reads
        // it as an address of its own either way).
        assert!(r#""<me@corp.test>"@evil.test"#.parse::<Mailbox>().is_err());
    }

    #[test]
    fn provenance_finds_an_address_wherever_a_document_holds_it() {
        // The consumer: serde_json reading the document back. Whatever it
        // holds at any depth, with any punctuation after it, is found in the
        // document's text.
        let mut g = Gen(0x2545_f491_4f6c_dd1d);
        for i in 0..2000 {
            let addr = format!("{}@{}", g.pick(&["eve", "eve.x", "e-v_e+1"]), g.pick(&["evil.test", "a.evil.test"]));
            let tail = g.pick(&["", "?", ".", "'}]}", ")", "!", ";", ".'"]);
            let leaf = serde_json::json!(format!("{}{addr}{tail}", g.pick(&["", "mailto:", "to: ", "<", "'", "("])));
            let mut doc = leaf;
            for _ in 0..(g.next() % 4) {
                doc = match g.next() % 2 {
                    0 => serde_json::json!({ g.pick(&["to", "rows", "x"]): doc }),
                    _ => serde_json::json!([1, doc]),
                };
            }
            let text = doc.to_string();
            assert!(values_in(Kind::Address, &text).contains(&addr.to_ascii_lowercase()), "case {i}: {text}");
            // The quick search the arbiter uses agrees with the full reading.
            assert!(text_holds(Kind::Address, &addr.to_ascii_lowercase(), &text), "case {i}: {text}");
            let longer = format!("{}x", addr.to_ascii_lowercase());
            assert!(!text_holds(Kind::Address, &longer, &text), "case {i}: {text}");
        }
    }
}
