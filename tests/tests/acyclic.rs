//! No module-level import cycles: for each crate listed, the graph of its
//! modules (one node per source file), with an edge wherever a file names
//! another module of its crate (`crate::a::b`, `super::x`, `self::x`, or a
//! child module by its bare name, groups like `crate::{a, b::{c, d}}`
//! expanded), has no cycle. Comments, string literals and `#[cfg(test)]`
//! items are not part of the structure and are left out.
//!
//! A cycle means two modules can only be understood (and changed) together;
//! the cure is to move what both need into a smaller module below them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A crate's module graph: module path (`""` for the root, `tools::lane`) →
/// the modules of the same crate it refers to.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// The crates whose module graphs must be acyclic, by `src` directory
/// (relative to the workspace root). choird and choirctl join by adding
/// `"choird/src"` and `"choirctl/src"` here once they have no cycles.
const ACYCLIC: &[&str] = &["common/src", "choir-agent/src", "choird/src", "choirctl/src"];

#[test]
fn the_crates_have_no_module_cycles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut failures = Vec::new();
    for src in ACYCLIC {
        let graph = module_graph(&root.join(src));
        assert!(graph.len() > 3, "{src}: found only {} modules", graph.len());
        // The crate root (lib.rs, main.rs) is shown as `crate`.
        let name = |m: &String| if m.is_empty() { "crate".to_owned() } else { m.clone() };
        for (cycle, component) in cycles(&graph) {
            let path: Vec<String> = cycle.iter().map(name).collect();
            let all: Vec<String> = component.iter().map(name).collect();
            failures.push(format!("{src}: {} (the cycles run through: {})", path.join(" → "), all.join(", ")));
        }
    }
    assert!(failures.is_empty(), "module import cycles:\n{}", failures.join("\n"));
}

#[test]
fn the_checker_finds_cycles_through_every_kind_of_path() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    let write = |rel: &str, text: &str| {
        let path = src.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write("lib.rs", "//! root\npub mod a;\npub mod b;\npub mod tools;\n");
    // a → b through a group; b → a only in a comment, a string and a test.
    write("a.rs", "//! a\nuse crate::{b::{One, Two}, tools};\n");
    write(
        "b.rs",
        "//! b\n// crate::a::X\nconst S: &str = \"crate::a::X\";\n#[cfg(test)]\nmod tests {\n    use crate::a::X;\n}\n",
    );
    // tools (the parent) names its child by its bare name; the child
    // reaches back with super::, and names a sibling with super::.
    write("tools/mod.rs", "//! tools\npub mod lane;\npub mod fs;\npub fn f() { lane::g() }\n");
    write("tools/lane.rs", "//! lane\nuse super::fs::h;\nuse super::Thing;\n");
    write("tools/fs.rs", "//! fs\nuse std::fs::read;\n");
    let graph = module_graph(src);
    assert_eq!(graph["a"], BTreeSet::from(["b".to_owned(), "tools".to_owned()]));
    assert_eq!(graph["b"], BTreeSet::new(), "comments, strings and tests are not edges");
    assert_eq!(graph["tools"], BTreeSet::from(["tools::lane".to_owned()]));
    assert_eq!(graph["tools::lane"], BTreeSet::from(["tools".to_owned(), "tools::fs".to_owned()]));
    assert_eq!(graph["tools::fs"], BTreeSet::new(), "std::fs is not the sibling fs");
    assert_eq!(paths_of(cycles(&graph)), vec![vec!["tools".to_owned(), "tools::lane".to_owned(), "tools".to_owned()]]);
    // Breaking it: the child needs nothing of its parent any more.
    write("tools/lane.rs", "//! lane\nuse super::fs::h;\n");
    assert!(cycles(&module_graph(src)).is_empty());
    // A longer cycle through crate:: paths is named in order.
    write("b.rs", "//! b\nuse crate::tools::lane::X;\n");
    write("tools/lane.rs", "//! lane\npub fn g() { crate::a::f() }\n");
    assert_eq!(
        paths_of(cycles(&module_graph(src))),
        vec![vec!["a".to_owned(), "b".to_owned(), "tools::lane".to_owned(), "a".to_owned()]]
    );
}

