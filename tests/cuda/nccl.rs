//! NCCL through `peregrine_runtime::cuda::nccl`, as tensor parallelism will join its ranks:
//! the library loads; a one-rank group's all-gather and all-reduce queue on the rank's
//! stream and replay from a captured graph on fresh inputs into poisoned outputs; and, on a
//! machine with two GPUs or more, every rank gets the sum and the gather of all the ranks'
//! random inputs. Without NCCL each test says so and passes, unless
//! `PEREGRINE_REQUIRE_NCCL` is set (`scripts/gpu_run.sh tests` sets it, having put NCCL
//! where it is found).

use crate::{random_f32, rng, setup};
use peregrine_runtime::cuda::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use peregrine_runtime::cuda::cudarc::driver::CudaSlice;
use peregrine_runtime::cuda::nccl::{group, grouped, nccl_version};
use peregrine_runtime::cuda::{device_count, Gpu};

/// Whether NCCL can be used here; says why not (or fails, where it is required).
fn nccl_present() -> bool {
    match nccl_version() {
        Ok(version) => {
            eprintln!("NCCL {version}");
            true
        }
        Err(e) if std::env::var_os("PEREGRINE_REQUIRE_NCCL").is_some() => {
            panic!("PEREGRINE_REQUIRE_NCCL is set, but {e}")
        }
        Err(e) => {
            eprintln!("skipped: {e}");
            false
        }
    }
}

#[test]
fn a_one_rank_group_gathers_and_sums_from_a_captured_graph() {
    let Some(s) = setup() else {
        return;
    };
    if !nccl_present() {
        return;
    }
    let mut rng = rng("a_one_rank_group_gathers_and_sums_from_a_captured_graph");
    let gpu = &s.gpu;
    let comms = group(vec![gpu.stream().clone()]).unwrap();
    let comm = &comms[0];
    assert_eq!((comm.rank(), comm.size()), (0, 1));
    let n = 4099;
    let mut send = gpu.upload(&random_f32(&mut rng, n, 4.0)).unwrap();
    let mut recv = gpu.upload(&vec![f32::NAN; n]).unwrap();
    let mut sums = gpu.upload(&random_f32(&mut rng, n, 4.0)).unwrap();
    // A gather into the wrong room is refused before anything is queued.
    let mut short = gpu.upload(&vec![0f32; n - 1]).unwrap();
    let err = comm.all_gather(&send, &mut short).unwrap_err().to_string();
    assert!(
        err.contains("4099 elements from each of 1 ranks into 4098"),
        "{err}"
    );
    // Once eagerly (NCCL sets up on its first collective), then captured.
    let queue = |send: &CudaSlice<f32>, recv: &mut CudaSlice<f32>, sums: &mut CudaSlice<f32>| {
        comm.all_gather(send, recv).unwrap();
        comm.all_reduce_sum(sums).unwrap();
    };
    queue(&send, &mut recv, &mut sums);
    gpu.synchronize().unwrap();
    let stream = gpu.stream();
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    queue(&send, &mut recv, &mut sums);
    let graph = stream
        .end_capture(CUgraphInstantiate_flags(0))
        .unwrap()
        .expect("the capture recorded the collectives");
    for round in 0..3 {
        let fresh = random_f32(&mut rng, n, 4.0);
        let summed = random_f32(&mut rng, n, 4.0);
        stream.memcpy_htod(&fresh, &mut send).unwrap();
        stream.memcpy_htod(&summed, &mut sums).unwrap();
        stream.memcpy_htod(&vec![f32::NAN; n], &mut recv).unwrap();
        graph.launch().unwrap();
        // One rank's gather is its own input, and its sum the input itself, bit for bit.
        assert_eq!(gpu.download(&recv).unwrap(), fresh, "round {round}: gather");
        assert_eq!(gpu.download(&sums).unwrap(), summed, "round {round}: sum");
    }
}

#[test]
fn every_rank_gets_the_sum_and_the_gather_of_all_ranks() {
    let Some(_) = setup() else {
        return;
    };
    let gpus = device_count().unwrap();
    if gpus < 2 {
        eprintln!("skipped: {gpus} GPU (a group of ranks needs two or more)");
        return;
    }
    if !nccl_present() {
        return;
    }
    let mut rng = rng("every_rank_gets_the_sum_and_the_gather_of_all_ranks");
    let devices: Vec<Gpu> = (0..gpus).map(|i| Gpu::open(i).unwrap()).collect();
    let comms = group(devices.iter().map(|g| g.stream().clone()).collect()).unwrap();
    let n = 10_007;
    let inputs: Vec<Vec<f32>> = (0..gpus).map(|_| random_f32(&mut rng, n, 4.0)).collect();
    let mut sums: Vec<_> = devices
        .iter()
        .zip(&inputs)
        .map(|(g, x)| g.upload(x).unwrap())
        .collect();
    let sends: Vec<_> = devices
        .iter()
        .zip(&inputs)
        .map(|(g, x)| g.upload(x).unwrap())
        .collect();
    let mut gathers: Vec<_> = devices
        .iter()
        .map(|g| g.upload(&vec![f32::NAN; n * gpus]).unwrap())
        .collect();
    grouped(|| {
        for (((comm, sum), send), gather) in
            comms.iter().zip(&mut sums).zip(&sends).zip(&mut gathers)
        {
            comm.all_reduce_sum(sum)?;
            comm.all_gather(send, gather)?;
        }
        Ok(())
    })
    .unwrap();
    let want_sum: Vec<f64> = (0..n)
        .map(|i| inputs.iter().map(|x| x[i] as f64).sum())
        .collect();
    let want_gather = inputs.concat();
    for (rank, g) in devices.iter().enumerate() {
        g.synchronize().unwrap();
        let got = g.download(&sums[rank]).unwrap();
        for (i, (&got, &want)) in got.iter().zip(&want_sum).enumerate() {
            // f32 sums of up to 8 values within [-32, 32]: a few ulps of 32.
            assert!(
                (got as f64 - want).abs() <= 1e-5,
                "rank {rank}, element {i}: {got} against {want}"
            );
        }
        assert_eq!(
            g.download(&gathers[rank]).unwrap(),
            want_gather,
            "rank {rank}"
        );
    }
    eprintln!(
        "{gpus} ranks: {n} sums and gathers of {} elements each",
        n * gpus
    );
}
