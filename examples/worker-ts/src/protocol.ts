/* Generated from schema/*.json by scripts/generate-protocol.mjs; do not edit.
 * Regenerate: npm run generate (in examples/worker-ts). */

/**
 * Any top-level document of the decision protocol.
 */
export type ProtocolDocument =
  DecisionRequest | DecisionResponse | ClientInput | LlmRequest | LlmResponse | StreamDelta;
/**
 * A provider wire format for worker-run LLM calls.
 */
export type LlmFormat = "openai" | "anthropic" | "openai-responses";
/**
 * Where an LLM call runs.
 */
export type LlmHandler = "server" | "worker";
/**
 * Whether a person must approve a tool's calls before they run (an extension of the
 * protocol: AHP's tool confirmation).
 */
export type Approval = "always" | "never";
/**
 * Where a tool call runs.
 */
export type ToolHandler = "worker" | "client" | "server";
/**
 * A session; chosen by the client (or `<decision id>-<tool call id>` for a child the
 * engine's proposal spawns).
 */
export type SessionId = string;
/**
 * A node of the message tree: given by the client, minted as `msg_<16 hex>`, or the id of
 * the LLM call whose answer it records.
 */
export type MessageId = string;
/**
 * Where a call runs: the engine, the worker, or the client.
 */
export type Handler = "server" | "worker" | "client";
/**
 * A call: tool calls (`call_<16 hex>`, or the model's tool call id), LLM calls
 * (`llm_<16 hex>`) and sub-agent delegations (the parent's tool call id).
 */
export type CallId = string;
/**
 * A call's kind.
 */
export type CallKind = "tool_call" | "llm_call" | "sub_agent";
/**
 * Where a call is in its lifecycle.
 */
export type CallStatus = "pending" | "completed" | "failed" | "retry_scheduled" | "queued";
/**
 * A decision, `dec_<16 hex>`; its redeliveries carry the same id.
 */
export type DecisionId = string;
/**
 * The kinds of `Compaction`.
 */
export type CompactionKind = "summary" | "cleared_tool_results";
/**
 * A message body: plain text or a list of typed parts.
 */
export type Content = string | ContentPart[];
/**
 * One part of a multimodal message.
 */
export type ContentPart =
  | {
      text: string;
      type: "text";
    }
  | {
      image_url: UrlRef;
      type: "image_url";
    }
  | {
      file: FileData;
      type: "file";
    }
  | {
      input_audio: AudioData;
      type: "input_audio";
    }
  | {
      type: "video_url";
      video_url: UrlRef;
    };
/**
 * Who wrote a message.
 */
export type Role = "system" | "user" | "assistant" | "tool";
/**
 * One thing a decision asks the engine to do.
 */
