//! Fixed-capacity, page-aligned host buffers that Python views zero-copy.
//!
//! A buffer is allocated once, aligned to and sized in whole pages, and never reallocated: a
//! DLPack view handed to torch stays valid for the buffer's life. Writes take `&mut self`, so
//! only the buffer's one owner (a table) can change it from safe Rust; what others get is a
//! [`SharedBuffer`], a read-only handle that keeps the memory alive (torch views and staging
//! copies read through it).
//!
//! Each buffer records the element range written since the last [`HostBuffer::take_dirty`], so
//! the pipeline can upload exactly what changed (see `arena.rs`).

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{Error, Result};

/// Page size used for alignment and rounding (4 KiB, the x86-64 and common aarch64 page).
pub const PAGE_SIZE: usize = 4096;

/// Element types a host buffer may hold; all plain old data with a DLPack type code.
pub trait Element: Copy + Send + Sync + PartialEq + 'static {
    /// DLPack type code (0 int, 1 uint, 2 float) and bit width.
    const DLPACK_CODE: u8;
    const BITS: u8;
    /// Whether this value is all-zero bytes (a fresh zeroed allocation already holds it).
    fn is_zero_bits(&self) -> bool;
}

macro_rules! element {
    ($t:ty, $code:expr, $bits:expr) => {
        impl Element for $t {
            const DLPACK_CODE: u8 = $code;
            const BITS: u8 = $bits;
            fn is_zero_bits(&self) -> bool {
                self.to_bits_u64() == 0
            }
        }
    };
}

/// Bit pattern of a value, for the zero test above.
trait ToBits {
    fn to_bits_u64(&self) -> u64;
}
impl ToBits for f32 {
    fn to_bits_u64(&self) -> u64 {
        self.to_bits() as u64
    }
}
impl ToBits for i32 {
    fn to_bits_u64(&self) -> u64 {
        *self as u32 as u64
    }
}
impl ToBits for i64 {
    fn to_bits_u64(&self) -> u64 {
        *self as u64
    }
}
impl ToBits for u8 {
    fn to_bits_u64(&self) -> u64 {
        *self as u64
    }
}

element!(f32, 2, 32);
element!(i32, 0, 32);
element!(i64, 0, 64);
element!(u8, 1, 8);

/// One page-aligned allocation; frees itself when the last owner (buffer or view) goes.
pub(crate) struct RawAlloc {
    /// The page-aligned start handed out.
    ptr: NonNull<u8>,
    /// Bytes from `ptr`: a whole number of pages.
    size: usize,
    /// What the allocator returned, and with which layout (for `dealloc`).
    base: NonNull<u8>,
    layout: Layout,
}

// SAFETY: plain memory with no thread affinity; `RawAlloc` itself offers no access to it.
unsafe impl Send for RawAlloc {}
unsafe impl Sync for RawAlloc {}

