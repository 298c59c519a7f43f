//! The request fields tables read: declared by each table ([`FieldSpec`]), read once per added
//! request by whoever drives the pipeline (the bindings read them from `SamplingParams` by
//! kind), and handed to every table's `check` as one [`Fields`].

use crate::error::{Error, Result};

/// A float as an error shows it: as Rust writes it ("2", "0.5", "inf"), or in exponent form
/// where that would be long ("1e-50", not fifty zeros).
struct Shown(f64);

impl std::fmt::Display for Shown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let plain = self.0.to_string();
        if plain.len() > 20 {
            write!(f, "{:e}", self.0)
        } else {
            f.write_str(&plain)
        }
    }
}

/// One end of a [`Range`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum End {
    /// This value, included.
    Closed(f64),
    /// This value, excluded.
    Open(f64),
    /// As far as a float32 goes: the field is stored as a float32, which must be finite.
    Finite,
    /// The per-request cap of this engine-config name, included: checked where the cap is
    /// known (the tables); a front end that knows no engine checks the rest of the range.
    Cap(&'static str),
    /// None: any int the core reads (an int field's upper end, [`INT_RANGE`]).
    Unbounded,
}

impl End {
    /// Whether `x` is on the inside of this end (`lo`: as the lower end, else the upper);
    /// `cap` is the value of a [`End::Cap`] end, unchecked when `None`. NaN never is.
    fn admits(self, x: f64, lo: bool, cap: Option<u64>) -> bool {
        match self {
            End::Closed(e) if lo => x >= e,
            End::Closed(e) => x <= e,
            End::Open(e) if lo => x > e,
            End::Open(e) => x < e,
            End::Finite => x.is_finite(),
            End::Cap(_) => !x.is_nan() && cap.is_none_or(|c| x <= c as f64),
            End::Unbounded => !x.is_nan(),
        }
    }

    /// This end's value in a bracketed range, if it has one ("1", "max_dry_penalty_last_n").
    fn shown(self) -> Option<String> {
        match self {
            End::Closed(e) | End::Open(e) => Some(e.to_string()),
            End::Cap(name) => Some(name.to_string()),
            End::Finite | End::Unbounded => None,
        }
    }
}

/// The values a number field accepts: its ends, whether it is an int field, and a note the
/// error adds (what some values mean: "(0: off)"). Declared once, on the field
/// ([`FieldSpec::range`]); the tables check with it ([`FieldSpec::checked`],
/// [`FieldSpec::checked_int`]) and the Python front ends ask the core
/// (`_core.field_range_error`), so each range and its message live here alone.
///
/// A float range with a [`End::Finite`] end holds float32 values: a value is checked as the
/// float32 it is stored as (rounded to nearest), so "finite" is float32's and "> 0" is what
/// stays above 0 as a float32. Every message has one form, from the declaration: "must be
/// in [0, 1] (0: off), got 2", "must be a finite float32 >= 1, got 0.5", "must be an int
/// in [0, max_no_repeat_ngram_size] (0: off), got -1"; a value above a known cap adds it:
/// "got 200 > max_no_repeat_ngram_size = 128". A value inside every end it is checked
/// against gets no message, so a front end without the caps says the same words as the core
/// of every value it refuses.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Range {
    pub lo: End,
    pub hi: End,
    /// An `Int` or `OptInt` field's range (checked with [`Range::int_error`]).
    pub int: bool,
    pub note: &'static str,
}

impl Range {
    /// A float in `[lo, hi]`.
    pub const fn closed(lo: f64, hi: f64) -> Self {
        Range {
            lo: End::Closed(lo),
            hi: End::Closed(hi),
            int: false,
            note: "",
        }
    }

    /// A finite float32 `>= lo`.
    pub const fn at_least(lo: f64) -> Self {
        Range {
            lo: End::Closed(lo),
            hi: End::Finite,
            int: false,
            note: "",
        }
    }

    /// Any finite float32.
    pub const fn finite() -> Self {
        Range {
            lo: End::Finite,
            hi: End::Finite,
            int: false,
            note: "",
        }
    }

    /// An int `>= lo` (no upper end but the core's [`INT_RANGE`]; see [`Range::up_to_cap`]).
    pub const fn int_at_least(lo: i64) -> Self {
        Range {
            lo: End::Closed(lo as f64),
            hi: End::Unbounded,
            int: true,
            note: "",
        }
    }

