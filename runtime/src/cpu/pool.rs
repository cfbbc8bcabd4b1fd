//! Pooled host buffers with identities, recycled by size like a caching device allocator.

use bytemuck::Pod;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The 32-bit word freed storage is filled with in poisoning builds: a NaN as `f32`, an
/// id past any vocabulary or pool as `u32`, a slot past any pool as `i64`.
pub const POISON_WORD: u32 = 0x7FBA_DBAD;

/// Whether freed (and fresh) storage is poisoned in this build.
const POISONING: bool = cfg!(any(test, feature = "poison"));

/// Memory: 8-byte words, so that every element type up to 8 bytes views it aligned.
type Storage = RwLock<Vec<u64>>;

/// A buffer's identity, unique over the process's lifetime (storage is reused, ids never).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferId(pub u64);

/// Freed storage by word count, and the id counter; a measuring pool only counts.
#[derive(Default)]
struct Shared {
    free: Mutex<HashMap<usize, Vec<Arc<Storage>>>>,
    next_id: AtomicU64,
    measuring: bool,
    measured_words: AtomicU64,
}

/// A caching allocator of host buffers; clones share one pool.
#[derive(Clone, Default)]
pub struct BufferPool {
    shared: Arc<Shared>,
}

/// The owning part of a buffer: when the last handle drops, its storage goes back to the
/// pool (poisoned first in poisoning builds).
struct Owned {
    id: BufferId,
    words: usize,
    storage: Arc<Storage>,
    pool: Arc<Shared>,
}

/// An owning handle of a buffer of `len` elements of `T`; clones share the buffer, which
/// returns to its pool when the last handle drops.
pub struct CpuBuffer<T> {
    owned: Arc<Owned>,
    len: usize,
    _elem: PhantomData<fn() -> T>,
}

/// An owning, type-erased handle of a buffer: what a recorded op keeps of each buffer it
/// touches.
#[derive(Clone)]
pub struct BufferHandle(Arc<Owned>);

/// Read access to a buffer's elements.
pub struct ReadGuard<'a, T> {
    guard: RwLockReadGuard<'a, Vec<u64>>,
    len: usize,
    _elem: PhantomData<T>,
}

/// Write access to a buffer's elements.
pub struct WriteGuard<'a, T> {
    guard: RwLockWriteGuard<'a, Vec<u64>>,
    len: usize,
    _elem: PhantomData<T>,
}

fn poison(words: &mut [u64]) {
    let word = (POISON_WORD as u64) << 32 | POISON_WORD as u64;
    words.fill(word);
}

impl BufferPool {
    /// A new, empty pool.
    pub fn new() -> BufferPool {
        BufferPool::default()
    }

    /// A pool that allocates nothing and only adds up what it is asked for
    /// ([`BufferPool::measured_bytes`]): building a model's buffers from it tells what they
    /// would take before any is allocated. Its buffers have no storage: never read or
    /// write them.
    pub fn measuring() -> BufferPool {
        BufferPool {
            shared: Arc::new(Shared {
                measuring: true,
                ..Shared::default()
            }),
        }
    }

    /// The bytes a measuring pool was asked for (0 for an allocating pool).
    pub fn measured_bytes(&self) -> u64 {
        self.shared.measured_words.load(Ordering::Relaxed) * 8
    }

    /// A buffer of `len` elements of `T`, on freed storage of the same size when the pool
    /// holds some. Its contents are unspecified (poison in poisoning builds, zeros or a
    /// freed buffer's data otherwise): write before reading.
    pub fn alloc<T: Pod>(&self, len: usize) -> CpuBuffer<T> {
        let words = len.saturating_mul(std::mem::size_of::<T>()).div_ceil(8);
        if self.shared.measuring {
            self.shared
                .measured_words
                .fetch_add(words as u64, Ordering::Relaxed);
            return self.buffer(words, len, Arc::new(RwLock::new(Vec::new())));
        }
        let reused = self
            .shared
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(&words)
            .and_then(Vec::pop);
        let storage = reused.unwrap_or_else(|| {
            let mut fresh = vec![0u64; words];
            if POISONING {
                poison(&mut fresh);
            }
            Arc::new(RwLock::new(fresh))
        });
        self.buffer(words, len, storage)
    }