export type Action =
  | {
      /**
       * Where it runs (default server).
       */
      handler?: LlmHandler | null;
      /**
       * Omitted: the engine mints one.
       */
      id?: CallId | null;
      max_completion_tokens?: number | null;
      /**
       * Explicit messages; these suppress system-prompt injection.
       */
      messages?: DraftMessage[] | null;
      /**
       * Omitted: the agent config's.
       */
      model?: string | null;
      reasoning?: ReasoningConfig | null;
      /**
       * Retry policy for this call.
       */
      retry?: RetryPolicy | null;
      stream?: boolean | null;
      /**
       * Sampling temperature.
       */
      temperature?: number | null;
      /**
       * The tools the model sees.
       */
      tools?: LlmTool[] | null;
      type: "llm.call";
    }
  | {
      /**
       * The arguments: a JSON value, or the model's raw argument string.
       */
      arguments: unknown;
      /**
       * Who runs it (default worker).
       */
      handler?: ToolHandler | null;
      /**
       * Omitted: the engine mints one.
       */
      id?: CallId | null;
      name: string;
      /**
       * Retry policy (default: no retry).
       */
      retry?: RetryPolicy | null;
      type: "tool.call";
    }
  | {
      /**
       * The attempt; omitted: the current one.
       */
      attempt?: number | null;
      /**
       * Omitted: the answered `tool.execute`'s call.
       */
      id?: CallId | null;
      result: unknown;
      type: "tool.result";
    }
  | {
      /**
       * The attempt; omitted: the current one.
       */
      attempt?: number | null;
      code?: ErrorCode | null;
      detail?: unknown;
      error: string;
      /**
       * Omitted: the answered execute trigger's call.
       */
      id?: CallId | null;
      /**
       * Whether another attempt may follow (default false: terminal).
       */
      retryable?: boolean | null;
      type: "tool.error";
    }
  | {
      /**
       * The attempt; omitted: the current one.
       */
      attempt?: number | null;
      /**
       * Omitted: the answered `llm.execute`'s call.
       */
      id?: CallId | null;
      /**
       * An `LlmResponse`, or provider-native when the `llm.execute` carried a format.
       */
      response: unknown;
      type: "llm.result";
    }
  | {
      /**
       * The attempt; omitted: the current one.
       */
      attempt?: number | null;
      code?: ErrorCode | null;
      detail?: unknown;
      error: string;
      /**
       * Omitted: the answered execute trigger's call.
       */
      id?: CallId | null;
      /**
       * Whether another attempt may follow (default false: terminal).
       */
      retryable?: boolean | null;
      type: "llm.error";
    }
  | {
      /**
       * The child's agent.
       */
      agent_id: string;
      /**
       * Retry policy for the delegation.
       */
      retry?: RetryPolicy | null;
      session_id: SessionId;
      tool_call_id: CallId;
      type: "sub_agent.spawn";
    }
  | {
      message: DraftMessage;
      session_id: SessionId;
      type: "message.send";
    }
  | {
      /**
       * Omitted: the engine mints one.
       */
      interrupt_id?: InterruptId | null;
      /**
       * Anything the client needs to answer.
       */
      payload?: unknown;
      /**
       * Why, for the client.
       */
      reason: string;
      type: "interrupt";
    }
  | {
      /**
       * The turn's result.
       */
      data?: unknown;
      type: "done";
    };
/**
 * How hard the model should think.
 */
export type Effort = ("high" | "medium" | "low") | "xhigh" | "minimal" | "none";
/**
 * The class of a call failure.
 */
export type ErrorCode = "provider_error" | "rate_limited" | "refused" | "budget_exceeded" | "deadline_exceeded";
/**
 * An interrupt: given by the worker, or minted as `int_<16 hex>`.
 */
export type InterruptId = string;
/**
 * News not yet written into the conversation, delivered in a `DecisionRequest`.
 */
export type Trigger =
  | {
      type: "session.start";
    }
  | {
      client: ClientContext;
      /**
       * The client's full conversation view.
       */
      messages: DraftMessage[];
      /**
       * Index of the first new message.
       */
      new_from: number;
      type: "client.messages";
    }
  | {
      args?: unknown;
      name: string;
      type: "client.action";
    }
  | {
      /**
       * The raw argument string.
       */
      arguments: string;
      /**
       * The attempt being run (1-based).
       */
      attempt: number;
      /**
       * When this attempt times out.
       */
      deadline?: string | null;
      id: CallId;
      input: ToolInput;
      name: string;
      type: "tool.execute";
    }
  | {
      /**
       * The error text, when not ok.
       */
      error?: string | null;
      id: CallId;
      name: string;
      ok: boolean;
      /**
       * The result text, when ok.
       */
      result?: string | null;
      type: "tool.finished";
    }
  | {
      /**
       * The attempt being run (1-based).
       */
      attempt: number;
      /**
       * When this attempt times out.
       */
      deadline?: string | null;
      /**
       * The provider format of `request`.
       */
      format?: LlmFormat | null;
      id: CallId;
      /**
       * An `LlmRequest`, or provider-native when `format` is set.
       */
      request: unknown;
      stream: boolean;
      type: "llm.execute";
    }
  | {
      /**
       * The error class, when not ok.
       */
      code?: ErrorCode | null;
      /**
       * Cost in dollars, a decimal string.
       */
      cost?: string | null;
      /**
       * Provider detail of the error.
       */
      detail?: unknown;
      /**
       * The error text, when not ok.
       */
      error?: string | null;
      id: CallId;
      /**
       * The assistant message, when ok; its id is the call id.
       */
      message?: DraftMessage | null;
      ok: boolean;
      /**
       * Whether the model ran out of tokens.
       */
      truncated: boolean;
      type: "llm.finished";
      usage?: unknown;
    }
  | {
      /**
       * The child's agent.
       */
      agent_id: string;
      /**
       * The error text, when not ok.
       */
      error?: string | null;
      id: CallId;
      /**
       * Whether the child's turn succeeded.
       */
      ok: boolean;
      /**
       * The child's final output, when ok.
       */
      result?: string | null;
      session_id: SessionId;
      type: "sub_agent.finished";
    }
  | {
      interrupt_id: InterruptId;
      /**
       * What the client answered.
       */
      payload?: unknown;
      type: "interrupt.resumed";
    };
