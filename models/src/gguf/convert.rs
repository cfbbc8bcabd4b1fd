//! `convert_gguf`: a GGUF Llama file to a Hugging Face model folder, written atomically.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;
use safetensors::{Dtype, View};

use super::hf_config::LlamaConfig;
use super::names::{self, Permuted, OUTPUT};
use super::permute::{check_permutable, unpermute_rows};
use super::reader::{supported_list, GgufFile, TensorInfo};
use super::tokenizer;
use super::types::GgmlType;
use crate::progress;
use peregrine_kernels::cpu::quant::BlockFormat;

/// Converts the GGUF file at `gguf_path` into a Hugging Face folder `out_dir` holding
/// `config.json`, `model.safetensors` (quantized tensors dequantized to F32; F32, F16 and
/// BF16 tensors kept as they are), `tokenizer.json` and `tokenizer_config.json`.
///
/// The folder is written beside `out_dir` under a temporary name and renamed at the end, so
/// a failed conversion leaves nothing behind. `out_dir` must not exist or be empty.
pub fn convert_gguf(gguf_path: &Path, out_dir: &Path) -> Result<()> {
    write_folder(gguf_path, out_dir, None)
}

/// How [`import_gguf`] puts the GGUF file into the folder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Moved in (the file was a temporary one); copied if it cannot be moved.
    Move,
    /// Hard-linked, else symbolically linked, else copied (the user's file stays).
    Link,
}

/// Like [`convert_gguf`], but the weights stay in the GGUF file: the folder holds
/// `config.json`, the tokenizer files and `model.gguf` (the file itself, placed as
/// `placement` says), which the loader reads as it is stored.
pub fn import_gguf(gguf_path: &Path, out_dir: &Path, placement: Placement) -> Result<()> {
    write_folder(gguf_path, out_dir, Some(placement))
}

/// Puts `src` at `dest` as `placement` says.
fn place(src: &Path, dest: &Path, placement: Placement) -> std::io::Result<()> {
    let linked = match placement {
        Placement::Move => fs::rename(src, dest),
        Placement::Link => fs::hard_link(src, dest).or_else(|e| symlink(src, dest).map_err(|_| e)),
    };
    linked.or_else(|_| fs::copy(src, dest).map(|_| ()))
}

#[cfg(unix)]
fn symlink(src: &Path, dest: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(fs::canonicalize(src)?, dest)
}

#[cfg(not(unix))]
fn symlink(_: &Path, _: &Path) -> std::io::Result<()> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// The folder of [`convert_gguf`] (`placement` `None`: weights to safetensors) or
/// [`import_gguf`].
fn write_folder(gguf_path: &Path, out_dir: &Path, placement: Option<Placement>) -> Result<()> {
    let safetensors = placement.is_none();
    let file = GgufFile::open(gguf_path)?;
    let config = LlamaConfig::from_gguf(&file)?;
    let tensors = plan(&file, &config)?;
    let tok = tokenizer::build(&file, config.vocab_size, config.max_position_embeddings)?;
    let total = tensors.iter().map(|(_, t)| t.data_len() as u64).sum();
    let bar = progress::bytes_bar(if safetensors { total } else { 0 }, "converting");
    let tensors: Vec<_> = tensors
        .into_iter()
        .map(|(name, tensor)| {
            let tracked = Tracked {
                name: name.clone(),
                tensor,
                bar: &bar,
            };
            (name, tracked)
        })
        .collect();
    let count = tensors.len();
    write_atomically(out_dir, |dir| {
        write_json(&dir.join("config.json"), &config.to_json())?;
        write_json(&dir.join("tokenizer_config.json"), &tok.config)?;
        tok.tokenizer
            .save(dir.join("tokenizer.json"), true)
            .map_err(|e| anyhow::anyhow!("writing tokenizer.json: {e}"))?;
        if let Some(placement) = placement {
            return place(gguf_path, &dir.join(super::GGUF_WEIGHTS), placement)
                .with_context(|| format!("placing {} in the folder", gguf_path.display()));
        }
        safetensors::serialize_to_file(tensors, None, &dir.join("model.safetensors"))
            .context("writing model.safetensors")
    })
    .with_context(|| {
        format!(
            "converting {} to {}",
            gguf_path.display(),
            out_dir.display()
        )
    })?;
    let done = if safetensors {
        format!("converted {count} tensors")
    } else {
        format!("imported {count} tensors as they are stored")
    };
    progress::finish(&bar, &done);
    Ok(())
}

/// Where an output tensor's bytes come from.
enum Source<'a> {
    /// Stored in the output dtype already.
    Raw(&'a [u8]),
    /// Block-quantized; decoded to F32.
    Quantized(BlockFormat, &'a [u8]),
}

/// One tensor of `model.safetensors`, decoded only when written.
struct OutTensor<'a> {
    dtype: Dtype,
    shape: Vec<usize>,
    source: Source<'a>,
    /// `Some(n_heads)` for rows permuted by llama.cpp.
    unpermute_heads: Option<usize>,
}

