//! Provenance values (R-ARB-5): the sources an argument value can have, and
//! the normal forms values are compared in. Shared by the agent (which
//! traces each value of a call through its lane's history) and choird
//! (which checks argument policies when it loads them, and answers
//! `choirctl policy test`).
//!
//! **The rule.** Values are compared exactly, after normalising by kind:
//! - a mail address: trimmed, lowercased, an optional `Name <…>` dropped;
//! - a URL: parsed, scheme and host lowercased, default port and fragment
//!   dropped, an empty path made `/`;
//! - a number (an account, a phone, an IBAN): its digits, when it has at
//!   least six;
//! - any other text: whitespace runs collapsed, compared as a contiguous
//!   part of an entry's text.
//!
//! An address, URL or number is looked for among the values *of the same
//! kind* a text holds ([`values_in`]), never as a substring of one, so
//! `bob@corp.test` does not come from `evilbob@corp.test.evil`.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// Where a value could have come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The user's messages in this conversation.
    User,
    /// The operator's side (Choir's own notes, built from config and state).
    Operator,
    /// The output of a tool whose output is trusted.
    Trusted,
    /// The output of a tool whose output is untrusted (mail, web, files…).
    Untrusted,
    /// A label, not an origin: a private field of a tool's output held it
    /// (the user's passport number, card, account; see
    /// `choir_common::roles`). It is never cleaned: an echo keeps it.
    Private,
    /// Nowhere in the history: the model made it.
    Model,
}

impl Source {
    /// `user`, `operator`, `trusted`, `untrusted` or `model`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::User => "user",
            Source::Operator => "operator",
            Source::Trusted => "trusted",
            Source::Untrusted => "untrusted",
            Source::Private => "private",
            Source::Model => "model",
        }
    }
}

/// What kind of value a string is, for normalising it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A mail address.
    Address,
    /// An http(s) URL.
    Url,
    /// A number of at least six digits (with separators).
    Number,
    /// Anything else.
    Text,
}

/// Characters of an address's (unquoted) local part, as found in text.
fn local_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "._%+-!#$&'*/=?^`{|}~".contains(c)
}

/// Characters of a domain.
fn domain_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '.' || c == '-'
}

fn valid_domain(domain: &str) -> bool {
    domain.contains('.')
        && !domain.starts_with(['.', '-'])
        && !domain.ends_with(['.', '-'])
        && !domain.contains("..")
        && domain.chars().all(domain_char)
}

/// A recipient as a mailer reads it (RFC 5322's `addr-spec` or
/// `display-name <addr-spec>`), lowercased. **The mailer's reading, not the
/// eye's:** the angle form counts only when the value *ends* with `>`, so
/// `"\"<me@corp.test>\""@evil.test` is the quoted local part
/// `"<me@corp.test>"` at `evil.test` — a whole address of its own, found in
/// no text that does not hold exactly it — never `me@corp.test`.
fn address(s: &str) -> Option<String> {
    let s = s.trim();
    let inner = match s.strip_suffix('>').and_then(|rest| rest.rfind('<').map(|a| &rest[a + 1..])) {
        Some(inner) => inner.trim(),
        None => s,
    };
    let (local, domain) = inner.rsplit_once('@')?;
    if !valid_domain(domain) || local.is_empty() {
        return None;
    }
    let quoted = local.len() >= 2 && local.starts_with('"') && local.ends_with('"');
    let ok_local = if quoted {
        !local[1..local.len() - 1].contains(['\r', '\n'])
    } else {
        local.chars().all(local_char) && !local.starts_with('.') && !local.ends_with('.') && !local.contains("..")
    };
    ok_local.then(|| inner.to_ascii_lowercase())
}