fn paths_of(found: Vec<(Vec<String>, BTreeSet<String>)>) -> Vec<Vec<String>> {
    found.into_iter().map(|(path, _)| path).collect()
}

/// Builds the module graph of the crate whose sources are under `src`.
fn module_graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    collect_rs(src, src, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut graph = Graph::new();
    for (module, text) in &files {
        let code = strip_tests(&strip_comments_and_strings(text));
        let children: BTreeSet<&str> = modules
            .iter()
            .filter_map(|m| {
                let rest = if module.is_empty() { Some(m.as_str()) } else { m.strip_prefix(&format!("{module}::")) };
                rest.filter(|r| !r.is_empty() && !r.contains("::"))
            })
            .collect();
        let here: Vec<&str> = if module.is_empty() { Vec::new() } else { module.split("::").collect() };
        let edges = graph.entry(module.clone()).or_default();
        for path in paths(&code) {
            let Some(absolute) = resolve(&path, &here, &children) else { continue };
            // The longest prefix that is a module of this crate.
            let target = (0..=absolute.len())
                .rev()
                .map(|n| absolute[..n].join("::"))
                .find(|m| modules.contains(m))
                .unwrap_or_default();
            if target != *module {
                edges.insert(target);
            }
        }
    }
    graph
}

/// (module path, text) of every `.rs` file under `dir`.
fn collect_rs(src: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect_rs(src, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            if parts.last().is_some_and(|l| l == "mod" || (parts.len() == 1 && (l == "lib" || l == "main"))) {
                parts.pop();
            }
            out.push((parts.join("::"), std::fs::read_to_string(&path).unwrap()));
        }
    }
}

