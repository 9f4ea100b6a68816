//! The engine's layers hold: every path into the crate (`use crate::…`,
//! `crate::x::y` in code, groups over several lines, a name the crate root
//! re-exports, `super::` chains that climb to the root) points at a module
//! of the same layer or a lower one, as `lib.rs`'s list states them.
//!
//! The table is read from `lib.rs`'s own doc, so that the list a reader
//! sees is the one enforced. Tests (items under a `cfg` that requires
//! `test`), comments and doc links are not architecture and are not read.
//! A module that no layer names fails the test too: a new file must be
//! given a place; so does a glob import of the crate root. Not followed:
//! `super::` inside an inline module other than a test module (the engine
//! has none), and macros that expand to paths.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A reference from one module to a module of a higher layer.
#[derive(Debug, PartialEq, Eq)]
struct Upward {
    file: String,
    line: usize,
    from: String,
    to: String,
}

/// The layers as `lib.rs`'s doc lists them: each line `//! N. …` names its
/// modules as doc links (`` [`phys`] ``); a line that continues an item
/// (indented) belongs to it. Returns module -> layer number.
fn layers_of(lib_rs: &str) -> BTreeMap<String, usize> {
    let declared: BTreeSet<String> = lib_rs
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|m| m.trim_end_matches(';').to_string())
        .collect();
    let mut table = BTreeMap::new();
    let mut layer: Option<usize> = None;
    for line in lib_rs.lines() {
        let Some(doc) = line.strip_prefix("//!") else {
            continue;
        };
        let text = doc.trim_start();
        let number = text
            .split_once(". ")
            .and_then(|(n, _)| n.parse::<usize>().ok());
        if let Some(n) = number {
            layer = Some(n);
        } else if !doc.starts_with("    ") {
            // A line that is neither an item nor its continuation ends the
            // list.
            if layer.is_some() && text.is_empty() {
                continue;
            }
            if layer.is_some() {
                layer = None;
            }
            continue;
        }
        let Some(n) = layer else { continue };
        let mut rest = text;
        while let Some(i) = rest.find("[`") {
            rest = &rest[i + 2..];
            let Some(j) = rest.find("`]") else { break };
            let name = &rest[..j];
            if declared.contains(name) {
                if let Some(before) = table.insert(name.to_string(), n) {
                    assert_eq!(before, n, "lib.rs puts {name} in layers {before} and {n}");
                }
            }
            rest = &rest[j..];
        }
    }
    table
}

/// The names `lib.rs` re-exports at the crate root (`pub use machine::{…}`,
/// `pub use crate::x::Y as Z`), by the module they come from.
fn root_reexports(lib_rs: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    let code = code_only(lib_rs);
    for stmt in code.split(';') {
        let Some(rest) = stmt.trim().strip_prefix("pub use ") else {
            continue;
        };
        let rest = rest.trim().trim_start_matches("crate::");
        let Some((module, items)) = rest.split_once("::") else {
            continue;
        };
        let items = items.trim().trim_start_matches('{').trim_end_matches('}');
        for item in items.split(',') {
            let item = item.trim();
            assert_ne!(item, "*", "lib.rs re-exports all of {module}: name them");
            // The name it is known by: the alias, or the last segment.
            let name = match item.split_once(" as ") {
                Some((_, alias)) => alias.trim(),
                None => item.rsplit("::").next().unwrap_or(item),
            };
            if !name.is_empty() {
                names.insert(name.to_string(), module.trim().to_string());
            }
        }
    }
    names
}

/// `src` with comments, string literals and `#[cfg(test)]` items blanked
/// (newlines kept, so that line numbers still hold).
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            while i < b.len() && !b[i..].starts_with(b"*/") {
                out.push(if b[i] == b'\n' { b'\n' } else { b' ' });
                i += 1;
            }
            i = (i + 2).min(b.len());
        } else if b[i] == b'"' {
            out.push(b'"');
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                if i < b.len() && b[i] == b'\n' {
                    out.push(b'\n');
                }
                i += 1;
            }
            out.push(b'"');
            i += 1;
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('"', '\'', '{'); a lifetime is left alone.
            out.extend_from_slice(b"' '");
            i += if b[i + 1] == b'\\' { 4 } else { 3 };
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    let code = String::from_utf8_lossy(&out).into_owned();
    strip_cfg_test(&code)
}

