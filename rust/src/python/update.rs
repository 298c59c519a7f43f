//! Reading vLLM-shaped batch updates from Python, duck-typed.
//!
//! Accepts our `BatchUpdate`, vLLM's own dataclass, or anything with `batch_size`, `removed`,
//! `added` (tuples `(index, params, prompt_tok_ids, output_tok_ids)`) and `moved` (tuples
//! `(index1, index2, direction)`, direction any enum whose name is SWAP or UNIDIRECTIONAL, or
//! its value 1 / 2). Every malformed piece becomes a `ValueError` naming the request and field.

use pyo3::prelude::*;
use pyo3::types::PyString;

use super::errors::{bad_update, bad_value};
use crate::batch::{BatchUpdate, Move, MoveDirectionality};

fn index_of(obj: &Bound<'_, PyAny>, field: &str) -> PyResult<usize> {
    obj.extract::<usize>().map_err(|_| {
        bad_update(
            field,
            format!("index must be a non-negative int, got {}", describe(obj)),
        )
    })
}

fn describe(obj: &Bound<'_, PyAny>) -> String {
    obj.repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "<unprintable>".into())
}

fn direction(index: usize, obj: &Bound<'_, PyAny>) -> PyResult<MoveDirectionality> {
    let name = match obj.getattr("name") {
        Ok(n) => n.extract::<String>().ok(),
        Err(_) => None,
    };
    match (name.as_deref(), obj.extract::<i64>().ok()) {
        (Some("SWAP"), _) | (None, Some(2)) => Ok(MoveDirectionality::Swap),
        (Some("UNIDIRECTIONAL"), _) | (None, Some(1)) => Ok(MoveDirectionality::Unidirectional),
        _ => Err(bad_value(
            index,
            "moved",
            format!(
                "direction must be SWAP or UNIDIRECTIONAL, got {}",
                describe(obj)
            ),
        )),
    }
}

/// One `added` entry as seen by a payload extractor.
pub struct AddedEntry<'py> {
    pub index: usize,
    pub params: Bound<'py, PyAny>,
    pub prompt_tok_ids: Bound<'py, PyAny>,
    pub output_tok_ids: Bound<'py, PyAny>,
}

/// Parses the whole update; `extract` turns each added entry into the table's payload.
pub fn parse_update<'py, A>(
    bu: &Bound<'py, PyAny>,
    mut extract: impl FnMut(&AddedEntry<'py>) -> PyResult<A>,
) -> PyResult<BatchUpdate<A>> {
    let batch_size = index_of(&bu.getattr("batch_size")?, "batch_size")?;
    let mut update = BatchUpdate::new(batch_size);
    for item in bu.getattr("removed")?.try_iter()? {
        update.removed.push(index_of(&item?, "removed")?);
    }
    for item in bu.getattr("added")?.try_iter()? {
        let item = item?;
        if item.is_instance_of::<PyString>() || item.len().ok() != Some(4) {
            return Err(bad_update(
                "added",
                format!(
                    "entries must be (index, params, prompt_tok_ids, output_tok_ids), got {}",
                    describe(&item)
                ),
            ));
        }
        let entry = AddedEntry {
            index: index_of(&item.get_item(0)?, "added")?,
            params: item.get_item(1)?,
            prompt_tok_ids: item.get_item(2)?,
            output_tok_ids: item.get_item(3)?,
        };
        let payload = extract(&entry)?;
        update.added.push((entry.index, payload));
    }
    for item in bu.getattr("moved")?.try_iter()? {
        let item = item?;
        if item.is_instance_of::<PyString>() || item.len().ok() != Some(3) {
            return Err(bad_update(
                "moved",
                format!(
                    "entries must be (index1, index2, direction), got {}",
                    describe(&item)
                ),
            ));
        }
        let from = index_of(&item.get_item(0)?, "moved")?;
        let to = index_of(&item.get_item(1)?, "moved")?;
        let dir = direction(from, &item.get_item(2)?)?;
        update.moved.push(Move { from, to, dir });
    }
    Ok(update)
}

/// Reads `params.<field>`; a missing attribute is a `ValueError` naming request and field.
pub fn param<'py>(
    index: usize,
    params: &Bound<'py, PyAny>,
    field: &'static str,
) -> PyResult<Bound<'py, PyAny>> {
    params
        .getattr(field)
        .map_err(|_| bad_value(index, field, "sampling params have no such attribute"))
}

/// Extracts a value, mapping a type mismatch to a `ValueError` naming request and field.
pub fn extract_as<'py, T: for<'a> FromPyObject<'a, 'py>>(
    index: usize,
    field: &'static str,
    obj: &Bound<'py, PyAny>,
    expected: &str,
) -> PyResult<T> {
    obj.extract::<T>().map_err(|_| {
        bad_value(
            index,
            field,
            format!("expected {expected}, got {}", describe(obj)),
        )
    })
}
