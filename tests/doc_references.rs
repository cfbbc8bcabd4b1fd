//! Every reference a source file makes to the project's documents points at something in
//! the repository: each `docs/….md` path exists, each rule cited as `docs/architecture.md,
//! rule N` (or `rules N to M`) is a rule of that document's section 7, and no comment
//! cites a document the repository does not hold.

use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// Endings of the files whose comments are checked.
const SOURCES: [&str; 5] = ["rs", "cu", "cuh", "py", "sh"];
/// Where the rules are cited from.
const RULES_CITED: &str = "docs/architecture.md, rule";

/// Every source file of the repository outside build output, with its text.
fn sources() -> Vec<(PathBuf, String)> {
    let mut found = Vec::new();
    let mut dirs = vec![PathBuf::from(ROOT)];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy();
            if path.is_dir() {
                if name != "target" && !name.starts_with('.') {
                    dirs.push(path);
                }
            } else if SOURCES
                .iter()
                .any(|e| path.extension().is_some_and(|x| x == *e))
            {
                if let Ok(text) = std::fs::read_to_string(&path) {
                    found.push((path, text));
                }
            }
        }
    }
    found
}

/// The numbers of the rules in section 7 of docs/architecture.md (`N. **…**` items).
fn architecture_rules() -> Vec<u32> {
    let text = std::fs::read_to_string(Path::new(ROOT).join("docs/architecture.md")).unwrap();
    let section = text
        .split("\n## ")
        .find(|s| s.starts_with("7. "))
        .expect("docs/architecture.md has a section 7 (the rules)");
    section
        .lines()
        .filter_map(|line| {
            let (number, rest) = line.split_once(". **")?;
            let number = number.parse().ok()?;
            rest.contains("**").then_some(number)
        })
        .collect()
}

/// The `docs/….md` paths named in `text`.
fn doc_paths(text: &str) -> Vec<&str> {
    text.match_indices("docs/")
        .filter_map(|(at, _)| {
            let rest = &text[at..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || "_-./".contains(c)))
                .unwrap_or(rest.len());
            let path = rest[..end].trim_end_matches('.');
            path.ends_with(".md").then_some(path)
        })
        .collect()
}

/// `text` with its lines joined by spaces, each line's comment marker (`//!`, `///`, `//`,
/// `#`) taken off, so that a citation broken over two comment lines reads as one.
fn flattened(text: &str) -> String {
    text.lines()
        .map(|line| {
            let line = line.trim_start();
            ["//!", "///", "//", "#"]
                .iter()
                .find_map(|marker| line.strip_prefix(marker))
                .unwrap_or(line)
                .trim()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The rule numbers `text` cites as `docs/architecture.md, rule N` or `rules N to M`; a
/// citation without a number is a problem of its own.
fn cited_rules(text: &str) -> Result<Vec<u32>, String> {
    let text = flattened(text);
    let number = |w: &str| -> Option<u32> {
        w.trim_end_matches(|c: char| !c.is_ascii_digit())
            .parse()
            .ok()
    };
    let mut rules = Vec::new();
    for (at, _) in text.match_indices(RULES_CITED) {
        let rest = text[at + RULES_CITED.len()..].trim_start_matches('s');
        let words: Vec<&str> = rest.split_whitespace().take(3).collect();
        let cited: Vec<u32> = match words.as_slice() {
            [from, "to", to, ..] => number(from).into_iter().chain(number(to)).collect(),
            [n, ..] => number(n).into_iter().collect(),
            [] => Vec::new(),
        };
        if cited.is_empty() {
            return Err(format!(
                "a citation of a rule without its number: `{rest:.40}`"
            ));
        }
        rules.extend(cited);
    }
    Ok(rules)
}

#[test]
fn every_document_and_rule_a_comment_cites_exists() {
    let rules = architecture_rules();
    assert!(rules.len() >= 10, "section 7 lists {rules:?}");
    // Documents earlier comments cited that the repository never held.
    let missing_documents = ["DESIGN.md", "reference §"];
    let mut problems = Vec::new();
    // This file, whose tests and lists spell citations on purpose, is not read.
    let this_file = Path::new(ROOT).join(file!());
    for (path, text) in sources().into_iter().filter(|(p, _)| *p != this_file) {
        let name = path.strip_prefix(ROOT).unwrap().display().to_string();
        for doc in doc_paths(&text) {
            if !Path::new(ROOT).join(doc).is_file() {
                problems.push(format!("{name}: {doc} does not exist"));
            }
        }
        match cited_rules(&text) {
            Ok(cited) => problems.extend(
                cited
                    .into_iter()
                    .filter(|rule| !rules.contains(rule))
                    .map(|rule| format!("{name}: docs/architecture.md has no rule {rule}")),
            ),
            Err(problem) => problems.push(format!("{name}: {problem}")),
        }
        for missing in missing_documents {
            if text.contains(missing) {
                problems.push(format!("{name}: cites `{missing}`, not in the repository"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn citations_are_read_as_written() {
    assert_eq!(
        doc_paths("see docs/performance.md. And docs/architecture.md, rule 3"),
        ["docs/performance.md", "docs/architecture.md"]
    );
    assert_eq!(cited_rules("(docs/architecture.md, rule 3)"), Ok(vec![3]));
    assert_eq!(
        cited_rules("(docs/architecture.md, rules 3 to 5) are"),
        Ok(vec![3, 5])
    );
    assert_eq!(
        cited_rules("//! held (docs/architecture.md,\n//! rule 5), the"),
        Ok(vec![5])
    );
    assert!(cited_rules("docs/architecture.md, rule of thumb").is_err());
}