/// Blanks each item compiled only into tests (`#[cfg(test)]`,
/// `#[cfg(all(test, …))]`: a predicate that names `test` and not
/// `not(test)`), up to its closing brace (or its semicolon, for
/// `mod tests;`, or its comma, for a field).
fn strip_cfg_test(code: &str) -> String {
    let mut out: Vec<u8> = code.as_bytes().to_vec();
    let mut from = 0;
    while let Some(at) = code[from..].find("#[cfg(") {
        let start = from + at;
        let Some(close) = code[start..].find(")]") else {
            break;
        };
        let predicate = &code[start + "#[cfg(".len()..start + close];
        let test_only = predicate
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .any(|w| w == "test")
            && !predicate.contains("not(test");
        if !test_only {
            from = start + close;
            continue;
        }
        // The item starts after the attribute (whose commas are not its).
        let item = start + close + ")]".len();
        let mut depth = 0usize;
        let mut end = code.len();
        for (k, c) in code[item..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    // A `}` at depth 0 closes what holds the item (a
                    // struct whose last field it was): the item ends
                    // before it.
                    if depth == 0 {
                        end = item + k;
                        break;
                    }
                    depth -= 1;
                    if depth == 0 {
                        end = item + k + 1;
                        break;
                    }
                }
                // A statement, or a field or variant.
                ';' | ',' if depth == 0 => {
                    end = item + k + 1;
                    break;
                }
                _ => {}
            }
        }
        for byte in &mut out[start..end] {
            if *byte != b'\n' {
                *byte = b' ';
            }
        }
        from = end;
    }
    String::from_utf8(out).expect("blanking keeps UTF-8")
}