    /// A new handle of `len` elements on `storage` of `words` words.
    fn buffer<T: Pod>(&self, words: usize, len: usize, storage: Arc<Storage>) -> CpuBuffer<T> {
        let id = BufferId(self.shared.next_id.fetch_add(1, Ordering::Relaxed));
        CpuBuffer {
            owned: Arc::new(Owned {
                id,
                words,
                storage,
                pool: self.shared.clone(),
            }),
            len,
            _elem: PhantomData,
        }
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice<T: Pod>(&self, data: &[T]) -> CpuBuffer<T> {
        let buffer = self.alloc(data.len());
        buffer.write().copy_from_slice(data);
        buffer
    }

    /// Freed buffers the pool holds for reuse.
    pub fn free_buffers(&self) -> usize {
        let free = self
            .shared
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        free.values().map(Vec::len).sum()
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        if self.pool.measuring {
            return;
        }
        if POISONING {
            let mut words = self.storage.write().unwrap_or_else(PoisonError::into_inner);
            poison(&mut words);
        }
        self.pool
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(self.words)
            .or_default()
            .push(self.storage.clone());
    }
}

impl<T> Clone for CpuBuffer<T> {
    fn clone(&self) -> Self {
        CpuBuffer {
            owned: self.owned.clone(),
            len: self.len,
            _elem: PhantomData,
        }
    }
}

impl<T: Pod> CpuBuffer<T> {
    /// The buffer's identity.
    pub fn id(&self) -> BufferId {
        self.owned.id
    }

    /// Elements held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// An owning, type-erased handle of the same buffer.
    pub fn handle(&self) -> BufferHandle {
        BufferHandle(self.owned.clone())
    }

    /// Reads the elements.
    pub fn read(&self) -> ReadGuard<'_, T> {
        ReadGuard {
            guard: self
                .owned
                .storage
                .read()
                .unwrap_or_else(PoisonError::into_inner),
            len: self.len,
            _elem: PhantomData,
        }
    }

    /// Writes the elements. An op that reads and writes one buffer takes only this guard.
    pub fn write(&self) -> WriteGuard<'_, T> {
        WriteGuard {
            guard: self
                .owned
                .storage
                .write()
                .unwrap_or_else(PoisonError::into_inner),
            len: self.len,
            _elem: PhantomData,
        }
    }

    /// The buffer's memory without ownership: what a graph that merely baked in an address
    /// would hold. Only this crate's tests use it, to show that poison catches such a graph.
    #[cfg(test)]
    pub(crate) fn address(&self) -> Arc<RwLock<Vec<u64>>> {
        self.owned.storage.clone()
    }
}

impl BufferHandle {
    /// The buffer's identity.
    pub fn id(&self) -> BufferId {
        self.0.id
    }
}

impl<T: Pod> Deref for ReadGuard<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &bytemuck::cast_slice(&self.guard)[..self.len]
    }
}

impl<T: Pod> Deref for WriteGuard<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &bytemuck::cast_slice(&self.guard)[..self.len]
    }
}

impl<T: Pod> DerefMut for WriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut bytemuck::cast_slice_mut(&mut self.guard)[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_measuring_pool_adds_up_and_allocates_nothing() {
        let pool = BufferPool::measuring();
        let a = pool.alloc::<f32>(3);
        let b = pool.alloc::<u64>(1 << 40);
        assert_eq!(pool.measured_bytes(), 16 + (8 << 40), "whole 8-byte words");
        assert_eq!(a.address().read().unwrap().len(), 0);
        drop((a, b));
        assert_eq!(pool.free_buffers(), 0);
        assert_eq!(BufferPool::new().measured_bytes(), 0);
    }

    #[test]
    fn freed_storage_is_poisoned_and_reused_by_size() {
        let pool = BufferPool::new();
        let a = pool.from_slice(&[1.0f32, 2.0, 3.0, 4.0]);
        let address = a.address();
        let first = a.id();
        drop(a);
        assert_eq!(pool.free_buffers(), 1);
        let words = address.read().unwrap();
        let as_f32: &[f32] = bytemuck::cast_slice(&words);
        assert!(as_f32.iter().all(|x| x.is_nan()), "{as_f32:?}");
        drop(words);
        // The same size takes the freed storage back, under a new identity.
        let b = pool.alloc::<u32>(4);
        assert!(Arc::ptr_eq(&b.address(), &address));
        assert_ne!(b.id(), first);
        assert!(b.read().iter().all(|&x| x == POISON_WORD));
        assert_eq!(pool.free_buffers(), 0);
        // A slot mapping read from freed memory points far past any pool.
        let c = pool.alloc::<i64>(2);
        assert!(c.read().iter().all(|&s| s > 1 << 40));
    }

    #[test]
    fn a_buffer_lives_while_any_handle_does() {
        let pool = BufferPool::new();
        let a = pool.from_slice(&[7u32; 4]);
        let handle = a.handle();
        let clone = a.clone();
        drop(a);
        drop(handle);
        assert_eq!(pool.free_buffers(), 0);
        assert_eq!(*clone.read(), [7; 4]);
        drop(clone);
        assert_eq!(pool.free_buffers(), 1);
    }
}