    /// The same range without its lower end's value.
    pub const fn open_lo(mut self) -> Self {
        if let End::Closed(e) = self.lo {
            self.lo = End::Open(e);
        }
        self
    }

    /// The same range without its upper end's value.
    pub const fn open_hi(mut self) -> Self {
        if let End::Closed(e) = self.hi {
            self.hi = End::Open(e);
        }
        self
    }

    /// The same range, at most the per-request cap named `cap` (engine-config name).
    pub const fn up_to_cap(mut self, cap: &'static str) -> Self {
        self.hi = End::Cap(cap);
        self
    }

    /// The same range, its error saying `note` after it.
    pub const fn note(mut self, note: &'static str) -> Self {
        self.note = note;
        self
    }

    /// The engine cap bounding it, if any (by engine-config name).
    pub fn cap(&self) -> Option<&'static str> {
        match (self.lo, self.hi) {
            (End::Cap(c), _) | (_, End::Cap(c)) => Some(c),
            _ => None,
        }
    }

    /// Whether it holds float32 values (an end is [`End::Finite`]).
    fn float32(&self) -> bool {
        !self.int && (self.lo == End::Finite || self.hi == End::Finite)
    }

    /// Whether `x` (a value as checked: an int's as a float, a float32 range's rounded to
    /// float32) is inside, its cap end checked against `cap` when known.
    fn admits(&self, x: f64, cap: Option<u64>) -> bool {
        self.lo.admits(x, true, cap) && self.hi.admits(x, false, cap)
    }

    /// The values it takes, as its error says them: "in [0, 1) (0: off)", "a finite float32
    /// > 0", "an int >= 1", "an int in [0, max_no_repeat_ngram_size]".
    pub fn describe(&self) -> String {
        let kind = if self.int {
            "an int"
        } else if self.float32() {
            "a finite float32"
        } else {
            ""
        };
        let bound = match (self.lo.shown(), self.hi.shown()) {
            (Some(lo), Some(hi)) => format!(
                "in {}{lo}, {hi}{}",
                if matches!(self.lo, End::Open(_)) {
                    "("
                } else {
                    "["
                },
                if matches!(self.hi, End::Open(_)) {
                    ")"
                } else {
                    "]"
                },
            ),
            (Some(lo), None) => {
                let op = if matches!(self.lo, End::Open(_)) {
                    ">"
                } else {
                    ">="
                };
                format!("{op} {lo}")
            }
            (None, Some(hi)) => {
                let op = if matches!(self.hi, End::Open(_)) {
                    "<"
                } else {
                    "<="
                };
                format!("{op} {hi}")
            }
            (None, None) => String::new(),
        };
        let mut out = [kind, bound.as_str()]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        if !self.note.is_empty() {
            out.push(' ');
            out.push_str(self.note);
        }
        out
    }

    /// The refusal of `shown` (the value as the caller sent it), or `None` when `x` is
    /// inside; `cap` the value of the cap end (unchecked when `None`).
    fn refusal(&self, x: f64, shown: &dyn std::fmt::Display, cap: Option<u64>) -> Option<String> {
        if self.admits(x, cap) {
            return None;
        }
        let above_cap = match (self.cap(), cap) {
            (Some(name), Some(c)) if self.admits(x, None) => format!(" > {name} = {c}"),
            _ => String::new(),
        };
        Some(format!(
            "must be {}, got {shown}{above_cap}",
            self.describe()
        ))
    }

    /// What the error says of a float field's value outside ("must be in [0, 1], got 2"), or
    /// `None` inside (NaN never is).
    pub fn float_error(&self, x: f64) -> Option<String> {
        debug_assert!(!self.int, "an int range checked as a float");
        let checked = if self.float32() { x as f32 as f64 } else { x };
        self.refusal(checked, &Shown(x), None)
    }

    /// What the error says of an int field's value outside ("must be an int >= 1, got 0"),
    /// or `None` inside; `cap` the value of its cap end, if it has one and it is known.
    pub fn int_error(&self, x: i64, cap: Option<u64>) -> Option<String> {
        debug_assert!(self.int, "a float range checked as an int");
        self.refusal(x as f64, &x, cap)
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

/// A value of a field, as a test or a doc gives it ([`FieldSpec::examples`],
/// [`FieldSpec::bad`]); `_core.registry()` hands them to Python as Python values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Example {
    Float(f64),
    Int(i64),
    Bool(bool),
    /// Not set (`None`).
    Unset,
    /// A value of the wrong type ("2" for an int field).
    Str(&'static str),
    /// `2**n`: an int beyond what the core reads (n > 63).
    PowerOfTwo(u32),
    Ids(&'static [i64]),
    IdLists(&'static [&'static [i64]]),
    Bias(&'static [(i64, f64)]),
}

/// One field a table reads.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldSpec {
    /// The name tables take it by, and errors name.
    pub name: &'static str,
    /// The `SamplingParams` attribute it is read from.
    pub attr: &'static str,
    pub kind: FieldKind,
    /// Given to its table only when this `Int` field (declared before it) is > 0; read, and
    /// so held to its caps, either way (a cap holds whether or not the field is in use).
    pub when_positive: Option<&'static str>,
    /// Whether it only tunes its processor (DRY's base, XTC's threshold, a window): set alone
    /// it changes nothing. The other fields switch the processor on for the request; a
    /// pipeline without the table refuses a request that sets one of those
    /// (`python::params::Reader`'s guards), rather than dropping it.
    pub tunes: bool,
    /// The values a number field accepts (checked with [`FieldSpec::checked`] or
    /// [`FieldSpec::checked_int`]), an int's per-request cap among them ([`Range::up_to_cap`]).
    pub range: Option<Range>,
    /// What one entry of a list field is called in an error ("word": "200 words exceed").
    pub item: &'static str,
    /// The values at or below this are off, read as the neutral value (`kept_top_k`'s -1,
    /// `top_n_sigma <= 0`): `SamplingParams` holds the neutral value, the table checks with
    /// [`FieldSpec::canonical`].
    pub off_at_most: Option<f64>,
    /// Values a request may give it, the first one not neutral (for a field that is not
    /// `tunes`, one that switches its processor on); the rest the edges worth testing. The
    /// tests' lists of fields and values are derived from these (`registry.Field.examples`).
    pub examples: &'static [Example],
    /// Values a request may not give it (each refused, naming the field).
    pub bad: &'static [Example],
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
            item: "entry",
            off_at_most: None,
            examples: &[],
            bad: &[],
        }
    }

    /// The same field, off (read as neutral) at or below `x` (see [`FieldSpec::off_at_most`]).
    pub const fn off_at_most(mut self, x: f64) -> Self {
        self.off_at_most = Some(x);
        self
    }

    /// The neutral value of a float or int field (`None` for the other kinds).
    pub fn neutral(&self) -> Option<f64> {
        match self.kind {
            FieldKind::Float { neutral } => Some(neutral),
            FieldKind::Int { neutral } => Some(neutral as f64),
            _ => None,
        }
    }

    /// `x` as the table sees it: the neutral value where [`FieldSpec::off_at_most`] says
    /// it is off, else itself.
    pub fn canonical(&self, x: f64) -> f64 {
        match (self.off_at_most, self.neutral()) {
            (Some(most), Some(neutral)) if x <= most => neutral,
            _ => x,
        }
    }

    /// The same field with these example values (see [`FieldSpec::examples`]).
    pub const fn examples(mut self, examples: &'static [Example]) -> Self {
        self.examples = examples;
        self
    }

    /// The same field with these refused values (see [`FieldSpec::bad`]).
    pub const fn bad(mut self, bad: &'static [Example]) -> Self {
        self.bad = bad;
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
            _ => self.range.and_then(|r| r.cap()).into_iter().collect(),
        }
    }

    /// The same field, accepting only `range`.
    pub const fn range(mut self, range: Range) -> Self {
        self.range = Some(range);
        self
    }

    /// A float field's `x` when its range holds it, else the error naming request `index` and
    /// the field (a field without a range takes anything).
    pub fn checked(&self, index: usize, x: f64) -> Result<f64> {
        match self.range.and_then(|r| r.float_error(x)) {
            Some(message) => Err(Error::invalid(index, self.name, message)),
            None => Ok(x),
        }
    }

    /// An int field's `x` when its range holds it, else the error naming request `index` and
    /// the field; `cap` the value of the range's cap (a table passes the one it was built with).
    pub fn checked_int(&self, index: usize, x: i64, cap: Option<usize>) -> Result<i64> {
        debug_assert_eq!(
            cap.is_some(),
            self.range.is_some_and(|r| r.cap().is_some()),
            "{}: a cap is passed exactly for a range with a cap end",
            self.name
        );
        match self
            .range
            .and_then(|r| r.int_error(x, cap.map(|c| c as u64)))
        {
            Some(message) => Err(Error::invalid(index, self.name, message)),
            None => Ok(x),
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

    /// The same field, given to its table only when `int_field` is > 0 (see
    /// [`FieldSpec::when_positive`]).
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

/// One request's value for one column, as read from its parameters (its
/// column's table, `tables::columns`, checks and stores it).
#[derive(Clone, Debug, PartialEq)]
pub enum ColumnValue {
    /// Not set: the default (or an empty token list).
    Unset,
    Float(f64),
    Int(i64),
    Array(Vec<f64>),
    Tokens(Vec<i64>),
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
    /// The request's `seed` (Python's `int(seed) mod 2**64`), read when a table keeps seeds
    /// (XTC's own draws: `FloatParams::seeds`); `None` when unset.
    pub seed: Option<u64>,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// One message form for every shape of range, generated from the declaration.
    #[test]
    fn each_shape_of_range_says_its_values_in_one_form() {
        let unit = Range::closed(0.0, 1.0).open_lo().note("(1: off)");
        assert_eq!(unit.float_error(1.0), None);
        assert_eq!(
            unit.float_error(0.0).unwrap(),
            "must be in (0, 1] (1: off), got 0"
        );
        let base = Range::at_least(1.0);
        assert_eq!(base.float_error(f64::from(f32::MAX)), None);
        assert_eq!(
            base.float_error(0.5).unwrap(),
            "must be a finite float32 >= 1, got 0.5"
        );
        assert!(base.float_error(f64::INFINITY).is_some());
        assert!(base.float_error(f64::NAN).is_some());
        assert_eq!(
            base.float_error(1e39).unwrap(),
            "must be a finite float32 >= 1, got 1e39",
            "inf as a float32"
        );
        let positive = Range::at_least(0.0).open_lo();
        assert_eq!(
            positive.float_error(1e-50).unwrap(),
            "must be a finite float32 > 0, got 1e-50",
            "0 as a float32"
        );
        assert_eq!(positive.float_error(1e-45), None);
        let finite = Range::finite().note("(<= 0: off)");
        assert_eq!(finite.float_error(-3.0), None);
        assert_eq!(
            finite.float_error(f64::NEG_INFINITY).unwrap(),
            "must be a finite float32 (<= 0: off), got -inf"
        );
        let from_one = Range::int_at_least(1);
        assert_eq!(from_one.int_error(i64::MAX, None), None);
        assert_eq!(
            from_one.int_error(0, None).unwrap(),
            "must be an int >= 1, got 0"
        );
        let window = Range::int_at_least(-1).up_to_cap("max_w").note("(-1: all)");
        assert_eq!(window.cap(), Some("max_w"));
        assert_eq!(window.int_error(100, Some(100)), None);
        assert_eq!(window.int_error(101, None), None, "no cap known: unchecked");
        let below = "must be an int in [-1, max_w] (-1: all), got -2";
        assert_eq!(window.int_error(-2, None).unwrap(), below);
        assert_eq!(
            window.int_error(-2, Some(100)).unwrap(),
            below,
            "the same words"
        );
        assert_eq!(
            window.int_error(101, Some(100)).unwrap(),
            "must be an int in [-1, max_w] (-1: all), got 101 > max_w = 100"
        );
    }

    #[test]
    fn checked_names_the_request_and_the_field() {
        let spec = FieldSpec::new("k", FieldKind::Int { neutral: 0 })
            .range(Range::int_at_least(0).up_to_cap("max_k"));
        assert_eq!(spec.caps(), vec!["max_k"]);
        assert_eq!(spec.checked_int(3, 4, Some(4)).unwrap(), 4);
        let e = spec.checked_int(3, 5, Some(4)).unwrap_err().to_string();
        assert!(
            e.contains("index 3") && e.contains("'k'") && e.contains("got 5"),
            "{e}"
        );
    }
}
