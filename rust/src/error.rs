//! Every way a batch update or a request's parameters can be rejected.
//!
//! Each variant names the batch index of the request and the field at fault, so a user can
//! find the bad request without a debugger. The bindings map them all to `ValueError`
//! (except [`Error::RemovedAfterRead`], a protocol misuse, which becomes `RuntimeError`).

use std::fmt;

pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, Clone, PartialEq)]
pub enum Error {
    /// `batch_size` larger than the table's fixed capacity (`max_num_seqs`).
    BatchTooLarge { batch_size: usize, capacity: usize },
    /// A slot index (in `added`, `removed` or `moved`) outside `[0, capacity)`.
    IndexOutOfRange {
        index: usize,
        field: &'static str,
        capacity: usize,
    },
    /// The same index appears twice in one update's `added` list.
    DuplicateAdd { index: usize },
    /// A request parameter outside its domain.
    InvalidParam {
        index: usize,
        field: &'static str,
        message: String,
    },
    /// A request carries more entries than the stated per-request cap.
    TooManyEntries {
        index: usize,
        field: &'static str,
        count: usize,
        cap: usize,
    },
    /// A size (capacity, vocabulary, per-request cap) beyond what the tables can allocate.
    TooLarge {
        field: &'static str,
        value: usize,
        max: usize,
    },
    /// `removed_append` after `removed` was read (vLLM raises `RuntimeError`).
    RemovedAfterRead,
    /// The allocator refused a buffer (Python's `MemoryError`).
    OutOfMemory { field: &'static str, bytes: usize },
    /// A step call that does not fit the pipeline's protocol (Python's `RuntimeError`).
    Protocol(String),
    /// A bad engine-wide setting (not tied to a request).
    Config {
        field: &'static str,
        message: String,
    },
}

impl Error {
    pub fn invalid(index: usize, field: &'static str, message: impl Into<String>) -> Self {
        Error::InvalidParam {
            index,
            field,
            message: message.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::BatchTooLarge {
                batch_size,
                capacity,
            } => write!(
                f,
                "batch_size {batch_size} exceeds the capacity (max_num_seqs) of {capacity}"
            ),
            Error::IndexOutOfRange {
                index,
                field,
                capacity,
            } => write!(
                f,
                "request at index {index}: field '{field}': index must be in [0, {capacity}) (max_num_seqs)"
            ),
            Error::DuplicateAdd { index } => write!(
                f,
                "request at index {index}: field 'added': index added twice in one batch update"
            ),
            Error::InvalidParam {
                index,
                field,
                message,
            } => write!(f, "request at index {index}: field '{field}': {message}"),
            Error::TooManyEntries {
                index,
                field,
                count,
                cap,
            } => write!(
                f,
                "request at index {index}: field '{field}': {count} entries exceed the per-request cap of {cap}"
            ),
            Error::TooLarge { field, value, max } => write!(
                f,
                "field '{field}': {value} is outside the supported range [1, {max}]"
            ),
            Error::RemovedAfterRead => write!(
                f,
                "Cannot register new removed request after self.removed has been read."
            ),
            Error::OutOfMemory { field, bytes } => write!(
                f,
                "field '{field}': could not allocate {bytes} bytes of host memory"
            ),
            Error::Protocol(message) => f.write_str(message),
            Error::Config { field, message } => write!(f, "config field '{field}': {message}"),
        }
    }
}

impl std::error::Error for Error {}
