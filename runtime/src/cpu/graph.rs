//! A recorded sequence of kernel calls over pooled buffers, replayed in order.

use super::pool::{BufferHandle, BufferId};

/// Why a recorded op refused to run.
pub type OpError = Box<dyn std::error::Error + Send + Sync>;

/// A kernel call as recorded: it runs against the context `C` (memory that outlives every
/// graph, such as the KV cache) and the buffers its closure owns.
type Kernel<C> = Box<dyn Fn(&mut C) -> Result<(), OpError> + Send + Sync>;

/// A replay that stopped at an op, naming it.
#[derive(Debug, thiserror::Error)]
#[error("graph op {index} ({name}): {source}")]
pub struct GraphError {
    /// The op's place in the graph.
    pub index: usize,
    /// The op's name.
    pub name: &'static str,
    /// What it refused.
    pub source: OpError,
}

/// One recorded op: its name, owning handles of the buffers it reads or writes, the call.
struct RecordedOp<C> {
    name: &'static str,
    buffers: Vec<BufferHandle>,
    kernel: Kernel<C>,
}

/// Kernel calls recorded in order with the buffers they touch. Each op owns handles of its
/// buffers (and its closure owns the typed handles it reads through), so none of them
/// returns to the pool while the graph lives. Running a forward eagerly is recording it
/// into a graph, replaying it once and dropping it: one code path for both.
pub struct CpuGraph<C> {
    ops: Vec<RecordedOp<C>>,
}

impl<C> Default for CpuGraph<C> {
    fn default() -> Self {
        CpuGraph { ops: Vec::new() }
    }
}

impl<C> CpuGraph<C> {
    /// An empty graph.
    pub fn new() -> CpuGraph<C> {
        CpuGraph::default()
    }

    /// Records `kernel` under `name`, touching `buffers`.
    pub fn record(
        &mut self,
        name: &'static str,
        buffers: &[BufferHandle],
        kernel: impl Fn(&mut C) -> Result<(), OpError> + Send + Sync + 'static,
    ) {
        self.ops.push(RecordedOp {
            name,
            buffers: buffers.to_vec(),
            kernel: Box::new(kernel),
        });
    }

    /// Runs every op in order against `ctx`, stopping at the first that refuses. The ops
    /// run on a worker of the global thread pool, so the parallel kernels inside them
    /// share their work among the workers directly rather than each waking the pool from
    /// outside (which costs tens of microseconds a kernel on a small machine).
    pub fn replay(&self, ctx: &mut C) -> Result<(), GraphError>
    where
        C: Send,
    {
        rayon::scope(|_| self.replay_here(ctx))
    }

    fn replay_here(&self, ctx: &mut C) -> Result<(), GraphError> {
        for (index, op) in self.ops.iter().enumerate() {
            (op.kernel)(ctx).map_err(|source| GraphError {
                index,
                name: op.name,
                source,
            })?;
        }
        Ok(())
    }

    /// Ops recorded.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Each op's name and the identities of the buffers it touches, in order.
    pub fn ops(&self) -> impl Iterator<Item = (&'static str, Vec<BufferId>)> + '_ {
        self.ops
            .iter()
            .map(|op| (op.name, op.buffers.iter().map(BufferHandle::id).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::BufferPool;

    /// Allocates and frees many buffers of `len` floats, each written with `value`: a
    /// freed buffer's storage is then another's.
    fn churn(pool: &BufferPool, len: usize, value: f32) {
        let held: Vec<_> = (0..16).map(|_| pool.alloc::<f32>(len)).collect();
        held.iter().for_each(|b| b.write().fill(value));
    }

    #[test]
    fn a_graph_owns_its_buffers_through_churn() {
        let pool = BufferPool::new();
        let x = pool.from_slice(&[1.0f32, 2.0, 3.0, 4.0]);
        let y = pool.alloc::<f32>(4);
        let mut graph = CpuGraph::<()>::new();
        let (xr, yr) = (x.clone(), y.clone());
        graph.record("double", &[x.handle(), y.handle()], move |_| {
            let src = xr.read();
            yr.write()
                .iter_mut()
                .zip(src.iter())
                .for_each(|(o, i)| *o = 2.0 * i);
            Ok(())
        });
        let x_id = x.id();
        drop(x);
        churn(&pool, 4, 5.0);
        graph.replay(&mut ()).unwrap();
        assert_eq!(*y.read(), [2.0, 4.0, 6.0, 8.0]);
        let (name, ids) = graph.ops().next().unwrap();
        assert_eq!((name, ids), ("double", vec![x_id, y.id()]));
    }

    #[test]
    fn poison_catches_a_graph_that_kept_only_an_address() {
        // The bug class: a graph baked in the address of a buffer it does not own; the
        // buffer is freed, and the replay reads freed memory.
        let pool = BufferPool::new();
        let x = pool.from_slice(&[1.0f32, 2.0, 3.0, 4.0]);
        let y = pool.alloc::<f32>(4);
        let address = x.address();
        let mut graph = CpuGraph::<()>::new();
        let yr = y.clone();
        graph.record("double", &[y.handle()], move |_| {
            let words = address.read().unwrap();
            let src: &[f32] = bytemuck::cast_slice(&words);
            yr.write()
                .iter_mut()
                .zip(src)
                .for_each(|(o, i)| *o = 2.0 * i);
            Ok(())
        });
        graph.replay(&mut ()).unwrap();
        assert_eq!(*y.read(), [2.0, 4.0, 6.0, 8.0], "fine while x lives");
        drop(x);
        graph.replay(&mut ()).unwrap();
        assert!(y.read().iter().all(|v| v.is_nan()), "{:?}", &*y.read());
    }

    #[test]
    fn a_refusing_op_is_named() {
        let mut graph = CpuGraph::<u32>::new();
        graph.record("count", &[], |n| {
            *n += 1;
            Ok(())
        });
        graph.record("check", &[], |n| {
            if *n > 1 {
                return Err(format!("{n} rows planned for 1").into());
            }
            Ok(())
        });
        let mut n = 0;
        graph.replay(&mut n).unwrap();
        let err = graph.replay(&mut n).unwrap_err();
        assert_eq!(err.to_string(), "graph op 1 (check): 2 rows planned for 1");
        assert_eq!(graph.len(), 2);
    }
}
