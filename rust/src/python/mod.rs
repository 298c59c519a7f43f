//! PyO3 bindings: wiring only. Each exposed class is a thin wrapper around one core state;
//! parsing of vLLM-shaped Python objects lives in `update.rs`, error mapping in `errors.rs`.

#[macro_use]
mod update;

mod allowed;
mod bad_words;
mod buffer;
mod errors;
mod history;
mod logit_bias;
mod min_p;
mod min_tokens;
mod penalties;
mod thinking;

use pyo3::prelude::*;

#[pymodule]
mod _core {
    #[pymodule_export]
    use super::allowed::AllowedTokenIdsState;
    #[pymodule_export]
    use super::bad_words::BadWordsState;
    #[pymodule_export]
    use super::buffer::HostBufferView;
    #[pymodule_export]
    use super::logit_bias::LogitBiasState;
    #[pymodule_export]
    use super::min_p::MinPState;
    #[pymodule_export]
    use super::min_tokens::MinTokensState;
    #[pymodule_export]
    use super::penalties::PenaltiesState;
    #[pymodule_export]
    use super::thinking::ThinkingState;

    use pyo3::prelude::*;

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        m.add("PAGE_SIZE", crate::buffer::PAGE_SIZE)?;
        Ok(())
    }
}
