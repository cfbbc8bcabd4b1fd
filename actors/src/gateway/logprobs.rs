//! Token logprobs in the shapes of the two endpoints, and the prompt's (`echo` with
//! `logprobs` in the completions shape, vLLM's `prompt_logprobs`).

use super::generation::{PromptTokenOut, TokenOut};
use super::protocol::response::{
    ChatLogprobs, ChatTokenLogprob, ChatTopLogprob, CompletionLogprobs, PromptLogprob,
    PromptLogprobsOut, PromptPosition, TopLogprobs,
};

/// The completions shape. `offset` is where the first token's text starts in the output
/// (in characters); it is advanced past the tokens, for the next chunk of a stream. As in
/// vLLM, each token's alternatives include the token itself.
pub fn completion(tokens: &[TokenOut], offset: &mut usize) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    for token in tokens {
        let mut top = token.top.clone();
        if !top.iter().any(|(text, _)| *text == token.text) {
            top.push((token.text.clone(), token.logprob));
        }
        out.tokens.push(token.text.clone());
        out.token_logprobs.push(Some(token.logprob));
        out.top_logprobs.push(Some(TopLogprobs(top)));
        out.text_offset.push(*offset);
        *offset += token.text.chars().count();
    }
    out
}

/// The prompt's tokens in the completions shape (`echo` with `logprobs`), each with its
/// `top` most likely alternatives (and itself); the first, which follows nothing, with
/// neither a logprob nor alternatives. `offset` as in [`completion`].
pub fn echoed(prompt: &[PromptTokenOut], top: usize, offset: &mut usize) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    for token in prompt {
        let Some(scored) = &token.scored else {
            out.tokens.push(token.text.clone());
            out.token_logprobs.push(None);
            out.top_logprobs.push(None);
            out.text_offset.push(*offset);
            *offset += token.text.chars().count();
            continue;
        };
        let scored = TokenOut {
            text: token.text.clone(),
            logprob: scored.logprob,
            top: scored
                .top
                .iter()
                .take(top)
                .map(|(_, text, logprob)| (text.clone(), *logprob))
                .collect(),
        };
        out.append(completion(&[scored], offset));
    }
    out
}

/// vLLM's `prompt_logprobs` of `prompt`: each scored token and its `top` most likely
/// alternatives, by id, each with its rank and text.
pub fn prompt_logprobs(prompt: &[PromptTokenOut], top: usize) -> PromptLogprobsOut {
    let positions = prompt.iter().map(|token| {
        let scored = token.scored.as_ref()?;
        let own = PromptLogprob {
            logprob: scored.logprob,
            rank: scored.rank,
            decoded_token: token.text.clone(),
        };
        let mut entries = vec![(token.id, own)];
        for (at, (id, text, logprob)) in scored.top.iter().take(top).enumerate() {
            if *id != token.id {
                let entry = PromptLogprob {
                    logprob: *logprob,
                    rank: at + 1,
                    decoded_token: text.clone(),
                };
                entries.push((*id, entry));
            }
        }
        Some(PromptPosition(entries))
    });
    PromptLogprobsOut(positions.collect())
}

