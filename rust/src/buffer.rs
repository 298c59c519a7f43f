//! Fixed-capacity, page-aligned host buffers that Python views zero-copy.
//!
//! A buffer is allocated once, aligned to and sized in whole pages, and never reallocated: a
//! DLPack view handed to torch stays valid for the buffer's life, and CUDA can register
//! (pin) it once without sharing a page with another allocation. Torch aliases the memory, so
//! Rust reads and writes it only through raw pointers, never through long-lived `&mut` slices.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::marker::PhantomData;
use std::ptr::NonNull;

/// Page size used for alignment and rounding (4 KiB, the x86-64 and common aarch64 page).
pub const PAGE_SIZE: usize = 4096;

/// Element types a host buffer may hold; all plain old data with a DLPack type code.
pub trait Element: Copy + Send + Sync + 'static {
    /// DLPack type code (0 int, 1 uint, 2 float) and bit width.
    const DLPACK_CODE: u8;
    const BITS: u8;
}

impl Element for f32 {
    const DLPACK_CODE: u8 = 2;
    const BITS: u8 = 32;
}
impl Element for i32 {
    const DLPACK_CODE: u8 = 0;
    const BITS: u8 = 32;
}
impl Element for i64 {
    const DLPACK_CODE: u8 = 0;
    const BITS: u8 = 64;
}
impl Element for u8 {
    const DLPACK_CODE: u8 = 1;
    const BITS: u8 = 8;
}

/// A fixed-length array of `T` in its own page-aligned, page-multiple allocation.
pub struct HostBuffer<T: Element> {
    ptr: NonNull<T>,
    len: usize,
    layout: Layout,
    _marker: PhantomData<T>,
}

// SAFETY: the buffer is plain memory with no thread affinity. Concurrent access is prevented by
// its owners (tables are mutated only through `&mut self`); torch reads it on the caller's thread.
unsafe impl<T: Element> Send for HostBuffer<T> {}
unsafe impl<T: Element> Sync for HostBuffer<T> {}

impl<T: Element> HostBuffer<T> {
    /// Allocates `len` elements (at least one page) and fills them with `value`.
    pub fn new(len: usize, value: T) -> Self {
        let bytes = (len.max(1) * std::mem::size_of::<T>()).div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let layout = Layout::from_size_align(bytes, PAGE_SIZE).expect("buffer layout overflow");
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc_zeroed(layout) } as *mut T;
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        let buf = HostBuffer {
            ptr,
            len,
            layout,
            _marker: PhantomData,
        };
        buf.fill(0, len, value);
        buf
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes allocated (a whole number of pages): the range to register with CUDA.
    pub fn nbytes(&self) -> usize {
        self.layout.size()
    }

    pub fn as_ptr(&self) -> *mut T {
        self.ptr.as_ptr()
    }

    #[inline]
    pub fn get(&self, i: usize) -> T {
        assert!(
            i < self.len,
            "HostBuffer index {i} out of bounds {}",
            self.len
        );
        // SAFETY: in bounds; the memory is initialised at construction.
        unsafe { self.ptr.as_ptr().add(i).read() }
    }

    /// Writes one element. Takes `&self` because the memory is shared with torch views; the
    /// owning table serialises writers through its own `&mut self`.
    #[inline]
    pub fn set(&self, i: usize, value: T) {
        assert!(
            i < self.len,
            "HostBuffer index {i} out of bounds {}",
            self.len
        );
        // SAFETY: in bounds.
        unsafe { self.ptr.as_ptr().add(i).write(value) }
    }

    /// Fills `[start, end)` with `value`.
    pub fn fill(&self, start: usize, end: usize, value: T) {
        assert!(start <= end && end <= self.len);
        for i in start..end {
            // SAFETY: in bounds (checked above).
            unsafe { self.ptr.as_ptr().add(i).write(value) }
        }
    }

    /// A snapshot copy of the first `n` elements (tests and debugging).
    pub fn to_vec(&self, n: usize) -> Vec<T> {
        (0..n.min(self.len)).map(|i| self.get(i)).collect()
    }
}

impl<T: Element> Drop for HostBuffer<T> {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr.as_ptr() as *mut u8, self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_aligned_and_filled() {
        let b = HostBuffer::<f32>::new(10, 1.5);
        assert_eq!(b.as_ptr() as usize % PAGE_SIZE, 0);
        assert_eq!(b.nbytes(), PAGE_SIZE);
        assert_eq!(b.to_vec(10), vec![1.5; 10]);
        b.set(3, 2.0);
        assert_eq!(b.get(3), 2.0);
        let big = HostBuffer::<i64>::new(1025, 0);
        assert_eq!(big.nbytes(), 3 * PAGE_SIZE);
    }
}
