//! Built-in file tools: `choir.fs.read` (`file:S`) and `choir.fs.write`
//! (`file:X`). Paths are opened through [`crate::workspace::Workspace`], so they
//! cannot leave the workspace; writes replace the file atomically.

use choir_common::manifest::ToolManifest;
use serde_json::{json, Value};

use super::tool::{ExecContext, Tool, ToolError};
use crate::workspace::{PathError, RelPath, Workspace};

/// Largest file `choir.fs.read` returns whole.
pub const READ_CAP: u64 = 1024 * 1024;
/// Largest file read at all (for line ranges and edits).
const HARD_CAP: u64 = 64 * 1024 * 1024;

/// Parses a built-in manifest literal. They are checked by the registry tests,
/// so a failure here is a bug caught before any release.
pub fn builtin_manifest(v: Value) -> ToolManifest {
    serde_json::from_value(v).unwrap_or_else(|e| panic!("built-in manifest: {e}"))
}

/// Manifest of `choir.fs.read`.
pub fn read_manifest() -> ToolManifest {
    builtin_manifest(json!({
        "llm": {
            "name": "choir.fs.read",
            "description": "Read a UTF-8 text file from the workspace: whole (up to 1 MiB), the first or last N lines, or a line range.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Path relative to /workspace"},
                    "head": {"type": "integer", "minimum": 1, "description": "Only the first N lines"},
                    "tail": {"type": "integer", "minimum": 1, "description": "Only the last N lines"},
                    "start_line": {"type": "integer", "minimum": 1, "description": "First line of a range (1-based)"},
                    "end_line": {"type": "integer", "minimum": 1, "description": "Last line of a range (inclusive)"}
                },
                "required": ["path"],
                "additionalProperties": false
            }
        },
        "runtime": {
            "timeout_ms": 10000,
            "locks": [{"resource": "file:{path}", "mode": "S"}],
            "side_effect": "read",
            "idempotent": true,
            "version": "2",
            // A workspace file can hold text from anywhere: untrusted; and
            // it is the user's: private, wherever it goes next.
            "output_trust": "untrusted",
            "private_fields": [""]
        }
    }))
}

/// Manifest of `choir.fs.write`.
pub fn write_manifest() -> ToolManifest {
    builtin_manifest(json!({
        "llm": {
            "name": "choir.fs.write",
            "description": "Change a text file in the workspace: overwrite or append content, insert it before a line, replace a line range, or apply exact-text edits (each old_text must match exactly once). dry_run returns a unified diff without writing.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Path relative to /workspace"},
                    "content": {"type": "string"},
                    "mode": {"type": "string", "enum": ["overwrite", "append", "insert", "replace_lines"]},
                    "line": {"type": "integer", "minimum": 1, "description": "insert: the line to insert before"},
                    "start_line": {"type": "integer", "minimum": 1, "description": "replace_lines: first line"},
                    "end_line": {"type": "integer", "minimum": 1, "description": "replace_lines: last line (inclusive)"},
                    "edits": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "properties": {"old_text": {"type": "string", "minLength": 1}, "new_text": {"type": "string"}},
                            "required": ["old_text", "new_text"],
                            "additionalProperties": false
                        }
                    },
                    "dry_run": {"type": "boolean"}
                },
                "required": ["path"],
                "additionalProperties": false
            }
        },
        "runtime": {
            "timeout_ms": 10000,
            "locks": [{"resource": "file:{path}", "mode": "X"}],
            "side_effect": "write",
            "idempotent": false,
            "version": "2",
            // Its diffs show the file's existing lines, which can hold text from anywhere: untrusted.
            "output_trust": "untrusted"
        }
    }))
}

fn path_error(e: PathError) -> ToolError {
    match e {
        PathError::NotFound(_) => ToolError::new("not_found", e.to_string()),
        PathError::Escapes(_) | PathError::Refused { .. } => ToolError::new("path_forbidden", e.to_string()),
        PathError::Io { .. } => ToolError::new("io_error", e.to_string()),
    }
}

fn bad(msg: impl Into<String>) -> ToolError {
    ToolError::new("invalid_arguments", msg)
}

fn str_arg<'a>(input: &'a Value, key: &str) -> Option<&'a str> {
    input.get(key).and_then(Value::as_str)
}

fn num_arg(input: &Value, key: &str) -> Option<usize> {
    input.get(key).and_then(Value::as_u64).map(|n| n as usize)
}

