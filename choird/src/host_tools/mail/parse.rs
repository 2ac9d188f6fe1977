//! A message as the model gets it: headers, the text body (the plain-text
//! part, else the HTML part converted to text), and its attachments —
//! parsed with `mailparse`, with bounds on parts and sizes.

use mailparse::{DispositionType, MailHeaderMap, ParsedMail};

/// Parts looked at at most (a hostile message may nest thousands).
const MAX_PARTS: usize = 200;
/// Attachments kept at most.
pub const MAX_ATTACHMENTS: usize = 20;

/// One parsed message.
#[derive(Debug, Default)]
pub struct Message {
    /// `From`.
    pub from: String,
    /// `To`.
    pub to: String,
    /// `Subject`.
    pub subject: String,
    /// `Date`.
    pub date: String,
    /// `Message-ID`.
    pub message_id: String,
    /// The text.
    pub text: String,
    /// (file name, bytes).
    pub attachments: Vec<(String, Vec<u8>)>,
}

/// Parses a whole message (RFC 5322).
pub fn message(raw: &[u8]) -> Result<Message, String> {
    let mail = mailparse::parse_mail(raw).map_err(|e| format!("the message cannot be parsed: {e}"))?;
    let h = |k: &str| mail.headers.get_first_value(k).unwrap_or_default();
    let mut m = Message {
        from: h("From"),
        to: h("To"),
        subject: h("Subject"),
        date: h("Date"),
        message_id: h("Message-ID"),
        ..Message::default()
    };
    let mut plain: Option<String> = None;
    let mut html: Option<String> = None;
    let mut seen = 0;
    walk(&mail, &mut seen, &mut |part| {
        let disp = part.get_content_disposition();
        let name = disp.params.get("filename").cloned().or_else(|| part.ctype.params.get("name").cloned());
        let is_attachment = disp.disposition == DispositionType::Attachment || name.is_some();
        if is_attachment {
            if m.attachments.len() < MAX_ATTACHMENTS {
                if let Ok(data) = part.get_body_raw() {
                    m.attachments.push((name.unwrap_or_else(|| "attachment".into()), data));
                }
            }
        } else if part.ctype.mimetype == "text/plain" && plain.is_none() {
            plain = part.get_body().ok();
        } else if part.ctype.mimetype == "text/html" && html.is_none() {
            html = part.get_body().ok();
        }
    });
    m.text = plain.or_else(|| html.map(|h| html_to_text(&h))).unwrap_or_default().trim().to_owned();
    Ok(m)
}

fn walk<'a>(p: &'a ParsedMail<'a>, seen: &mut usize, f: &mut impl FnMut(&'a ParsedMail<'a>)) {
    *seen += 1;
    if *seen > MAX_PARTS {
        return;
    }
    if p.subparts.is_empty() {
        f(p);
    }
    for s in &p.subparts {
        walk(s, seen, f);
    }
}

/// HTML as text: scripts, styles and comments dropped, block ends as line
/// breaks, links kept as `text (url)`, tags removed, common entities decoded.
pub fn html_to_text(html: &str) -> String {
    let lower = html.to_ascii_lowercase();
    let mut out = String::with_capacity(html.len() / 2);
    let mut i = 0;
    let bytes = html.as_bytes();
    while i < html.len() {
        if bytes[i] == b'<' {
            let rest = &lower[i..];
            // Skip what is never text.
            let skip_to = |end: &str| rest.find(end).map(|e| i + e + end.len());
            let next = if rest.starts_with("<!--") {
                skip_to("-->")
            } else if rest.starts_with("<script") {
                skip_to("</script>")
            } else if rest.starts_with("<style") {
                skip_to("</style>")
            } else {
                None
            };
            if let Some(n) = next {
                i = n;
                continue;
            }
            let Some(close) = rest.find('>') else { break };
            let tag = &rest[1..close];
            let name: String = tag.trim_start_matches('/').chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
            if matches!(
                name.as_str(),
                "br" | "p"
                    | "div"
                    | "tr"
                    | "li"
                    | "h1"
                    | "h2"
                    | "h3"
                    | "h4"
                    | "h5"
                    | "h6"
                    | "table"
                    | "ul"
                    | "ol"
                    | "blockquote"
            ) {
                out.push('\n');
            }
            if name == "a" && !tag.starts_with('/') {
                if let Some(h) = tag.find("href=") {
                    let v = &html[i + 1 + h + 5..i + close];
                    let v = v.trim_start_matches(['"', '\'']);
                    let end = v.find(['"', '\'', ' ']).unwrap_or(v.len());
                    out.push_str(&format!("[{}] ", &v[..end]));
                }
            }
            i += close + 1;
            continue;
        }
        let next = html[i..].find('<').map_or(html.len(), |n| i + n);
        out.push_str(&decode_entities(&html[i..next]));
        i = next;
    }
    let lines: Vec<String> = out.lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect();
    let mut text = lines.join("\n");
    while text.contains("\n\n\n") {
        text = text.replace("\n\n\n", "\n\n");
    }
    text.trim().to_owned()
}

fn decode_entities(s: &str) -> String {
    s.replace("&nbsp;", " ")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_becomes_text_without_scripts_or_styles() {
        let t = html_to_text(
            "<html><style>p{}</style><script>alert(1)</script><p>Hello&nbsp;<b>you</b></p><!-- x --><p>See <a href=\"https://e.test/x\">this</a> &amp; that</p></html>",
        );
        assert_eq!(t, "Hello you\n\nSee [https://e.test/x] this & that");
    }

    #[test]
    fn a_multipart_message_gives_its_text_and_attachments() {
        let raw = b"From: Ann <ann@example.test>\r\nTo: bot@example.test\r\nSubject: Hi\r\nMessage-ID: <1@x>\r\n\
MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=\"b\"\r\n\r\n--b\r\nContent-Type: text/html\r\n\r\n<p>Hello <i>there</i></p>\r\n\
--b\r\nContent-Type: application/octet-stream\r\nContent-Disposition: attachment; filename=\"a.bin\"\r\nContent-Transfer-Encoding: base64\r\n\r\nAAEC\r\n--b--\r\n";
        let m = message(raw).unwrap();
        assert_eq!(
            (m.from.as_str(), m.subject.as_str(), m.text.as_str()),
            ("Ann <ann@example.test>", "Hi", "Hello there")
        );
        assert_eq!(m.attachments, vec![("a.bin".to_owned(), vec![0u8, 1, 2])]);
    }
}
