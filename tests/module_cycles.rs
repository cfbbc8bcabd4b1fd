//! No module of a crate uses a module that uses it back: for every source file of every
//! crate, the modules its `crate::`, `super::` and `self::` paths name (outside comments
//! and its `#[cfg(test)] mod tests`) are its uses, and no two modules use each other.
//! A module that uses another's item through a re-export uses the module that re-exports
//! it, so a shared type belongs in a module of its own rather than in either side.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// The crates' source folders, the binary's last.
const CRATES: [&str; 8] = [
    "config/src",
    "runtime/src",
    "kernels/src",
    "ops/src",
    "models/src",
    "structured/src",
    "actors/src",
    "src",
];

/// A module: its crate's source folder and its path below the crate root.
type Module = (&'static str, Vec<String>);

/// The `.rs` files below `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module a file of `base` defines (`a/b.rs` and `a/b/mod.rs` are `[a, b]`).
fn module_of(base: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(base).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// `text` without comments and without a trailing `#[cfg(test)] mod tests` block.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The paths `code` names from `crate`, `super` or `self`: each a list of segments.
fn paths_in(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let bytes = code.as_bytes();
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(found) = code[from..].find(start) {
            let at = from + found;
            from = at + start.len();
            let word_before = at > 0
                && (bytes[at - 1].is_ascii_alphanumeric()
                    || bytes[at - 1] == b'_'
                    || bytes[at - 1] == b':');
            if word_before {
                continue;
            }
            let rest = &code[at..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(rest.len());
            let segments: Vec<String> = rest[..end]
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            paths.push(segments);
        }
    }
    paths
}

/// The module `path` (written in `module`) names: the longest prefix of its absolute
/// path that is a module of the crate.
fn target(
    known: &BTreeSet<Vec<String>>,
    module: &[String],
    path: &[String],
) -> Option<Vec<String>> {
    let mut absolute: Vec<String> = match path.first().map(String::as_str) {
        Some("crate") => Vec::new(),
        Some("self") => module.to_vec(),
        _ => {
            // `super` is the parent of the module itself, whatever file holds it.
            let ups = path.iter().take_while(|s| *s == "super").count();
            module[..module.len().checked_sub(ups)?].to_vec()
        }
    };
    absolute.extend(
        path.iter()
            .skip_while(|s| matches!(s.as_str(), "crate" | "self" | "super"))
            .cloned(),
    );
    (0..=absolute.len())
        .rev()
        .map(|n| absolute[..n].to_vec())
        .find(|prefix| known.contains(prefix))
}

#[test]
fn no_module_uses_a_module_that_uses_it_back() {
    let mut uses: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for krate in CRATES {
        let base = Path::new(ROOT).join(krate);
        let mut files = Vec::new();
        rust_files(&base, &mut files);
        let modules: Vec<(Vec<String>, &PathBuf)> =
            files.iter().map(|f| (module_of(&base, f), f)).collect();
        let known: BTreeSet<Vec<String>> = modules.iter().map(|(m, _)| m.clone()).collect();
        for (module, file) in &modules {
            let code = code_of(&std::fs::read_to_string(file).unwrap());
            for path in paths_in(&code) {
                if let Some(to) = target(&known, module, &path) {
                    if &to != module {
                        uses.entry((krate, module.clone()))
                            .or_default()
                            .insert((krate, to));
                    }
                }
            }
        }
    }
    assert!(uses.len() > 100, "only {} modules use another", uses.len());
    let mut both_ways = Vec::new();
    for (a, targets) in &uses {
        for b in targets {
            if a < b && uses.get(b).is_some_and(|t| t.contains(a)) {
                both_ways.push(format!(
                    "{}/{} <-> {}/{}",
                    a.0,
                    a.1.join("/"),
                    b.0,
                    b.1.join("/")
                ));
            }
        }
    }
    assert!(
        both_ways.is_empty(),
        "modules that use each other (move what both need into a module of its own):\n{}",
        both_ways.join("\n")
    );
}

#[test]
fn the_scan_sees_a_use_both_ways() {
    let known: BTreeSet<Vec<String>> = [vec![], vec!["a".into()], vec!["a".into(), "b".into()]]
        .into_iter()
        .collect();
    let a = vec!["a".to_string()];
    let code = code_of("use super::a::b::Thing; // crate::ignored::x\nfn f() { self::b::g() }");
    let paths = paths_in(&code);
    assert_eq!(paths.len(), 2, "{paths:?}");
    let named: Vec<_> = paths.iter().filter_map(|p| target(&known, &a, p)).collect();
    // `super::a::b` from module `a` is `a::b` (the crate root's `a`, then `b`).
    assert_eq!(named, vec![vec!["a".to_string(), "b".to_string()]; 2]);
}