/// Reads a text file: refuses binary content with a clear message.
fn read_text(ws: &Workspace, rel: &RelPath, cap: u64) -> Result<String, ToolError> {
    let bytes = ws.read(rel, cap).map_err(|e| match e {
        PathError::Io { reason, .. } if reason.starts_with("file is larger") => ToolError::new(
            "too_large",
            format!(
                "{} is larger than {cap} bytes; read part of it with head, tail or start_line/end_line",
                rel.as_str()
            ),
        ),
        other => path_error(other),
    })?;
    let sniff = &bytes[..bytes.len().min(8192)];
    if sniff.contains(&0) {
        return Err(ToolError::new(
            "binary_file",
            format!("{} is a binary file ({} bytes) and cannot be shown as text", rel.as_str(), bytes.len()),
        ));
    }
    String::from_utf8(bytes).map_err(|_| ToolError::new("binary_file", format!("{} is not UTF-8 text", rel.as_str())))
}

/// `choir.fs.read`.
pub struct ReadTool;

impl Tool for ReadTool {
    fn execute(&self, ctx: &ExecContext<'_>, input: &Value) -> Result<Value, ToolError> {
        let rel = ctx.workspace.normalize(str_arg(input, "path").unwrap_or_default()).map_err(path_error)?;
        let (head, tail) = (num_arg(input, "head"), num_arg(input, "tail"));
        let (start, end) = (num_arg(input, "start_line"), num_arg(input, "end_line"));
        let selectors =
            [head.is_some(), tail.is_some(), start.is_some() || end.is_some()].iter().filter(|b| **b).count();
        if selectors > 1 {
            return Err(bad("use only one of head, tail or start_line/end_line"));
        }
        let partial = selectors == 1;
        let text = read_text(ctx.workspace, &rel, if partial { HARD_CAP } else { READ_CAP })?;
        let lines: Vec<&str> = text.split_inclusive('\n').collect();
        let total = lines.len();
        let (from, to) = match (head, tail, start, end) {
            (Some(n), _, _, _) => (0, n.min(total)),
            (_, Some(n), _, _) => (total.saturating_sub(n), total),
            (_, _, s, e) if partial => {
                let s = s.unwrap_or(1);
                let e = e.unwrap_or(total).min(total);
                if s > e.max(1) || (s > total && total > 0) {
                    return Err(bad(format!("line range {s}-{e} is outside the file's {total} lines")));
                }
                (s - 1, e)
            }
            _ => (0, total),
        };
        let content: String = lines[from..to].concat();
        Ok(json!({
            "summary": format!("read lines {}-{} of {} from {}", if to > from { from + 1 } else { 0 }, to, total, rel.as_str()),
            "path": rel.as_str(),
            "content": content,
            "total_lines": total,
            "from_line": if to > from { from + 1 } else { 0 },
            "to_line": to,
        }))
    }
}

/// `choir.fs.write`.
pub struct WriteTool;

impl WriteTool {
    /// The new content of the file, from the current content and the input.
    fn new_content(current: Option<&str>, rel: &RelPath, input: &Value) -> Result<String, ToolError> {
        let need = |what: &str| {
            current.ok_or_else(|| {
                ToolError::new("not_found", format!("{} does not exist ({what} needs an existing file)", rel.as_str()))
            })
        };
        if let Some(edits) = input.get("edits").and_then(Value::as_array) {
            if input.get("content").is_some() || input.get("mode").is_some() {
                return Err(bad("edits cannot be combined with content or mode"));
            }
            let mut text = need("edits")?.to_owned();
            for (i, e) in edits.iter().enumerate() {
                let old = str_arg(e, "old_text").unwrap_or_default();
                let new = str_arg(e, "new_text").unwrap_or_default();
                let count = text.matches(old).count();
                if count != 1 {
                    return Err(ToolError::new(
                        "edit_mismatch",
                        format!(
                            "edits[{i}].old_text matches {count} times in {}; it must match exactly once",
                            rel.as_str()
                        ),
                    ));
                }
                text = text.replacen(old, new, 1);
            }
            return Ok(text);
        }
        let content = str_arg(input, "content").ok_or_else(|| bad("content is required (or use edits)"))?;
        match str_arg(input, "mode").unwrap_or("overwrite") {
            "overwrite" => Ok(content.to_owned()),
            "append" => Ok(format!("{}{content}", current.unwrap_or_default())),
            "insert" => {
                let cur = need("insert")?;
                let line = num_arg(input, "line").ok_or_else(|| bad("insert needs line"))?;
                let mut lines: Vec<String> = cur.split_inclusive('\n').map(str::to_owned).collect();
                if line > lines.len() + 1 {
                    return Err(bad(format!("line {line} is past the end of the file ({} lines)", lines.len())));
                }
                let at_end = line == lines.len() + 1;
                if let Some(last) = lines.last_mut().filter(|_| at_end) {
                    if !last.ends_with('\n') {
                        last.push('\n');
                    }
                }
                let mut block = content.to_owned();
                if line <= lines.len() && !block.ends_with('\n') {
                    block.push('\n');
                }
                lines.insert(line - 1, block);
                Ok(lines.concat())
            }
            "replace_lines" => {
                let cur = need("replace_lines")?;
                let (s, e) = match (num_arg(input, "start_line"), num_arg(input, "end_line")) {
                    (Some(s), Some(e)) if s <= e => (s, e),
                    _ => return Err(bad("replace_lines needs start_line <= end_line")),
                };
                let lines: Vec<&str> = cur.split_inclusive('\n').collect();
                if e > lines.len() {
                    return Err(bad(format!("line range {s}-{e} is outside the file's {} lines", lines.len())));
                }
                let mut block = content.to_owned();
                if e < lines.len() && !block.is_empty() && !block.ends_with('\n') {
                    block.push('\n');
                }
                Ok(format!("{}{block}{}", lines[..s - 1].concat(), lines[e..].concat()))
            }
            other => Err(bad(format!("unknown mode {other}"))),
        }
    }
}