/// The top-level module each path of `code` names that leaves the file's
/// own top-level module: `crate::x…`, and `super::` chains that climb to
/// the crate root (from `module`, the file's module path, such as
/// `["phys", "migrc"]`), with the line of each. A glob of the crate root
/// (`crate::*`) is returned as `*`.
fn references(
    code: &str,
    module: &[String],
    root: &BTreeMap<String, String>,
) -> Vec<(usize, String)> {
    let mut refs = Vec::new();
    let mut at = 0;
    loop {
        let next = ["crate::", "super::"]
            .iter()
            .filter_map(|p| code[at..].find(p).map(|i| (at + i, *p)))
            .min();
        let Some((i, pattern)) = next else { break };
        at = i + pattern.len();
        // Not the tail of a longer identifier (`usermm_crate::`).
        let preceded = code[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_');
        if preceded {
            continue;
        }
        let line = code[..i].matches('\n').count() + 1;
        if pattern == "super::" {
            // `super::` from `module`'s file names its parent; a chain of
            // them climbs one level each.
            let mut up = 1;
            while code[at..].starts_with("super::") {
                at += "super::".len();
                up += 1;
            }
            if up < module.len() {
                continue; // still inside the file's top-level module
            }
        }
        for name in path_heads(&code[at..]) {
            let module = root.get(&name).cloned().unwrap_or(name);
            refs.push((line, module));
        }
    }
    refs
}

/// The first segment of a path (`phys::Folio` -> `phys`), or of each path
/// of a group (`{phys::Folio, mm::Mm}` -> `phys`, `mm`).
fn path_heads(rest: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    if let Some(group) = rest.strip_prefix('{') {
        let mut heads = Vec::new();
        let mut depth = 0;
        let mut start = 0;
        for (k, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    heads.push(ident(&group[start..k]));
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    heads.push(ident(&group[start..k]));
                    start = k + 1;
                }
                _ => {}
            }
        }
        heads.retain(|h| !h.is_empty() && h != "self");
        heads
    } else if rest.starts_with('*') {
        vec!["*".to_string()]
    } else {
        vec![ident(rest)]
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("read src")
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// Every upward reference among `files` (path relative to src, text), and
/// the modules no layer names.
fn check(lib_rs: &str, files: &[(String, String)]) -> (Vec<Upward>, BTreeSet<String>) {
    let layers = layers_of(lib_rs);
    let root = root_reexports(lib_rs);
    let mut upward = Vec::new();
    let mut unplaced = BTreeSet::new();
    for (rel, text) in files {
        if rel == "lib.rs" {
            continue;
        }
        let top = rel
            .split(['/', '.'])
            .next()
            .expect("a file has a name")
            .to_string();
        let Some(&from_layer) = layers.get(&top) else {
            unplaced.insert(top);
            continue;
        };
        // The file's module path: `phys/migrc.rs` is phys::migrc,
        // `phys/mod.rs` is phys.
        let mut module: Vec<String> = rel
            .trim_end_matches(".rs")
            .split('/')
            .map(str::to_string)
            .collect();
        if module.last().is_some_and(|m| m == "mod") {
            module.pop();
        }
        for (line, to) in references(&code_only(text), &module, &root) {
            if to == top {
                continue;
            }
            assert_ne!(
                to, "*",
                "{rel}:{line}: a glob import of the crate root hides its layers"
            );
            // A name that is no module (a macro at the crate root, say)
            // has no layer.
            if layers.get(&to).is_some_and(|&l| l > from_layer) {
                upward.push(Upward {
                    file: rel.clone(),
                    line,
                    from: top.clone(),
                    to,
                });
            }
        }
    }
    (upward, unplaced)
}

fn engine_sources() -> (String, Vec<(String, String)>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    let files = paths
        .iter()
        .map(|p| {
            let rel = p
                .strip_prefix(&src)
                .expect("under src")
                .to_string_lossy()
                .replace('\\', "/");
            (rel, std::fs::read_to_string(p).expect("read source"))
        })
        .collect();
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("read lib.rs");
    (lib, files)
}

#[test]
fn no_module_imports_from_a_higher_layer() {
    let (lib, files) = engine_sources();
    let layers = layers_of(&lib);
    assert!(
        layers.len() >= 30,
        "lib.rs's layer list names only {} modules: {layers:?}",
        layers.len()
    );
    let (upward, unplaced) = check(&lib, &files);
    assert!(
        unplaced.is_empty(),
        "modules that lib.rs's layer list does not name: {unplaced:?}"
    );
    let report: Vec<String> = upward
        .iter()
        .map(|u| {
            format!(
                "{}:{}: {} (layer {}) uses {} (layer {})",
                u.file, u.line, u.from, layers[&u.from], u.to, layers[&u.to]
            )
        })
        .collect();
    assert!(
        report.is_empty(),
        "imports from a higher layer:\n{}",
        report.join("\n")
    );
}

#[test]
fn an_upward_import_is_caught() {
    let (lib, mut files) = engine_sources();
    let (before, _) = check(&lib, &files);
    assert!(before.is_empty());
    // The allocator calling reclaim directly, as the kernel's does.
    let page_alloc = files
        .iter_mut()
        .find(|(rel, _)| rel == "phys/page_alloc.rs")
        .expect("phys/page_alloc.rs");
    page_alloc
        .1
        .push_str("\nfn reclaim_now() {\n    use crate::vmscan::balance_pgdat;\n}\n");
    // And through a group written over several lines (as rustfmt writes
    // a long one), and the crate root's re-export.
    let vmstat = files
        .iter_mut()
        .find(|(rel, _)| rel == "vmstat.rs")
        .expect("vmstat.rs");
    vmstat
        .1
        .push_str("\nuse crate::{\n    sync::Arc,\n    Machine,\n};\n");
    // And by `super::` from a folder's mod.rs, and `super::super::` from a
    // file inside it, both of which name the crate root.
    for (rel, path) in [
        ("phys/mod.rs", "super::cpu::Cpu"),
        ("phys/folio.rs", "super::super::mm::Mm"),
    ] {
        let f = files.iter_mut().find(|(r, _)| r == rel).expect(rel);
        f.1.push_str(&format!("\nuse {path};\n"));
    }
    let (after, _) = check(&lib, &files);
    let caught: Vec<(&str, &str, &str)> = after
        .iter()
        .map(|u| (u.file.as_str(), u.from.as_str(), u.to.as_str()))
        .collect();
    assert_eq!(
        caught,
        [
            ("phys/folio.rs", "phys", "mm"),
            ("phys/mod.rs", "phys", "cpu"),
            ("phys/page_alloc.rs", "phys", "vmscan"),
            ("vmstat.rs", "vmstat", "machine"),
        ]
    );
}

#[test]
fn tests_comments_and_strings_are_not_architecture() {
    let lib =
        "//! Layers:\n//!\n//! 0. Base: [`a`].\n//! 1. Top: [`b`].\n\npub mod a;\npub mod b;\n";
    let a = "// crate::b in a comment\n/// [`crate::b::X`]\nconst S: &str = \"crate::b\";\n#[cfg(test)]\nmod tests {\n    use crate::b;\n}\n#[cfg(all(test, not(loom)))]\nmod more {\n    use super::*;\n    use crate::b::Y;\n}\n";
    let files = vec![("a.rs".to_string(), a.to_string())];
    let (upward, unplaced) = check(lib, &files);
    assert!(upward.is_empty(), "{upward:?}");
    assert!(unplaced.is_empty());
    let files = vec![(
        "a.rs".to_string(),
        format!("{a}\nfn f() {{ crate::b::g(); }}\n"),
    )];
    let (upward, _) = check(lib, &files);
    assert_eq!(upward.len(), 1, "{upward:?}");
}
