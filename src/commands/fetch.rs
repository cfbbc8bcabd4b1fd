//! `peregrine fetch NAME`.

use crate::cli::FetchArgs;
use peregrine_models::fetch::{default_cache_dir, fetch_model};

/// Fetches a known model into the cache and prints its directory.
pub fn run(args: FetchArgs) -> anyhow::Result<()> {
    let dir = fetch_model(&args.name, &default_cache_dir(args.cache_dir.as_deref())?)?;
    println!("{}", dir.display());
    Ok(())
}
