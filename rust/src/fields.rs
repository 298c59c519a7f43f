//! The request fields tables read: declared by each table ([`FieldSpec`]), read once per added
//! request by whoever drives the pipeline (the bindings read them from `SamplingParams` by
//! kind), and handed to every table's `check` as one [`Fields`].

use crate::error::{Error, Result};
use crate::tables::columns::ColumnValue;

/// The values a number field accepts: an interval, each end open or closed, and a note the
/// error adds (what the ends mean: "(0: off)"). Declared once, on the field; the tables
/// check with it and the Python front ends ask the core (`_core.field_range_error`), so the
/// range and its message live here alone.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Range {
    pub lo: f64,
    pub hi: f64,
    pub lo_open: bool,
    pub hi_open: bool,
    pub note: &'static str,
}

impl Range {
    /// `[lo, hi]`.
    pub const fn closed(lo: f64, hi: f64) -> Self {
        Range {
            lo,
            hi,
            lo_open: false,
            hi_open: false,
            note: "",
        }
    }

    /// The same interval without its lower end.
    pub const fn open_lo(mut self) -> Self {
        self.lo_open = true;
        self
    }

    /// The same interval without its upper end.
    pub const fn open_hi(mut self) -> Self {
        self.hi_open = true;
        self
    }

    /// The same interval, its error saying `note` after it.
    pub const fn note(mut self, note: &'static str) -> Self {
        self.note = note;
        self
    }

    /// Whether `x` is inside (NaN never is).
    pub fn contains(&self, x: f64) -> bool {
        let above = if self.lo_open {
            x > self.lo
        } else {
            x >= self.lo
        };
        let below = if self.hi_open {
            x < self.hi
        } else {
            x <= self.hi
        };
        above && below
    }

    /// What the error says of a value outside: "must be in [0, 1) (0: off), got 2".
    pub fn refusal(&self, x: f64) -> String {
        format!(
            "must be in {}{}, {}{}{}, got {x}",
            if self.lo_open { "(" } else { "[" },
            self.lo,
            self.hi,
            if self.hi_open { ")" } else { "]" },
            if self.note.is_empty() {
                String::new()
            } else {
                format!(" {}", self.note)
            },
        )
    }
}

/// How a field is read and what it holds when the request does not set it.
#[derive(Clone, Debug, PartialEq)]
pub enum FieldKind {
    /// A float; unset reads as `neutral`.
    Float { neutral: f64 },
    /// An int (not a bool); unset reads as `neutral`.
    Int { neutral: i64 },
    /// An optional int (not a bool).
    OptInt,
    /// A bool (not an int); unset reads as false.
    Bool,
    /// Optional token ids, read no further than `factor ×` the cap named `cap` (a longer
    /// list is refused).
    Ids { cap: &'static str, factor: usize },
    /// Lists of token ids: at most the cap `lists` of lists, of at most the cap `len` ids.
    IdLists {
        lists: &'static str,
        len: &'static str,
    },
    /// `token -> bias` (a dict), at most the cap named `cap` entries.
    Bias { cap: &'static str },
}

/// One field a table reads.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldSpec {
    /// The name tables take it by, and errors name.
    pub name: &'static str,
    /// The `SamplingParams` attribute it is read from.
    pub attr: &'static str,
    pub kind: FieldKind,
    /// Read only when this `Int` field (declared before it) is > 0.
    pub when_positive: Option<&'static str>,
    /// Whether it only tunes its processor (DRY's base, XTC's threshold, a window): set alone
    /// it changes nothing. The other fields switch the processor on for the request; a
    /// pipeline without the table refuses a request that sets one of those
    /// (`python::params::Reader`'s guards), rather than dropping it.
    pub tunes: bool,
    /// The values a number field accepts (checked with [`FieldSpec::checked`]).
    pub range: Option<Range>,
    /// An `Int` field's per-request cap (engine-config name): its value is at most the cap.
    pub cap: Option<&'static str>,
    /// What one entry of a list field is called in an error ("word": "200 words exceed").
    pub item: &'static str,
}

impl FieldSpec {
    pub const fn new(name: &'static str, kind: FieldKind) -> Self {
        FieldSpec {
            name,
            attr: name,
            kind,
            when_positive: None,
            tunes: false,
            range: None,
            cap: None,
            item: "entry",
        }
    }

    /// The same `Int` field, at most the per-request cap named `cap`.
    pub const fn capped(mut self, cap: &'static str) -> Self {
        self.cap = Some(cap);
        self
    }

    /// The same list field, one entry of which an error calls `item`.
    pub const fn item(mut self, item: &'static str) -> Self {
        self.item = item;
        self
    }

    /// Every per-request cap bounding the field, by engine-config name: a list's length (and
    /// for lists of lists, each list's), or an `Int`'s value.
    pub fn caps(&self) -> Vec<&'static str> {
        match &self.kind {
            FieldKind::Ids { cap, .. } | FieldKind::Bias { cap } => vec![*cap],
            FieldKind::IdLists { lists, len } => vec![*lists, *len],
            _ => self.cap.into_iter().collect(),
        }
    }

    /// The same field, accepting only `range`.
    pub const fn range(mut self, range: Range) -> Self {
        self.range = Some(range);
        self
    }

    /// `x` when the field's range holds it, else the error naming request `index` and the
    /// field (a field without a range takes anything).
    pub fn checked(&self, index: usize, x: f64) -> Result<f64> {
        match &self.range {
            Some(r) if !r.contains(x) => Err(Error::invalid(index, self.name, r.refusal(x))),
            _ => Ok(x),
        }
    }

