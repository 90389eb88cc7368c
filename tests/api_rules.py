"""The Messages API's request rules (tests/fixtures/recorded/API_RULES.md) as a checker.

`check_request(body, issued)` returns the error message the real API would answer with
(HTTP 400), or None when the request would be accepted. `issued` maps the content of every
assistant reply the fake sent, so modified thinking blocks and prefills can be caught.
"""

import json
import re

TOP_LEVEL = {
    "model",
    "max_tokens",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "stream",
    "cache_control",
    "output_config",
    "metadata",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "thinking",
    "service_tier",
    "container",
    "diagnostics",
    "context_management",
}
CONTEXT_EDITS = {"clear_tool_uses_20250919", "clear_thinking_20251015"}
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
EFFORTS = ("low", "medium", "high", "xhigh", "max")
MAX_OUTPUT = 128_000


def merged(messages):
    """Consecutive messages of one role are merged before validation (R6)."""
    out = []
    for m in messages:
        content = (
            m["content"]
            if isinstance(m["content"], list)
            else [{"type": "text", "text": m["content"]}]
        )
        if out and out[-1]["role"] == m["role"]:
            out[-1]["content"] = out[-1]["content"] + content
        else:
            out.append({"role": m["role"], "content": list(content)})
    return out


def check_request(body, issued=None, betas=()):
    """The API's 400 message for `body` (sent with these anthropic-beta values), or None if
    the real API would accept it."""
    issued = issued or {}
    extra = sorted(set(body) - TOP_LEVEL)
    if "context_management" in body and "context-management-2025-06-27" not in betas:
        extra = ["context_management"] + extra  # a beta field: unknown without its header
    if extra:
        return f"{extra[0]}: Extra inputs are not permitted"
    diagnostics = body.get("diagnostics")
    if diagnostics is not None and (
        not isinstance(diagnostics, dict) or set(diagnostics) - {"previous_message_id"}
    ):
        return "diagnostics: Extra inputs are not permitted"
    for edit in (body.get("context_management") or {}).get("edits", []):
        if edit.get("type") not in CONTEXT_EDITS:
            return f"context_management.edits.0.type: Input should be {' or '.join(sorted(CONTEXT_EDITS))}"
    for key in ("model", "max_tokens", "messages"):
        if key not in body:
            return f"{key}: Field required"
    if not isinstance(body["max_tokens"], int) or body["max_tokens"] < 1:
        return "max_tokens: Input should be greater than or equal to 1"
    if body["max_tokens"] > MAX_OUTPUT:
        return (
            f"max_tokens: {body['max_tokens']} > {MAX_OUTPUT}, which is the maximum allowed "
            f"number of output tokens for {body['model']}"
        )
    tools = body.get("tools") or []
    for i, tool in enumerate(tools):
        if not TOOL_NAME.match(tool.get("name", "")):
            return f"tools.{i}.custom.name: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
        if not isinstance(tool.get("input_schema"), dict):
            return f"tools.{i}.custom.input_schema: Field required"
    choice = body.get("tool_choice")
    if choice is not None and choice.get("type") not in ("auto", "any", "tool", "none"):
        return "tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'"
    thinking = (body.get("thinking") or {}).get("type") in ("enabled", "adaptive")
    if thinking and choice and choice.get("type") in ("any", "tool"):
        return "Thinking may not be enabled when tool_choice forces tool use."
    effort = (body.get("output_config") or {}).get("effort")
    if effort is not None and effort not in EFFORTS:
        return (
            f"This model does not support effort level '{effort}'. Supported levels: "
            "high, low, max, medium."
        )
    breakpoints = 1 if body.get("cache_control") else 0
    system = body.get("system")
    if isinstance(system, list):
        breakpoints += sum(1 for b in system if b.get("cache_control"))
    breakpoints += sum(1 for t in tools if t.get("cache_control"))
    raw = body["messages"]
    if not isinstance(raw, list) or not raw:
        return "messages: at least one message is required"
    for i, m in enumerate(raw):
        if m.get("role") not in ("user", "assistant"):
            return f"messages.{i}.role: Input should be 'user' or 'assistant'"
        content = m.get("content")
        if content == [] or content == "":
            if not (i == len(raw) - 1 and m["role"] == "assistant"):
                return (
                    f"messages.{i}: all messages must have non-empty content except for the "
                    "optional final assistant message"
                )
        if isinstance(content, list):
            for j, block in enumerate(content):
                shape = block_shape_error(f"messages.{i}.content.{j}", block, m["role"])
                if shape:
                    return shape
                if block.get("cache_control"):
                    breakpoints += 1
                    if block.get("type") in ("thinking", "redacted_thinking"):
                        return (
                            f"messages.{i}.content.{j}: cache_control cannot be set on "
                            "thinking blocks"
                        )
                if block.get("type") == "text":
                    if not isinstance(block.get("text"), str) or block["text"] == "":
                        return "messages: text content blocks must be non-empty"
                    # Recorded traffic shows " " accepted mid-history in an assistant turn.
                    if not block["text"].strip() and (m["role"] == "user" or i == len(raw) - 1):
                        return "messages: text content blocks must contain non-whitespace text"
    if breakpoints > 4:
        return f"A maximum of 4 blocks with cache_control may be provided. Found {breakpoints}."
    messages = merged(raw)
    seen = (
        set()
    )  # anthropics/claude-code#21317: "messages.1.content.1: `tool_use` ids must be unique"
    for i, m in enumerate(messages):
        for j, block in enumerate(m["content"]):
            if block.get("type") == "tool_use":
                if block.get("id") in seen:
                    return f"messages.{i}.content.{j}: `tool_use` ids must be unique"
                seen.add(block.get("id"))
    uses_tools = any(
        b.get("type") in ("tool_use", "tool_result") for m in messages for b in m["content"]
    )
    if uses_tools and not tools:
        return "Requests which include `tool_use` or `tool_result` blocks must define tools."
    for i, m in enumerate(messages):
        content = m["content"]
        if m["role"] == "assistant":
            ids = [b["id"] for b in content if b.get("type") == "tool_use"]
            has_thinking = any(b.get("type") in ("thinking", "redacted_thinking") for b in content)
            if has_thinking and content[0].get("type") not in ("thinking", "redacted_thinking"):
                return (
                    f"messages.{i}.content.0: If an assistant message contains any thinking "
                    f"blocks, the first block must be `thinking` or `redacted_thinking`. "
                    f"Found `{content[0].get('type')}`."
                )
            for j, block in enumerate(content):
                if block.get("type") in ("thinking", "redacted_thinking"):
                    key = json.dumps(block, sort_keys=True)
                    if issued and key not in issued.get("thinking", set()):
                        return (
                            f"messages.{i}.content.{j}: `thinking` or `redacted_thinking` "
                            "blocks in the latest assistant message cannot be modified. "
                            "These blocks must remain as they were in the original response."
                        )
            if ids:
                last_use = max(j for j, b in enumerate(content) if b.get("type") == "tool_use")
                trailing = any(b.get("type") == "text" for b in content[last_use + 1 :])
                nxt = messages[i + 1] if i + 1 < len(messages) else None
                answered = (
                    []
                    if nxt is None
                    else [
                        b.get("tool_use_id")
                        for b in nxt["content"]
                        if b.get("type") == "tool_result"
                    ]
                )
                missing = [x for x in ids if x not in answered]
                if trailing or (nxt is not None and missing):
                    return (
                        f"messages.{i + 1}: `tool_use` ids were found without `tool_result` "
                        f"blocks immediately after: {', '.join(missing or ids)}. Each "
                        "`tool_use` block must have a corresponding `tool_result` block in "
                        "the next message."
                    )
                if nxt is None:
                    return (
                        f"messages.{i + 1}: `tool_use` ids were found without `tool_result` "
                        f"blocks immediately after: {', '.join(ids)}. Each `tool_use` block "
                        "must have a corresponding `tool_result` block in the next message."
                    )
        else:
            results = [j for j, b in enumerate(content) if b.get("type") == "tool_result"]
            prev = messages[i - 1] if i > 0 and messages[i - 1]["role"] == "assistant" else None
            prev_ids = (
                []
                if prev is None
                else [b["id"] for b in prev["content"] if b.get("type") == "tool_use"]
            )
            for j in results:
                if content[j].get("tool_use_id") not in prev_ids:
                    return (
                        f"messages.{i}.content.{j}: unexpected `tool_use_id` found in "
                        f"`tool_result` blocks: {content[j].get('tool_use_id')}. Each "
                        "`tool_result` block must have a corresponding `tool_use` block in "
                        "the previous message."
                    )
                c = content[j].get("content")
                if c is not None and not isinstance(c, (str, list)):
                    return (
                        f"messages.{i}.content.{j}.content: Input should be a valid string or list"
                    )
            if prev_ids and results != list(range(len(results))):
                return (
                    f"messages.{i}: Did not find {len(prev_ids)} `tool_result` block(s) at the "
                    "beginning of this message. Messages following `tool_use` blocks must "
                    "begin with a matching number of `tool_result` blocks."
                )
    if messages[-1]["role"] == "assistant":
        key = json.dumps(messages[-1]["content"], sort_keys=True)
        if key not in issued.get("paused", set()):
            return (
                "This model does not support assistant message prefill. The conversation "
                "must end with a user message."
            )
    return None


