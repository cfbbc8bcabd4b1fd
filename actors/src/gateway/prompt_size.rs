//! The prompt's length in characters, checked before it is tokenized: a prompt far longer
//! than any context is refused with 413 at once, instead of costing seconds of tokenizing
//! and hundreds of megabytes first.

use super::errors::ApiError;
use super::protocol::request::Prompt;

/// 413 naming `param` when `text` has more than `limit` characters.
pub fn check_chars(param: &str, text: &str, limit: usize) -> Result<(), ApiError> {
    if text.len() <= limit || text.chars().nth(limit).is_none() {
        return Ok(());
    }
    Err(ApiError::too_large(format!(
        "the prompt in `{param}` has {} characters, over the limit of {limit} \
         (max_prompt_chars)",
        text.chars().count()
    ))
    .with_param(param))
}

/// 413 naming `prompt` when a text prompt has more than `limit` characters (token ids
/// are checked against the context once counted).
pub fn check_prompt(prompt: &Prompt, limit: usize) -> Result<(), ApiError> {
    match prompt {
        Prompt::Text(text) => check_chars("prompt", text, limit),
        Prompt::Texts(texts) => texts
            .iter()
            .try_for_each(|text| check_chars("prompt", text, limit)),
        Prompt::Tokens(_) | Prompt::TokenLists(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_text_over_the_limit_is_refused() {
        assert!(check_chars("prompt", "héllo", 5).is_ok());
        let err = check_chars("messages", "héllo!", 5).unwrap_err();
        assert_eq!(err.status().as_u16(), 413);
        assert_eq!(err.param(), Some("messages"));
        assert_eq!(
            err.message(),
            "the prompt in `messages` has 6 characters, over the limit of 5 (max_prompt_chars)"
        );
        let texts = Prompt::Texts(vec!["ok".into(), "too long".into()]);
        assert_eq!(check_prompt(&texts, 4).unwrap_err().param(), Some("prompt"));
        assert!(check_prompt(&Prompt::Tokens(vec![1; 100]), 4).is_ok());
    }
}
