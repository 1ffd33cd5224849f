//! Provider wire formats (OpenAI chat completions, Anthropic messages) <-> the neutral LlmRequest/LlmResponse.
