//! One upload per step: the pipeline's exported buffers laid out in one arena.
//!
//! Every table keeps its host buffers ([`HostBuffer`]s it alone writes). The device holds one
//! byte arena with a section per buffer, and the host holds staging copies of the same layout.
//! After a step, [`Arena::stage`] copies what each buffer recorded as written into one staging
//! copy and returns the byte span covering all of it; the caller uploads that span with one
//! non-blocking copy. The tables' own buffers are never read by a device copy, so Rust may
//! rewrite them at any time without waiting for the device; a staging copy is rewritten only
//! after the copy out of it finished (the caller alternates between two and waits, in
//! `update_state`, on the one it is about to reuse).

use crate::buffer::{Element, HostBuffer, RawAlloc, SharedBuffer};
use crate::error::{Error, Result};
use std::sync::Arc;

/// Section alignment in the arena: enough for any dtype view and for coalesced device reads.
pub const SECTION_ALIGN: usize = 256;

/// A buffer the pipeline stages: its memory and what was written since the last stage.
pub trait Staged {
    fn shared(&self) -> SharedBuffer;
    /// Bytes of elements (the section's length in the arena).
    fn byte_len(&self) -> usize;
    /// Byte range written since the last call (and forgets it).
    fn take_dirty_bytes(&mut self) -> Option<(usize, usize)>;
}

impl<T: Element> Staged for HostBuffer<T> {
    fn shared(&self) -> SharedBuffer {
        HostBuffer::shared(self)
    }

    fn byte_len(&self) -> usize {
        HostBuffer::byte_len(self)
    }

    fn take_dirty_bytes(&mut self) -> Option<(usize, usize)> {
        let size = std::mem::size_of::<T>();
        self.take_dirty().map(|(lo, hi)| (lo * size, hi * size))
    }
}

/// Something that owns staged buffers, visited in a fixed order (the arena's section order).
pub trait HasBuffers {
    /// Calls `f(name, buffer)` for every exported buffer, always in the same order.
    fn visit_buffers(&mut self, f: &mut dyn FnMut(&'static str, &mut dyn Staged));
}

/// Where one buffer lives in the arena.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Section {
    pub name: String,
    pub offset: usize,
    pub bytes: usize,
    /// DLPack code and bits of the elements.
    pub dtype: (u8, u8),
    pub len: usize,
}

/// The arena layout plus its staging copies.
pub struct Arena {
    sections: Vec<Section>,
    sources: Vec<SharedBuffer>,
    total: usize,
    staging: Vec<Arc<RawAlloc>>,
    last_upload: usize,
    uploaded_total: u64,
}

impl Arena {
    /// Lays out every buffer `owner` visits, in visiting order, each section aligned.
    pub fn new(owner: &mut dyn HasBuffers, prefix: &str) -> Result<Self> {
        let mut sections = Vec::new();
        let mut sources = Vec::new();
        let mut total = 0usize;
        let mut overflow = false;
        owner.visit_buffers(&mut |name, buf| {
            let bytes = buf.byte_len();
            let shared = buf.shared();
            // A fresh layout starts clean: the first upload is a full one (`stage_all`).
            let _ = buf.take_dirty_bytes();
            let offset = total;
            match offset
                .checked_add(bytes)
                .and_then(|e| e.checked_next_multiple_of(SECTION_ALIGN))
            {
                Some(end) => total = end,
                None => overflow = true,
            }
            sections.push(Section {
                name: format!("{prefix}{name}"),
                offset,
                bytes,
                dtype: shared.dtype(),
                len: shared.len(),
            });
            sources.push(shared);
        });
        if overflow {
            return Err(Error::TooLarge {
                field: "arena size",
                value: usize::MAX,
                max: isize::MAX as usize,
            });
        }
        Ok(Arena {
            sections,
            sources,
            total,
            staging: Vec::new(),
            last_upload: 0,
            uploaded_total: 0,
        })
    }

    pub fn sections(&self) -> &[Section] {
        &self.sections
    }

    /// The buffer behind section `i`.
    pub fn source(&self, i: usize) -> Option<SharedBuffer> {
        self.sources.get(i).cloned()
    }

    /// Bytes of the whole arena.
    pub fn total_bytes(&self) -> usize {
        self.total
    }

