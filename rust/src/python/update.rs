//! Reading vLLM-shaped batch updates from Python, duck-typed.
//!
//! Accepts our `BatchUpdate`, vLLM's own dataclass, or anything with `batch_size`, `removed`,
//! `added` (tuples `(index, params, prompt_tok_ids, output_tok_ids)`) and `moved` (tuples
//! `(index1, index2, direction)`, direction any enum whose name is SWAP or UNIDIRECTIONAL, or
//! its value 1 / 2). Every malformed piece becomes a `ValueError` naming the request and field
//! (a `BatchUpdateError` for the update's structure, a `RequestError` for a request's value).

use pyo3::exceptions::PyAttributeError;
use pyo3::intern;
use pyo3::prelude::*;

use crate::error::Error;
use pyo3::types::{PyInt, PyString, PyTuple};

use super::errors::{is_interrupt, unless_interrupt};
use crate::batch::{BatchUpdate, Move, MoveDirectionality};

/// Where an item sits: `"entry 3: "` for the item at position 3 of an update's list.
fn at(pos: Option<usize>) -> String {
    pos.map_or_else(String::new, |p| format!("entry {p}: "))
}

fn index_of(obj: &Bound<'_, PyAny>, field: &'static str, pos: Option<usize>) -> PyResult<usize> {
    if obj.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyErr::from(Error::malformed_update(
            field,
            format!("{}an index must be an int, got a bool", at(pos)),
        )));
    }
    obj.extract::<usize>().map_err(|e| {
        unless_interrupt(e, |_| {
            PyErr::from(Error::malformed_update(
                field,
                format!(
                    "{}index must be a non-negative int, got {}",
                    at(pos),
                    describe(obj)
                ),
            ))
        })
    })
}

fn describe(obj: &Bound<'_, PyAny>) -> String {
    obj.repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "<unprintable>".into())
}

/// [`describe`], except that an interrupt its `__repr__` raises is returned as the error.
pub fn try_describe(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    match obj.repr() {
        Ok(r) => Ok(r.to_string()),
        Err(e) if is_interrupt(&e) => Err(e),
        Err(_) => Ok("<unprintable>".into()),
    }
}

fn direction(index: usize, obj: &Bound<'_, PyAny>) -> PyResult<MoveDirectionality> {
    let py = obj.py();
    // An interrupt raised by the direction's own attribute (not an `Exception`) propagates;
    // any other error reading a name means it has none.
    fn name_of<'py>(
        obj: &Bound<'py, PyAny>,
        attr: &Bound<'py, PyString>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        match obj.getattr(attr) {
            Ok(n) => Ok(Some(n)),
            Err(e) if is_interrupt(&e) => Err(e),
            Err(_) => Ok(None),
        }
    }
    // Enum members keep their name in the plain attribute `_name_` (cheap); `name` is a
    // property (slow) and other duck types may only have that. Ints are the enum values; a
    // bool is neither (`True` would read as 1, UNIDIRECTIONAL).
    let name = match name_of(obj, intern!(py, "_name_"))? {
        Some(n) => Some(n),
        None => name_of(obj, intern!(py, "name"))?,
    };
    let by_name = name
        .as_ref()
        .and_then(|n| n.cast::<PyString>().ok())
        .map(|n| n.to_str());
    let dir = match by_name {
        Some(Ok("SWAP")) => Some(MoveDirectionality::Swap),
        Some(Ok("UNIDIRECTIONAL")) => Some(MoveDirectionality::Unidirectional),
        _ if obj.is_instance_of::<PyInt>() && !obj.is_instance_of::<pyo3::types::PyBool>() => {
            match obj.extract::<i64>() {
                Ok(2) => Some(MoveDirectionality::Swap),
                Ok(1) => Some(MoveDirectionality::Unidirectional),
                _ => None,
            }
        }
        _ => None,
    };
    dir.ok_or_else(|| {
        PyErr::from(Error::malformed_entry(
            index,
            "moved",
            format!(
                "direction must be SWAP or UNIDIRECTIONAL, got {}",
                describe(obj)
            ),
        ))
    })
}

