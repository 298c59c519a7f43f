//! PyO3 bindings: wiring only. One class per pipeline (`Pipeline`) and one for exported host
//! buffers (`HostBufferView`); parsing of vLLM-shaped Python objects lives in `update.rs` and
//! `params.rs`, error mapping in `errors.rs`.

#[macro_use]
mod update;

mod buffer;
mod errors;
mod history;
mod params;
mod pipeline;

use pyo3::prelude::*;

#[pymodule]
mod _core {
    #[pymodule_export]
    use super::buffer::HostBufferView;
    #[pymodule_export]
    use super::pipeline::Pipeline;

    use pyo3::prelude::*;

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        m.add("PAGE_SIZE", crate::buffer::PAGE_SIZE)?;
        m.add("SECTION_ALIGN", crate::arena::SECTION_ALIGN)?;
        Ok(())
    }
}
