//! The engine's layers hold: every path into the crate (`use crate::…`,
//! `crate::x::y` in code, `super::` out of a top-level file) points at a
//! module of the same layer or a lower one, as `lib.rs`'s list states them.
//!
//! The table is read from `lib.rs`'s own doc, so that the list a reader
//! sees is the one enforced. Tests (`#[cfg(test)]` items), comments and
//! doc links are not architecture and are not read. A module that no layer
//! names fails the test too: a new file must be given a place.

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
                table.insert(name.to_string(), n);
            }
            rest = &rest[j..];
        }
    }
    table
}

/// The names `lib.rs` re-exports at the crate root (`pub use machine::{…}`),
/// by the module they come from.
fn root_reexports(lib_rs: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for line in lib_rs.lines() {
        let Some(rest) = line.trim().strip_prefix("pub use ") else {
            continue;
        };
        let rest = rest.trim_end_matches(';');
        let Some((module, items)) = rest.split_once("::") else {
            continue;
        };
        let items = items.trim_start_matches('{').trim_end_matches('}');
        for item in items.split(',') {
            let item = item.trim();
            if !item.is_empty() {
                names.insert(item.to_string(), module.to_string());
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

/// Blanks each item after `#[cfg(test)]`, up to its closing brace (or its
/// semicolon, for `mod tests;` and single-line items).
fn strip_cfg_test(code: &str) -> String {
    let mut out: Vec<u8> = code.as_bytes().to_vec();
    let mut from = 0;
    while let Some(at) = code[from..].find("#[cfg(test)]") {
        let start = from + at;
        let mut depth = 0usize;
        let mut end = code.len();
        for (k, c) in code[start..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = start + k + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = start + k + 1;
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

/// The top-level module each `crate::` (or, from a top-level file,
/// `super::`) path of `code` names, with its line.
fn references(
    code: &str,
    top_level_file: bool,
    root: &BTreeMap<String, String>,
) -> Vec<(usize, String)> {
    let mut refs = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let mut rest = line;
        while let Some(i) = rest.find("crate::").or_else(|| {
            if top_level_file {
                rest.find("super::")
            } else {
                None
            }
        }) {
            // Not the tail of a longer identifier (`usermm_crate::`).
            let preceded = rest[..i]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_');
            // "crate::" and "super::" are both seven bytes.
            rest = &rest[i + 7..];
            if preceded {
                continue;
            }
            for name in path_heads(rest) {
                let module = root.get(&name).cloned().unwrap_or(name);
                refs.push((n + 1, module));
            }
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
        let top_level_file = !rel.contains('/');
        for (line, to) in references(&code_only(text), top_level_file, &root) {
            if to == top {
                continue;
            }
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
    // And through a group, and the crate root's re-export.
    let vmstat = files
        .iter_mut()
        .find(|(rel, _)| rel == "vmstat.rs")
        .expect("vmstat.rs");
    vmstat.1.push_str("\nuse crate::{sync::Arc, Machine};\n");
    let (after, _) = check(&lib, &files);
    let caught: Vec<(&str, &str, &str)> = after
        .iter()
        .map(|u| (u.file.as_str(), u.from.as_str(), u.to.as_str()))
        .collect();
    assert_eq!(
        caught,
        [
            ("phys/page_alloc.rs", "phys", "vmscan"),
            ("vmstat.rs", "vmstat", "machine"),
        ]
    );
}

#[test]
fn tests_comments_and_strings_are_not_architecture() {
    let lib =
        "//! Layers:\n//!\n//! 0. Base: [`a`].\n//! 1. Top: [`b`].\n\npub mod a;\npub mod b;\n";
    let a = "// crate::b in a comment\n/// [`crate::b::X`]\nconst S: &str = \"crate::b\";\n#[cfg(test)]\nmod tests {\n    use crate::b;\n}\n";
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
