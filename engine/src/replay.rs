//! The resume-replay block (rule 8): what a recovery re-prompt tells the agent.
//!
//! The core decides how many blocks a dispatch carries ([`PromptRequest::replay_blocks`]:
//! 0 for a first dispatch, exactly 1 for a recovery re-prompt) and from which recovery
//! generation. This module only renders that decision, always around the caller's
//! *original* text, never around an earlier rendering, so blocks cannot accumulate.

use palisade_core::PromptRequest;

/// How every replay block starts; a test (or an agent) can count the blocks by it.
pub const REPLAY_BLOCK_TAG: &str = "<palisade-resume ";

/// The prompt text as the agent must receive it: `request.replay_blocks` replay blocks,
/// then the caller's original text.
#[must_use]
pub fn render_prompt(original: &str, request: &PromptRequest) -> String {
    let mut text = String::with_capacity(original.len() + 320 * usize::from(request.replay_blocks));
    for _ in 0..request.replay_blocks {
        text.push_str(&replay_block(request));
    }
    text.push_str(original);
    text
}

fn replay_block(request: &PromptRequest) -> String {
    let delivered = request.delivered_through;
    format!(
        "{REPLAY_BLOCK_TAG}generation=\"{}\" delivered-through=\"{delivered}\">\n\
         Your previous run of this turn was interrupted: the agent process stopped. The \
         user has already received the first {delivered} output events of that run. \
         Continue the turn from there; do not repeat what was already delivered.\n\
         </palisade-resume>\n\n",
        request.replay_generation,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(replay_blocks: u8) -> PromptRequest {
        PromptRequest {
            replay_blocks,
            replay_generation: 2,
            delivered_through: 7,
        }
    }

    #[test]
    fn first_dispatch_is_the_original_text() {
        assert_eq!(render_prompt("hello", &request(0)), "hello");
    }

    #[test]
    fn re_prompt_carries_exactly_as_many_blocks_as_the_core_says() {
        for blocks in 1..=3u8 {
            let text = render_prompt("hello", &request(blocks));
            assert_eq!(text.matches(REPLAY_BLOCK_TAG).count(), usize::from(blocks));
            assert!(text.ends_with("hello"));
            assert!(text.contains("generation=\"2\" delivered-through=\"7\""));
        }
    }
}
