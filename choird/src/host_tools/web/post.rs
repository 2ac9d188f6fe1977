//! `choir.http.post`: a POST of JSON or a form, run by choird, only to the
//! exact origins in the agent's `web.post_origins`, through its egress
//! policy (resolved once, connected to the checked address), with no
//! redirect followed and both bodies capped. `auth_secret` names one of the
//! agent's `web.post_secrets`, which choird turns into a header: the value
//! never reaches the agent or the model. Not idempotent: the registry runs
//! it at most once per call id, and audits every call with its destination
//! and status.

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use choir_common::ids::AgentId;
use choir_common::manifest::ToolManifest;
use choir_common::trust::wrap_untrusted;
use serde_json::{json, Value};

use crate::config::Config;
use crate::egress::{origin_of, parse_web_url, Policy, MAX_URL_BYTES};
use crate::error::Error;
use crate::host_tools::{HostCall, HostTool, ToolStatus};
use crate::secrets::Secrets;
use crate::shared::Shared;

/// Largest request body sent.
pub const MAX_REQUEST: usize = 1024 * 1024;
/// Bytes of a response read at most (the rest is dropped, and said so).
pub const MAX_RESPONSE: u64 = 1024 * 1024;
/// Characters of a response shown to the model.
const SHOWN_CHARS: usize = 20_000;
/// Headers a call may set at most.
const MAX_HEADERS: usize = 20;
/// How long a post may take.
const TIMEOUT: Duration = Duration::from_secs(30);
/// Headers a call may not set: choird owns them (framing, routing, and
/// credentials, which go through `auth_secret`).
const OWN_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "authorization",
    "cookie",
    "proxy-authorization",
    "proxy-connection",
    "expect",
];

/// The tool.
pub struct Post {
    shared: Arc<Shared>,
}

impl Post {
    /// The tool over `shared`'s config and secrets.
    pub fn new(shared: Arc<Shared>) -> Post {
        Post { shared }
    }
}

fn refused(why: String) -> Error {
    Error::Forbidden(why)
}

impl HostTool for Post {
    fn name(&self) -> &str {
        "choir.http.post"
    }

