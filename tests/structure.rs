//! The code's structure, kept true by tests (docs/ARCHITECTURE.md): no import circle between the
//! top-level modules of a library crate (test modules aside), and no function longer than 80 lines in the
//! libraries' non-test code (the request, heartbeat and read paths live there).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The library crates whose module graph and function lengths are checked.
const CRATES: &[&str] = &[
    "protocol",
    "redis",
    "api-client",
    "coordinator",
    "client",
    "macros",
];

/// The longest function allowed in library code, in lines (signature to closing brace).
const MAX_FN_LINES: usize = 80;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// Every `.rs` file under `dir`, recursively, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The top-level module a source file belongs to (`None` for the crate root and binaries).
fn top_module(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    match first {
        "lib.rs" | "main.rs" | "bin" => None,
        f => Some(f.trim_end_matches(".rs").to_owned()),
    }
}

/// The source without `//` comments (line and doc comments) and string literals' contents.
fn code_only(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first path segments named after `crate::` in `code` (`crate::a::b` → `a`;
/// `crate::{a, b::c}` → `a`, `b`).
fn crate_refs(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut refs = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // One level of braces: `a, b::{c, d}, e` → a, b, e.
            let mut depth = 0;
            let mut item_start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && !c.is_whitespace() => {
                        refs.insert(ident(&group[j..]));
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            refs.insert(ident(rest));
        }
    }
    refs
}

/// Edges between the top-level modules of the crate in `dir`.
fn module_graph(dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let src = dir.join("src");
    let files = rust_files(&src);
    let modules: BTreeSet<String> = files.iter().filter_map(|f| top_module(&src, f)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let Some(from) = top_module(&src, f) else {
            continue;
        };
        let text = fs::read_to_string(f).expect("readable source");
        // Test modules (the last item of a file, by rustfmt's layout) may use anything.
        let text = text.split("\n#[cfg(test)]").next().unwrap_or_default();
        let code = code_only(text);
        let edges = graph.entry(from.clone()).or_default();
        for to in crate_refs(&code) {
            if to != from && modules.contains(&to) {
                edges.insert(to);
            }
        }
    }
    graph
}

/// The strongly connected components of more than one module (Tarjan).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Tarjan<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        out: Vec<Vec<String>>,
    }
    impl<'g> Tarjan<'g> {
        fn visit(&mut self, v: &'g str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut scc = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    scc.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if scc.len() > 1 {
                    scc.sort();
                    self.out.push(scc);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.out
}

#[test]
fn no_import_circle_between_top_level_modules() {
    let mut found = Vec::new();
    for krate in CRATES {
        let dir = root().join(krate);
        if !dir.join("src").is_dir() {
            continue;
        }
        for scc in cycles(&module_graph(&dir)) {
            found.push(format!("{krate}: {}", scc.join(" <-> ")));
        }
    }
    assert!(found.is_empty(), "import circles: {found:#?}");
}

#[test]
fn the_cycle_finder_finds_a_circle() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("api", &["auth", "engine"][..]),
        ("auth", &["api"][..]),
        ("engine", &[][..]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.iter().map(|s| s.to_string()).collect()))
    .collect();
    assert_eq!(
        cycles(&graph),
        vec![vec!["api".to_owned(), "auth".to_owned()]]
    );
    assert_eq!(
        crate_refs("use crate::{api::ApiError, auth::{a, b}, engine};\nlet x = crate::wake::X;"),
        ["api", "auth", "engine", "wake"]
            .into_iter()
            .map(str::to_owned)
            .collect()
    );
}

/// `(lines, file:line, name)` of every function in `text` longer than [`MAX_FN_LINES`]
/// outside `#[cfg(test)]` modules (a function ends at the first line that closes it at the
/// indentation of its signature; `rustfmt` layout assumed).
fn long_functions(file: &Path, text: &str) -> Vec<(usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let test_module_start = lines
        .iter()
        .position(|l| l.trim_start() == "#[cfg(test)]")
        .unwrap_or(lines.len());
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate().take(test_module_start) {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        let signature = trimmed
            .trim_start_matches("pub ")
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub(super) ")
            .trim_start_matches("const ")
            .trim_start_matches("async ");
        let Some(rest) = signature.strip_prefix("fn ") else {
            continue;
        };
        let closing = format!("{indent}}}");
        let Some(len) = lines[i..].iter().position(|l| *l == closing) else {
            continue;
        };
        if lines[i..=i + len]
            .iter()
            .any(|l| l.ends_with(';') && *l == lines[i])
        {
            continue; // a declaration without a body
        }
        if len + 1 > MAX_FN_LINES {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            out.push((len + 1, format!("{}:{} {name}", file.display(), i + 1)));
        }
    }
    out
}

#[test]
fn no_library_function_over_80_lines() {
    let mut found = Vec::new();
    for krate in CRATES {
        let src = root().join(krate).join("src");
        for f in rust_files(&src) {
            // Binaries (the CLI's entry point aside) are not on the request or read paths.
            if f.components().any(|c| c.as_os_str() == "bin") || f.ends_with("tests.rs") {
                continue;
            }
            let text = fs::read_to_string(&f).expect("readable source");
            found.extend(long_functions(&f, &text));
        }
    }
    found.sort();
    assert!(
        found.is_empty(),
        "functions over {MAX_FN_LINES} lines: {found:#?}"
    );
}

#[test]
fn the_length_check_finds_a_long_function() {
    let body = "    let x = 1;\n".repeat(MAX_FN_LINES - 1);
    let text = format!("pub async fn long() {{\n{body}}}\n\nfn short() {{\n}}\n");
    let found = long_functions(Path::new("x.rs"), &text);
    assert_eq!(found, vec![(MAX_FN_LINES + 1, "x.rs:1 long".to_owned())]);
    let tests_only = format!("#[cfg(test)]\nmod tests {{\n    fn long() {{\n{body}    }}\n}}\n");
    assert!(long_functions(Path::new("x.rs"), &tests_only).is_empty());
}
