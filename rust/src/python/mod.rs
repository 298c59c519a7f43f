//! PyO3 bindings: wiring only. One class per pipeline (`Pipeline`) and one for exported host
//! buffers (`HostBufferView`); parsing of vLLM-shaped Python objects lives in `update.rs` and
//! `params.rs`, error mapping in `errors.rs`.

mod buffer;
mod errors;
mod history;
mod params;
mod pipeline;
mod update;

use pyo3::prelude::*;

#[pymodule]
mod _core {
    #[pymodule_export]
    use super::buffer::HostBufferView;
    #[pymodule_export]
    use super::pipeline::Pipeline;

    use pyo3::prelude::*;

    /// The built-in tables, from the core's registry: `(name, caps, fields)` per table in
    /// reading order, with `caps` as `(engine-config name, default)` and `fields` as
    /// `(name, SamplingParams attribute)`.
    #[allow(clippy::type_complexity)]
    #[pyfunction]
    fn builtins() -> Vec<(
        &'static str,
        Vec<(&'static str, usize)>,
        Vec<(&'static str, &'static str)>,
    )> {
        crate::tables::BUILTINS
            .iter()
            .map(|b| {
                (
                    b.name,
                    b.caps.to_vec(),
                    b.fields.iter().map(|f| (f.name, f.attr)).collect(),
                )
            })
            .collect()
    }

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        m.add("PAGE_SIZE", crate::buffer::PAGE_SIZE)?;
        m.add("SECTION_ALIGN", crate::arena::SECTION_ALIGN)?;
        Ok(())
    }
}