impl Tool for WriteTool {
    fn execute(&self, ctx: &ExecContext<'_>, input: &Value) -> Result<Value, ToolError> {
        let rel = ctx.workspace.normalize(str_arg(input, "path").unwrap_or_default()).map_err(path_error)?;
        let current = if ctx.workspace.exists(&rel).map_err(path_error)? {
            Some(read_text(ctx.workspace, &rel, HARD_CAP)?)
        } else {
            None
        };
        let new = WriteTool::new_content(current.as_deref(), &rel, input)?;
        let old = current.as_deref().unwrap_or_default();
        let diff = similar::TextDiff::from_lines(old, new.as_str());
        let (mut added, mut removed) = (0, 0);
        for change in diff.iter_all_changes() {
            match change.tag() {
                similar::ChangeTag::Insert => added += 1,
                similar::ChangeTag::Delete => removed += 1,
                similar::ChangeTag::Equal => {}
            }
        }
        if input.get("dry_run").and_then(Value::as_bool) == Some(true) {
            let a = format!("a/{}", rel.as_str());
            let b = format!("b/{}", rel.as_str());
            let unified = diff.unified_diff().context_radius(3).header(&a, &b).to_string();
            return Ok(json!({
                "summary": format!("dry run: {} would change (+{added} -{removed} lines); nothing written", rel.as_str()),
                "path": rel.as_str(),
                "diff": unified,
                "written": false,
            }));
        }
        ctx.workspace.write_atomic(&rel, new.as_bytes()).map_err(path_error)?;
        Ok(json!({
            "summary": format!("wrote {} ({} bytes, +{added} -{removed} lines)", rel.as_str(), new.len()),
            "path": rel.as_str(),
            "bytes": new.len(),
            "lines_added": added,
            "lines_removed": removed,
            "written": true,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::SecretStore;
    use std::time::{Duration, Instant};

    fn with_ws(f: impl FnOnce(&ExecContext<'_>, &std::path::Path)) {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(dir.path()).unwrap();
        let ctx = ExecContext {
            workspace: &ws,
            lane: "edge",
            call_id: "test",
            state_dir: dir.path(),
            deadline: Instant::now() + Duration::from_secs(10),
            secrets: SecretStore::default(),
            hooks: None,
            history: &[],
        };
        f(&ctx, dir.path());
    }

    #[test]
    fn read_whole_head_tail_and_ranges() {
        with_ws(|ctx, root| {
            std::fs::write(root.join("f.txt"), "1\n2\n3\n4\n5\n").unwrap();
            let read = |extra: Value| {
                let mut input = json!({"path": "f.txt"});
                input.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
                ReadTool.execute(ctx, &input)
            };
            assert_eq!(read(json!({})).unwrap()["content"], "1\n2\n3\n4\n5\n");
            assert_eq!(read(json!({"head": 2})).unwrap()["content"], "1\n2\n");
            assert_eq!(read(json!({"tail": 2})).unwrap()["content"], "4\n5\n");
            assert_eq!(read(json!({"start_line": 2, "end_line": 3})).unwrap()["content"], "2\n3\n");
            assert_eq!(read(json!({"start_line": 4})).unwrap()["content"], "4\n5\n");
            assert_eq!(read(json!({"head": 1, "tail": 1})).unwrap_err().code, "invalid_arguments");
            assert_eq!(read(json!({"start_line": 9})).unwrap_err().code, "invalid_arguments");
        });
    }

    #[test]
    fn binary_and_oversized_files_get_clear_errors() {
        with_ws(|ctx, root| {
            std::fs::write(root.join("b.bin"), [0x7f, b'E', b'L', b'F', 0, 1, 2]).unwrap();
            let e = ReadTool.execute(ctx, &json!({"path": "b.bin"})).unwrap_err();
            assert_eq!(e.code, "binary_file");
            assert!(e.message.contains("7 bytes"), "{e}");
            std::fs::write(root.join("big.txt"), "x\n".repeat(600_000)).unwrap();
            let e = ReadTool.execute(ctx, &json!({"path": "big.txt"})).unwrap_err();
            assert_eq!(e.code, "too_large");
            assert!(e.message.contains("head, tail"), "{e}");
            let tail = ReadTool.execute(ctx, &json!({"path": "big.txt", "tail": 1})).unwrap();
            assert_eq!((tail["content"].as_str(), tail["total_lines"].as_u64()), (Some("x\n"), Some(600_000)));
        });
    }

    #[test]
    fn write_modes() {
        with_ws(|ctx, root| {
            let w = |input: Value| WriteTool.execute(ctx, &input);
            let file = || std::fs::read_to_string(root.join("f.txt")).unwrap();
            w(json!({"path": "f.txt", "content": "a\nb\nc\n"})).unwrap();
            w(json!({"path": "f.txt", "content": "d\n", "mode": "append"})).unwrap();
            assert_eq!(file(), "a\nb\nc\nd\n");
            w(json!({"path": "f.txt", "content": "X", "mode": "insert", "line": 2})).unwrap();
            assert_eq!(file(), "a\nX\nb\nc\nd\n");
            w(json!({"path": "f.txt", "content": "end", "mode": "insert", "line": 6})).unwrap();
            assert_eq!(file(), "a\nX\nb\nc\nd\nend");
            w(json!({"path": "f.txt", "content": "B\nC", "mode": "replace_lines", "start_line": 3, "end_line": 4}))
                .unwrap();
            assert_eq!(file(), "a\nX\nB\nC\nd\nend");
            assert_eq!(
                w(json!({"path": "f.txt", "content": "z", "mode": "insert", "line": 9})).unwrap_err().code,
                "invalid_arguments"
            );
            assert_eq!(
                w(json!({"path": "nope.txt", "content": "z", "mode": "insert", "line": 1})).unwrap_err().code,
                "not_found"
            );
        });
    }

    #[test]
    fn edits_must_match_exactly_once_and_dry_run_writes_nothing() {
        with_ws(|ctx, root| {
            std::fs::write(root.join("c.rs"), "fn a() {}\nfn b() {}\nfn a2() {}\n").unwrap();
            let w = |input: Value| WriteTool.execute(ctx, &input);
            let e = w(json!({"path": "c.rs", "edits": [{"old_text": "fn a", "new_text": "fn z"}]})).unwrap_err();
            assert_eq!(e.code, "edit_mismatch");
            assert!(e.message.contains("matches 2 times"), "{e}");
            let e = w(json!({"path": "c.rs", "edits": [{"old_text": "fn q", "new_text": "x"}]})).unwrap_err();
            assert!(e.message.contains("matches 0 times"), "{e}");
            let dry =
                w(json!({"path": "c.rs", "edits": [{"old_text": "fn b()", "new_text": "fn bee()"}], "dry_run": true}))
                    .unwrap();
            assert_eq!(
                dry["diff"],
                "--- a/c.rs\n+++ b/c.rs\n@@ -1,3 +1,3 @@\n fn a() {}\n-fn b() {}\n+fn bee() {}\n fn a2() {}\n"
            );
            assert_eq!(std::fs::read_to_string(root.join("c.rs")).unwrap(), "fn a() {}\nfn b() {}\nfn a2() {}\n");
            w(json!({"path": "c.rs", "edits": [{"old_text": "fn b()", "new_text": "fn bee()"}, {"old_text": "a2", "new_text": "a3"}]}))
                .unwrap();
            assert_eq!(std::fs::read_to_string(root.join("c.rs")).unwrap(), "fn a() {}\nfn bee() {}\nfn a3() {}\n");
        });
    }
}