/**
 * The engine's validation of a tool call's arguments.
 */
export type ToolInput =
  | {
      status: "valid";
      /**
       * The parsed arguments.
       */
      value: unknown;
    }
  | {
      error: string;
      status: "invalid";
      /**
       * The parsed arguments.
       */
      value: unknown;
    }
  | {
      error: string;
      status: "malformed";
    };
/**
 * A turn's idempotency id: given by the client, or minted as `turn_<16 hex>`.
 */
export type TurnId = string;
/**
 * One input from a client.
 */
export type ClientInput =
  | {
      /**
       * The agent that runs the session.
       */
      agent_id: string;
      /**
       * Client tools and context for the turn, as `client.messages` carries them. An
       * extension: the seed's `client.message` has none, and an AHP client's tools come this
       * way (ARCHITECTURE.md, "Decisions where the design was silent").
       */
      client?: ClientContext | null;
      message: DraftMessage;
      /**
       * Whether the client wants token streaming.
       */
      stream?: boolean | null;
      /**
       * Idempotency key of the turn; omitted: the engine mints one.
       */
      turn_id?: TurnId | null;
      type: "client.message";
    }
  | {
      /**
       * The agent that runs the session.
       */
      agent_id: string;
      /**
       * Client tools and context.
       */
      client?: ClientContext | null;
      /**
       * The client's full conversation view.
       */
      messages: DraftMessage[];
      /**
       * Whether the client wants token streaming.
       */
      stream?: boolean | null;
      /**
       * Idempotency key of the turn; omitted: the engine mints one.
       */
      turn_id?: TurnId | null;
      type: "client.messages";
    }
  | {
      /**
       * The agent that runs the session.
       */
      agent_id: string;
      args?: unknown;
      name: string;
      /**
       * Idempotency key of the turn; omitted: the engine mints one.
       */
      turn_id?: TurnId | null;
      type: "client.action";
    }
  | {
      interrupt_id: InterruptId;
      /**
       * The answer.
       */
      payload?: unknown;
      type: "interrupt.resume";
    }
  | {
      /**
       * The attempt; omitted: the current one.
       */
      attempt?: number | null;
      id: CallId;
      result?: unknown;
      type: "tool.result";
    }
  | {
      /**
       * The attempt; omitted: the current one.
       */
      attempt?: number | null;
      error: string;
      id: CallId;
      retryable: boolean;
      type: "tool.error";
    }
  | {
      /**
       * Run it (`true`), or answer the model that it was denied (`false`).
       */
      approved: boolean;
      id: CallId;
      /**
       * Why, told to the model with a denial.
       */
      reason?: string | null;
      type: "tool.approval";
    };

/**
 * One decision, POSTed to the worker (or accepted by the engine itself).
 */
export interface DecisionRequest {
  /**
   * The agent config on this branch; `null` when nothing has set one. Required on the wire.
   */
  agent: AgentConfig | null;
  /**
   * The session's agent.
   */
  agent_id: string;
  /**
   * Ancestor session ids, for sub-agents (nearest last).
   */
  ancestry: SessionId[];
  /**
   * Delivery attempts of this decision.
   */
  attempts: number;
  /**
   * Calls not yet reported back.
   */
  calls: Call[];
  /**
   * When this delivery times out. Required on the wire, may be `null`.
   */
  deadline: string | null;
  decision_id: DecisionId;
  identity: WorkerIdentity;
  message_tree: MessageTree;
  /**
   * The active conversation path, root to head.
   */
  messages: Message[];
  /**
   * Tool and sub-agent calls not yet reported back.
   */
  pending_calls: number;
  proposed: DecisionResponse;
  session_id: SessionId;
  /**
   * The agent state, verbatim.
   */
  state: unknown;
  trigger: Trigger;
  /**
   * The turn's idempotency id. Required on the wire, may be `null`.
   */
  turn_id: TurnId | null;
}
/**
 * An agent's configuration, versioned per branch of the session.
 */
