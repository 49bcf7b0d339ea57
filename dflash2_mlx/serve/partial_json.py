"""A JSON object cut short, read as far as it goes: what a cut tool call's input is.

The anthropic SDK reads a streamed tool_use block's `input_json_delta` pieces
with jiter's partial mode (complete members only); a non-streamed answer cut
inside the same call must give the same input, without that dependency.
"""

import json


def partial_object(text: str) -> dict:
    """The complete members of a JSON object cut short (`{"a": 1, "b": "x` -> {"a": 1}): the text up
    to the last point where closing the open brackets gives valid JSON. A number or literal at the
    very end counts when its text is one already; an unfinished string does not."""
    stack, keys, safe = [], [], None  # open closers; per open object: whether a key comes next
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "{[":
            stack.append("}" if c == "{" else "]")
            keys.append(c == "{")
            safe = (i + 1, "".join(reversed(stack)))
        elif c in "}]" and stack:
            stack.pop()
            keys.pop()
            safe = (i + 1, "".join(reversed(stack)))
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            if j >= n:
                break
            i = j
            if not (stack and stack[-1] == "}" and keys[-1]):  # a value, not a key
                safe = (i + 1, "".join(reversed(stack)))
        elif c == ":" and keys:
            keys[-1] = False
        elif c == "," and keys:
            keys[-1] = stack[-1] == "}"
        elif c not in " \t\r\n":  # a number or a literal: complete once a delimiter follows it
            j = i
            while j < n and text[j] not in ",}] \t\r\n":
                j += 1
            try:
                json.loads(text[i:j])
            except json.JSONDecodeError:
                break
            i, safe = j - 1, (j, "".join(reversed(stack)))
        i += 1
    if safe is None:
        return {}
    try:
        value = json.loads(text[: safe[0]] + safe[1])
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}
