//! The Python environment of the end-to-end tests: a virtual environment under the
//! workspace's `target/` folder (`target/e2e-venv`), built on first use from the pinned
//! `tests/e2e/requirements.txt` with pip, so that `cargo test` needs nothing installed by hand
//! but Python 3 with pip.
//!
//! Many test threads and many test processes may ask for it at once: within a process the
//! first caller builds it and the others wait for the answer; across processes the builder
//! holds an exclusive lock on `target/e2e-venv.lock`, builds in a temporary folder beside the
//! venv and renames it into place once it is complete, so a venv at its final path is always
//! whole. The venv records a hash of the requirements file (and the base Python's version)
//! in `peregrine-e2e.stamp`; a change of either rebuilds it. Without Python or pip the tests
//! fail, saying what to install: they never skip.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The folder of the venv, under the target folder.
const VENV_DIR: &str = "e2e-venv";

/// The file, inside the venv, that records what it was built from.
const STAMP: &str = "peregrine-e2e.stamp";

/// What to tell someone whose machine lacks Python or pip.
const INSTALL_PYTHON: &str = "install Python 3 with pip and venv \
     (e.g. `apt-get install python3 python3-pip python3-venv`)";

/// The modules a built venv must import (the requirements' import names).
const IMPORTS: &str =
    "import openai, jsonschema, pydantic, langchain_openai, anthropic, agents, vllm_router, smg";

/// The venv's Python interpreter, building the venv first if it is missing or stale. Panics
/// with a message saying what is missing when it cannot be built.
pub fn python() -> PathBuf {
    static PYTHON: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match PYTHON.get_or_init(ensure) {
        Ok(python) => python.clone(),
        Err(why) => panic!("the end-to-end tests' Python environment: {why}"),
    }
}

/// `tests/e2e/requirements.txt`.
pub fn requirements() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("e2e")
        .join("requirements.txt")
}

/// The workspace's target folder: the nearest folder above the test binary that cargo
/// tagged with `CACHEDIR.TAG` (so `CARGO_TARGET_DIR` and `--target` are followed), else
/// `target/` in the workspace.
fn target_dir() -> PathBuf {
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe
            .ancestors()
            .skip(1)
            .find(|d| d.join("CACHEDIR.TAG").is_file())
        {
            return dir.to_path_buf();
        }
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target")
}

fn venv_python(venv: &Path) -> PathBuf {
    venv.join("bin").join("python")
}

/// Builds the venv unless a complete, current one is there: the path of its interpreter.
fn ensure() -> Result<PathBuf, String> {
    let target = target_dir();
    let venv = target.join(VENV_DIR);
    let requirements = requirements();
    let wanted = stamp(&requirements)?;
    if is_current(&venv, &wanted) {
        return Ok(venv_python(&venv));
    }

    fs::create_dir_all(&target).map_err(|e| format!("cannot create {}: {e}", target.display()))?;
    let lock_path = target.join(format!("{VENV_DIR}.lock"));
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| format!("cannot open the lock file {}: {e}", lock_path.display()))?;
    eprintln!(
        "e2e: {} is missing or stale; taking the lock {}",
        venv.display(),
        lock_path.display()
    );
    lock.lock()
        .map_err(|e| format!("cannot lock {}: {e}", lock_path.display()))?;
    // Another process may have built it while this one waited.
    if is_current(&venv, &wanted) {
        return Ok(venv_python(&venv));
    }
    let result = build(&target, &venv, &requirements, &wanted);
    drop(lock);
    result.map(|()| venv_python(&venv))
}

/// Whether `venv` holds a venv built from what `wanted` describes, whose interpreter runs.
fn is_current(venv: &Path, wanted: &str) -> bool {
    let recorded = fs::read_to_string(venv.join(STAMP)).unwrap_or_default();
    recorded == wanted
        && Command::new(venv_python(venv))
            .args(["-c", "import sys"])
            .output()
            .is_ok_and(|o| o.status.success())
}

/// What the venv is built from: the requirements file's hash and the base Python's version.
fn stamp(requirements: &Path) -> Result<String, String> {
    let text = fs::read(requirements)
        .map_err(|e| format!("cannot read {}: {e}", requirements.display()))?;
    let version = match Command::new("python3").arg("--version").output() {
        Ok(output) if output.status.success() => {
            let mut v = String::from_utf8_lossy(&output.stdout).trim().to_string();
            if v.is_empty() {
                v = String::from_utf8_lossy(&output.stderr).trim().to_string();
            }
            v
        }
        Ok(output) => {
            return Err(format!(
                "`python3 --version` failed ({}):\n{}\n{INSTALL_PYTHON}",
                output.status,
                show(&output)
            ))
        }
        Err(e) => {
            return Err(format!(
                "the end-to-end tests need Python 3 as `python3` on PATH, which cannot be run \
                 ({e}); {INSTALL_PYTHON}"
            ))
        }
    };
    Ok(format!(
        "requirements-fnv1a64 {:016x}\npython {version}\n",
        fnv1a64(&text)
    ))
}