impl RawAlloc {
    /// `bytes` rounded up to whole pages (at least one), zeroed and page-aligned. An allocation
    /// failure is an error, not an abort.
    ///
    /// The allocation asks for the allocator's natural alignment and one page more, then starts
    /// at the first page boundary inside it: a zeroed request with the natural alignment is a
    /// `calloc`, whose large blocks are fresh pages mapped on first touch, so a big table costs
    /// no memory until written. (A zeroed request for page alignment is zero-filled by hand,
    /// touching every page at construction.)
    pub(crate) fn zeroed(bytes: usize, field: &'static str) -> Result<Self> {
        let too_large = || Error::TooLarge {
            field,
            value: bytes,
            max: isize::MAX as usize,
        };
        let size = bytes
            .max(1)
            .checked_next_multiple_of(PAGE_SIZE)
            .ok_or_else(too_large)?;
        let total = size.checked_add(PAGE_SIZE).ok_or_else(too_large)?;
        let layout = Layout::from_size_align(total, 16).map_err(|_| too_large())?;
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let base = NonNull::new(raw).ok_or(Error::OutOfMemory { field, bytes })?;
        let offset = (PAGE_SIZE - (raw as usize) % PAGE_SIZE) % PAGE_SIZE;
        // SAFETY: `offset < PAGE_SIZE`, so `[offset, offset + size)` lies inside the `total` bytes
        // allocated.
        let ptr = unsafe { NonNull::new_unchecked(raw.add(offset)) };
        Ok(RawAlloc {
            ptr,
            size,
            base,
            layout,
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn nbytes(&self) -> usize {
        self.size
    }
}

impl Drop for RawAlloc {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { dealloc(self.base.as_ptr(), self.layout) }
    }
}

/// A fixed-length array of `T` in its own page-aligned, page-multiple allocation.
pub struct HostBuffer<T: Element> {
    alloc: Arc<RawAlloc>,
    len: usize,
    /// Elements `[dirty_lo, dirty_hi)` were written since the last `take_dirty`.
    dirty_lo: usize,
    dirty_hi: usize,
    _marker: PhantomData<T>,
}

impl<T: Element> HostBuffer<T> {
    /// Allocates `len` elements (at least one page) holding `value`. Only a non-zero `value`
    /// is written; a zero one is what the fresh allocation already holds.
    pub fn new(len: usize, value: T) -> Self {
        Self::try_new(len, value, "buffer").unwrap_or_else(|e| panic!("{e}"))
    }

    /// As [`new`](Self::new), but an impossible size or a failed allocation is an error.
    pub fn try_new(len: usize, value: T, field: &'static str) -> Result<Self> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or(Error::TooLarge {
                field,
                value: len,
                max: isize::MAX as usize / std::mem::size_of::<T>(),
            })?;
        let mut buf = HostBuffer {
            alloc: Arc::new(RawAlloc::zeroed(bytes, field)?),
            len,
            dirty_lo: 0,
            dirty_hi: 0,
            _marker: PhantomData,
        };
        if !value.is_zero_bits() {
            buf.fill(0, len, value);
        }
        buf.dirty_lo = 0;
        buf.dirty_hi = 0;
        Ok(buf)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes allocated (a whole number of pages).
    pub fn nbytes(&self) -> usize {
        self.alloc.nbytes()
    }

    /// Bytes that hold elements (`len × size_of::<T>()`).
    pub fn byte_len(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// The first `n` elements (at most `len`) as a slice, for reading in a loop.
    pub fn prefix(&self, n: usize) -> &[T] {
        let n = n.min(self.len);
        // SAFETY: in bounds; initialised at construction; `&self` keeps writers out.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), n) }
    }

    pub fn as_ptr(&self) -> *const T {
        self.alloc.as_ptr() as *const T
    }

    #[inline]
    pub fn get(&self, i: usize) -> T {
        assert!(
            i < self.len,
            "HostBuffer index {i} out of bounds {}",
            self.len
        );
        // SAFETY: in bounds; the memory is initialised (zeroed or filled) at construction.
        unsafe { self.as_ptr().add(i).read() }
    }

    #[inline]
    fn mark(&mut self, start: usize, end: usize) {
        if self.dirty_lo == self.dirty_hi {
            self.dirty_lo = start;
            self.dirty_hi = end;
        } else {
            self.dirty_lo = self.dirty_lo.min(start);
            self.dirty_hi = self.dirty_hi.max(end);
        }
    }

    /// Writes one element.
    #[inline]
    pub fn set(&mut self, i: usize, value: T) {
        assert!(
            i < self.len,
            "HostBuffer index {i} out of bounds {}",
            self.len
        );
        // SAFETY: in bounds; `&mut self` makes this owner the only writer from Rust.
        unsafe { (self.alloc.as_ptr() as *mut T).add(i).write(value) }
        self.mark(i, i + 1);
    }

    /// Fills `[start, end)` with `value`.
    pub fn fill(&mut self, start: usize, end: usize, value: T) {
        assert!(start <= end && end <= self.len);
        if start == end {
            return;
        }
        let base = self.alloc.as_ptr() as *mut T;
        for i in start..end {
            // SAFETY: in bounds (checked above).
            unsafe { base.add(i).write(value) }
        }
        self.mark(start, end);
    }

    /// Writes `values` at `[start, start + values.len())`.
    pub fn write(&mut self, start: usize, values: &[T]) {
        let end = start + values.len();
        assert!(end <= self.len);
        if start == end {
            return;
        }
        // SAFETY: in bounds (checked above); `values` is a Rust slice, so it cannot overlap
        // this buffer's memory while `&mut self` is held.
        unsafe {
            std::ptr::copy_nonoverlapping(
                values.as_ptr(),
                (self.alloc.as_ptr() as *mut T).add(start),
                values.len(),
            )
        }
        self.mark(start, end);
    }

    /// Moves elements `[src, src + n)` to `[dst, dst + n)` (the ranges may overlap).
    pub fn copy_within(&mut self, src: usize, dst: usize, n: usize) {
        assert!(src.max(dst) + n <= self.len);
        if n == 0 || src == dst {
            return;
        }
        let base = self.alloc.as_ptr() as *mut T;
        // SAFETY: both ranges are in bounds (checked above); `ptr::copy` allows overlap.
        unsafe { std::ptr::copy(base.add(src), base.add(dst), n) }
        self.mark(dst, dst + n);
    }

    /// The element range written since the last call, if any (and forgets it).
    pub fn take_dirty(&mut self) -> Option<(usize, usize)> {
        let range = (self.dirty_lo, self.dirty_hi);
        self.dirty_lo = 0;
        self.dirty_hi = 0;
        (range.0 < range.1).then_some(range)
    }

    /// A read-only handle that keeps the memory alive (DLPack export, staging copies).
    pub fn shared(&self) -> SharedBuffer {
        SharedBuffer {
            alloc: Arc::clone(&self.alloc),
            len: self.len,
            code: T::DLPACK_CODE,
            bits: T::BITS,
        }
    }

    /// A snapshot copy of the first `n` elements (tests and debugging).
    pub fn to_vec(&self, n: usize) -> Vec<T> {
        (0..n.min(self.len)).map(|i| self.get(i)).collect()
    }
}

/// A read-only, type-erased handle on a host buffer's memory: what torch views alias.
#[derive(Clone)]
pub struct SharedBuffer {
    alloc: Arc<RawAlloc>,
    len: usize,
    code: u8,
    bits: u8,
}

impl SharedBuffer {
    pub(crate) fn from_alloc(alloc: Arc<RawAlloc>, len: usize, code: u8, bits: u8) -> Self {
        SharedBuffer {
            alloc,
            len,
            code,
            bits,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// DLPack type code and bit width of one element.
    pub fn dtype(&self) -> (u8, u8) {
        (self.code, self.bits)
    }

    /// Address of the first element; the memory must only be read (or written by the one
    /// consumer the pipeline hands it to, e.g. torch on a CPU device).
    pub fn as_ptr(&self) -> *mut u8 {
        self.alloc.as_ptr()
    }

    /// Allocated bytes, a whole number of pages (the range to register with CUDA).
    pub fn nbytes(&self) -> usize {
        self.alloc.nbytes()
    }

    /// `Arc` strong count of the allocation (tests of export lifetimes).
    pub fn owners(&self) -> usize {
        Arc::strong_count(&self.alloc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_aligned_filled_and_dirty() {
        let mut b = HostBuffer::<f32>::new(10, 1.5);
        assert_eq!(b.as_ptr() as usize % PAGE_SIZE, 0);
        assert_eq!(b.nbytes(), PAGE_SIZE);
        assert_eq!(b.to_vec(10), vec![1.5; 10]);
        assert_eq!(b.take_dirty(), None);
        b.set(3, 2.0);
        b.set(7, 2.0);
        assert_eq!(b.get(3), 2.0);
        assert_eq!(b.take_dirty(), Some((3, 8)));
        assert_eq!(b.take_dirty(), None);
        b.write(2, &[4.0, 5.0]);
        b.copy_within(2, 3, 2);
        assert_eq!(b.to_vec(6), vec![1.5, 1.5, 4.0, 4.0, 5.0, 1.5]);
        assert_eq!(b.take_dirty(), Some((2, 5)));
        let big = HostBuffer::<i64>::new(1025, 0);
        assert_eq!(big.nbytes(), 3 * PAGE_SIZE);
    }

    #[test]
    fn impossible_sizes_are_errors() {
        assert!(HostBuffer::<i64>::try_new(usize::MAX / 4, 0, "x").is_err());
    }
}