BLOCK_TAGS = {  # API_RULES.md section 10: the kinds of block each role may send
    "user": {"text", "image", "document", "search_result", "tool_result"},
    "assistant": {
        "text",
        "thinking",
        "redacted_thinking",
        "tool_use",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "mcp_tool_use",
        "mcp_tool_result",
        "container_upload",
    },
}


def block_shape_error(where, block, role):
    """The API's validation message for a content block of the wrong shape (section 10)."""
    if not isinstance(block, dict):
        return f"{where}: Input should be a valid dictionary or object to extract fields from"
    kind = block.get("type")
    if kind not in BLOCK_TAGS.get(role, ()):
        return (
            f"{where}: Input tag '{kind}' found using 'type' does not match any of the "
            f"expected tags: {', '.join(repr(t) for t in sorted(BLOCK_TAGS[role]))}"
        )
    if kind == "text" and not isinstance(block.get("text"), str):
        return f"{where}.text.text: Input should be a valid string"
    if kind == "tool_use":
        for key in ("id", "name", "input"):
            if key not in block:
                return f"{where}.tool_use.{key}: Field required"
        if not isinstance(block["name"], str) or not block["name"]:
            return f"{where}.tool_use.name: String should have at least 1 character"
        if not isinstance(block["input"], dict):
            return f"{where}.tool_use.input: Input should be a valid dictionary"
    return None


def remember(issued, message):
    """Note a reply the fake sent, so its thinking blocks and pause can be recognised later."""
    content = [
        b
        for b in message.get("content", [])
        if isinstance(b, dict)
        and not (b.get("type") == "text" and not str(b.get("text", "")).strip())
    ]
    for block in content:
        if block.get("type") in ("thinking", "redacted_thinking"):
            issued.setdefault("thinking", set()).add(json.dumps(block, sort_keys=True))
    if message.get("stop_reason") == "pause_turn":
        issued.setdefault("paused", set()).add(json.dumps(content, sort_keys=True))