export interface AgentConfig {
  /**
   * Wire format of worker-handled LLM calls; requires `handler: worker`.
   */
  format?: LlmFormat | null;
  /**
   * Where LLM calls run (default server).
   */
  handler?: LlmHandler | null;
  /**
   * The model to call; the only required field.
   */
  model: string;
  /**
   * The retry policy of this agent's calls.
   */
  retry?: RetryPolicy | null;
  /**
   * Whether LLM calls stream (default false).
   */
  stream?: boolean | null;
  /**
   * Agents the model may delegate to; each is a tool named by its id.
   */
  sub_agents?: SubAgent[] | null;
  /**
   * The system prompt, prepended at call time (never stored as a message).
   */
  system?: string | null;
  /**
   * The tools the model may call.
   */
  tools?: AgentTool[] | null;
}
/**
 * How a call is bounded and retried.
 */
export interface RetryPolicy {
  /**
   * The wait before the first retry; doubles each retry.
   */
  backoff_base_secs: number;
  /**
   * The longest wait between attempts.
   */
  backoff_max_secs: number;
  /**
   * How many attempts may follow the first.
   */
  max_retries: number;
  /**
   * The bound on one attempt; null: no limit. Required on the wire, may be `null`.
   */
  timeout_secs: number | null;
}
/**
 * An agent the model may delegate to.
 */
export interface SubAgent {
  /**
   * What the agent is for, for the model.
   */
  description?: string | null;
  /**
   * The agent to spawn, and the tool name the model sees.
   */
  id: string;
}
/**
 * A tool the model may call.
 */
export interface AgentTool {
  /**
   * Whether its calls wait for a person's approval (default never).
   */
  approval?: Approval | null;
  /**
   * What the tool does, for the model.
   */
  description?: string | null;
  /**
   * Who runs it (default worker).
   */
  handler?: ToolHandler | null;
  /**
   * JSON Schema for the arguments; absent: no arguments.
   */
  input?: unknown;
  /**
   * For a tool the engine runs (`handler: "server"`): the MCP server and tool it calls.
   */
  mcp?: McpToolSource | null;
  /**
   * The tool's name, as the model sees it.
   */
  name: string;
  /**
   * JSON Schema results must satisfy; a violating result settles as a terminal error.
   */
  output?: unknown;
}
/**
 * Where a tool the engine runs comes from: a tool of an MCP server (an extension of the
 * protocol, set by the engine on the tools it lists from the agent's servers).
 */
export interface McpToolSource {
  /**
   * The server says repeating a call is harmless (MCP's `idempotentHint`): a call whose
   * outcome is unknown (the host stopped after sending it) may be sent again. Otherwise such
   * a call fails saying it may have run, and is never sent twice.
   */
  idempotent?: boolean;
  /**
   * The server's name in the agent's configuration (the tool's name is `<server>__<tool>`).
   */
  server: string;
  /**
   * The longest wait for one call.
   */
  timeout_secs: number;
  /**
   * The tool's own name on that server.
   */
  tool: string;
}
/**
 * A call as a decision sees it.
 */
export interface Call {
  /**
   * The child's agent (sub-agents).
   */
  agent_id?: string | null;
  /**
   * The head when the call was requested (`None`: the empty tree).
   */
  anchor?: MessageId | null;
  /**
   * The raw argument string (tool calls).
   */
  arguments?: string | null;
  /**
   * The current attempt (0 before the first starts).
   */
  attempt: number;
  /**
   * When the current attempt times out.
   */
  deadline?: string | null;
  handler?: Handler | null;
  id: CallId;
  kind: CallKind;
  /**
   * The tool (tool calls).
   */
  name?: string | null;
  /**
   * The child session (sub-agents).
   */
  session_id?: SessionId | null;
  status: CallStatus;
  /**
   * Whether it streams (LLM calls).
   */
  stream?: boolean | null;
}
/**
 * The session owner, without the tenant.
 */
