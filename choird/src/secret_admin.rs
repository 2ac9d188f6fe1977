//! The operator's secrets (R-CTL-2): `choirctl secrets list|set|rm`.
//! Values never leave choird through this path: a list shows names, whether
//! each is set, its length and everything that uses it (config fields,
//! agents' bindings, tools' `secret_resources`); `set` takes the value in a
//! request body (choirctl reads it from stdin or a prompt, never from its
//! command line); `rm` is refused while anything uses the secret, naming
//! what. `secrets.json` is rewritten atomically with mode 0600 (a new file
//! beside it, synced, renamed over it) and reloaded at once: choird's own
//! uses (model endpoints, bots, mail, Notion, Brave, posts) take the new value
//! at their next use; an agent reads the secrets bound to it when it starts.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use choir_common::admin::{SecretList, SecretRow};
use choir_common::manifest::load_tool_layer;
use serde_json::Value;

use crate::error::Error;
use crate::secrets::{valid_name, Secrets};

/// Longest value accepted.
pub const MAX_VALUE: usize = 64 * 1024;

/// Every use of a secret in `config` (the file's JSON): `(name, where)`.
/// Any field named `*_secret` (a string) or `secrets` / `*_secrets` (an
/// array of names, or an object keyed by names) counts.
pub fn config_uses(config: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    walk(config, "", &mut out);
    out
}

fn walk(v: &Value, at: &str, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(map) => {
            for (k, x) in map {
                let here = if at.is_empty() { k.clone() } else { format!("{at}.{k}") };
                let names_secrets = k == "secrets" || k.ends_with("_secrets");
                match x {
                    Value::String(s) if k.ends_with("_secret") => out.push((s.clone(), format!("config.json {here}"))),
                    Value::Array(items) if names_secrets => out.extend(
                        items.iter().filter_map(Value::as_str).map(|s| (s.to_owned(), format!("config.json {here}"))),
                    ),
                    // A map of secrets: by name (`post_secrets.<name>: {…}`), or to names.
                    Value::Object(m) if names_secrets => {
                        out.extend(m.iter().map(|(key, s)| {
                            (s.as_str().unwrap_or(key).to_owned(), format!("config.json {here}.{key}"))
                        }))
                    }
                    _ => walk(x, &here, out),
                }
            }
        }
        Value::Array(items) => {
            for (i, x) in items.iter().enumerate() {
                walk(x, &format!("{at}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// The tools under `repos/` that declare a secret: `(name, where)`.
fn tool_uses(home: &Path) -> Vec<(String, String)> {
    let repos = home.join("repos");
    let mut layers = vec![repos.join("global").join("tools")];
    if let Ok(agents) = std::fs::read_dir(repos.join("agents")) {
        layers.extend(agents.flatten().map(|a| a.path().join("tools")));
    }
    let mut out = Vec::new();
    for dir in layers {
        // A layer that does not load is `tools list`'s to report.
        for t in load_tool_layer(&dir).unwrap_or_default() {
            let file = t.file.strip_prefix(home).unwrap_or(&t.file).display().to_string();
            for s in &t.manifest.runtime.secret_resources {
                out.push((s.clone(), format!("tool {} ({file})", t.manifest.llm.name)));
            }
        }
    }
    out
}

/// Every use of every secret name: name → places.
pub fn uses(home: &Path, config: &Value) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, place) in config_uses(config).into_iter().chain(tool_uses(home)) {
        out.entry(name).or_default().push(place);
    }
    out
}

/// `secrets list`: every secret set and every name used, values masked.
pub fn list(home: &Path, config: &Value, secrets: &Secrets) -> SecretList {
    let uses = uses(home, config);
    let mut names: Vec<String> = secrets.names().map(str::to_owned).collect();
    names.extend(uses.keys().cloned());
    names.sort();
    names.dedup();
    let rows = names
        .into_iter()
        .map(|name| SecretRow {
            set: secrets.contains(&name),
            length: secrets.get(&name).map(str::len),
            used_by: uses.get(&name).cloned().unwrap_or_default(),
            name,
        })
        .collect();
    SecretList { secrets: rows }
}

/// Checks a name and a value for `secrets set`.
pub fn check_set(name: &str, value: &str) -> Result<(), Error> {
    if !valid_name(name) {
        return Err(Error::Malformed(format!(
            "secret name {} must be 1–64 letters, digits, '_' or '-'",
            crate::http::printable(name)
        )));
    }
    if value.is_empty() {
        return Err(Error::Malformed("the value is empty; nothing was changed".into()));
    }
    if value.len() > MAX_VALUE {
        return Err(Error::Malformed(format!("the value is {} bytes; at most {MAX_VALUE}", value.len())));
    }
    if value.contains('\0') {
        return Err(Error::Malformed("the value contains a NUL byte; nothing was changed".into()));
    }
    Ok(())
}

/// Writes `secrets` to `path` atomically, mode 0600.
pub fn write(path: &Path, secrets: &Secrets) -> Result<(), Error> {
    let io = |e: std::io::Error| Error::Internal(format!("{}: {e}", path.display()));
    let tmp = path.with_extension("json.choir-tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).map_err(io)?;
    let text = serde_json::to_string_pretty(&secrets.to_map()).map_err(|e| Error::Internal(e.to_string()))?;
    f.write_all(text.as_bytes()).and_then(|()| f.write_all(b"\n")).and_then(|()| f.sync_all()).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_secret_field_of_a_config_is_a_use() {
        let config = json!({
            "llm": {"edge": {"api_key_secret": "llm_key"}},
            "agents": {"demo": {"secrets": ["gh_token"], "web": {"post_secrets": {"hook_token": {"origins": ["https://h.test"]}}}}},
            "telegram": {"bots": {"main": {"token_secret": "bot"}}},
        });
        let mut got = config_uses(&config);
        got.sort();
        assert_eq!(
            got,
            vec![
                ("bot".to_owned(), "config.json telegram.bots.main.token_secret".to_owned()),
                ("gh_token".to_owned(), "config.json agents.demo.secrets".to_owned()),
                ("hook_token".to_owned(), "config.json agents.demo.web.post_secrets.hook_token".to_owned()),
                ("llm_key".to_owned(), "config.json llm.edge.api_key_secret".to_owned()),
            ]
        );
    }

    #[test]
    fn a_bad_name_or_value_is_refused() {
        assert!(check_set("gh_token", "v").is_ok());
        for (name, value) in [("", "v"), ("a b", "v"), ("../x", "v"), ("ok", ""), ("ok", "a\0b")] {
            assert!(check_set(name, value).is_err(), "{name:?} {value:?}");
        }
        assert!(check_set("ok", &"x".repeat(MAX_VALUE + 1)).is_err());
    }
}
