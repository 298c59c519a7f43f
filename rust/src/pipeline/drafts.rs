//! Speculative decoding's draft rows on the V1 path (vLLM's rejection-sampler layout).

use super::Pipeline;
use crate::error::{Error, Result};
use crate::history::HistorySource;
use crate::tables::bad_words::BadWordsTable;
use crate::tables::min_tokens::MinTokensTable;

impl<S: HistorySource> Pipeline<S> {
    /// Draft-row masks of MinTokens (vLLM `apply_with_spec_decode`); returns the layout's row
    /// count and the masks' padded length. The row count is checked against the configured
    /// draft tokens first.
    pub fn spec_min_tokens(&mut self, num_draft: &[usize]) -> Result<(usize, usize)> {
        self.check_draft_layout(num_draft)?;
        let store = &self.store;
        match self.tables.get_mut::<MinTokensTable>() {
            Some(MinTokensTable {
                state,
                spec: Some(out),
                ..
            }) => Ok((
                state.spec_decode_triples(num_draft, out, store)?,
                out.padded_len(),
            )),
            _ => Err(Error::Protocol(
                "speculative decoding is not configured for MinTokens".into(),
            )),
        }
    }

    /// Draft-row bans of bad words (vLLM `apply_bad_words_with_drafts`); returns the layout's
    /// row count and the bans' padded length.
    pub fn spec_bad_words(
        &mut self,
        num_draft: &[usize],
        drafts: &[Vec<i64>],
    ) -> Result<(usize, usize)> {
        self.check_draft_layout(num_draft)?;
        let store = &self.store;
        match self.tables.get_mut::<BadWordsTable>() {
            Some(BadWordsTable {
                state,
                spec: Some(out),
                ..
            }) => Ok((
                state.spec_decode_triples(num_draft, drafts, out, store)?,
                out.padded_len(),
            )),
            _ => Err(Error::Protocol(
                "speculative decoding is not configured for bad words".into(),
            )),
        }
    }

    pub(super) fn check_draft_layout(&self, num_draft: &[usize]) -> Result<()> {
        if num_draft.len() > self.capacity {
            return Err(Error::TooLarge {
                field: "num_draft_tokens",
                value: num_draft.len(),
                max: self.capacity,
            });
        }
        if let Some((r, &n)) = num_draft
            .iter()
            .enumerate()
            .find(|(_, &n)| n > self.spec_tokens.max(1))
        {
            return Err(Error::invalid(
                r,
                "num_draft_tokens",
                format!(
                    "{n} draft rows, more than the configured {} speculative tokens",
                    self.spec_tokens
                ),
            ));
        }
        Ok(())
    }
}
