//! The code's structure, kept true by tests (docs/ARCHITECTURE.md): no import circle between
//! sibling modules of a library crate — the top-level modules, and the submodules of each
//! folder (test modules aside) — and no function longer than 80 lines in the libraries'
//! non-test code (the request, heartbeat and read paths live there); ARCHITECTURE names only
//! files and modules that exist.

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
    "python",
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

/// The module path of a source file (`src/a/b.rs` and `src/a/b/mod.rs` → `[a, b]`; the
/// crate root `[]`); `None` for binaries (`src/bin/`, `src/main.rs` is the root of its own
/// crate and is skipped too).
fn module_path(src: &Path, file: &Path) -> Option<Vec<String>> {
    let rel = file.strip_prefix(src).ok()?;
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_str().map(str::to_owned))
        .collect::<Option<_>>()?;
    if parts.first().is_some_and(|p| p == "bin" || p == "main.rs") {
        return None;
    }
    let last = parts.pop()?;
    match last.as_str() {
        "lib.rs" | "mod.rs" => {}
        f => parts.push(f.trim_end_matches(".rs").to_owned()),
    }
    Some(parts)
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

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The paths of the use tree at the start of `s` (`a::b::{c, d::{e}}` → `a::b::c`,
/// `a::b::d::e`); a `self` or `*` item stands for the path before it.
fn tree_paths(s: &str) -> Vec<Vec<String>> {
    let mut segments = Vec::new();
    let mut rest = s;
    loop {
        let id = ident(rest);
        if id.is_empty() || id == "self" {
            break;
        }
        segments.push(id.to_owned());
        rest = &rest[id.len()..];
        match rest.strip_prefix("::") {
            Some(r) => rest = r.trim_start(),
            None => return vec![segments],
        }
    }
    let Some(group) = rest.strip_prefix('{') else {
        return vec![segments];
    };
    // The items of the group, split at its top-level commas.
    let (mut depth, mut start, mut out) = (0, 0, Vec::new());
    for (j, c) in group.char_indices() {
        let item_end = match c {
            '{' => {
                depth += 1;
                None
            }
            '}' if depth == 0 => Some(true),
            '}' => {
                depth -= 1;
                None
            }
            ',' if depth == 0 => Some(false),
            _ => None,
        };
        if let Some(last) = item_end {
            for p in tree_paths(group[start..j].trim_start()) {
                out.push(segments.iter().cloned().chain(p).collect());
            }
            start = j + 1;
            if last {
                break;
            }
        }
    }
    out
}

/// The module paths `code` (of the file at module path `at`) names through `crate::`,
/// `super::` (repeated) and `self::`, made absolute (`crate::a::b` → `[a, b]`; in `[x, y]`,
/// `super::z::W` → `[x, z, W]`). Bare paths (extern crates, a file's own children) are left
/// out: a module names its siblings only through `super::` or `crate::`.
fn named_paths(code: &str, at: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    for (i, _) in code
        .match_indices("crate::")
        .chain(code.match_indices("super::"))
        .chain(code.match_indices("self::"))
    {
        // The start of a path only: not `a::super::`, not the middle of an identifier.
        if i > 0
            && (bytes[i - 1] == b':'
                || bytes[i - 1].is_ascii_alphanumeric()
                || bytes[i - 1] == b'_')
        {
            continue;
        }
        let mut rest = &code[i..];
        let mut base: Vec<String> = at.to_vec();
        if let Some(r) = rest.strip_prefix("crate::") {
            base.clear();
            rest = r;
        } else if let Some(r) = rest.strip_prefix("self::") {
            rest = r;
        } else {
            while let Some(r) = rest.strip_prefix("super::") {
                base.pop();
                rest = r;
            }
        }
        for p in tree_paths(rest) {
            out.push(base.iter().cloned().chain(p).collect());
        }
    }
    out
}

/// The first segments named after `crate::` in `code` (`crate::a::b` → `a`;
/// `crate::{a, b::c}` → `a`, `b`).
fn crate_refs(code: &str) -> BTreeSet<String> {
    named_paths(code, &["here".to_owned()])
        .into_iter()
        .filter_map(|p| p.into_iter().next())
        .collect()
}

/// Every import edge between sibling modules of the crate in `dir`, by the folder (module
/// path) they sit in: `[]` holds the top-level modules, `[metrics]` those of `metrics/`. A
/// file in `a` (or below it) naming a path in its sibling `b` is the edge `a → b`.
fn module_graphs(dir: &Path) -> BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> {
    let src = dir.join("src");
    let files: Vec<(PathBuf, Vec<String>)> = rust_files(&src)
        .into_iter()
        .filter_map(|f| module_path(&src, &f).map(|m| (f, m)))
        .collect();
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(_, m)| m.clone()).collect();
    let mut graphs: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (f, from) in &files {
        let text = fs::read_to_string(f).expect("readable source");
        // Test modules (the last item of a file, by rustfmt's layout) may use anything.
        let text = text.split("\n#[cfg(test)]").next().unwrap_or_default();
        for to in named_paths(&code_only(text), from) {
            let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common < from.len() && common < to.len() && modules.contains(&to[..=common]) {
                graphs
                    .entry(from[..common].to_vec())
                    .or_default()
                    .entry(from[common].clone())
                    .or_default()
                    .insert(to[common].clone());
            }
        }
    }
    graphs
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

/// Every import circle among sibling modules of the library crates, as
/// `crate: folder: a <-> b`.
fn import_circles(crates: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for krate in crates {
        let dir = root().join(krate);
        if !dir.join("src").is_dir() {
            continue;
        }
        for (folder, graph) in module_graphs(&dir) {
            let folder = if folder.is_empty() {
                "(top level)".to_owned()
            } else {
                folder.join("::")
            };
            for scc in cycles(&graph) {
                found.push(format!("{krate}: {folder}: {}", scc.join(" <-> ")));
            }
        }
    }
    found
}

#[test]
fn no_import_circle_between_sibling_modules() {
    let found = import_circles(CRATES);
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

/// Paths through `super::` and `self::` resolve against the file's module, use trees
/// expand, and a `super::` in the middle of a path is not a new one.
#[test]
fn paths_resolve_against_the_module_of_the_file() {
    let at = ["metrics".to_owned(), "history".to_owned()];
    let code = "use super::lag::LagProbe;\nuse super::{sampler::ShardMemos, http};\n\
                use super::super::store::{self, X};\nlet y = self::inner::f();\n\
                use crate::engine::{GroupDoc, view::{a, b}};";
    let paths: Vec<String> = named_paths(code, &at)
        .into_iter()
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(
        paths,
        [
            "engine::GroupDoc",
            "engine::view::a",
            "engine::view::b",
            "metrics::lag::LagProbe",
            "metrics::sampler::ShardMemos",
            "metrics::http",
            "store",
            "store::X",
            "metrics::history::inner::f",
        ]
    );
}

/// A circle between two submodules of one folder is found (in a crate written out here).
#[test]
fn the_module_graph_finds_a_circle_between_submodules() {
    let dir = std::env::temp_dir().join(format!("rsc-structure-{}", std::process::id()));
    let write = |rel: &str, text: &str| {
        let p = dir.join("src").join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    };
    write("lib.rs", "mod metrics;\nmod store;\n");
    write("store.rs", "pub struct S;\n");
    write("metrics/mod.rs", "mod history;\nmod lag;\n");
    write(
        "metrics/history.rs",
        "use super::lag::Probe;\nuse crate::store::S;\n",
    );
    write(
        "metrics/lag.rs",
        "use crate::metrics::{history::History};\n",
    );
    let graphs = module_graphs(&dir);
    fs::remove_dir_all(&dir).unwrap();
    let metrics = &graphs[&vec!["metrics".to_owned()]];
    assert_eq!(
        cycles(metrics),
        vec![vec!["history".to_owned(), "lag".to_owned()]]
    );
    assert!(cycles(&graphs[&Vec::new()]).is_empty(), "{graphs:?}");
    assert!(graphs[&Vec::new()]["metrics"].contains("store"));
}

/// Whether `file` is a module its parent declares under `#[cfg(test)]` (`#[cfg(test)] mod
/// sim;` in `member.rs` for `member/sim.rs`): test code, as a `tests.rs` is.
fn declared_for_tests(file: &Path) -> bool {
    let (Some(dir), Some(name)) = (file.parent(), file.file_stem().and_then(|n| n.to_str())) else {
        return false;
    };
    let parents = [
        dir.with_extension("rs"),
        dir.join("mod.rs"),
        dir.join("lib.rs"),
    ];
    let declaration = format!("mod {name};");
    parents
        .iter()
        .filter_map(|p| fs::read_to_string(p).ok())
        .any(|text| {
            let lines: Vec<&str> = text.lines().map(str::trim).collect();
            lines
                .windows(2)
                .any(|w| w[0] == "#[cfg(test)]" && w[1].ends_with(&declaration))
        })
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
            if f.components().any(|c| c.as_os_str() == "bin")
                || f.ends_with("tests.rs")
                || declared_for_tests(&f)
            {
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

/// The file and folder names a document writes in backticks (`engine/`, `worker/read.rs`,
/// `producer/mod.rs::publish_batch` → `producer/mod.rs`): a token with a `/` or a source
/// file's extension, not a route (`/v1/...`).
fn named_files(doc: &str) -> BTreeSet<String> {
    const EXTENSIONS: &[&str] = &[".rs", ".lua", ".md", ".toml", ".sh"];
    doc.split('`')
        .skip(1)
        .step_by(2)
        .map(|t| t.split("::").next().unwrap_or(t))
        .filter(|t| {
            !t.is_empty()
                && !t.starts_with('/')
                && t.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_.-/".contains(c))
                && (t.contains('/') || EXTENSIONS.iter().any(|e| t.ends_with(e)))
        })
        .map(str::to_owned)
        .collect()
}

/// Every file and folder of the repository (build output and `.git` aside), as paths from
/// the root with `/` separators; folders end with `/`.
fn repository_paths() -> Vec<String> {
    let root = root();
    let mut out = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            let name = e.file_name();
            if name == "target" || name == ".git" {
                continue;
            }
            let rel = p
                .strip_prefix(&root)
                .expect("under the root")
                .to_string_lossy();
            let rel = rel.replace('\\', "/");
            if p.is_dir() {
                out.push(format!("{rel}/"));
                stack.push(p);
            } else {
                out.push(rel);
            }
        }
    }
    out
}

/// The names of `names` that no file or folder of `paths` ends with (a name is written
/// relative to its crate or folder, so it matches any path it is the tail of).
fn unknown_names(names: &BTreeSet<String>, paths: &[String]) -> Vec<String> {
    names
        .iter()
        .filter(|n| {
            let n = n.trim_start_matches("./");
            !paths.iter().any(|p| {
                p == n
                    || p.strip_suffix('/') == Some(n)
                    || p.ends_with(&format!("/{n}"))
                    || p.strip_suffix('/')
                        .is_some_and(|p| p.ends_with(&format!("/{n}")))
            })
        })
        .cloned()
        .collect()
}

#[test]
fn architecture_names_only_files_and_modules_that_exist() {
    let doc = fs::read_to_string(root().join("docs/ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let names = named_files(&doc);
    assert!(names.len() > 50, "too few names found: {names:?}");
    let unknown = unknown_names(&names, &repository_paths());
    assert!(
        unknown.is_empty(),
        "docs/ARCHITECTURE.md names files or modules that do not exist: {unknown:?}"
    );
}

#[test]
fn the_name_check_finds_a_missing_module() {
    let names = named_files(
        "`engine/` and `service/heartbeat.rs::steady`, `consumer/gone.rs`, a route `/v1/x`, `GroupId`",
    );
    assert_eq!(
        names.iter().map(String::as_str).collect::<Vec<_>>(),
        ["consumer/gone.rs", "engine/", "service/heartbeat.rs"]
    );
    let paths = [
        "coordinator/src/engine/".to_owned(),
        "coordinator/src/service/heartbeat.rs".to_owned(),
        "client/src/consumer/worker.rs".to_owned(),
    ];
    assert_eq!(unknown_names(&names, &paths), ["consumer/gone.rs"]);
}