    /// The same field, marked as one that only tunes its processor (see [`FieldSpec::tunes`]).
    pub const fn tunes(mut self) -> Self {
        self.tunes = true;
        self
    }

    /// The same field read from another attribute.
    pub const fn from_attr(mut self, attr: &'static str) -> Self {
        self.attr = attr;
        self
    }

    /// The same field, read only when `int_field` is > 0.
    pub const fn when_positive(mut self, int_field: &'static str) -> Self {
        self.when_positive = Some(int_field);
        self
    }
}

/// What an `Int` or `OptInt` field holds: a value outside its range is refused where the field
/// is read (the front ends refuse it too: the bindings export the range).
pub type IntValue = i64;

/// The range of an `Int` or `OptInt` field's value, both ends included.
pub const INT_RANGE: (IntValue, IntValue) = (IntValue::MIN, IntValue::MAX);

/// A field's value as read.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Float(f64),
    Int(IntValue),
    OptInt(Option<IntValue>),
    Bool(bool),
    Ids(Option<Vec<i64>>),
    IdLists(Vec<Vec<i64>>),
    Bias(Vec<(i64, f64)>),
}

/// Everything the tables read from one added request, read once. A table takes the values it
/// owns; a field the request did not set (or that was not read) is at its neutral value.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Fields {
    values: Vec<(&'static str, Value)>,
    /// Prompt token ids, read when some table wants them (`None` for prompt-embeds requests).
    pub prompt: Option<Vec<i64>>,
    /// One value per declared column, in declaration order.
    pub columns: Vec<ColumnValue>,
}

/// Whether two field names are the same; names from the same declaration are the same
/// string, so the pointer is compared first.
fn same_name(a: &str, b: &str) -> bool {
    (std::ptr::eq(a.as_ptr(), b.as_ptr()) && a.len() == b.len()) || a == b
}

impl Fields {
    /// Room for `n` fields (a reader knows how many it reads).
    pub fn with_capacity(n: usize) -> Self {
        Fields {
            values: Vec::with_capacity(n),
            ..Fields::default()
        }
    }

    /// Sets (or replaces) a field's value.
    pub fn set(&mut self, name: &'static str, value: Value) {
        match self.values.iter_mut().find(|(n, _)| same_name(n, name)) {
            Some(slot) => slot.1 = value,
            None => self.values.push((name, value)),
        }
    }

    /// Adds a field the request does not hold yet (a reader reading each field once).
    pub fn push(&mut self, name: &'static str, value: Value) {
        debug_assert!(self.get(name).is_none(), "field {name} read twice");
        self.values.push((name, value));
    }

    pub fn get(&self, name: &str) -> Option<&Value> {
        self.values
            .iter()
            .find(|(n, _)| same_name(n, name))
            .map(|(_, v)| v)
    }

    fn take(&mut self, name: &str) -> Option<Value> {
        let k = self.values.iter().position(|(n, _)| same_name(n, name))?;
        Some(self.values.swap_remove(k).1)
    }

    /// A float field (its neutral value when unset).
    pub fn float(&self, spec: &FieldSpec) -> f64 {
        match (self.get(spec.name), &spec.kind) {
            (Some(Value::Float(v)), _) => *v,
            (_, FieldKind::Float { neutral }) => *neutral,
            _ => f64::NAN,
        }
    }

    /// An int field (its neutral value when unset).
    pub fn int(&self, spec: &FieldSpec) -> i64 {
        match (self.get(spec.name), &spec.kind) {
            (Some(Value::Int(v)), _) => *v,
            (_, FieldKind::Int { neutral }) => *neutral,
            _ => 0,
        }
    }

    pub fn opt_int(&self, spec: &FieldSpec) -> Option<i64> {
        match self.get(spec.name) {
            Some(Value::OptInt(v)) => *v,
            _ => None,
        }
    }

    /// A bool field (false when unset).
    pub fn bool(&self, spec: &FieldSpec) -> bool {
        matches!(self.get(spec.name), Some(Value::Bool(true)))
    }

    pub fn take_ids(&mut self, spec: &FieldSpec) -> Option<Vec<i64>> {
        match self.take(spec.name) {
            Some(Value::Ids(v)) => v,
            _ => None,
        }
    }

    pub fn take_id_lists(&mut self, spec: &FieldSpec) -> Vec<Vec<i64>> {
        match self.take(spec.name) {
            Some(Value::IdLists(v)) => v,
            _ => Vec::new(),
        }
    }

    pub fn take_bias(&mut self, spec: &FieldSpec) -> Vec<(i64, f64)> {
        match self.take(spec.name) {
            Some(Value::Bias(v)) => v,
            _ => Vec::new(),
        }
    }

    /// Whether the field is set to something other than its neutral value.
    pub fn is_set(&self, spec: &FieldSpec) -> bool {
        match (self.get(spec.name), &spec.kind) {
            (None, _) => false,
            (Some(Value::Float(v)), FieldKind::Float { neutral }) => v != neutral,
            (Some(Value::Int(v)), FieldKind::Int { neutral }) => v != neutral,
            (Some(Value::OptInt(v)), _) => v.is_some(),
            (Some(Value::Bool(v)), _) => *v,
            (Some(Value::Ids(v)), _) => v.is_some(),
            (Some(Value::IdLists(v)), _) => !v.is_empty(),
            (Some(Value::Bias(v)), _) => !v.is_empty(),
            (Some(_), _) => true,
        }
    }
}