    /// Staging copy `k` (allocated on first use; the caller pins it).
    pub fn staging(&mut self, k: usize) -> Result<SharedBuffer> {
        while self.staging.len() <= k {
            self.staging
                .push(Arc::new(RawAlloc::zeroed(self.total, "staging arena")?));
        }
        Ok(SharedBuffer::from_alloc(
            Arc::clone(&self.staging[k]),
            self.total,
            1,
            8,
        ))
    }

    /// Stages the step's changes into staging copy `k` and returns the byte span `[lo, hi)` of
    /// the arena to upload (`None` when nothing changed). The span covers every range a buffer
    /// recorded as written; all of it is copied from the buffers, so bytes inside it that did not
    /// change are current too, whatever copy `k` held before. With `all`, the whole arena.
    pub fn stage(
        &mut self,
        owner: &mut dyn HasBuffers,
        k: usize,
        all: bool,
    ) -> Result<Option<(usize, usize)>> {
        let dirty = self.take_span(owner);
        let span = if all { Some((0, self.total)) } else { dirty };
        if let Some((lo, hi)) = span {
            let dst = self.staging(k)?.as_ptr();
            for (s, src) in self.sections.iter().zip(&self.sources) {
                let a = lo.max(s.offset);
                let b = hi.min(s.offset + s.bytes);
                if a >= b {
                    continue;
                }
                // SAFETY: `[a, b)` lies inside this section, so `[a - offset, b - offset)` lies
                // inside the source buffer's elements and `[a, b)` inside the staging copy
                // (`total` bytes); the allocations are distinct. The caller guarantees no
                // device copy is reading staging copy `k`.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        src.as_ptr().add(a - s.offset),
                        dst.add(a),
                        b - a,
                    );
                }
            }
        }
        self.record(span);
        Ok(span)
    }

    /// The union, in arena bytes, of what the buffers recorded as written (and forgets it).
    fn take_span(&mut self, owner: &mut dyn HasBuffers) -> Option<(usize, usize)> {
        let mut span: Option<(usize, usize)> = None;
        let sections = &self.sections;
        let mut i = 0;
        owner.visit_buffers(&mut |_, buf| {
            if let Some((lo, hi)) = buf.take_dirty_bytes() {
                let s = &sections[i];
                let (a, b) = (s.offset + lo, s.offset + hi);
                span = Some(span.map_or((a, b), |(x, y)| (x.min(a), y.max(b))));
            }
            i += 1;
        });
        span
    }

    fn record(&mut self, span: Option<(usize, usize)>) {
        self.last_upload = span.map_or(0, |(a, b)| b - a);
        self.uploaded_total += self.last_upload as u64;
    }

    /// Bytes in the last staged span (what the last upload carried).
    pub fn last_upload_bytes(&self) -> usize {
        self.last_upload
    }

    /// Bytes staged since construction.
    pub fn uploaded_total(&self) -> u64 {
        self.uploaded_total
    }

    /// Forgets what was written (the CPU path, where torch reads the buffers themselves),
    /// still counting it, so the counter tells what a device upload would carry.
    pub fn discard(&mut self, owner: &mut dyn HasBuffers) {
        let span = self.take_span(owner);
        self.record(span);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Two(HostBuffer<f32>, HostBuffer<i64>);

    impl HasBuffers for Two {
        fn visit_buffers(&mut self, f: &mut dyn FnMut(&'static str, &mut dyn Staged)) {
            f("a", &mut self.0);
            f("b", &mut self.1);
        }
    }

    #[test]
    fn stages_only_what_changed() {
        let mut t = Two(HostBuffer::new(100, 1.0), HostBuffer::new(10, 0));
        let mut arena = Arena::new(&mut t, "").unwrap();
        assert_eq!(arena.sections()[1].offset, 512);
        assert_eq!(arena.stage(&mut t, 0, false).unwrap(), None);
        assert_eq!(arena.last_upload_bytes(), 0);
        t.1.set(2, 7);
        t.0.set(99, 3.0);
        let span = arena.stage(&mut t, 0, false).unwrap().unwrap();
        assert_eq!(span, (396, 512 + 24));
        let staged = arena.staging(0).unwrap();
        // SAFETY: test-only reads inside the staging copy.
        unsafe {
            assert_eq!(*(staged.as_ptr().add(396) as *const f32), 3.0);
            assert_eq!(*(staged.as_ptr().add(512 + 16) as *const i64), 7);
        }
        assert_eq!(arena.stage(&mut t, 1, true).unwrap(), Some((0, 768)));
    }
}
