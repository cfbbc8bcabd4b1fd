//! NCCL, the collectives a tensor-parallel group joins its ranks with (the all-reduce after
//! the row-parallel products, the all-gather of vocabulary-parallel logits): cudarc's
//! `nccl` module, loaded at run time as the rest of CUDA is, so that a build needs no NCCL
//! and a machine without it gets an error that says so, not a panic.

use super::GpuError;
use cudarc::driver::{CudaSlice, CudaStream};
use cudarc::nccl::{result, Comm, NcclType, ReduceOp};
use std::fmt;
use std::sync::{Arc, OnceLock};

/// An NCCL version, as `ncclGetVersion` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct NcclVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl NcclVersion {
    /// Decodes `ncclGetVersion`'s code: `major * 10000 + minor * 100 + patch` from 2.9 on,
    /// `major * 1000 + minor * 100 + patch` before.
    pub fn from_code(code: u32) -> NcclVersion {
        let major_unit = if code >= 20900 { 10000 } else { 1000 };
        NcclVersion {
            major: code / major_unit,
            minor: code % major_unit / 100,
            patch: code % 100,
        }
    }
}

impl fmt::Display for NcclVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The NCCL library this process can load, or why it has none (looked for once).
pub fn nccl_version() -> Result<NcclVersion, GpuError> {
    static FOUND: OnceLock<Result<NcclVersion, String>> = OnceLock::new();
    FOUND.get_or_init(load).clone().map_err(GpuError::NoNccl)
}

/// Opens NCCL and asks its version, or says why it cannot.
fn load() -> Result<NcclVersion, String> {
    // cudarc panics where it cannot open the library: look for it first.
    // SAFETY: only tries to open the library by its known names.
    if !unsafe { cudarc::nccl::sys::is_culib_present() } {
        return Err(
            "no libnccl.so could be opened (NCCL's runtime package installs \
             libnccl.so.2 alone: install its development package, libnccl-dev, or put a \
             folder holding a libnccl.so link to libnccl.so.2 on LD_LIBRARY_PATH)"
                .into(),
        );
    }
    let code = std::panic::catch_unwind(result::get_nccl_version)
        .map_err(|_| "the libnccl.so found failed to load".to_string())?
        .map_err(|e| format!("ncclGetVersion failed: {e:?}"))?;
    Ok(NcclVersion::from_code(code.max(0) as u32))
}

/// One rank's communicator in a group of this process's GPUs; its collectives queue on
/// its rank's stream (and so can be captured into that stream's graphs).
pub struct RankComm {
    comm: Comm,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a time, which
// `RankComm`'s owner (one runner thread per rank) guarantees; cudarc's `Comm` is not `Send`
// only because it holds the communicator as a raw pointer.
unsafe impl Send for RankComm {}

/// One communicator per stream (`ncclCommInitAll`): rank `i` on `streams[i]`'s device, its
/// collectives queued on that stream. NCCL refuses two ranks on one GPU.
pub fn group(streams: Vec<Arc<CudaStream>>) -> Result<Vec<RankComm>, GpuError> {
    nccl_version()?;
    let comms = Comm::from_devices(streams)
        .map_err(|e| GpuError::Nccl(format!("ncclCommInitAll: {e:?}")))?;
    Ok(comms.into_iter().map(|comm| RankComm { comm }).collect())
}

/// Queues the collectives `queue` issues as one NCCL group (`ncclGroupStart` /
/// `ncclGroupEnd`), as a thread that drives more than one rank must: each rank's call
/// would otherwise wait for the others'.
pub fn grouped<R>(queue: impl FnOnce() -> Result<R, GpuError>) -> Result<R, GpuError> {
    nccl_version()?;
    result::group_start().map_err(|e| GpuError::Nccl(format!("ncclGroupStart: {e:?}")))?;
    let queued = queue();
    // The group ends whatever happened, so that later calls are not grouped with it.
    let ended = result::group_end().map_err(|e| GpuError::Nccl(format!("ncclGroupEnd: {e:?}")));
    let queued = queued?;
    ended?;
    Ok(queued)
}

impl RankComm {
    /// This communicator's rank.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// The ranks in its group.
    pub fn size(&self) -> usize {
        self.comm.world_size()
    }

    /// Sums `buf` over the group's ranks, in place, on the rank's stream.
    pub fn all_reduce_sum<T: NcclType>(&self, buf: &mut CudaSlice<T>) -> Result<(), GpuError> {
        self.comm
            .all_reduce_in_place(buf, &ReduceOp::Sum)
            .map(drop)
            .map_err(|e| GpuError::Nccl(format!("ncclAllReduce: {e:?}")))
    }

    /// Gathers every rank's `send` into `recv`, rank after rank, on the rank's stream:
    /// `recv` holds the group's size times `send`'s length.
    pub fn all_gather<T: NcclType>(
        &self,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
    ) -> Result<(), GpuError> {
        if recv.len() != send.len() * self.size() {
            return Err(GpuError::Nccl(format!(
                "an all-gather of {} elements from each of {} ranks into {}",
                send.len(),
                self.size(),
                recv.len()
            )));
        }
        self.comm
            .all_gather(send, recv)
            .map(drop)
            .map_err(|e| GpuError::Nccl(format!("ncclAllGather: {e:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_codes_decode_before_and_after_2_9() {
        let v = NcclVersion::from_code(22703);
        assert_eq!((v.major, v.minor, v.patch), (2, 27, 3));
        assert_eq!(v.to_string(), "2.27.3");
        assert_eq!(NcclVersion::from_code(2804).to_string(), "2.8.4");
        assert!(NcclVersion::from_code(2804) < NcclVersion::from_code(21003));
    }

    #[test]
    fn a_machine_without_nccl_gets_an_error_that_says_how_to_provide_it() {
        // SAFETY: only tries to open the library by its known names.
        let present = unsafe { cudarc::nccl::sys::is_culib_present() };
        match (present, nccl_version()) {
            (true, Ok(version)) => assert!(version.major >= 2, "NCCL {version}"),
            (false, Err(e)) => {
                let text = e.to_string();
                assert!(
                    text.starts_with("NCCL cannot be used: no libnccl.so could be opened")
                        && text.contains("LD_LIBRARY_PATH"),
                    "{text}"
                );
                // Grouping collectives asks for the library first rather than panicking.
                let grouped = grouped(|| Ok(())).unwrap_err().to_string();
                assert_eq!(grouped, text);
            }
            (present, got) => panic!("library present: {present}, version: {got:?}"),
        }
    }
}
