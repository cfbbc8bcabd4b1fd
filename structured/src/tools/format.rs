//! The tool-call formats, named as vLLM's `--tool-call-parser` names them, the marker texts
//! each writes, and the choice of a format from a model's chat template.

/// `<tool_call>`: opens a Hermes call block.
pub(super) const HERMES_OPEN: &str = "<tool_call>";
/// `</tool_call>`: closes a Hermes call block.
pub(super) const HERMES_CLOSE: &str = "</tool_call>";
/// `<|python_tag|>`: Llama 3's code-interpreter marker, which may lead its JSON calls.
pub(super) const PYTHON_TAG: &str = "<|python_tag|>";
/// `[TOOL_CALLS]`: leads Mistral's calls.
pub(super) const MISTRAL_CALLS: &str = "[TOOL_CALLS]";
/// `[ARGS]`: between a call's name and its arguments in Mistral's newer (v11+) form.
pub(super) const MISTRAL_ARGS: &str = "[ARGS]";
/// `<｜tool▁calls▁begin｜>`: opens DeepSeek V3's calls.
pub(super) const DEEPSEEK_CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
/// `<｜tool▁calls▁end｜>`: closes DeepSeek V3's calls.
pub(super) const DEEPSEEK_CALLS_END: &str = "<｜tool▁calls▁end｜>";
/// `<｜tool▁call▁begin｜>`: opens one DeepSeek V3 call.
pub(super) const DEEPSEEK_CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
/// `<｜tool▁call▁end｜>`: closes one DeepSeek V3 call.
pub(super) const DEEPSEEK_CALL_END: &str = "<｜tool▁call▁end｜>";
/// `<｜tool▁sep｜>`: between a DeepSeek V3 call's type and its name.
pub(super) const DEEPSEEK_SEP: &str = "<｜tool▁sep｜>";

/// How a model family writes its tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ToolCallFormat {
    /// `hermes` (Hermes 2 Pro, Qwen2.5, Qwen3, SmolLM2):
    /// `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`, one block per call;
    /// a block may also hold a JSON list of calls (SmolLM2 as Ollama prompts it).
    Hermes,
    /// `llama3_json` (Llama 3.1 to 3.3): a bare `{"name": "f", "parameters": {...}}`
    /// (or `"arguments"`), possibly after `<|python_tag|>`, several joined by `;`.
    Llama3Json,
    /// `mistral`: `[TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]`, or the newer
    /// `[TOOL_CALLS]f[ARGS]{...}` (one marker per call).
    Mistral,
    /// `deepseek_v3`: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f`
    /// then a fenced JSON block and `<｜tool▁call▁end｜>` per call, then
    /// `<｜tool▁calls▁end｜>`.
    DeepSeekV3,
}

impl ToolCallFormat {
    /// Every format.
    pub const ALL: [ToolCallFormat; 4] = [
        ToolCallFormat::Hermes,
        ToolCallFormat::Llama3Json,
        ToolCallFormat::Mistral,
        ToolCallFormat::DeepSeekV3,
    ];

    /// The format vLLM's `--tool-call-parser NAME` selects (`hermes`, `llama3_json`,
    /// `mistral`, `deepseek_v3`; also `llama4_json` and `deepseekv3`, which read the same).
    pub fn from_parser_name(name: &str) -> Option<ToolCallFormat> {
        match name {
            "hermes" => Some(ToolCallFormat::Hermes),
            "llama3_json" | "llama4_json" => Some(ToolCallFormat::Llama3Json),
            "mistral" => Some(ToolCallFormat::Mistral),
            "deepseek_v3" | "deepseekv3" => Some(ToolCallFormat::DeepSeekV3),
            _ => None,
        }
    }

    /// The format's `--tool-call-parser` name.
    pub fn parser_name(self) -> &'static str {
        match self {
            ToolCallFormat::Hermes => "hermes",
            ToolCallFormat::Llama3Json => "llama3_json",
            ToolCallFormat::Mistral => "mistral",
            ToolCallFormat::DeepSeekV3 => "deepseek_v3",
        }
    }
}

/// The format a model's chat template (its Jinja source) writes tool calls in, from the
/// markers it mentions; `None` for a template without tool syntax (SmolLM2's), whose
/// model the gateway prompts with [`crate::tools::tools_system_prompt`] and parses as
/// [`ToolCallFormat::Hermes`].
pub fn detect(chat_template: &str) -> Option<ToolCallFormat> {
    if chat_template.contains("tool▁calls▁begin") {
        Some(ToolCallFormat::DeepSeekV3)
    } else if chat_template.contains(MISTRAL_CALLS) {
        Some(ToolCallFormat::Mistral)
    } else if chat_template.contains(HERMES_OPEN) {
        Some(ToolCallFormat::Hermes)
    } else if chat_template.contains(PYTHON_TAG) || chat_template.contains("ipython") {
        Some(ToolCallFormat::Llama3Json)
    } else {
        None
    }
}

/// How calls in the Hermes format are laid out, for prompts and forced calls (the reader
/// takes both).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum HermesStyle {
    /// One `<tool_call>` block per call, the object on its own line: the format's own
    /// (Qwen2.5, Qwen3, Hermes).
    #[default]
    Blocks,
    /// One `<tool_call>` block holding a JSON list of all the calls:
    /// `<tool_call>[{"name": ...}, {"name": ...}]</tool_call>`, as SmolLM2 was trained.
    List,
}
