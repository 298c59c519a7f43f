//! DLPack export of host buffers, in plain Rust (the bindings only wrap the pointer in a capsule).
//!
//! The managed tensor owns an `Arc` of the buffer, so the memory outlives every torch view. Its
//! deleter touches no Python object and cannot panic: torch may call it from any thread, without
//! the GIL, even during interpreter shutdown.

use crate::buffer::SharedBuffer;
use std::ffi::c_void;

pub const KDL_CPU: i32 = 1;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DLDevice {
    pub device_type: i32,
    pub device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DLDataType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

#[repr(C)]
pub struct DLTensor {
    pub data: *mut c_void,
    pub device: DLDevice,
    pub ndim: i32,
    pub dtype: DLDataType,
    pub shape: *mut i64,
    pub strides: *mut i64,
    pub byte_offset: u64,
}

#[repr(C)]
pub struct DLManagedTensor {
    pub dl_tensor: DLTensor,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
pub struct DLPackVersion {
    pub major: u32,
    pub minor: u32,
}

#[repr(C)]
pub struct DLManagedTensorVersioned {
    pub version: DLPackVersion,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    pub flags: u64,
    pub dl_tensor: DLTensor,
}

/// Keeps the exported buffer alive and owns the shape array the tensor points at.
struct ExportCtx {
    _owner: Box<dyn Send + Sync>,
    shape: [i64; 1],
}

fn make_tensor(buf: &SharedBuffer, ctx: &mut ExportCtx) -> DLTensor {
    let (code, bits) = buf.dtype();
    DLTensor {
        data: buf.as_ptr() as *mut c_void,
        device: DLDevice {
            device_type: KDL_CPU,
            device_id: 0,
        },
        ndim: 1,
        dtype: DLDataType {
            code,
            bits,
            lanes: 1,
        },
        shape: ctx.shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    }
}

fn new_ctx(buf: &SharedBuffer) -> Box<ExportCtx> {
    Box::new(ExportCtx {
        _owner: Box::new(buf.clone()),
        shape: [buf.len() as i64],
    })
}

unsafe extern "C" fn delete_versioned(p: *mut DLManagedTensorVersioned) {
    if p.is_null() {
        return;
    }
    // SAFETY: `p` and its ctx were created by `export_versioned` with Box::into_raw.
    unsafe {
        let managed = Box::from_raw(p);
        drop(Box::from_raw(managed.manager_ctx as *mut ExportCtx));
    }
}

unsafe extern "C" fn delete_legacy(p: *mut DLManagedTensor) {
    if p.is_null() {
        return;
    }
    // SAFETY: `p` and its ctx were created by `export_legacy` with Box::into_raw.
    unsafe {
        let managed = Box::from_raw(p);
        drop(Box::from_raw(managed.manager_ctx as *mut ExportCtx));
    }
}

/// A versioned (DLPack 1.x) managed tensor viewing the whole buffer. The caller owns the
/// returned pointer and must hand it to a consumer or call its deleter.
pub fn export_versioned(buf: &SharedBuffer) -> *mut DLManagedTensorVersioned {
    let mut ctx = new_ctx(buf);
    let dl_tensor = make_tensor(buf, &mut ctx);
    Box::into_raw(Box::new(DLManagedTensorVersioned {
        version: DLPackVersion { major: 1, minor: 0 },
        manager_ctx: Box::into_raw(ctx) as *mut c_void,
        deleter: Some(delete_versioned),
        flags: 0,
        dl_tensor,
    }))
}

/// A legacy (pre-1.0) managed tensor, for consumers that do not ask for a version.
pub fn export_legacy(buf: &SharedBuffer) -> *mut DLManagedTensor {
    let mut ctx = new_ctx(buf);
    let dl_tensor = make_tensor(buf, &mut ctx);
    Box::into_raw(Box::new(DLManagedTensor {
        dl_tensor,
        manager_ctx: Box::into_raw(ctx) as *mut c_void,
        deleter: Some(delete_legacy),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_keeps_owner_alive_until_deleted() {
        let owner = crate::buffer::HostBuffer::<f32>::new(8, 0.25);
        let buf = owner.shared();
        let m = export_versioned(&buf);
        assert_eq!(buf.owners(), 3);
        // SAFETY: freshly exported, not yet consumed.
        unsafe {
            assert_eq!(*(*m).dl_tensor.shape, 8);
            assert_eq!((*m).dl_tensor.data as usize, buf.as_ptr() as usize);
            ((*m).deleter.unwrap())(m);
        }
        assert_eq!(buf.owners(), 2);
        let l = export_legacy(&buf);
        // SAFETY: as above.
        unsafe { ((*l).deleter.unwrap())(l) };
        assert_eq!(buf.owners(), 2);
    }
}
