//! One of the strict model fakes, chosen at run time, with what an `[llm]` block needs to reach
//! it: for tests that run the same scenario against each provider's wire format.

use std::ops::Deref;

use crate::{FakeAnthropic, FakeOpenAi, FakeOpenAiResponses, FakeServer};

/// A running model fake, and the `[llm]` `type` and model that reach it.
pub struct ModelFake {
    pub fake: Box<dyn Deref<Target = FakeServer> + Send + Sync>,
    pub base_url: String,
    /// The `[llm]` block's `type`.
    pub kind: &'static str,
    /// A model of the provider's, priced and windowed as the real one.
    pub model: &'static str,
}

impl ModelFake {
    /// Anthropic's Messages API, model `claude-sonnet-4-5`.
    pub async fn anthropic() -> Self {
        let fake = FakeAnthropic::start().await;
        let base_url = fake.base_url();
        ModelFake { fake: Box::new(fake), base_url, kind: "anthropic", model: "claude-sonnet-4-5" }
    }

    /// OpenAI's Chat Completions, model `gpt-4o`.
    pub async fn chat_completions() -> Self {
        let fake = FakeOpenAi::start().await;
        let base_url = fake.base_url();
        ModelFake { fake: Box::new(fake), base_url, kind: "openai", model: "gpt-4o" }
    }

    /// OpenAI's Responses API, model `gpt-5`.
    pub async fn responses() -> Self {
        let fake = FakeOpenAiResponses::start().await;
        let base_url = fake.base_url();
        ModelFake { fake: Box::new(fake), base_url, kind: "openai-responses", model: "gpt-5" }
    }
}

impl Deref for ModelFake {
    type Target = FakeServer;

    fn deref(&self) -> &FakeServer {
        &self.fake
    }
}