/// Builds the venv in a temporary folder beside `venv` and renames it into place. The caller
/// holds the lock.
fn build(target: &Path, venv: &Path, requirements: &Path, stamp: &str) -> Result<(), String> {
    // Leftovers of builders that died (they held the lock, which is now ours).
    if let Ok(entries) = fs::read_dir(target) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(&format!("{VENV_DIR}.tmp-"))
                || name.starts_with(&format!("{VENV_DIR}.old-"))
            {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }
    let tmp = target.join(format!("{VENV_DIR}.tmp-{}", std::process::id()));
    eprintln!(
        "e2e: building the Python environment {} from {} (once; pip needs the network)",
        venv.display(),
        requirements.display()
    );
    let started = std::time::Instant::now();
    let result = create_and_install(&tmp, requirements, stamp);
    if let Err(why) = result {
        let _ = fs::remove_dir_all(&tmp);
        return Err(why);
    }
    if venv.exists() {
        // A stale or broken venv: move it aside first (a rename cannot replace a folder
        // that has files), then delete it.
        let old = target.join(format!("{VENV_DIR}.old-{}", std::process::id()));
        fs::rename(venv, &old)
            .map_err(|e| format!("cannot move the stale {} aside: {e}", venv.display()))?;
        let _ = fs::remove_dir_all(&old);
    }
    fs::rename(&tmp, venv)
        .map_err(|e| format!("cannot rename {} to {}: {e}", tmp.display(), venv.display()))?;
    eprintln!(
        "e2e: built {} in {:.0}s",
        venv.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Creates a venv in `dir`, installs the requirements into it with pip, checks that they
/// import, and writes the stamp. The venv is used only through `dir/bin/python` (never its
/// scripts, whose first lines name `dir`), so it may be renamed afterwards.
fn create_and_install(dir: &Path, requirements: &Path, stamp: &str) -> Result<(), String> {
    let _ = fs::remove_dir_all(dir);
    let python = venv_python(dir);
    // A venv with its own pip; where Python ships without ensurepip (Debian's python3
    // without python3-venv), a venv without pip, filled by the system's pip.
    let own_pip = run(Command::new("python3").arg("-m").arg("venv").arg(dir)).is_ok();
    if !own_pip {
        let _ = fs::remove_dir_all(dir);
        run(Command::new("python3")
            .args(["-m", "venv", "--without-pip"])
            .arg(dir))
        .map_err(|why| {
            format!(
                "`python3 -m venv` cannot create a virtual environment:\n{why}\n{INSTALL_PYTHON}"
            )
        })?;
    }
    let mut install = if own_pip {
        let mut c = Command::new(&python);
        c.args(["-m", "pip"]);
        c
    } else {
        let mut c = Command::new("python3");
        c.args(["-m", "pip", "--python"]).arg(&python);
        c
    };
    install
        .args([
            "install",
            "--disable-pip-version-check",
            "--no-input",
            "--quiet",
            "--requirement",
        ])
        .arg(requirements)
        .env("PIP_REQUIRE_VIRTUALENV", "0");
    if let Err(why) = run(&mut install) {
        let no_pip = why.contains("No module named pip");
        return Err(if no_pip {
            format!(
                "pip is not available to install {}:\n{why}\n{INSTALL_PYTHON}",
                requirements.display()
            )
        } else {
            format!("pip could not install {}:\n{why}", requirements.display())
        });
    }
    run(Command::new(&python).args(["-c", IMPORTS])).map_err(|why| {
        format!(
            "the packages of {} were installed but do not import:\n{why}",
            requirements.display()
        )
    })?;
    fs::write(dir.join(STAMP), stamp)
        .map_err(|e| format!("cannot write {}: {e}", dir.join(STAMP).display()))
}

/// Runs `command` to the end: Ok when it exits 0, else what it printed.
fn run(command: &mut Command) -> Result<Output, String> {
    match command.output() {
        Ok(output) if output.status.success() => Ok(output),
        Ok(output) => Err(format!(
            "{command:?} failed ({}):\n{}",
            output.status,
            show(&output)
        )),
        Err(e) => Err(format!("cannot run {command:?}: {e}\n{INSTALL_PYTHON}")),
    }
}

fn show(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The 64-bit FNV-1a hash: stable across Rust versions, unlike `DefaultHasher`.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