/// The items of a fixed-length entry (a tuple, or any sequence of that length), the entry at
/// position `pos` of the list `field`. A sequence whose `__len__` or `__getitem__` raises or
/// lies is a `BatchUpdateError` naming the list and position (a `KeyboardInterrupt` from it
/// propagates untouched).
fn entry_items<'py>(
    item: &Bound<'py, PyAny>,
    n: usize,
    field: &'static str,
    pos: usize,
    shape: &str,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let wrong = || {
        PyErr::from(Error::malformed_update(
            field,
            format!(
                "entry {pos}: entries must be {shape}, got {}",
                describe(item)
            ),
        ))
    };
    if let Ok(t) = item.cast::<PyTuple>() {
        // The tuple's own items (a subclass's `__len__` / `__getitem__` are not asked).
        if t.len() == n {
            return Ok(t.iter().collect());
        }
        return Err(wrong());
    }
    if item.is_instance_of::<PyString>() {
        return Err(wrong());
    }
    let raised = |what: String, e: PyErr| {
        unless_interrupt(e, |e| {
            PyErr::from(Error::malformed_update(
                field,
                format!("entry {pos}: {what} raised {e}"),
            ))
        })
    };
    match item.len() {
        Ok(len) if len == n => {}
        Ok(_) => return Err(wrong()),
        Err(e) if is_interrupt(&e) => return Err(e),
        // Not a sized sequence: the shape is wrong.
        Err(_) => return Err(wrong()),
    }
    (0..n)
        .map(|i| {
            item.get_item(i)
                .map_err(|e| raised(format!("reading item {i} of {}", describe(item)), e))
        })
        .collect()
}

/// One `added` entry as seen by a payload extractor.
pub struct AddedEntry<'py> {
    pub index: usize,
    pub params: Bound<'py, PyAny>,
    pub prompt_tok_ids: Bound<'py, PyAny>,
    pub output_tok_ids: Bound<'py, PyAny>,
}

/// The processor-independent part of one update: indices, moves and the added entries' objects.
pub struct Shape<'py> {
    pub batch_size: usize,
    pub removed: Vec<usize>,
    pub added: Vec<AddedEntry<'py>>,
    pub moved: Vec<Move>,
}

/// A Python error raised while iterating an update's list, as a `ValueError` naming the list
/// (and the position it was reading); a `KeyboardInterrupt` propagates untouched.
fn raised(field: &'static str, pos: usize, e: PyErr) -> PyErr {
    unless_interrupt(e, |e| {
        PyErr::from(Error::malformed_update(
            field,
            format!("reading entry {pos} raised {e}"),
        ))
    })
}

/// `bu.<field>` as an iterator; a missing or non-iterable field is a `ValueError`.
fn iter_field<'py>(
    bu: &Bound<'py, PyAny>,
    name: &Bound<'py, PyString>,
    field: &'static str,
) -> PyResult<Bound<'py, pyo3::types::PyIterator>> {
    let value = bu.getattr(name).map_err(|e| {
        unless_interrupt(e, |_| {
            PyErr::from(Error::malformed_update(
                field,
                "the batch update has no such attribute",
            ))
        })
    })?;
    value.try_iter().map_err(|e| {
        unless_interrupt(e, |_| {
            PyErr::from(Error::malformed_update(
                field,
                format!("expected a sequence, got {}", describe(&value)),
            ))
        })
    })
}

