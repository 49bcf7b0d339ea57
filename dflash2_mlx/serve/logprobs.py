"""Log-probability entries in the shape chat completions and the Responses API share."""


def logprob_entries(tokenizer, deltas) -> list[dict]:
    """Each token's log-probability entry (token, logprob, bytes, top_logprobs), the shape chat
    completions and the Responses API share."""
    def entry(token: int, logprob: float) -> dict:
        text = tokenizer.decode([token])
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return [{**entry(d.token, d.logprobs.logprob), "top_logprobs": [entry(i, v) for i, v in d.logprobs.top]}
            for d in deltas if d.logprobs is not None]
