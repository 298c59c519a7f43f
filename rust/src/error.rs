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
    /// A malformed entry of an update's list that names a request (its index in `added`,
    /// `moved`...).
    MalformedEntry {
        index: usize,
        field: &'static str,
        message: String,
    },
    /// A malformed batch-update structure, not tied to one request (`field`: its list).
    MalformedUpdate {
        field: &'static str,
        message: String,
    },
    /// A request's value needed more memory than there is.
    RequestOutOfMemory { index: usize, field: &'static str },
    /// A whole per-step input that names no one request (a token feed, a row map).
    InvalidInput {
        field: &'static str,
        message: String,
    },
    /// A custom column's declaration is refused (`column`: its name).
    InvalidDeclaration { column: String, message: String },
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
            | Error::TooManyEntries { .. }
            | Error::InvalidInput { .. } => ErrorKind::Request,
            Error::BatchTooLarge { .. }
            | Error::IndexOutOfRange { .. }
            | Error::DuplicateAdd { .. }
            | Error::MalformedEntry { .. }
            | Error::MalformedUpdate { .. } => ErrorKind::BatchUpdate,
            Error::Config { .. } | Error::InvalidDeclaration { .. } => ErrorKind::Config,
            Error::TooLarge { .. } => ErrorKind::Size,
            Error::RemovedAfterRead | Error::Protocol(_) => ErrorKind::Protocol,
            Error::OutOfMemory { .. } | Error::RequestOutOfMemory { .. } => ErrorKind::Allocation,
        }
    }

    /// The batch index (or slot) of the request the error is about, if it names one.
    pub fn index(&self) -> Option<usize> {
        match self {
            Error::IndexOutOfRange { index, .. }
            | Error::DuplicateAdd { index }
            | Error::InvalidParam { index, .. }
            | Error::InvalidColumn { index, .. }
            | Error::TooManyEntries { index, .. }
            | Error::MalformedEntry { index, .. }
            | Error::RequestOutOfMemory { index, .. } => Some(*index),
            _ => None,
        }
    }

    /// The field at fault (a request field, an update's list, a setting), if any.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            Error::BatchTooLarge { .. } => Some("batch_size"),
            Error::DuplicateAdd { .. } => Some("added"),
            Error::InvalidColumn { .. } => Some("column"),
            Error::InvalidDeclaration { .. } => Some("columns"),
            Error::IndexOutOfRange { field, .. }
            | Error::InvalidParam { field, .. }
            | Error::TooManyEntries { field, .. }
            | Error::TooLarge { field, .. }
            | Error::OutOfMemory { field, .. }
            | Error::Config { field, .. }
            | Error::MalformedEntry { field, .. }
            | Error::MalformedUpdate { field, .. }
            | Error::RequestOutOfMemory { field, .. }
            | Error::InvalidInput { field, .. } => Some(field),
            Error::RemovedAfterRead | Error::Protocol(_) => None,
        }
    }

    /// The message after `field '...': ` (for a column's declaration, after `column '...': `),
    /// for an error about a request's value or a step's input; `None` for a setting, a size,
    /// an allocation the tables made, and the protocol.
    pub fn detail(&self) -> Option<String> {
        match self {
            Error::TooLarge { .. } | Error::OutOfMemory { .. } | Error::Config { .. } => None,
            Error::InvalidDeclaration { message, .. } => Some(message.clone()),
            _ => self.field_text(),
        }
    }

    /// How the message goes on after `field '...': `, for every error that names a field the
    /// message's way.
    fn field_text(&self) -> Option<String> {
        Some(match self {
            Error::IndexOutOfRange { capacity, .. } => {
                format!("index must be in [0, {capacity}) (max_num_seqs)")
            }
            Error::DuplicateAdd { .. } => "index added twice in one batch update".to_string(),
            Error::InvalidColumn {
                column, message, ..
            } => format!("'{column}': {message}"),
            Error::TooManyEntries { count, cap, .. } => {
                format!("{count} entries exceed the per-request cap of {cap}")
            }
            Error::TooLarge { value, max, .. } => {
                format!("{value} is outside the supported range [1, {max}]")
            }
            Error::OutOfMemory { bytes, .. } => {
                format!("could not allocate {bytes} bytes of host memory")
            }
            Error::RequestOutOfMemory { .. } => "out of memory".to_string(),
            Error::InvalidParam { message, .. }
            | Error::Config { message, .. }
            | Error::MalformedEntry { message, .. }
            | Error::MalformedUpdate { message, .. }
            | Error::InvalidInput { message, .. } => message.clone(),
            Error::BatchTooLarge { .. }
            | Error::RemovedAfterRead
            | Error::Protocol(_)
            | Error::InvalidDeclaration { .. } => return None,
        })
    }

    /// What the message says before `field '...'`: the request (`request at index 3: `), the
    /// update (`batch update: `), the engine (`config `), or nothing.
    fn place(&self) -> String {
        match (self.index(), self) {
            (Some(index), _) => format!("request at index {index}: "),
            (None, Error::MalformedUpdate { .. }) => "batch update: ".to_string(),
            (None, Error::Config { .. }) => "config ".to_string(),
            _ => String::new(),
        }
    }

    /// The custom column an error is about ([`Error::InvalidColumn`]); `None` for every other.
    pub fn column(&self) -> Option<&str> {
        match self {
            Error::InvalidColumn { column, .. } | Error::InvalidDeclaration { column, .. } => {
                Some(column)
            }
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

    /// [`Error::InvalidColumn`]: request `index`'s value for the custom column `column`.
    pub fn invalid_column(index: usize, column: &str, message: impl Into<String>) -> Self {
        Error::InvalidColumn {
            index,
            column: column.to_string(),
            message: message.into(),
        }
    }

    /// [`Error::MalformedEntry`]: an entry of the update's list `field` naming request `index`.
    pub fn malformed_entry(index: usize, field: &'static str, message: impl Into<String>) -> Self {
        Error::MalformedEntry {
            index,
            field,
            message: message.into(),
        }
    }

    /// [`Error::MalformedUpdate`]: the update's `field` (a list, `batch_size`).
    pub fn malformed_update(field: &'static str, message: impl Into<String>) -> Self {
        Error::MalformedUpdate {
            field,
            message: message.into(),
        }
    }

    /// [`Error::InvalidInput`]: a per-step input `field` naming no one request.
    pub fn invalid_input(field: &'static str, message: impl Into<String>) -> Self {
        Error::InvalidInput {
            field,
            message: message.into(),
        }
    }

    /// [`Error::InvalidDeclaration`]: custom column `column`'s declaration.
    pub fn invalid_declaration(column: &str, message: impl Into<String>) -> Self {
        Error::InvalidDeclaration {
            column: column.to_string(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Error {
    /// Every message: `<place>field '<field>': <text>` for an error about a field (the one
    /// place that text is written), else the error's own sentence.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let (Some(field), Some(text)) = (self.field(), self.field_text()) {
            return write!(f, "{}field '{field}': {text}", self.place());
        }
        match self {
            Error::BatchTooLarge {
                batch_size,
                capacity,
            } => write!(
                f,
                "batch_size {batch_size} exceeds the capacity (max_num_seqs) of {capacity}"
            ),
            Error::RemovedAfterRead => write!(
                f,
                "Cannot register new removed request after self.removed has been read."
            ),
            Error::Protocol(message) => f.write_str(message),
            Error::InvalidDeclaration { column, message } => {
                write!(f, "column '{column}': {message}")
            }
            // Every other error names a field (`field_text`).
            _ => f.write_str("invalid input"),
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
    fn messages_of_the_binding_errors() {
        use ErrorKind::*;
        let cases = [
            (
                Error::invalid(2, "min_p", "must be a number, got True"),
                "request at index 2: field 'min_p': must be a number, got True",
                Request,
            ),
            (
                Error::invalid_column(1, "margin", "must be a number, got 'wide'"),
                "request at index 1: field 'column': 'margin': must be a number, got 'wide'",
                Request,
            ),
            (
                Error::malformed_entry(3, "moved", "expected a tuple"),
                "request at index 3: field 'moved': expected a tuple",
                BatchUpdate,
            ),
            (
                Error::malformed_update("removed", "expected a sequence, got 1"),
                "batch update: field 'removed': expected a sequence, got 1",
                BatchUpdate,
            ),
            (
                Error::RequestOutOfMemory {
                    index: 0,
                    field: "prompt_tok_ids",
                },
                "request at index 0: field 'prompt_tok_ids': out of memory",
                Allocation,
            ),
            (
                Error::invalid_input("slots", "expected ints"),
                "field 'slots': expected ints",
                Request,
            ),
            (
                Error::invalid_declaration("margin", "no such kind"),
                "column 'margin': no such kind",
                Config,
            ),
            (
                Error::Config {
                    field: "vocab_size",
                    message: "x".into(),
                },
                "config field 'vocab_size': x",
                Config,
            ),
        ];
        for (e, message, kind) in cases {
            assert_eq!((e.to_string().as_str(), e.kind()), (message, kind));
        }
        let e = Error::invalid_declaration("margin", "no such kind");
        assert_eq!(
            (e.field(), e.column(), e.detail().as_deref(), e.index()),
            (Some("columns"), Some("margin"), Some("no such kind"), None)
        );
        let e = Error::malformed_update("removed", "x");
        assert_eq!((e.index(), e.detail().as_deref()), (None, Some("x")));
    }

    #[test]
    fn column_name_of_a_column_error() {
        assert_eq!(located()[4].column(), Some("margin"));
        assert_eq!(located()[2].column(), None);
        // No message is parsed: only the column variant names a column.
        assert_eq!(Error::invalid(0, "column", "'margin': x").column(), None);
    }
}
