//! HTML for the console: one escaping function every value passes through,
//! and the page frame.
//!
//! **Invariants:** nothing reaches a page except through [`esc`] (text and
//! attribute values alike: `& < > " '` are entities, invisible and
//! direction-changing characters are shown as visible `U+XXXX` marks, so an
//! agent's `</textarea>`, `<script>` or a bidi-reordered name stays inert
//! text); no page has inline script or style (the CSP forbids them); links
//! are built only from choird's own paths, never from an agent's text.

use std::fmt::Write as _;

/// `s` safe as HTML text or a double-quoted attribute value.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\n' | '\t' => out.push(c),
            c if choir_common::text::hidden(c) || c.is_control() => {
                let _ = write!(out, "<span class=\"ctl\">U+{:04X}</span>", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// A page: its title, the session's CSRF token (for the scripts' requests),
/// the body's HTML (already escaped where it holds values).
pub fn page(title: &str, csrf: &str, kill_switch: bool, body: &str) -> String {
    let banner =
        if kill_switch { "<p class=\"alarm\">The kill switch is ON: agents do nothing that acts.</p>" } else { "" };
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta name=\"csrf\" content=\"{csrf}\">\
         <title>{title} · Choir</title>\
         <link rel=\"stylesheet\" href=\"/static/style.css\">\
         <script src=\"/static/app.js\" defer></script></head>\
         <body><header><nav><a href=\"/\">Agents</a> <a href=\"/approvals\">Approvals</a> \
         <a href=\"/usage\">Usage</a> <a href=\"/schedule\">Schedule</a> <a href=\"/sessions\">Sessions</a> <a href=\"/logs\">Logs</a> \
         <a href=\"/audit\">Audit</a> \
         <a href=\"/kill-switch\" class=\"danger\">Kill switch</a></nav>\
         <form method=\"post\" action=\"/logout\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <button>Log out</button></form></header>{banner}<main><h1>{title}</h1>{body}</main></body></html>",
        title = esc(title),
        csrf = esc(csrf),
    )
}

/// A table of rows of already-escaped cells under `heads`.
pub fn table(heads: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = String::from("<table><thead><tr>");
    for h in heads {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr></thead><tbody>");
    for r in rows {
        out.push_str("<tr>");
        for c in r {
            let _ = write!(out, "<td>{c}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_quotes_and_bidi_tricks_come_out_inert() {
        let e = esc("</textarea><script>alert(1)</script>\"onx='y' \u{202E}gnp.exe");
        assert!(!e.contains("<script") && !e.contains("</textarea") && !e.contains("\"onx"), "{e}");
        assert!(e.contains("&lt;/textarea&gt;&lt;script&gt;") && e.contains("&quot;onx=&#39;y&#39;"), "{e}");
        assert!(e.contains("<span class=\"ctl\">U+202E</span>") && !e.contains('\u{202E}'), "{e}");
        // Negative control: plain text passes unchanged.
        assert_eq!(esc("agent demo: 3 steps"), "agent demo: 3 steps");
    }
}