impl View for OutTensor<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        let bytes = match self.source {
            Source::Raw(b) => Cow::Borrowed(b),
            Source::Quantized(format, b) => {
                let mut values =
                    vec![0.0f32; b.len() / format.block_bytes() * format.block_elems()];
                format.dequantize(b, &mut values);
                Cow::Owned(values.iter().flat_map(|x| x.to_le_bytes()).collect())
            }
        };
        match self.unpermute_heads {
            Some(heads) => Cow::Owned(unpermute_rows(&bytes, self.shape[0], heads)),
            None => bytes,
        }
    }

    fn data_len(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.bitsize() / 8
    }
}

/// An output tensor that moves the conversion's bar on by its bytes once they are made.
struct Tracked<'a> {
    name: String,
    tensor: OutTensor<'a>,
    bar: &'a ProgressBar,
}

impl View for Tracked<'_> {
    fn dtype(&self) -> Dtype {
        self.tensor.dtype()
    }

    fn shape(&self) -> &[usize] {
        self.tensor.shape()
    }

    fn data(&self) -> Cow<'_, [u8]> {
        self.bar.set_message(self.name.clone());
        let data = self.tensor.data();
        self.bar.inc(self.tensor.data_len() as u64);
        data
    }

    fn data_len(&self) -> usize {
        self.tensor.data_len()
    }
}

/// Checks every tensor (name, shape, type) and describes its output; nothing is decoded yet.
fn plan<'a>(file: &'a GgufFile, config: &LlamaConfig) -> Result<Vec<(String, OutTensor<'a>)>> {
    let required: BTreeSet<String> = names::required(config.num_layers).into_iter().collect();
    let mut out = Vec::with_capacity(file.tensors().len());
    for info in file.tensors() {
        let known = required.contains(&info.name) || info.name == OUTPUT;
        let (Some((hf, permuted)), true) = (names::hf_name(&info.name), known) else {
            bail!(
                "GGUF tensor '{}' is not part of a {}-layer Llama model",
                info.name,
                config.num_layers
            );
        };
        let shape = info.hf_shape();
        if config.expected_shape(&info.name).as_ref() != Some(&shape) {
            bail!(
                "tensor '{}' has shape {shape:?}, but the config implies {:?}",
                info.name,
                config.expected_shape(&info.name).unwrap_or_default()
            );
        }
        let unpermute_heads = match permuted {
            Permuted::No => None,
            Permuted::Query => Some(config.num_heads),
            Permuted::Key => Some(config.num_kv_heads),
        };
        if let Some(heads) = unpermute_heads {
            check_permutable(&info.name, shape[0], heads)?;
        }
        let (dtype, source) = source(file, info)?;
        out.push((
            hf,
            OutTensor {
                dtype,
                shape,
                source,
                unpermute_heads,
            },
        ));
    }
    if let Some(missing) = required.iter().find(|n| file.tensor(n).is_none()) {
        bail!("GGUF has no tensor '{missing}'");
    }
    Ok(out)
}

/// The output dtype and the source bytes of `info`; an error naming the tensor and its type
/// for types Peregrine cannot read.
fn source<'a>(file: &'a GgufFile, info: &TensorInfo) -> Result<(Dtype, Source<'a>)> {
    let dtype = match info.ggml_type {
        GgmlType::F32 => Dtype::F32,
        GgmlType::F16 => Dtype::F16,
        GgmlType::BF16 => Dtype::BF16,
        ty => match ty.block_format() {
            Some(q) => return Ok((Dtype::F32, Source::Quantized(q, file.tensor_bytes(info)?))),
            None => bail!(
                "tensor '{}' has type {ty}, which Peregrine cannot convert (supported: {})",
                info.name,
                supported_list()
            ),
        },
    };
    Ok((dtype, Source::Raw(file.tensor_bytes(info)?)))
}

fn write_json(path: &Path, value: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

/// Runs `write` on a fresh temporary folder beside `out_dir`, then renames it to `out_dir`.
fn write_atomically(out_dir: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let occupied = match fs::read_dir(out_dir) {
        Ok(mut entries) => entries.next().is_some(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(e).with_context(|| format!("reading {}", out_dir.display())),
    };
    if occupied {
        bail!(
            "output directory {} already exists and is not empty",
            out_dir.display()
        );
    }
    let name = out_dir
        .file_name()
        .with_context(|| format!("output path {} has no folder name", out_dir.display()))?;
    let parent = match out_dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.partial-", name.to_string_lossy()))
        .tempdir_in(parent)
        .with_context(|| format!("creating a temporary folder in {}", parent.display()))?;
    write(tmp.path())?;
    let kept = tmp.keep();
    // An empty `out_dir` is replaced; `rename` onto an empty folder is not portable.
    let renamed = match fs::remove_dir(out_dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => fs::rename(&kept, out_dir),
    };
    if let Err(e) = renamed {
        // Best effort: the error that matters is the rename's.
        let _ = fs::remove_dir_all(&kept);
        return Err(e)
            .with_context(|| format!("moving the converted model to {}", out_dir.display()));
    }
    Ok(())
}