export interface WorkerIdentity {
  /**
   * The owner's id.
   */
  id?: string | null;
  /**
   * Owner metadata.
   */
  metadata?: {
    [k: string]: string;
  } | null;
}
/**
 * Every recorded message of a session, with the branch structure.
 */
export interface MessageTree {
  /**
   * The head of the active branch; absent while the tree is empty.
   */
  head_id?: MessageId | null;
  /**
   * Every node, parents before children.
   */
  nodes: TreeNode[];
}
/**
 * One node of a `MessageTree`.
 */
export interface TreeNode {
  message: Message;
  /**
   * Absent for a root.
   */
  parent_id?: MessageId | null;
}
/**
 * A recorded message: a node of the session's message tree.
 */
export interface Message {
  /**
   * Set on the engine's compaction marker: a system message recording what the model's view
   * of the conversation leaves out from here on (an extension of the protocol, see
   * `Compaction`). Only the engine writes one; a draft cannot carry it.
   */
  compaction?: Compaction | null;
  content?: Content | null;
  id: MessageId;
  /**
   * For a tool message: the tool's name.
   */
  name?: string | null;
  /**
   * For an assistant message: what its model's provider needs back with it.
   */
  provider_blocks?: ProviderBlocks | null;
  role: Role;
  /**
   * For a tool message: the call it answers.
   */
  tool_call_id?: CallId | null;
  /**
   * Tool calls the assistant made.
   */
  tool_calls?: ToolCall[] | null;
}
/**
 * What a compaction marker does to the model's view of the path it is on (an extension of the
 * protocol). The conversation itself is never changed: every message stays recorded and in
 * `messages`; only the requests the engine builds for a model leave out what a marker covers.
 */
export interface Compaction {
  kind: CompactionKind;
  through: MessageId;
}
/**
 * `{ url }`, as used by image and video parts.
 */
export interface UrlRef {
  url: string;
}
/**
 * The `file` of a file part.
 */
export interface FileData {
  /**
   * The file's bytes, base64 (or a data URL).
   */
  file_data: string;
  /**
   * The file's name.
   */
  filename: string;
}
/**
 * The `input_audio` of an audio part.
 */
export interface AudioData {
  /**
   * The audio bytes, base64.
   */
  data: string;
  /**
   * The audio format, e.g. `wav`.
   */
  format: string;
}
/**
 * Blocks of a model's reply that its provider requires back, unchanged, whenever the reply
 * is sent to it again (an extension of the protocol): Anthropic's signed `thinking` and
 * `redacted_thinking` blocks, which must lead the assistant turn that called a tool while
 * thinking is on; the Responses API's reasoning items with their encrypted content, with
 * markers of where the reply's other items stood. Sent back only to the provider that wrote them (an agent may change
 * models mid-session); clients see their text only as the reply's reasoning.
 */
export interface ProviderBlocks {
  /**
   * The blocks, in the order the provider sent them.
   */
  blocks: unknown[];
  /**
   * The wire format that wrote them: `anthropic`, `openai-responses`.
   */
  provider: string;
}
/**
 * A tool call requested by the model, in the OpenAI shape the protocol uses.
 */
export interface ToolCall {
  function: FunctionCall;
  id: CallId;
  /**
   * Always `function` today.
   */
  type: string;
}
/**
 * The function of a tool call.
 */
export interface FunctionCall {
  /**
   * The raw argument string, usually JSON.
   */
  arguments: string;
  name: string;
}
/**
 * What a decision answers: how the conversation now reads, and what to do next.
 */
export interface DecisionResponse {
  /**
   * What the engine should do next.
   */
  actions?: Action[] | null;
  /**
   * New agent config; omitted keeps the current one.
   */
  agent?: AgentConfig | null;
  /**
   * Messages to record (reconciled into the tree).
   */
  messages?: DraftMessage[] | null;
  /**
   * New agent state; omitted or null keeps the current state.
   */
  state?: unknown;
}
/**
 * A message not yet recorded: the same shape as `Message` with an optional id.
 */
