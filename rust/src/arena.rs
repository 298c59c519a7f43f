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

/// How one step's changes go to the device (see [`Arena::stage`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Upload {
    /// Copy arena bytes `[lo, hi)` of the staging copy to the same bytes on the device.
    Span { lo: usize, hi: usize },
    /// `words` int32 payload words at the start of the staging copy, their int64 arena word
    /// indices at byte `index_offset`: copy `index_offset + 8 × words` bytes, then scatter.
    Packed { words: usize, index_offset: usize },
}

/// The arena layout plus its staging copies.
pub struct Arena {
    sections: Vec<Section>,
    sources: Vec<SharedBuffer>,
    total: usize,
    staging: Vec<Arc<RawAlloc>>,
    /// Scratch: the written ranges of the step being staged.
    ranges: Vec<(usize, usize)>,
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
            ranges: Vec::new(),
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

    /// Stages the step's changes into staging copy `k` and says how to upload them (`None`
    /// when nothing changed). Two forms, whichever carries fewer bytes:
    /// - [`Upload::Span`]: the arena bytes `[lo, hi)` covering every written range, all copied
    ///   from the buffers (so bytes inside it that did not change are current too, whatever
    ///   copy `k` held before), to be copied to the same place on the device;
    /// - [`Upload::Packed`]: only the written 4-byte words, packed at the start of the staging
    ///   copy, followed by their word indices in the arena (int64, at byte `index_offset`);
    ///   the device scatters them with one indexed copy.
    ///
    /// With `all`, the whole arena as one span (the first upload).
    pub fn stage(
        &mut self,
        owner: &mut dyn HasBuffers,
        k: usize,
        all: bool,
    ) -> Result<Option<Upload>> {
        self.take_ranges(owner);
        let span = if all {
            Some((0, self.total))
        } else {
            self.span()
        };
        let Some((lo, hi)) = span else {
            self.record(0);
            return Ok(None);
        };
        let dst = self.staging(k)?.as_ptr();
        let (words, index_offset, packed_bytes) = self.packed_size();
        if all || packed_bytes >= hi - lo {
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
            self.record(hi - lo);
            return Ok(Some(Upload::Span { lo, hi }));
        }
        // Packed: payload words, then their arena word indices. `packed_bytes < hi - lo <=
        // total`, so both fit in the staging copy.
        let mut w = 0usize;
        for &(a, b) in &self.ranges {
            let (s, src) = self
                .sections
                .iter()
                .zip(&self.sources)
                .find(|(s, _)| s.offset <= a && b <= s.offset + s.bytes)
                .expect("a written range lies inside its section");
            let n = (b - a) / 4;
            // SAFETY: `[a, b)` lies inside section `s` (found above), so the source range is
            // inside its buffer; the payload `[4w, 4(w + n))` and the indices from
            // `index_offset + 8w` lie below `packed_bytes < total`, inside the staging copy;
            // the allocations are distinct.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src.as_ptr().add(a - s.offset),
                    dst.add(4 * w),
                    b - a,
                );
                let idx = dst.add(index_offset) as *mut i64;
                for j in 0..n {
                    idx.add(w + j).write_unaligned((a / 4 + j) as i64);
                }
            }
            w += n;
        }
        self.record(packed_bytes);
        Ok(Some(Upload::Packed {
            words,
            index_offset,
        }))
    }

    /// Collects, in arena bytes, what the buffers recorded as written (and forgets it).
    fn take_ranges(&mut self, owner: &mut dyn HasBuffers) {
        self.ranges.clear();
        let sections = &self.sections;
        let ranges = &mut self.ranges;
        let mut i = 0;
        owner.visit_buffers(&mut |_, buf| {
            if let Some((lo, hi)) = buf.take_dirty_bytes() {
                let s = &sections[i];
                ranges.push((s.offset + lo, s.offset + hi));
            }
            i += 1;
        });
    }

    /// The arena bytes covering every collected range.
    fn span(&self) -> Option<(usize, usize)> {
        self.ranges
            .iter()
            .fold(None, |acc: Option<(usize, usize)>, &(a, b)| {
                Some(acc.map_or((a, b), |(x, y)| (x.min(a), y.max(b))))
            })
    }

    /// (payload words, byte offset of the indices, total bytes) of the packed form.
    fn packed_size(&self) -> (usize, usize, usize) {
        let words: usize = self.ranges.iter().map(|&(a, b)| (b - a) / 4).sum();
        let index_offset = (words * 4).next_multiple_of(8);
        (words, index_offset, index_offset + words * 8)
    }

    fn record(&mut self, bytes: usize) {
        self.last_upload = bytes;
        self.uploaded_total += bytes as u64;
    }

    /// Bytes the last stage carried (what the last upload copied).
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
        self.take_ranges(owner);
        let bytes = match self.span() {
            None => 0,
            Some((lo, hi)) => self.packed_size().2.min(hi - lo),
        };
        self.record(bytes);
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
        // A run of neighbouring writes: one span (cheaper than packing each word).
        t.0.fill(90, 100, 2.0);
        t.0.set(99, 3.0);
        let up = arena.stage(&mut t, 0, false).unwrap().unwrap();
        assert_eq!(up, Upload::Span { lo: 360, hi: 400 });
        assert_eq!(arena.last_upload_bytes(), 40);
        let staged = arena.staging(0).unwrap();
        // SAFETY: test-only reads inside the staging copy.
        unsafe {
            assert_eq!(*(staged.as_ptr().add(392) as *const f32), 2.0);
            assert_eq!(*(staged.as_ptr().add(396) as *const f32), 3.0);
        }
        // Far-apart writes: the written words packed, with their word indices.
        t.0.set(0, 9.0);
        t.1.set(9, 7);
        let up = arena.stage(&mut t, 1, false).unwrap().unwrap();
        assert_eq!(
            up,
            Upload::Packed {
                words: 3,
                index_offset: 16
            }
        );
        assert_eq!(arena.last_upload_bytes(), 16 + 24);
        let staged = arena.staging(1).unwrap();
        // SAFETY: test-only reads inside the staging copy.
        unsafe {
            let p = staged.as_ptr();
            assert_eq!(*(p as *const f32), 9.0);
            assert_eq!((p.add(4) as *const i64).read_unaligned(), 7);
            let idx = p.add(16) as *const i64;
            assert_eq!((*idx, *idx.add(1), *idx.add(2)), (0, 146, 147));
        }
        assert_eq!(
            arena.stage(&mut t, 1, true).unwrap(),
            Some(Upload::Span { lo: 0, hi: 768 })
        );
    }
}