/// The plain addresses written anywhere in `text`, whatever surrounds them
/// (quotes, brackets, `mailto:`, JSON or YAML punctuation, a trailing `?`),
/// lowercased; percent-encoded ones (`%40`) too.
fn addresses_in(text: &str, out: &mut BTreeSet<String>) {
    let bytes = text.as_bytes();
    for (at, _) in text.match_indices('@') {
        let mut start = at;
        while start > 0 && local_char(bytes[start - 1] as char) && bytes[start - 1].is_ascii() {
            start -= 1;
        }
        let mut end = at + 1;
        while end < bytes.len() && domain_char(bytes[end] as char) && bytes[end].is_ascii() {
            end += 1;
        }
        // Punctuation around the address is not part of it; a local part
        // after a symbol RFC 5322 allows there (`to='x@y.z`) is read both
        // ways, as a mailer would and as the eye does.
        let whole = text[start..at].trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
        let plain = whole.rsplit(|c: char| !(c.is_ascii_alphanumeric() || "._%+-".contains(c))).next().unwrap_or("");
        let domain = text[at + 1..end].trim_end_matches(['.', '-']);
        for local in [whole, plain.trim_start_matches('.')] {
            if let Some(a) = address(&format!("{local}@{domain}")) {
                out.insert(a);
            }
        }
    }
    if text.contains("%40") || text.contains("%40".to_ascii_uppercase().as_str()) {
        let decoded = percent_decode(text);
        if decoded != text {
            addresses_in(&decoded, out);
        }
    }
}

/// `text` with its `%XX` escapes decoded (invalid ones and non-UTF-8 left as they are).
fn percent_decode(text: &str) -> String {
    url::form_urlencoded::parse(format!("x={}", text.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_else(|| text.to_owned())
}

/// Top-level domains a web address written without a scheme is recognised
/// by (besides a `www.` prefix): enough for prose, not a list of all.
const COMMON_TLDS: &[&str] = &[
    "com", "org", "net", "io", "dev", "app", "ai", "co", "info", "biz", "edu", "gov", "me", "xyz", "site", "online",
    "link", "us", "uk", "de", "fr", "eu", "ch", "nl", "it", "es", "ru", "cn", "jp", "in", "ca", "au", "test",
];

/// Whether `host` is a host name written in prose as a web address.
fn bare_host(host: &str) -> bool {
    let labels: Vec<&str> = host.split('.').collect();
    let ok_labels = labels.len() >= 2
        && labels.iter().all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    let tld = labels.last().copied().unwrap_or_default().to_ascii_lowercase();
    ok_labels
        && tld.len() >= 2
        && tld.chars().all(|c| c.is_ascii_alphabetic())
        && (host.to_ascii_lowercase().starts_with("www.") || COMMON_TLDS.contains(&tld.as_str()))
}

fn web_url(s: &str) -> Option<String> {
    web_url_as(s.trim())
}

/// A web address written in prose: the punctuation that ends a sentence
/// or a quotation after it is not part of it.
fn web_url_in_prose(s: &str) -> Option<String> {
    web_url_as(s.trim().trim_end_matches(['.', ',', ';', ')', '"', '\'', '!', '?', ':']))
}

/// The normal form of the web address `s` (whole, as the HTTP client and
/// the browser read it: the WHATWG URL standard), if it is one.
fn web_url_as(s: &str) -> Option<String> {
    let lower = s.to_ascii_lowercase();
    // `https:/x`, `https:\\x` and `https:x` are all `https://x/` to the
    // standard's parser: a scheme is all it takes.
    let with_scheme = if lower.starts_with("http:") || lower.starts_with("https:") {
        s.to_owned()
    } else if bare_host(s.split(['/', '?', '#']).next().unwrap_or_default()) {
        // `www.example.com/x` in prose: the same address as `http://…`.
        format!("http://{s}")
    } else {
        return None;
    };
    let mut u = url::Url::parse(&with_scheme).ok()?;
    u.set_fragment(None);
    Some(u.to_string())
}

fn digits(s: &str) -> Option<String> {
    let allowed = s.trim().chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, ' ' | '-' | '/' | '.' | '+'));
    let d: String = s.chars().filter(char::is_ascii_digit).collect();
    let letters = s.chars().filter(char::is_ascii_alphabetic).count();
    (allowed && d.len() >= 6 && letters <= 4).then_some(d)
}

/// `text` as a reader of it sees it: when it is JSON whose strings hold
/// escapes (a multi-line text, quotes, `\u0040`), the text followed by each
/// string decoded on a line of its own; otherwise the text as it is (no
/// copy). The agent and choird trace through it alike.
pub fn with_json_strings(text: &str) -> std::borrow::Cow<'_, str> {
    if !(text.trim_start().starts_with(['{', '[']) && memchr::memchr(b'\\', text.as_bytes()).is_some()) {
        return std::borrow::Cow::Borrowed(text);
    }
    let Ok(v) = serde_json::from_str::<serde_json::Value>(text) else { return std::borrow::Cow::Borrowed(text) };
    let mut all = text.to_owned();
    push_strings(&v, &mut all);
    std::borrow::Cow::Owned(all)
}