/// Resolves a path's segments to an absolute module path of the crate, or
/// `None` when it starts outside the crate (std, other crates, local names).
fn resolve(path: &[String], here: &[&str], children: &BTreeSet<&str>) -> Option<Vec<String>> {
    let mut base: Vec<String> = here.iter().map(|s| (*s).to_owned()).collect();
    let mut rest = path;
    match path.first()?.as_str() {
        "crate" => {
            base.clear();
            rest = &path[1..];
        }
        "self" => rest = &path[1..],
        "super" => {
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        first if children.contains(first) && path.len() > 1 => {}
        _ => return None,
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// Every path with at least one `::` in `code`, groups expanded.
fn paths(code: &str) -> Vec<Vec<String>> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts = is_ident_start(chars[i])
            && (i == 0 || !(is_ident(chars[i - 1]) || (i >= 2 && chars[i - 1] == ':' && chars[i - 2] == ':')));
        if starts {
            let (found, end) = path_at(&chars, i);
            out.extend(found.into_iter().filter(|p| p.len() > 1));
            i = end.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// Parses `a::b::{c, d::e}` at `i`: the expanded paths and where it ends.
fn path_at(chars: &[char], mut i: usize) -> (Vec<Vec<String>>, usize) {
    let mut prefix = Vec::new();
    loop {
        let start = i;
        while i < chars.len() && is_ident(chars[i]) {
            i += 1;
        }
        prefix.push(chars[start..i].iter().collect::<String>());
        let mut j = i;
        while j < chars.len() && chars[j].is_whitespace() {
            j += 1;
        }
        if !(j + 1 < chars.len() && chars[j] == ':' && chars[j + 1] == ':') {
            return (vec![prefix], i);
        }
        j += 2;
        while j < chars.len() && chars[j].is_whitespace() {
            j += 1;
        }
        if j < chars.len() && chars[j] == '{' {
            let mut all = Vec::new();
            let mut k = j + 1;
            loop {
                while k < chars.len() && (chars[k].is_whitespace() || chars[k] == ',') {
                    k += 1;
                }
                if k >= chars.len() || chars[k] == '}' {
                    break;
                }
                if is_ident_start(chars[k]) {
                    let (inner, end) = path_at(chars, k);
                    for p in inner {
                        all.push(prefix.iter().cloned().chain(p).collect());
                    }
                    k = end;
                    // Skip `as alias` and anything else up to the next item.
                    while k < chars.len() && chars[k] != ',' && chars[k] != '}' {
                        k += 1;
                    }
                } else {
                    k += 1; // `*`
                }
            }
            return (all, k + 1);
        }
        if j < chars.len() && is_ident_start(chars[j]) {
            i = j;
            continue;
        }
        return (vec![prefix], j); // `a::*`, `a::<T>`
    }
}

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Blanks out comments (doc comments too), string and char literals.
fn strip_comments_and_strings(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        let at = |k: usize| c.get(k).copied().unwrap_or('\0');
        if c[i] == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if (c[i] == 'r' || (c[i] == 'b' && at(i + 1) == 'r'))
            && (i == 0 || !is_ident(c[i - 1]))
            && matches!(at(i + 1 + usize::from(c[i] == 'b')), '"' | '#')
        {
            // Raw string: r"…", r#"…"#, br#"…"#.
            let mut k = i + 1 + usize::from(c[i] == 'b');
            let mut hashes = 0;
            while at(k) == '#' {
                hashes += 1;
                k += 1;
            }
            if at(k) != '"' {
                out.push(c[i]);
                i += 1;
                continue;
            }
            k += 1;
            while k < c.len() && !(c[k] == '"' && (1..=hashes).all(|h| at(k + h) == '#')) {
                k += 1;
            }
            i = k + 1 + hashes;
            out.push_str("\"\"");
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c[i] == '\'' && (at(i + 1) == '\\' || at(i + 2) == '\'') {
            // A char literal ('x', '\n', '\u{1b}'); a lifetime ('a) is kept.
            i += 1;
            while i < c.len() && c[i] != '\'' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// Removes every item under `#[cfg(test)]` (the attribute, then up to the
/// item's `;` or its balanced `{…}`).
fn strip_tests(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        let (mut depth, mut end) = (0usize, after.len());
        for (k, ch) in after.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = k + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = k + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// One shortest cycle through each strongly connected component of more
/// than one module (starting at its first module, in path order), with the
/// component.
fn cycles(graph: &Graph) -> Vec<(Vec<String>, BTreeSet<String>)> {
    let mut found = Vec::new();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for start in graph.keys() {
        if seen.contains(start) {
            continue;
        }
        // Modules on a path start → … → start form start's component.
        let reach = |from: &str, rev: bool| -> BTreeSet<String> {
            let mut r = BTreeSet::new();
            let mut stack = vec![from.to_owned()];
            while let Some(m) = stack.pop() {
                let next: Vec<String> = if rev {
                    graph.iter().filter(|(_, t)| t.contains(&m)).map(|(k, _)| k.clone()).collect()
                } else {
                    graph.get(&m).map(|t| t.iter().cloned().collect()).unwrap_or_default()
                };
                for n in next {
                    if r.insert(n.clone()) {
                        stack.push(n);
                    }
                }
            }
            r
        };
        let component: BTreeSet<String> = reach(start, false).intersection(&reach(start, true)).cloned().collect();
        if component.is_empty() {
            continue;
        }
        seen.extend(component.iter().cloned());
        // Shortest way back to start inside the component (breadth first).
        let mut prev: BTreeMap<String, String> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start.clone()]);
        'search: while let Some(m) = queue.pop_front() {
            for n in graph.get(&m).into_iter().flatten().filter(|n| component.contains(*n)) {
                if n == start {
                    // Walk back from m to start, then read it forwards.
                    let mut cycle = vec![m.clone()];
                    while cycle.last() != Some(start) {
                        let back = prev[cycle.last().unwrap()].clone();
                        cycle.push(back);
                    }
                    cycle.reverse();
                    cycle.push(start.clone());
                    found.push((cycle, component.clone()));
                    break 'search;
                }
                if !prev.contains_key(n) && n != start {
                    prev.insert(n.clone(), m.clone());
                    queue.push_back(n.clone());
                }
            }
        }
    }
    found
}
