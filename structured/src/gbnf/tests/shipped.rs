//! The grammars llama.cpp ships (`grammars/*.gbnf`) convert, compile and match their
//! languages. They are not kept in this repository: the tests take them from the PyPI
//! source distribution of llama-cpp-python (a pinned version), which vendors llama.cpp,
//! downloaded once with pip into the workspace's `target/` folder.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use super::check;
use crate::gbnf::gbnf_to_lark;

/// The PyPI package whose source distribution vendors llama.cpp, and its pinned version.
const PACKAGE: &str = "llama-cpp-python";
const VERSION: &str = "0.3.16";
/// The grammars llama.cpp ships there.
const GRAMMARS: [&str; 8] = [
    "arithmetic.gbnf",
    "c.gbnf",
    "chess.gbnf",
    "english.gbnf",
    "japanese.gbnf",
    "json.gbnf",
    "json_arr.gbnf",
    "list.gbnf",
];

/// Copies `grammars/*.gbnf` of the vendored llama.cpp out of the sdist (`argv[1]`) into the
/// folder `argv[2]`.
const EXTRACT: &str = r#"
import os, sys, tarfile
sdist, out = sys.argv[1], sys.argv[2]
os.makedirs(out)
with tarfile.open(sdist) as tar:
    for member in tar.getmembers():
        parts = member.name.split("/")
        if member.isfile() and parts[-3:-1] == ["llama.cpp", "grammars"] and parts[-1].endswith(".gbnf"):
            with open(os.path.join(out, parts[-1]), "wb") as dst:
                dst.write(tar.extractfile(member).read())
"#;

/// The text of llama.cpp's grammar `name`.
fn shipped(name: &str) -> String {
    static FOLDER: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let folder = FOLDER
        .get_or_init(fetch)
        .as_ref()
        .unwrap_or_else(|err| panic!("llama.cpp's grammars could not be had: {err}"));
    std::fs::read_to_string(folder.join(name)).unwrap_or_else(|err| panic!("{name}: {err}"))
}

/// The folder holding llama.cpp's grammars, downloaded and extracted on first use.
fn fetch() -> Result<PathBuf, String> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let cache = target.join("gbnf-grammars");
    let folder = cache.join(format!("{PACKAGE}-{VERSION}"));
    if GRAMMARS.iter().all(|name| folder.join(name).is_file()) {
        return Ok(folder);
    }
    std::fs::create_dir_all(&cache).map_err(|err| format!("{}: {err}", cache.display()))?;
    let work = tempfile::tempdir_in(&cache).map_err(|err| err.to_string())?;
    run(Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            PACKAGE,
            "--dest",
        ])
        .arg(work.path())
        .arg(format!("{PACKAGE}=={VERSION}")))
    .map_err(|err| format!("pip could not download {PACKAGE}=={VERSION} from PyPI: {err}"))?;
    let sdist = work
        .path()
        .join(format!("{}-{VERSION}.tar.gz", PACKAGE.replace('-', "_")));
    let extracted = work.path().join("grammars");
    run(Command::new("python3")
        .args(["-c", EXTRACT])
        .arg(&sdist)
        .arg(&extracted))
    .map_err(|err| {
        format!(
            "cannot extract the grammars from {}: {err}",
            sdist.display()
        )
    })?;
    let missing: Vec<&str> = GRAMMARS
        .into_iter()
        .filter(|name| !extracted.join(name).is_file())
        .collect();
    if !missing.is_empty() {
        return Err(format!("{PACKAGE} {VERSION} lacks {missing:?}"));
    }
    // Another test process may have put them there first.
    if std::fs::rename(&extracted, &folder).is_err() && !folder.is_dir() {
        return Err(format!("cannot move the grammars to {}", folder.display()));
    }
    Ok(folder)
}

/// Runs `command`; its stderr's end where it fails.
fn run(command: &mut Command) -> Result<(), String> {
    let output = command.output().map_err(|err| err.to_string())?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    Err(format!(
        "{}: {}",
        output.status,
        lines[lines.len().saturating_sub(5)..].join("\n")
    ))
}

#[test]
fn arithmetic() {
    check(
        &shipped("arithmetic.gbnf"),
        &["1+2=3\n", "a=b\n", "x *(y -2) = z_1\n(1)=2\n", "a=b \n\n"],
        &["", "1+=3\n", "a=b", "A=b\n"],
    );
}

#[test]
fn c() {
    check(
        &shipped("c.gbnf"),
        &[
            "int main(){return 0;}",
            "int f(int x){x = x+1;int = 2;while(x<3){x = x*2;}}char g(){}",
            "float h(){// note\n/* block */return h();}",
        ],
        &[
            "int main(){return 0}",
            "int main(){}x",
            "main(){}",
            "int main(){int x}",
        ],
    );
}

#[test]
fn chess() {
    check(
        &shipped("chess.gbnf"),
        &[
            "1. e4 e5\n2. Nf3 Nc6\n",
            "1. d4 d5\n2. c4 dxc4\n3. O-O-O Qxd8+\n",
        ],
        &[
            "1. e4 e5\n",
            "1. e9 e5\n2. Nf3 Nc6\n",
            "1. e4 e5\n2. Nf3 Nc6",
        ],
    );
}

#[test]
fn english() {
    check(
        &shipped("english.gbnf"),
        &["Hello, world!", "It's 42.\nYes"],
        &["", " hello", "héllo", "a  b"],
    );
}

#[test]
fn japanese() {
    check(
        &shipped("japanese.gbnf"),
        &["こんにちは 世界", "カタカナ、ひらがな。"],
        &["", "hello", "こんにちは  世界"],
    );
}

#[test]
fn json() {
    let gbnf = shipped("json.gbnf");
    check(
        &gbnf,
        &[
            r#"{"a": [1, 2.5, -3e4, true, null], "b": {"c": "d\n\u00e9"}}"#,
            "{\n  \"x\":{}}",
            "{}",
        ],
        &["[1]", r#"{"a": 01}"#, r#"{"a" 1}"#, r#"{"a": "b}"#],
    );
    // Strings and numbers stay one lexeme each: no character-level parsing.
    let lark = gbnf_to_lark(&gbnf).unwrap();
    assert!(lark.contains("\nSTRING: "), "{lark}");
    assert!(lark.contains("\nNUMBER: "), "{lark}");
}

#[test]
fn json_arr() {
    check(
        &shipped("json_arr.gbnf"),
        &["[\n1,\n{\"a\": \"b\"}]", "[\n]"],
        &["[1]", "[\n1,\n2] "],
    );
}

#[test]
fn list() {
    check(
        &shipped("list.gbnf"),
        &["- a\n", "- one\n- two words\n"],
        &["", "- \n", "a\n", "- a"],
    );
}
