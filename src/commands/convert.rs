//! `peregrine convert FILE.gguf OUT_DIR`.

use crate::cli::ConvertArgs;
use peregrine_models::gguf::convert_gguf;

/// Converts the GGUF file into a Hugging Face directory.
pub fn run(args: ConvertArgs) -> anyhow::Result<()> {
    convert_gguf(&args.gguf, &args.out_dir)?;
    eprintln!("wrote {}", args.out_dir.display());
    Ok(())
}
