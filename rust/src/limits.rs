//! Upper bounds on table sizes, checked before anything is allocated.
//!
//! Every buffer is allocated once at construction, sized capacity × per-request cap; a typo
//! such as `max_num_seqs=2**40` must be a clear error, not an allocation abort or an overflowed
//! multiplication that leaves a zero-length buffer.

use crate::error::{Error, Result};

/// Most slots a table may have (`max_num_seqs`).
pub const MAX_CAPACITY: usize = 1 << 20;
/// Token ids are int32 on the device.
pub const MAX_VOCAB: usize = i32::MAX as usize;
/// Most elements in one exported buffer (1 GiB of int32): rows and columns are int32 too.
pub const MAX_ELEMENTS: usize = 1 << 28;

/// Checks `capacity`, `vocab_size` and the buffer size `capacity × Π per_request`.
pub fn check_sizes(capacity: usize, vocab_size: usize, per_request: &[usize]) -> Result<()> {
    if capacity == 0 || capacity > MAX_CAPACITY {
        return Err(Error::TooLarge {
            field: "max_num_seqs",
            value: capacity,
            max: MAX_CAPACITY,
        });
    }
    if vocab_size == 0 || vocab_size > MAX_VOCAB {
        return Err(Error::TooLarge {
            field: "vocab_size",
            value: vocab_size,
            max: MAX_VOCAB,
        });
    }
    let mut total = capacity;
    for &n in per_request {
        total = total
            .checked_mul(n.max(1))
            .filter(|&t| t <= MAX_ELEMENTS)
            .ok_or(Error::TooLarge {
                field: "max_num_seqs x per-request cap",
                value: capacity.saturating_mul(n),
                max: MAX_ELEMENTS,
            })?;
    }
    Ok(())
}

/// Checks one token id against the vocabulary: the one range check every table uses.
#[inline]
pub fn check_token(
    index: usize,
    field: &'static str,
    token: i64,
    vocab_size: usize,
) -> Result<i32> {
    if token < 0 || token as u64 >= vocab_size as u64 {
        return Err(Error::invalid(
            index,
            field,
            format!("token id {token} outside [0, {vocab_size})"),
        ));
    }
    Ok(token as i32)
}

/// [`check_token`] for an engine-wide setting: the error names the config field.
pub fn check_config_token(field: &'static str, token: i64, vocab_size: usize) -> Result<i32> {
    check_token(0, field, token, vocab_size).map_err(|_| Error::Config {
        field,
        message: format!("token id {token} outside [0, {vocab_size})"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds() {
        assert!(check_sizes(1024, 151_936, &[1024]).is_ok());
        assert!(check_sizes(1 << 40, 50, &[]).is_err());
        assert!(check_sizes(16, 50, &[1 << 60]).is_err());
        assert!(check_sizes(0, 50, &[]).is_err());
        assert!(check_sizes(16, 1 << 40, &[]).is_err());
    }
}
