//! Each format's markers, its region readers, and where reading resumes after a call that
//! broke off.

use super::deepseek::DeepSeekCalls;
use super::format::{
    ToolCallFormat, DEEPSEEK_CALLS_BEGIN, DEEPSEEK_CALLS_END, DEEPSEEK_CALL_BEGIN, HERMES_CLOSE,
    HERMES_OPEN, MISTRAL_CALLS, PYTHON_TAG,
};
use super::hermes::HermesBlock;
use super::llama::LlamaCall;
use super::mistral::MistralCalls;
use super::region::{Marker, Place, Region};

/// Where reading resumes after a call broke off: the rest is dropped up to `text`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Resume {
    /// The text that ends the dropped stretch.
    pub(super) text: &'static str,
    /// Whether `text` is dropped too (an end marker) or read again (a start marker).
    pub(super) dropped: bool,
}

/// A marker that opens a region anywhere in the text.
const fn anywhere(text: &'static str) -> Marker {
    Marker {
        text,
        place: Place::Anywhere,
    }
}

const HERMES: &[Marker] = &[anywhere(HERMES_OPEN)];
const LLAMA: &[Marker] = &[
    anywhere(PYTHON_TAG),
    Marker {
        text: "{",
        place: Place::Boundary,
    },
    Marker {
        text: ";",
        place: Place::AfterRegion,
    },
];
const MISTRAL: &[Marker] = &[anywhere(MISTRAL_CALLS)];
const DEEPSEEK: &[Marker] = &[
    anywhere(DEEPSEEK_CALLS_BEGIN),
    anywhere(DEEPSEEK_CALL_BEGIN),
];

/// The markers that open `format`'s regions.
pub(super) fn markers(format: ToolCallFormat) -> &'static [Marker] {
    match format {
        ToolCallFormat::Hermes => HERMES,
        ToolCallFormat::Llama3Json => LLAMA,
        ToolCallFormat::Mistral => MISTRAL,
        ToolCallFormat::DeepSeekV3 => DEEPSEEK,
    }
}

/// The reader of a region `marker` opened.
pub(super) fn open(format: ToolCallFormat, marker: &str) -> Box<dyn Region + Send> {
    match format {
        ToolCallFormat::Hermes => Box::new(HermesBlock::new()),
        ToolCallFormat::Llama3Json => Box::new(LlamaCall::new(marker)),
        ToolCallFormat::Mistral => Box::new(MistralCalls::new()),
        ToolCallFormat::DeepSeekV3 => Box::new(DeepSeekCalls::new(marker)),
    }
}

/// Where reading resumes after one of `format`'s calls broke off.
pub(super) fn resume(format: ToolCallFormat) -> Resume {
    match format {
        ToolCallFormat::Hermes => Resume {
            text: HERMES_CLOSE,
            dropped: true,
        },
        ToolCallFormat::Llama3Json => Resume {
            text: PYTHON_TAG,
            dropped: false,
        },
        ToolCallFormat::Mistral => Resume {
            text: MISTRAL_CALLS,
            dropped: false,
        },
        ToolCallFormat::DeepSeekV3 => Resume {
            text: DEEPSEEK_CALLS_END,
            dropped: true,
        },
    }
}