/// Appends every string in `v`, at any depth, each on a line of its own.
pub fn push_strings(v: &serde_json::Value, out: &mut String) {
    match v {
        serde_json::Value::String(s) => {
            out.push('\n');
            out.push_str(s);
        }
        serde_json::Value::Array(items) => items.iter().for_each(|i| push_strings(i, out)),
        serde_json::Value::Object(map) => map.values().for_each(|i| push_strings(i, out)),
        _ => {}
    }
}

/// The kind of `value` and its normal form.
pub fn normalise(value: &str) -> (Kind, String) {
    if let Some(a) = address(value) {
        return (Kind::Address, a);
    }
    if let Some(u) = web_url(value) {
        return (Kind::Url, u);
    }
    if let Some(d) = digits(value) {
        return (Kind::Number, d);
    }
    (Kind::Text, value.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// The values of `kind` a text holds, normalised.
pub fn values_in(kind: Kind, text: &str) -> BTreeSet<String> {
    match kind {
        Kind::Address => {
            let mut out = BTreeSet::new();
            addresses_in(text, &mut out);
            // A whole quoted-local-part address, as written.
            if text.contains("\"@") {
                out.extend(text.split(|c: char| c.is_whitespace() || matches!(c, ',' | '<' | '>')).filter_map(address));
            }
            out
        }
        Kind::Url => {
            let mut out = BTreeSet::new();
            // Links with a scheme, wherever they start (inside an attribute,
            // after a label, in JSON), to the first character a URL cannot
            // hold unescaped (RFC 3986) or a closing bracket; `[…]` stays,
            // for an IPv6 host.
            let lower = text.to_ascii_lowercase();
            for (at, _) in lower.match_indices("http") {
                let rest = &lower[at..];
                if !(rest.starts_with("http:") || rest.starts_with("https:")) {
                    continue;
                }
                let len = text[at..]
                    .find(|c: char| c.is_whitespace() || "<>\"'`{}|\\^(),".contains(c))
                    .unwrap_or(text.len() - at);
                if let Some(u) = web_url_in_prose(&text[at..at + len]) {
                    out.insert(u);
                }
            }
            // Web addresses written without a scheme (`www.x.com/a`).
            out.extend(
                text.split(|c: char| {
                    c.is_whitespace()
                        || matches!(c, '<' | '>' | '"' | '\'' | '`' | '[' | ']' | '(' | ')' | '{' | '}' | ',')
                })
                .filter(|token| !token.contains("://"))
                .filter_map(web_url_in_prose),
            );
            out
        }
        Kind::Number => {
            // Runs of digits and the separators numbers are written with.
            let mut out = BTreeSet::new();
            let mut run = String::new();
            for c in text.chars().chain(std::iter::once('\n')) {
                if c.is_ascii_digit() || (matches!(c, ' ' | '-' | '/' | '.') && !run.is_empty()) {
                    run.push(c);
                } else {
                    if let Some(d) = digits(run.trim_end_matches([' ', '-', '/', '.'])) {
                        out.insert(d);
                    }
                    run.clear();
                }
            }
            out
        }
        Kind::Text => BTreeSet::new(),
    }
}

/// The domain of an address or the host of a URL, lowercased.
pub fn domain_of(value: &str) -> Option<String> {
    match normalise(value) {
        (Kind::Address, a) => a.rsplit_once('@').map(|(_, d)| d.to_owned()),
        (Kind::Url, u) => url::Url::parse(&u).ok().and_then(|u| u.host_str().map(str::to_ascii_lowercase)),
        _ => None,
    }
}

/// Shortest text (in characters, normalised) that is traced at all: a
/// shorter one (`13`, `Bob`) is found by accident in too many places to say
/// where it came from, and counts as made by the model.
pub const MIN_TRACEABLE_TEXT: usize = 4;

/// The addresses, web addresses and numbers written inside a text, each
/// with its kind (what a model-written message may carry from elsewhere).
pub fn entities_in(text: &str) -> Vec<(Kind, String)> {
    let mut out = Vec::new();
    for kind in [Kind::Address, Kind::Url, Kind::Number] {
        out.extend(values_in(kind, text).into_iter().map(|v| (kind, v)));
    }
    out
}

/// Whether `text` holds `value` (of `kind`, normalised as [`normalise`] does).
pub fn text_holds(kind: Kind, norm: &str, text: &str) -> bool {
    match kind {
        // A needle without spaces cannot span a whitespace run: the text is
        // searched as it is (no copy); otherwise with its runs collapsed,
        // once its first word is seen to be there at all.
        Kind::Text if !norm.contains(' ') => holds_words(text, norm),
        Kind::Text => {
            let first = norm.split(' ').next().unwrap_or_default();
            text.contains(first) && holds_words(&text.split_whitespace().collect::<Vec<_>>().join(" "), norm)
        }
        Kind::Address => holds_address(norm, text),
        // A URL is written in many forms; only a text naming its host can
        // hold it — when the host is a plain name, written as it is kept (an
        // IP literal or an international name is written many ways).
        Kind::Url => {
            let host = url::Url::parse(norm).ok().and_then(|u| u.domain().map(str::to_owned)).unwrap_or_default();
            let plain = host.rsplit('.').next().is_some_and(|tld| tld.chars().any(|c| c.is_ascii_alphabetic()))
                && !host.contains("xn--");
            (!plain || find_ci(text, &host).next().is_some()) && values_in(Kind::Url, text).contains(norm)
        }
        Kind::Number => values_in(Kind::Number, text).contains(norm),
    }
}

/// Where `needle` (ASCII, any case) starts in `hay`, ignoring ASCII case.
fn find_ci<'a>(hay: &'a str, needle: &'a str) -> impl Iterator<Item = usize> + 'a {
    let (h, n) = (hay.as_bytes(), needle.as_bytes());
    let first = n.first().map(u8::to_ascii_lowercase);
    (0..h.len().saturating_sub(n.len().saturating_sub(1))).filter(move |&i| {
        first.is_some_and(|f| h[i].to_ascii_lowercase() == f) && h[i..i + n.len()].eq_ignore_ascii_case(n)
    })
}

/// Whether `text` holds the plain address `norm` (lowercased) as
/// [`values_in`] finds it, without collecting every address it holds: each
/// place the address is written, any case, standing on its own (no local
/// part character before it, no domain going on after it).
fn holds_address(norm: &str, text: &str) -> bool {
    if norm.starts_with('"') {
        return values_in(Kind::Address, text).contains(norm);
    }
    let Some((local, _)) = norm.split_once('@') else { return false };
    let (bytes, want) = (text.as_bytes(), norm.as_bytes());
    let last_of_local = local.as_bytes().last().copied();
    // Each `@` in the text (found at memory speed), a one-byte look at the
    // local part's end, then the address around it.
    let written = memchr::memchr_iter(b'@', bytes).any(|sign| {
        if sign == 0 || Some(bytes[sign - 1].to_ascii_lowercase()) != last_of_local {
            return false;
        }
        let Some(at) = sign.checked_sub(local.len()) else { return false };
        if bytes.len() < at + want.len() || !bytes[at..at + want.len()].eq_ignore_ascii_case(want) {
            return false;
        }
        let before = text.get(..at).and_then(|b| b.chars().next_back());
        let Some(after) = text.get(at + want.len()..) else { return false };
        let alone_before = before.is_none_or(|c| !(c.is_ascii_alphanumeric() || "._%+-".contains(c)));
        let rest = after.trim_start_matches(['.', '-']);
        let alone_after = rest.chars().next().is_none_or(|c| !c.is_ascii_alphanumeric());
        alone_before && alone_after
    });
    // Percent-encoded (`%40`): read as the full parse reads it.
    written || (memchr::memmem::find(bytes, b"%40").is_some() && values_in(Kind::Address, text).contains(norm))
}

/// Whether `needle` occurs in `hay` on word boundaries (`13` is not in `2013`).
fn holds_words(hay: &str, needle: &str) -> bool {
    if needle.is_empty() {
        return false;
    }
    let word = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
    let edge_in = |s: &str| word(s.chars().next());
    let edge_out = |s: &str| word(s.chars().next_back());
    let (starts_word, ends_word) = (edge_in(needle), edge_out(needle));
    // A needle found in UTF-8 starts and ends on character boundaries.
    memchr::memmem::find_iter(hay.as_bytes(), needle.as_bytes()).any(|i| {
        let before = hay[..i].chars().next_back();
        let after = hay[i + needle.len()..].chars().next();
        let glued = (starts_word && word(before)) || (ends_word && word(after));
        !glued
    })
}

/// Shortest secret-like token, and shortest text, that a private text can
/// label: a shorter one (`hello`, `2024`) is found by accident in too many
/// private files to mean anything.
pub const MIN_PRIVATE: usize = 8;

/// Words of a run of private text that label a text holding it.
const PRIVATE_RUN: usize = 8;

/// Runs of a value are looked for from every this many words.
const PRIVATE_STEP: usize = 4;

/// Whether `token` looks like a secret or an identifier (an API key, a
/// password, a reference): at least [`MIN_PRIVATE`] characters holding
/// both letters and digits.
fn secret_like(token: &str) -> bool {
    token.chars().count() >= MIN_PRIVATE
        && token.chars().any(|c| c.is_ascii_digit())
        && token.chars().any(|c| c.is_alphabetic())
}

/// The part of `value` that came from one of the private texts `privates`
/// (the index of the first that holds one, and the part), if any — each
/// needle prepared once for all of them:
/// a secret-like token written in both (on word boundaries, as written: an
/// API key in a URL's query, a password in a message), or a run of
/// [`PRIVATE_RUN`] words of the value found there (runs are looked for from
/// every [`PRIVATE_STEP`]th word, so any shared run of 11 words is found: a
/// paragraph of a private note in a mail or a post).
/// **Limits:** a secret of letters only is found only inside such a run;
/// a private text retyped with any change is not found (the safe direction
/// is the human's: the label is what asks).
pub fn private_part(value: &str, privates: &[&str]) -> Option<(usize, String)> {
    if privates.is_empty() {
        return None;
    }
    let separators = |c: char| c.is_whitespace() || "\"'`()[]{}<>,;?&=#/|".contains(c);
    for token in value.split(separators) {
        let token = token.trim_matches(|c: char| ".:!*".contains(c));
        if secret_like(token) {
            if let Some(i) = privates.iter().position(|p| holds_words(p, token)) {
                return Some((i, token.to_owned()));
            }
        }
    }
    let words: Vec<&str> = value.split_whitespace().collect();
    if words.len() < PRIVATE_RUN {
        return None;
    }
    let last = words.len() - PRIVATE_RUN;
    let starts = (0..=last).step_by(PRIVATE_STEP).chain((!last.is_multiple_of(PRIVATE_STEP)).then_some(last));
    for run in starts.map(|at| &words[at..at + PRIVATE_RUN]) {
        // The run's longest word: the fewest false starts and the fastest scan.
        let Some((k, anchor)) = run.iter().enumerate().max_by_key(|(_, w)| w.len()) else { continue };
        let finder = memchr::memmem::Finder::new(anchor.as_bytes());
        for (i, hay) in privates.iter().enumerate() {
            if finder.find_iter(hay.as_bytes()).any(|at| run_around(hay, run, k, at)) {
                return Some((i, run.join(" ")));
            }
        }
    }
    None
}

/// Whether `hay` holds the words of `run` one after another, separated by
/// any whitespace, on word boundaries, with its `k`th word at byte `i`
/// (read in place: no copy of `hay`).
fn run_around(hay: &str, run: &[&str], k: usize, i: usize) -> bool {
    let word = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
    let mut end = i + run[k].len();
    for w in &run[k + 1..] {
        let gap = hay[end..].len() - hay[end..].trim_start().len();
        if gap == 0 || !hay[end + gap..].starts_with(w) {
            return false;
        }
        end += gap + w.len();
    }
    let mut start = i;
    for w in run[..k].iter().rev() {
        let gap = hay[..start].len() - hay[..start].trim_end().len();
        if gap == 0 || !hay[..start - gap].ends_with(w) {
            return false;
        }
        start -= gap + w.len();
    }
    let first = run.first().and_then(|w| w.chars().next());
    let last = run.last().and_then(|w| w.chars().next_back());
    let glued_before = word(first) && word(hay[..start].chars().next_back());
    let glued_after = word(last) && word(hay[end..].chars().next());
    !(glued_before || glued_after)
}

/// One place a traced value was seen: the index of the text among those
/// given to [`trace`], its source, how the value is shown there, and whether
/// it was an address, web address or number written inside the value
/// rather than the value itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// Which text (its index).
    pub index: usize,
    /// The source that text speaks for.
    pub source: Source,
    /// The value as looked for there.
    pub shown: String,
    /// Whether it is an entity written inside the value.
    pub entity: bool,
}

/// Where `value` could have come from among `texts` (each with the source it
/// speaks for), and where it was seen, in the order of `texts`. **The rule**
/// (the agent's arbiter and choird judge by it alike): `texts` are in the
/// lane's order, the model's own words among them as [`Source::Model`]; a
/// value is found in a text as [`text_holds`] says; a value keeps the weakest
/// origin it ever had (a trusted text or a note that holds it *after* the
/// model or untrusted content said it is an echo, no voucher; the model's
/// words are never a source themselves); a text value shorter than
/// [`MIN_TRACEABLE_TEXT`] is found nowhere; a text also carries the sources
/// of the addresses, web addresses and numbers written in it that nothing
/// vouches for (seen only in untrusted content, or nowhere), so a message the
/// model wrote around a link from a web page is not the model's alone; found
/// nowhere, a value is the model's (`{Model}`).
pub fn trace(value: &str, texts: &[(Source, &str)]) -> Found {
    let sightings = |kind: Kind, norm: &str, shown: &str, entity: bool| {
        let mut sources = BTreeSet::new();
        let mut seen = Vec::new();
        let too_short = kind == Kind::Text && norm.chars().count() < MIN_TRACEABLE_TEXT;
        if norm.is_empty() || too_short {
            return (sources, seen);
        }
        // In the lane's order: once the model or untrusted content has said
        // the value, a later trusted place or note of Choir's that holds it
        // is an echo (an error, a refusal, a rejection quoting it) and
        // vouches for nothing. The user's own word always counts.
        let mut echoed = false;
        // A text given twice in a row (an untrusted result that is also
        // private) is searched once.
        let mut last: Option<(*const u8, usize, bool)> = None;
        for (index, (source, text)) in texts.iter().enumerate() {
            let holds = match last {
                Some((ptr, len, holds)) if ptr == text.as_ptr() && len == text.len() => holds,
                _ => !text.is_empty() && text_holds(kind, norm, text),
            };
            last = Some((text.as_ptr(), text.len(), holds));
            if !holds {
                continue;
            }
            match source {
                Source::Model => {
                    echoed = true;
                    continue;
                }
                // A short text in a private file says nothing of where it came from.
                Source::Private if kind == Kind::Text && norm.chars().count() < MIN_PRIVATE => continue,
                Source::Untrusted => echoed = true,
                Source::Trusted | Source::Operator if echoed => continue,
                _ => {}
            }
            sources.insert(*source);
            seen.push(Seen { index, source: *source, shown: shown.to_owned(), entity });
        }
        (sources, seen)
    };
    let (kind, norm) = normalise(value);
    let (mut sources, mut seen) = sightings(kind, &norm, value, false);
    let mut carried = BTreeSet::new();
    if kind == Kind::Text {
        for (k, entity) in entities_in(value) {
            let shown = match k {
                Kind::Url => entity.trim_start_matches("http://").trim_end_matches('/').to_owned(),
                _ => entity.clone(),
            };
            let (s, places) = sightings(k, &entity, &shown, true);
            let vouched = s.iter().any(|s| matches!(s, Source::User | Source::Operator | Source::Trusted));
            if !vouched {
                sources.extend(&s);
                carried.extend(&s);
                seen.extend(places);
                if s.is_empty() {
                    sources.insert(Source::Model);
                    carried.insert(Source::Model);
                }
            } else if s.contains(&Source::Private) {
                // Vouched for, but private: the label goes with the text.
                sources.insert(Source::Private);
                seen.extend(places.into_iter().filter(|p| p.source == Source::Private));
            }
        }
    }
    // A text or a link carrying a part of a private text carries its label.
    if matches!(kind, Kind::Text | Kind::Url) && !sources.contains(&Source::Private) {
        let (at, privates): (Vec<usize>, Vec<&str>) =
            texts.iter().enumerate().filter(|(_, (s, _))| *s == Source::Private).map(|(i, (_, t))| (i, *t)).unzip();
        if let Some((i, shown)) = private_part(value, &privates) {
            let index = at[i];
            sources.insert(Source::Private);
            seen.push(Seen { index, source: Source::Private, shown, entity: true });
        }
    }
    // A label is no origin: seen only as private, the value is the model's.
    if sources.iter().all(|s| *s == Source::Private) {
        sources.insert(Source::Model);
    }
    Found { sources, carried, seen }
}

/// What [`trace`] found of a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Where it could have come from (`{Model}` when nowhere).
    pub sources: BTreeSet<Source>,
    /// For a text: the sources of the addresses, links and numbers written
    /// in it that nothing vouches for (empty: none, or not a text).
    pub carried: BTreeSet<Source>,
    /// Where it was seen.
    pub seen: Vec<Seen>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_carrying_part_of_a_private_text_is_labelled() {
        let private = "# deploy.env\nDEPLOY_KEY=sk-live-4f9a8b2c77d1\nThe merger with Acme closes on the first of March, at forty dollars.";
        // Looked for among a public text and the private one: found in the second.
        let part = |v: &str| {
            private_part(v, &["nothing here", private]).map(|(i, p)| {
                assert_eq!(i, 1);
                p
            })
        };
        // A secret-like token, wherever it is written (a URL's query, a message).
        assert_eq!(part("https://evil.test/c?k=sk-live-4f9a8b2c77d1&x=1").as_deref(), Some("sk-live-4f9a8b2c77d1"));
        assert_eq!(part("key: 'sk-live-4f9a8b2c77d1'.").as_deref(), Some("sk-live-4f9a8b2c77d1"));
        // A run of eight words, whitespace as it may be.
        let run = "FYI:  The merger with Acme closes on\nthe first of March, at forty dollars. Cheers";
        assert!(part(run).is_some());
        // Not: a part of a token, a short or letters-only word, fewer words.
        assert_eq!(part("sk-live-4f9a8b2c77d1x"), None);
        assert_eq!(part("deploy merger Acme March"), None);
        assert_eq!(part("The merger with Acme closes soon"), None);
        // Traced: the label joins the sources, shown where it was seen.
        let texts = [(Source::User, "search the web for me"), (Source::Private, private)];
        let found = trace("who leaked sk-live-4f9a8b2c77d1?", &texts);
        assert!(found.sources.contains(&Source::Private), "{found:?}");
        assert_eq!(
            found.seen.iter().map(|s| (s.index, s.shown.as_str())).collect::<Vec<_>>(),
            [(1, "sk-live-4f9a8b2c77d1")]
        );
        assert!(!trace("who leaked the weather report?", &texts).sources.contains(&Source::Private));
    }

    #[test]
    fn values_are_normalised_by_kind() {
        assert_eq!(normalise(" Alice <Alice@Corp.TEST> "), (Kind::Address, "alice@corp.test".into()));
        assert_eq!(
            normalise("HTTPS://Hooks.Example.com:443/notes#x"),
            (Kind::Url, "https://hooks.example.com/notes".into())
        );
        assert_eq!(normalise("DE89 3704 0044 0532 0130 00"), (Kind::Number, "89370400440532013000".into()));
        assert_eq!(normalise("  the   launch "), (Kind::Text, "the launch".into()));
        assert_eq!(domain_of("x@Evil.Test"), Some("evil.test".into()));
        assert_eq!(domain_of("https://Evil.test:8443/a"), Some("evil.test".into()));
        assert_eq!(domain_of("hello"), None);
        assert_eq!(normalise("www.Secure-Systems-252.com"), (Kind::Url, "http://www.secure-systems-252.com/".into()));
        assert_eq!(normalise("my-site.org/page"), (Kind::Url, "http://my-site.org/page".into()));
        assert_eq!(normalise("report.pdf").0, Kind::Text, "a file name is not a web address");
        assert_eq!(normalise("e.g.").0, Kind::Text);
    }

    #[test]
    fn an_address_is_never_found_as_part_of_another() {
        let text = "mail evilbob@corp.test.evil or bob@corp.test.";
        assert!(text_holds(Kind::Address, "bob@corp.test", text));
        assert!(!text_holds(Kind::Address, "ob@corp.test", text));
        assert!(!text_holds(Kind::Address, "bob@corp.tes", text));
    }

    #[test]
    fn regression_an_address_inside_structured_text_was_not_found_where_it_appears() {
        let a = "attacker@evil.test";
        let shapes = [
            r#"{"to": "attacker@evil.test"}"#,
            r#"{"rows": [{"contact": {"mail": "attacker@evil.test"}}]}"#,
            "Mail attacker@evil.test?",
            "reply to 'attacker@evil.test'.'}]}",
            "['bob', 'attacker@evil.test']",
            "to: attacker@evil.test\ncc:\n  - ops@corp.test",
            r#"<a href="mailto:attacker@evil.test">write</a>"#,
            "send=attacker%40evil.test&x=1",
            "(attacker@evil.test)",
            "<ATTACKER@Evil.Test>",
            "to='attacker@evil.test",
        ];
        for text in shapes {
            assert!(values_in(Kind::Address, text).contains(a), "{text:?}: {:?}", values_in(Kind::Address, text));
        }
        // The negative control: a longer address is not this one.
        for text in ["evilattacker@evil.test.org", "attacker@evil.testing", "attacker@evil"] {
            assert!(!values_in(Kind::Address, text).contains(a), "{text:?}");
        }
    }

    #[test]
    fn regression_a_quoted_local_part_was_read_as_the_address_inside_it() {
        // A mailer sends this to evil.test; the old reading (the last
        // `<…>`) traced it to the user's own address.
        let value = r#""\"<me@corp.test>\""@evil.test"#;
        let (kind, norm) = normalise(value);
        assert_eq!(kind, Kind::Address);
        assert!(norm.ends_with("@evil.test") && norm != "me@corp.test", "{norm}");
        let texts = [(Source::User, "my address is me@corp.test")];
        assert_eq!(trace(value, &texts).sources, BTreeSet::from([Source::Model]));
        // The display form still reads the address in the brackets.
        assert_eq!(normalise("\"Me\" <me@corp.test>").1, "me@corp.test");
        assert_eq!(trace("Me <me@corp.test>", &texts).sources, BTreeSet::from([Source::User]));
    }

    #[test]
    fn a_url_inside_structured_text_is_found_where_it_appears() {
        let u = "https://evil.test/drop?k=1";
        for text in [
            r#"{"next": "https://evil.test/drop?k=1"}"#,
            "see 'https://evil.test/drop?k=1'",
            r#"<a href=https://evil.test/drop?k=1>x</a>"#,
            "(https://evil.test/drop?k=1).",
            "link: `https://evil.test/drop?k=1`",
        ] {
            assert!(values_in(Kind::Url, text).contains(u), "{text:?}: {:?}", values_in(Kind::Url, text));
        }
        assert!(!values_in(Kind::Url, "https://evil.test/drop?k=12").contains(u));
        let v6 = normalise("http://[::1]:40083/second").1;
        assert!(values_in(Kind::Url, r#"{"url": "http://[::1]:40083/second"}"#).contains(&v6), "{v6}");
        // Hosts written otherwise than they are kept are still found.
        for written in ["http://[::ffff:127.0.0.2]:36791/second", "http://bücher.test/a", "http://0x7f.1/x"] {
            let (_, norm) = normalise(written);
            assert!(text_holds(Kind::Url, &norm, &format!("open {written} now")), "{written} → {norm}");
        }
    }

    #[test]
    fn text_is_found_on_word_boundaries_only() {
        assert!(text_holds(Kind::Text, "file 13", "please delete file 13."));
        assert!(!text_holds(Kind::Text, "13", "in 2013 we met"));
        assert!(!text_holds(Kind::Text, "pass", "a password"));
        assert!(text_holds(Kind::Text, "the launch", "about the   launch, today"));
    }
}