/// Reads an update's structure afresh (every call: an update object identifies no step, and
/// its lists may have been changed since it was last read).
pub fn read_shape<'py>(bu: &Bound<'py, PyAny>, max_entries: usize) -> PyResult<Shape<'py>> {
    let py = bu.py();
    let batch_size = index_of(
        &bu.getattr(intern!(py, "batch_size")).map_err(|e| {
            unless_interrupt(e, |_| {
                PyErr::from(Error::malformed_update(
                    "batch_size",
                    "the batch update has no such attribute",
                ))
            })
        })?,
        "batch_size",
        None,
    )?;
    // Bounded: an endless or huge list must end in an error, not in an allocation abort.
    let too_many = |field: &'static str| {
        PyErr::from(Error::malformed_update(
            field,
            format!("more than {max_entries} entries for this batch capacity"),
        ))
    };
    let mut removed = Vec::new();
    for item in iter_field(bu, intern!(py, "removed"), "removed")? {
        if removed.len() == max_entries {
            return Err(too_many("removed"));
        }
        let pos = removed.len();
        removed.push(index_of(
            &item.map_err(|e| raised("removed", pos, e))?,
            "removed",
            Some(pos),
        )?);
    }
    let mut added = Vec::new();
    for item in iter_field(bu, intern!(py, "added"), "added")? {
        if added.len() == max_entries {
            return Err(too_many("added"));
        }
        let pos = added.len();
        let item = item.map_err(|e| raised("added", pos, e))?;
        let [index, params, prompt, output]: [Bound<'_, PyAny>; 4] = entry_items(
            &item,
            4,
            "added",
            pos,
            "(index, params, prompt_tok_ids, output_tok_ids)",
        )?
        .try_into()
        .expect("entry_items returns exactly n items");
        added.push(AddedEntry {
            index: index_of(&index, "added", Some(pos))?,
            params,
            prompt_tok_ids: prompt,
            output_tok_ids: output,
        });
    }
    let mut moved = Vec::new();
    for item in iter_field(bu, intern!(py, "moved"), "moved")? {
        if moved.len() == max_entries {
            return Err(too_many("moved"));
        }
        let pos = moved.len();
        let item = item.map_err(|e| raised("moved", pos, e))?;
        let [a, b, dir]: [Bound<'_, PyAny>; 3] =
            entry_items(&item, 3, "moved", pos, "(index1, index2, direction)")?
                .try_into()
                .expect("entry_items returns exactly n items");
        let from = index_of(&a, "moved", Some(pos))?;
        let to = index_of(&b, "moved", Some(pos))?;
        let dir = direction(from, &dir)?;
        moved.push(Move { from, to, dir });
    }
    Ok(Shape {
        batch_size,
        removed,
        added,
        moved,
    })
}

/// Most entries [`fingerprint`] reads of one list (an endless list ends in an error).
pub const MAX_FINGERPRINT_ENTRIES: usize = 1 << 22;

/// A fingerprint of what a step reads of an update's structure: the batch size, the removed
/// indices, the moves, and per added entry its index, the identity of its params, prompt and
/// output objects and the length of a list or tuple prompt / output. The objects are handed
/// back too: held by the caller, their identities cannot be reused by new objects while the
/// fingerprint is compared. Catches an update changed between the processors of one step
/// (an entry replaced, an index changed), not a params object changed in place.
pub fn fingerprint<'py>(bu: &Bound<'py, PyAny>) -> PyResult<(u64, Vec<Bound<'py, PyAny>>)> {
    use std::hash::{Hash, Hasher};
    let shape = read_shape(bu, MAX_FINGERPRINT_ENTRIES)?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    shape.batch_size.hash(&mut h);
    shape.removed.hash(&mut h);
    shape.moved.len().hash(&mut h);
    for m in &shape.moved {
        (m.from, m.to, m.dir == MoveDirectionality::Swap).hash(&mut h);
    }
    shape.added.len().hash(&mut h);
    let mut held = Vec::with_capacity(3 * shape.added.len());
    let sized = |o: &Bound<'_, PyAny>| {
        if let Ok(l) = o.cast::<pyo3::types::PyList>() {
            Some(l.len())
        } else {
            o.cast::<PyTuple>().ok().map(|t| t.len())
        }
    };
    for e in shape.added {
        e.index.hash(&mut h);
        for o in [e.params, e.prompt_tok_ids, e.output_tok_ids] {
            o.as_ptr().hash(&mut h);
            sized(&o).hash(&mut h);
            held.push(o);
        }
    }
    Ok((h.finish(), held))
}