export interface DraftMessage {
  content?: Content | null;
  /**
   * The recorded node this message is, if it is one; absent for news.
   */
  id?: MessageId | null;
  /**
   * For a tool message: the tool's name.
   */
  name?: string | null;
  /**
   * For an assistant message: what its model's provider needs back with it (an extension
   * of the protocol, `ProviderBlocks`).
   */
  provider_blocks?: ProviderBlocks | null;
  role: Role;
  /**
   * For a tool message: the call it answers.
   */
  tool_call_id?: CallId | null;
  /**
   * Tool calls the assistant made.
   */
  tool_calls?: ToolCall[] | null;
}
/**
 * Reasoning settings.
 */
export interface ReasoningConfig {
  effort?: Effort | null;
  /**
   * Turn reasoning on or off.
   */
  enabled?: boolean | null;
  /**
   * Reason, but leave the reasoning out of the response.
   */
  exclude?: boolean | null;
  /**
   * Token budget for reasoning.
   */
  max_tokens?: number | null;
}
/**
 * A tool as the model sees it.
 */
export interface LlmTool {
  description: string;
  /**
   * JSON Schema for the arguments; absent: no arguments.
   */
  input?: unknown;
  name: string;
  /**
   * JSON Schema of the result.
   */
  output?: unknown;
}
/**
 * What the client brought with a `client.messages` input.
 */
export interface ClientContext {
  /**
   * The client that brought `tools` and runs their calls (an AHP client id). An extension:
   * where several clients drive one session, a client tool's call goes to the one that
   * offered it.
   */
  client_id?: string | null;
  /**
   * Extra context items.
   */
  context?: unknown[] | null;
  /**
   * Anything else the client forwards.
   */
  forwarded_props?: unknown;
  /**
   * Client-side state.
   */
  state?: unknown;
  /**
   * Client-executed tools, layered onto the proposed config.
   */
  tools?: AgentTool[] | null;
}
/**
 * A model call, provider-neutral.
 */
export interface LlmRequest {
  max_completion_tokens?: number | null;
  /**
   * The conversation, system prompt first when the agent has one.
   */
  messages: DraftMessage[];
  model: string;
  /**
   * Reasoning settings, where the model offers reasoning.
   */
  reasoning?: ReasoningConfig | null;
  /**
   * Sampling temperature.
   */
  temperature?: number | null;
  /**
   * The tools the model may call.
   */
  tools?: LlmTool[] | null;
}
/**
 * A model's answer, provider-neutral.
 */
export interface LlmResponse {
  content?: string | null;
  /**
   * Cost in dollars, a decimal string.
   */
  cost?: string | null;
  /**
   * Why generation stopped: `stop`, `tool_calls`, `length`, `content_filter`, ...
   */
  finish_reason?: string | null;
  /**
   * Generated images.
   */
  images?: UrlRef[] | null;
  model: string;
  /**
   * What the provider needs back with this reply when it is sent to it again (an extension
   * of the protocol): recorded with the assistant message.
   */
  provider_blocks?: ProviderBlocks | null;
  /**
   * The model's reasoning, where it shows it (an extension of the protocol): recorded so
   * that a client sees the same reasoning live, as it streams, and afterwards.
   */
  reasoning?: string | null;
  /**
   * Tool calls requested.
   */
  tool_calls?: ToolCall[] | null;
  /**
   * Token usage, provider-shaped.
   */
  usage?: unknown;
}
/**
 * One chunk of a streaming model answer.
 */
export interface StreamDelta {
  /**
   * Set on the last chunk.
   */
  finish_reason?: string | null;
  /**
   * More reasoning.
   */
  reasoning?: string | null;
  /**
   * More text.
   */
  text?: string | null;
  /**
   * Tool call fragments.
   */
  tool_calls?: ToolCallDelta[] | null;
}
/**
 * A fragment of one tool call in a `StreamDelta`.
 */
export interface ToolCallDelta {
  /**
   * More of the argument string.
   */
  arguments?: string | null;
  id: CallId;
  /**
   * The tool's name, on the first fragment.
   */
  name?: string | null;
}
