//! `HostBufferView`: a DLPack producer over one core host buffer.
//!
//! `torch.from_dlpack(view)` / `numpy.from_dlpack(view)` alias the Rust memory (device kDLCPU).
//! The capsule's managed tensor holds an `Arc` of the buffer, so the memory lives as long as any
//! tensor does; its deleter never touches Python.

use std::ffi::{c_void, CStr};
use std::ptr::NonNull;

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::buffer::SharedBuffer;
use crate::dlpack::{self, DLManagedTensor, DLManagedTensorVersioned, KDL_CPU};

const NAME_VERSIONED: &CStr = c"dltensor_versioned";
const NAME_LEGACY: &CStr = c"dltensor";

#[pyclass(module = "logitsproc_rs._core", frozen)]
pub struct HostBufferView {
    buf: SharedBuffer,
}

impl HostBufferView {
    pub fn new(buf: SharedBuffer) -> Self {
        HostBufferView { buf }
    }
}

/// Capsule destructor: runs only if no consumer took the tensor (the consumer renames the
/// capsule to `used_dltensor*` and owns the tensor from then on).
unsafe extern "C" fn drop_versioned_capsule(cap: *mut ffi::PyObject) {
    // SAFETY: called by CPython with a valid capsule object.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, NAME_VERSIONED.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(cap, NAME_VERSIONED.as_ptr())
                as *mut DLManagedTensorVersioned;
            if let Some(d) = (*p).deleter {
                d(p)
            }
        }
    }
}

unsafe extern "C" fn drop_legacy_capsule(cap: *mut ffi::PyObject) {
    // SAFETY: called by CPython with a valid capsule object.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, NAME_LEGACY.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(cap, NAME_LEGACY.as_ptr()) as *mut DLManagedTensor;
            if let Some(d) = (*p).deleter {
                d(p)
            }
        }
    }
}

#[pymethods]
impl HostBufferView {
    /// DLPack producer. Returns a versioned capsule when the consumer accepts DLPack >= 1.0.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = stream; // host memory: no stream to synchronise with
        if let Some((dev, _)) = dl_device {
            if dev != KDL_CPU {
                return Err(PyBufferError::new_err(
                    "HostBufferView can only be exported to the CPU (kDLCPU)",
                ));
            }
        }
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "HostBufferView is exported zero-copy; copy=True is not supported",
            ));
        }
        let versioned = matches!(max_version, Some((major, _)) if major >= 1);
        if versioned {
            let raw = dlpack::export_versioned(&self.buf);
            let ptr = NonNull::new(raw as *mut c_void).expect("Box pointer is non-null");
            // SAFETY: `ptr` is a fresh DLManagedTensorVersioned; the destructor matches the name.
            let cap = unsafe {
                PyCapsule::new_with_pointer_and_destructor(
                    py,
                    ptr,
                    NAME_VERSIONED,
                    Some(drop_versioned_capsule),
                )
            };
            if cap.is_err() {
                // SAFETY: the capsule was not created, so nobody else owns the tensor.
                unsafe { ((*raw).deleter.expect("deleter set"))(raw) };
            }
            cap
        } else {
            let raw = dlpack::export_legacy(&self.buf);
            let ptr = NonNull::new(raw as *mut c_void).expect("Box pointer is non-null");
            // SAFETY: as above, for the legacy layout.
            let cap = unsafe {
                PyCapsule::new_with_pointer_and_destructor(
                    py,
                    ptr,
                    NAME_LEGACY,
                    Some(drop_legacy_capsule),
                )
            };
            if cap.is_err() {
                // SAFETY: as above.
                unsafe { ((*raw).deleter.expect("deleter set"))(raw) };
            }
            cap
        }
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        (KDL_CPU, 0)
    }

    fn __len__(&self) -> usize {
        self.buf.len()
    }

    /// Address of the first element (for `cudaHostRegister`).
    #[getter]
    fn data_ptr(&self) -> usize {
        self.buf.as_ptr() as usize
    }

    /// Allocated bytes, a whole number of pages (the range to register).
    #[getter]
    fn nbytes(&self) -> usize {
        self.buf.nbytes()
    }

    #[getter]
    fn dtype(&self) -> &'static str {
        match self.buf.dtype() {
            (2, 32) => "float32",
            (0, 32) => "int32",
            (0, 64) => "int64",
            (1, 8) => "uint8",
            _ => "unknown",
        }
    }
}

/// Views caller-owned float32 logits memory as a slice (the `unsafe_apply_cpu` methods).
///
/// # Safety
/// `ptr` must address a live, writable float32 CPU buffer holding `rows` rows of `vocab`
/// elements spaced `row_stride` apart, not aliased by any other Rust reference for the call;
/// the Python caller checks dtype, device, layout and shape of the tensor it takes it from.
pub unsafe fn logits_rows<'a, T>(
    ptr: usize,
    rows: usize,
    vocab: usize,
    row_stride: usize,
) -> PyResult<&'a mut [T]> {
    if rows == 0 {
        return Ok(&mut []);
    }
    if ptr == 0 || ptr % std::mem::align_of::<T>() != 0 || row_stride < vocab {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "logits: null or misaligned pointer, or a row stride below the vocabulary size",
        ));
    }
    let len = (rows - 1)
        .checked_mul(row_stride)
        .and_then(|n| n.checked_add(vocab))
        .ok_or_else(|| pyo3::exceptions::PyValueError::new_err("logits: size overflow"))?;
    // SAFETY: guaranteed by the caller (see above).
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr as *mut T, len) })
}
