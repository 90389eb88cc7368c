"""A stand-in for the API's prompt cache, to bill requests the way the API does.

A breakpoint is a block with cache_control, plus the last block when the request has the
top-level cache_control. A request reads the longest prefix already cached that one of its
breakpoints reaches by looking back at most 20 positions (the breakpoint itself counts as the
first; a run of consecutive tool_use or tool_result blocks is one position), and writes the
prefix up to its last breakpoint. Changing tool_choice invalidates the cached messages (not
the tools and system). A prefix shorter than the model's minimum (512 tokens for the 5.5
models) is never cached. Tokens are bytes / 4. Source: the prompt-caching page of the API
docs (see README, "Cost and caching").
"""

import hashlib
import json

LOOKBACK = 20


def tokens(value):
    return len(json.dumps(value, ensure_ascii=False).encode()) // 4


class PromptCache:
    def __init__(self, minimum=512):
        self.minimum, self.entries = minimum, set()

    def positions(self, body):
        """(blocks so far, is a breakpoint) per position, after the tools-and-system head."""
        blocks = [b for m in body["messages"] for b in m["content"]]
        out, previous = [], None
        for i, block in enumerate(blocks):
            kind = block.get("type")
            mark = bool(block.get("cache_control")) or (
                bool(body.get("cache_control")) and i == len(blocks) - 1
            )
            if out and kind in ("tool_use", "tool_result") and kind == previous:
                out[-1] = (i + 1, out[-1][1] or mark)  # one position for the run
            else:
                out.append((i + 1, mark))
            previous = kind
        return blocks, out

    def key(self, body, blocks):
        """What a cached prefix is known by: its content, not where the markers were."""
        head = [body.get("model"), body.get("tools"), body.get("system"), body.get("tool_choice")]
        plain = [{k: v for k, v in b.items() if k != "cache_control"} for b in blocks]
        return hashlib.sha256(json.dumps([head, plain], sort_keys=True).encode()).hexdigest()

    def bill(self, body, commit=True):
        """The usage the API would report for `body` (and remember what it writes)."""
        blocks, positions = self.positions(body)
        head = tokens([body.get("tools"), body.get("system")])
        size = lambda n: head + tokens(blocks[:n])  # noqa: E731
        total, read, last_mark = size(len(blocks)), 0, 0
        for p, (end, mark) in enumerate(positions):
            if not mark:
                continue
            last_mark = end
            for back in range(p, max(-1, p - LOOKBACK), -1):  # the breakpoint is the first
                n = positions[back][0]
                if self.key(body, blocks[:n]) in self.entries:
                    read = max(read, size(n))
                    break
        written = (
            max(0, size(last_mark) - read) if last_mark and size(last_mark) >= self.minimum else 0
        )
        if commit and written:
            for end, mark in positions:
                if mark and size(end) >= self.minimum:
                    self.entries.add(self.key(body, blocks[:end]))
        return {
            "input_tokens": total - read - written,
            "output_tokens": 30,
            "cache_creation_input_tokens": written,
            "cache_read_input_tokens": read,
        }