    fn manifest(&self) -> Option<ToolManifest> {
        serde_json::from_value(json!({
            "llm": {
                "name": "choir.http.post",
                "description": "POST JSON (json) or a form (form) to a web address the operator allowed, and get the reply. auth_secret names a credential choird adds itself (you never see it). Redirects are not followed.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "url": {"type": "string", "minLength": 1, "maxLength": MAX_URL_BYTES},
                        "json": {"description": "A JSON body"},
                        "form": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Form fields (application/x-www-form-urlencoded)"},
                        "headers": {"type": "object", "additionalProperties": {"type": "string"}, "maxProperties": MAX_HEADERS},
                        "auth_secret": {"type": "string", "minLength": 1, "maxLength": 64}
                    },
                    "required": ["url"],
                    "additionalProperties": false
                }
            },
            "runtime": {"timeout_ms": 40000, "network": true, "side_effect": "external", "idempotent": false, "version": "1",
                        "roles": {"/url": "destination", "/json": "payload", "/form": "payload", "/headers": "payload",
                                  "/auth_secret": "target"}}
        }))
        .ok()
    }

    fn status(&self, config: &Config, _secrets: &Secrets, agent: &AgentId) -> ToolStatus {
        match super::common::agent_web(config, agent) {
            Err(why) => why,
            Ok(w) if w.post_origins.is_empty() => {
                ToolStatus::Available(format!("agents.{agent}.web.post_origins is empty"))
            }
            Ok(_) => ToolStatus::Connected,
        }
    }

    fn audit_detail(&self, input: &Value, result: &Result<Value, Error>) -> Value {
        let destination = parse_web_url(input["url"].as_str().unwrap_or_default())
            .map(|u| format!("{}{}", origin_of(&u), u.path()))
            .unwrap_or_else(|_| "(invalid URL)".into());
        let status = result.as_ref().ok().and_then(|v| v["status_code"].as_u64());
        json!({"destination": destination, "status_code": status, "auth_secret": input["auth_secret"]})
    }

    fn execute(&self, call: &HostCall<'_>) -> Result<Value, Error> {
        let config = self.shared.config();
        let web = super::common::agent_web(&config, &call.caller.agent)
            .map_err(|_| refused(format!("agents.{}.web is not configured", call.caller.agent)))?;
        let input = call.input;
        let url = parse_web_url(input["url"].as_str().unwrap_or_default()).map_err(|e| Error::Malformed(e.0))?;
        let origin = origin_of(&url);
        if !web.post_origins.contains(&origin) {
            return Err(refused(format!(
                "{origin} is not an origin this agent may post to (the operator lists them in \
                 agents.{}.web.post_origins)",
                call.caller.agent
            )));
        }
        // The body: exactly one of json and form.
        let (content_type, body) = match (input.get("json"), input.get("form")) {
            (Some(j), None) => ("application/json", serde_json::to_vec(j).map_err(|e| Error::Internal(e.to_string()))?),
            (None, Some(Value::Object(f))) => {
                let mut s = url::form_urlencoded::Serializer::new(String::new());
                for (k, v) in f {
                    s.append_pair(k, v.as_str().unwrap_or_default());
                }
                ("application/x-www-form-urlencoded", s.finish().into_bytes())
            }
            _ => return Err(Error::Malformed("give exactly one of json and form".into())),
        };
        if body.len() > MAX_REQUEST {
            return Err(Error::TooLarge(format!("the body is {} bytes; at most {MAX_REQUEST} are sent", body.len())));
        }
        let mut headers: Vec<(String, String)> = Vec::new();
        if let Some(Value::Object(h)) = input.get("headers") {
            for (k, v) in h.iter().take(MAX_HEADERS) {
                let name = k.to_ascii_lowercase();
                let value = v.as_str().unwrap_or_default();
                let valid_name = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
                if !valid_name || value.chars().any(|c| c.is_control()) || value.len() > 4096 {
                    return Err(Error::Malformed(format!("header {k:?} is not a valid header")));
                }
                if OWN_HEADERS.contains(&name.as_str()) || name.starts_with("proxy-") {
                    return Err(Error::Malformed(format!(
                        "header {k} is set by choird, not by a call (credentials go through auth_secret)"
                    )));
                }
                headers.push((k.clone(), value.to_owned()));
            }
        }
        if let Some(name) = input["auth_secret"].as_str() {
            let Some(spec) = web.post_secrets.get(name) else {
                return Err(refused(format!("{name} is not a secret this agent may post with")));
            };
            if !spec.origins.contains(&origin) {
                return Err(refused(format!("secret {name} may not be sent to {origin}")));
            }
            let secrets = self.shared.secrets();
            let Some(value) = secrets.get(name) else {
                return Err(Error::Unavailable(format!("secret {name} is not set in secrets.json")));
            };
            headers.push((spec.header.clone(), format!("{}{value}", spec.prefix)));
        }
        let policy = Policy::new(web);
        let host = url.host_str().unwrap_or_default();
        let port = url.port_or_known_default().unwrap_or(443);
        let addr = policy.resolve(host, port).map_err(|e| refused(e.0))?;
        let agent = super::common::pinned_agent(addr, TIMEOUT);
        let mut req = agent.post(url.as_str()).header("Content-Type", content_type);
        for (k, v) in &headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let mut resp = req.send(&body[..]).map_err(|e| {
            log::info!("agent {}: post to {origin}: {e}", call.caller.agent);
            match e {
                ureq::Error::Timeout(_) => {
                    Error::Timeout(format!("{origin} did not answer within {} s", TIMEOUT.as_secs()))
                }
                _ => Error::Upstream(format!("{origin} could not be reached")),
            }
        })?;
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(|s| s.chars().take(200).collect::<String>());
        let location = resp.headers().get("location").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let mut raw = Vec::new();
        resp.body_mut()
            .as_reader()
            .take(MAX_RESPONSE + 1)
            .read_to_end(&mut raw)
            .map_err(|_| Error::Upstream(format!("{origin}'s reply broke off")))?;
        let over = raw.len() as u64 > MAX_RESPONSE;
        raw.truncate(MAX_RESPONSE as usize);
        let mut text = String::from_utf8_lossy(&raw).into_owned();
        if let Some(l) = location {
            text = format!("[redirect to {l} not followed]\n{text}");
        }
        let (text, cut) = choir_common::text::cap_with_note(&text, SHOWN_CHARS);
        let mut out = json!({
            "summary": format!("POST {origin}{} answered {status}", url.path()),
            "source": url.as_str(),
            "status_code": status,
            "content_type": content_type,
            "body": wrap_untrusted(url.as_str(), &text),
        });
        if over || cut {
            out["note"] = json!(format!("the reply was longer than shown (read at most {MAX_RESPONSE} bytes)"));
        }
        Ok(out)
    }
}