/// The chat shape.
pub fn chat(tokens: &[TokenOut]) -> ChatLogprobs {
    let content = tokens
        .iter()
        .map(|token| ChatTokenLogprob {
            token: token.text.clone(),
            logprob: token.logprob,
            bytes: token.text.as_bytes().to_vec(),
            top_logprobs: token
                .top
                .iter()
                .map(|(text, logprob)| ChatTopLogprob {
                    token: text.clone(),
                    logprob: *logprob,
                    bytes: text.as_bytes().to_vec(),
                })
                .collect(),
        })
        .collect();
    ChatLogprobs { content }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::generation::Scored;

    fn tokens() -> Vec<TokenOut> {
        vec![
            TokenOut {
                text: "hé".into(),
                logprob: -0.5,
                top: vec![("hé".into(), -0.5), ("x".into(), -1.0)],
            },
            TokenOut {
                text: "y".into(),
                logprob: -2.0,
                top: vec![("z".into(), -0.1)],
            },
        ]
    }

    #[test]
    fn completion_shape_tracks_offsets_and_adds_the_chosen_token() {
        let mut offset = 3;
        let out = completion(&tokens(), &mut offset);
        assert_eq!(out.tokens, ["hé", "y"]);
        assert_eq!(out.token_logprobs, [Some(-0.5), Some(-2.0)]);
        assert_eq!(out.text_offset, [3, 5]);
        assert_eq!(offset, 6);
        assert_eq!(out.top_logprobs[0].as_ref().unwrap().0.len(), 2);
        assert_eq!(
            out.top_logprobs[1].as_ref().unwrap().0,
            [("z".to_owned(), -0.1), ("y".to_owned(), -2.0)]
        );
        let json = serde_json::to_value(&out).unwrap();
        assert_eq!(
            json["top_logprobs"][1],
            serde_json::json!({"z": -0.1f32, "y": -2.0})
        );
    }

    /// A prompt of three tokens: the first unscored, the second the most likely there,
    /// the third ranked 3rd.
    fn prompt() -> Vec<PromptTokenOut> {
        let scored = |logprob, rank, top: &[(u32, &str, f32)]| {
            Some(Scored {
                logprob,
                rank,
                top: top
                    .iter()
                    .map(|&(id, t, l)| (id, t.to_owned(), l))
                    .collect(),
            })
        };
        vec![
            PromptTokenOut {
                id: 7,
                text: "<s>".into(),
                scored: None,
            },
            PromptTokenOut {
                id: 8,
                text: "ab".into(),
                scored: scored(-0.1, 1, &[(8, "ab", -0.1), (9, "c", -3.0)]),
            },
            PromptTokenOut {
                id: 10,
                text: "d".into(),
                scored: scored(-4.0, 3, &[(11, "e", -0.5), (8, "ab", -1.5)]),
            },
        ]
    }

    #[test]
    fn the_echoed_prompt_starts_unscored_and_keeps_top_alternatives() {
        let mut offset = 0;
        let out = echoed(&prompt(), 1, &mut offset);
        assert_eq!(out.tokens, ["<s>", "ab", "d"]);
        assert_eq!(out.token_logprobs, [None, Some(-0.1), Some(-4.0)]);
        assert_eq!(out.text_offset, [0, 3, 5]);
        assert_eq!(offset, 6);
        let json = serde_json::to_value(&out).unwrap();
        assert_eq!(
            json["top_logprobs"],
            serde_json::json!([null, {"ab": -0.1f32}, {"e": -0.5f32, "d": -4.0f32}])
        );
    }

    #[test]
    fn prompt_logprobs_put_the_prompt_token_first_by_id() {
        let out = prompt_logprobs(&prompt(), 2);
        let json = serde_json::to_string(&out).unwrap();
        assert_eq!(
            json,
            r#"[null,{"8":{"logprob":-0.1,"rank":1,"decoded_token":"ab"},"9":{"logprob":-3.0,"rank":2,"decoded_token":"c"}},{"10":{"logprob":-4.0,"rank":3,"decoded_token":"d"},"11":{"logprob":-0.5,"rank":1,"decoded_token":"e"},"8":{"logprob":-1.5,"rank":2,"decoded_token":"ab"}}]"#
        );
        // 0 alternatives: the prompt token alone.
        let out = prompt_logprobs(&prompt(), 0);
        assert_eq!(out.0[2].as_ref().unwrap().0.len(), 1);
    }

    #[test]
    fn chat_shape_has_bytes() {
        let out = chat(&tokens());
        assert_eq!(out.content[0].bytes, "hé".as_bytes());
        assert_eq!(out.content[0].top_logprobs.len(), 2);
        assert_eq!(out.content[1].top_logprobs[0].token, "z");
    }
}