/// Parses the whole update; `extract` turns each added entry into the payload.
pub fn parse_update<'py, A>(
    bu: &Bound<'py, PyAny>,
    max_entries: usize,
    mut extract: impl FnMut(&AddedEntry<'py>) -> PyResult<A>,
) -> PyResult<BatchUpdate<A>> {
    let shape = read_shape(bu, max_entries)?;
    let mut update = BatchUpdate::new(shape.batch_size);
    update.removed = shape.removed;
    update.moved = shape.moved;
    update.added.reserve(shape.added.len());
    for entry in &shape.added {
        update.added.push((entry.index, extract(entry)?));
    }
    Ok(update)
}

/// Reads `params.<field>`. A missing attribute reads as `None` ("not set"), so a duck-typed
/// params object only needs the fields it uses; any other error from a property propagates.
/// `name` is the interned Python string of `field`.
pub fn param_named<'py>(
    index: usize,
    params: &Bound<'py, PyAny>,
    field: &'static str,
    name: &Bound<'py, PyString>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = params.py();
    match params.getattr(name) {
        Ok(v) => Ok(v),
        Err(e) if e.is_instance_of::<PyAttributeError>(py) => Ok(py.None().into_bound(py)),
        Err(e) => Err(unless_interrupt(e, |e| {
            PyErr::from(Error::invalid(
                index,
                field,
                format!("reading it raised {e}"),
            ))
        })),
    }
}

/// Extracts a value, mapping a type mismatch to a `ValueError` naming request and field.
pub fn extract_as<'py, T: for<'a> FromPyObject<'a, 'py>>(
    index: usize,
    field: &'static str,
    obj: &Bound<'py, PyAny>,
    expected: &str,
) -> PyResult<T> {
    obj.extract::<T>().map_err(|e| {
        unless_interrupt(e.into(), |_| {
            PyErr::from(Error::invalid(
                index,
                field,
                format!("expected {expected}, got {}", describe(obj)),
            ))
        })
    })
}

/// Most prompt tokens read from one request (no model has a context near this; an endless
/// iterable must end in an error, not in an exhausted machine).
pub const MAX_PROMPT_TOKENS: usize = 1 << 24;

/// Reads at most `max` ints from an iterable (a str, a bool, or a non-int is rejected). Nothing
/// trusts `__len__`: memory grows with what is actually read, and a refusal to grow is a
/// `MemoryError`, never an abort.
pub fn bounded_ints(
    index: usize,
    field: &'static str,
    obj: &Bound<'_, PyAny>,
    max: usize,
) -> PyResult<Vec<i64>> {
    if obj.is_instance_of::<PyString>() {
        return Err(PyErr::from(Error::invalid(
            index,
            field,
            "expected a sequence of ints, got a str",
        )));
    }
    let iter = obj.try_iter().map_err(|e| {
        unless_interrupt(e, |_| {
            PyErr::from(Error::invalid(
                index,
                field,
                format!("expected a sequence of ints, got {}", describe(obj)),
            ))
        })
    })?;
    let mut out: Vec<i64> = Vec::new();
    for t in iter {
        if out.len() == max {
            return Err(PyErr::from(Error::invalid(
                index,
                field,
                format!("more entries than the cap of {max}"),
            )));
        }
        let t = t.map_err(|e| {
            unless_interrupt(e, |e| {
                PyErr::from(Error::invalid(
                    index,
                    field,
                    format!("reading it raised {e}"),
                ))
            })
        })?;
        if t.is_instance_of::<pyo3::types::PyBool>() {
            return Err(PyErr::from(Error::invalid(
                index,
                field,
                "expected ints, got a bool",
            )));
        }
        let v = extract_as::<i64>(index, field, &t, "ints")?;
        out.try_reserve(1)
            .map_err(|_| PyErr::from(Error::RequestOutOfMemory { index, field }))?;
        out.push(v);
    }
    Ok(out)
}

/// Extracts a sequence of token ids (a prompt): ints, at most [`MAX_PROMPT_TOKENS`].
pub fn token_ids(index: usize, field: &'static str, obj: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    bounded_ints(index, field, obj, MAX_PROMPT_TOKENS)
}
