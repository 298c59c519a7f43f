//! Every way a batch update or a request's parameters can be rejected.
//!
//! Each variant names the batch index of the request and the field at fault, so a user can
//! find the bad request without a debugger. [`Error::kind`] sorts them into the kinds a user
//! reads differently (a bad request, a malformed update, a bad setting, a size beyond the
//! tables, a misuse of the step protocol, a refused allocation), and [`Error::index`],
//! [`Error::field`], [`Error::detail`] and [`Error::column`] give the parts of the message, so
//! the bindings raise one exception class per kind with those as attributes (no caller parses
//! a message).

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
    /// A request's value for a custom column is refused (`column`: the column's name).
    InvalidColumn {
        index: usize,
        column: String,
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

/// The kind of an [`Error`]: what it is about, as a caller reads it. The bindings raise one
/// exception class per kind (`logitsproc_rs.errors`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// One request's parameter is refused ([`Error::InvalidParam`], [`Error::TooManyEntries`]).
    Request,
    /// The update itself is malformed: its size or an index in its lists.
    BatchUpdate,
    /// A bad engine-wide setting.
    Config,
    /// A size beyond what the tables support (a setting, or a step's row count).
    Size,
    /// A call that does not fit the step protocol.
    Protocol,
    /// The allocator refused a buffer.
    Allocation,
}

impl Error {
    /// What the error is about.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidParam { .. }
            | Error::InvalidColumn { .. }
            | Error::TooManyEntries { .. } => ErrorKind::Request,
            Error::BatchTooLarge { .. }
            | Error::IndexOutOfRange { .. }
            | Error::DuplicateAdd { .. } => ErrorKind::BatchUpdate,
            Error::Config { .. } => ErrorKind::Config,
            Error::TooLarge { .. } => ErrorKind::Size,
            Error::RemovedAfterRead | Error::Protocol(_) => ErrorKind::Protocol,
            Error::OutOfMemory { .. } => ErrorKind::Allocation,
        }
    }

    /// The batch index (or slot) of the request the error is about, if it names one.
    pub fn index(&self) -> Option<usize> {
        match self {
            Error::IndexOutOfRange { index, .. }
            | Error::DuplicateAdd { index }
            | Error::InvalidParam { index, .. }
            | Error::InvalidColumn { index, .. }
            | Error::TooManyEntries { index, .. } => Some(*index),
            _ => None,
        }
    }

    /// The field at fault (a request field, an update's list, a setting), if any.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            Error::BatchTooLarge { .. } => Some("batch_size"),
            Error::DuplicateAdd { .. } => Some("added"),
            Error::InvalidColumn { .. } => Some("column"),
            Error::IndexOutOfRange { field, .. }
            | Error::InvalidParam { field, .. }
            | Error::TooManyEntries { field, .. }
            | Error::TooLarge { field, .. }
            | Error::OutOfMemory { field, .. }
            | Error::Config { field, .. } => Some(field),
            Error::RemovedAfterRead | Error::Protocol(_) => None,
        }
    }

    /// For an error that names a request: the message after `request at index i: field 'f': `.
    pub fn detail(&self) -> Option<String> {
        match self {
            Error::IndexOutOfRange { capacity, .. } => {
                Some(format!("index must be in [0, {capacity}) (max_num_seqs)"))
            }
            Error::DuplicateAdd { .. } => Some("index added twice in one batch update".to_string()),
            Error::InvalidParam { message, .. } => Some(message.clone()),
            Error::InvalidColumn {
                column, message, ..
            } => Some(format!("'{column}': {message}")),
            Error::TooManyEntries { count, cap, .. } => Some(format!(
                "{count} entries exceed the per-request cap of {cap}"
            )),
            _ => None,
        }
    }

    /// The custom column an error is about ([`Error::InvalidColumn`]); `None` for every other.
    pub fn column(&self) -> Option<&str> {
        match self {
            Error::InvalidColumn { column, .. } => Some(column),
            _ => None,
        }
    }

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
            Error::InvalidColumn {
                index,
                column,
                message,
            } => write!(
                f,
                "request at index {index}: field 'column': '{column}': {message}"
            ),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn located() -> Vec<Error> {
        vec![
            Error::IndexOutOfRange {
                index: 9,
                field: "moved",
                capacity: 8,
            },
            Error::DuplicateAdd { index: 2 },
            Error::invalid(3, "min_p", "must be in [0, 1], got 2"),
            Error::TooManyEntries {
                index: 4,
                field: "logit_bias",
                count: 5,
                cap: 4,
            },
            Error::InvalidColumn {
                index: 1,
                column: "margin".into(),
                message: "1e39 is not a finite float32".into(),
            },
        ]
    }

    #[test]
    fn parts_rebuild_the_message_of_an_error_about_a_request() {
        for e in located() {
            let (index, field, detail) = (e.index().unwrap(), e.field().unwrap(), e.detail());
            let detail = detail.unwrap();
            assert_eq!(
                e.to_string(),
                format!("request at index {index}: field '{field}': {detail}")
            );
        }
    }

    #[test]
    fn kinds_and_fields() {
        let kinds: Vec<_> = located().iter().map(Error::kind).collect();
        use ErrorKind::*;
        assert_eq!(kinds, [BatchUpdate, BatchUpdate, Request, Request, Request]);
        let e = Error::BatchTooLarge {
            batch_size: 9,
            capacity: 8,
        };
        assert_eq!(
            (e.kind(), e.field(), e.index()),
            (BatchUpdate, Some("batch_size"), None)
        );
        assert_eq!(Error::RemovedAfterRead.kind(), Protocol);
        assert_eq!(Error::Protocol("x".into()).field(), None);
        let e = Error::OutOfMemory {
            field: "penalties",
            bytes: 1,
        };
        assert_eq!((e.kind(), e.field()), (Allocation, Some("penalties")));
        let e = Error::Config {
            field: "reasoning_start_token_ids",
            message: "x".into(),
        };
        assert_eq!((e.kind(), e.detail()), (Config, None));
    }

    #[test]
    fn column_name_of_a_column_error() {
        assert_eq!(located()[4].column(), Some("margin"));
        assert_eq!(located()[2].column(), None);
        // No message is parsed: only the column variant names a column.
        assert_eq!(Error::invalid(0, "column", "'margin': x").column(), None);
    }
}
